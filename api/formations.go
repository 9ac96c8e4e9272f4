package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/record"
)

// formationRequest is the body of POST /v1/formations.
type formationRequest struct {
	Snapshot  string          `json:"snapshot"`
	Session   string          `json:"session"`
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments"`
	Principal *struct {
		ID         string         `json:"id"`
		Attributes map[string]any `json:"attributes"`
	} `json:"principal"`
}

// createFormation records a formed call. A call the policy denies is still
// recorded and answered 403 with the formation, for audit.
func (s *server) createFormation(w http.ResponseWriter, r *http.Request) {
	var req formationRequest
	if err := decodeJSON(r, &req, false); err != nil {
		s.problem(w, r, err)
		return
	}
	caller, _ := CallerFrom(r.Context())
	fr := authz.FormRequest{Snapshot: req.Snapshot, Session: req.Session, Tool: req.Tool, Arguments: req.Arguments, Host: caller.ID}
	if req.Principal != nil {
		fr.PrincipalID, fr.Attributes = req.Principal.ID, req.Principal.Attributes
	}
	f, err := s.uc.Formations.Form(r.Context(), fr)
	if err != nil {
		s.problem(w, r, err)
		return
	}
	w.Header().Set("Location", "/v1/formations/"+f.ID)
	status := http.StatusCreated
	if f.Status == record.StatusDenied {
		status = http.StatusForbidden
	}
	writeJSON(w, status, newWireFormation(f))
}

// recoverRequest is the body of POST /v1/formations/{id}/recover: empty
// for a retry, the alternative call for a fallback, new arguments (or
// none) for prompt_user.
type recoverRequest struct {
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments"`
}

// recoverFormation forms a call that recovers a failed, refused or
// uncertain-resolved one, as its declared failure mode allows; it is
// answered as a formation is.
func (s *server) recoverFormation(w http.ResponseWriter, r *http.Request) {
	var req recoverRequest
	if err := decodeJSON(r, &req, true); err != nil {
		s.problem(w, r, err)
		return
	}
	caller, _ := CallerFrom(r.Context())
	f, err := s.uc.Formations.Recover(r.Context(), authz.RecoverRequest{Formation: pathParam(r, "formation"), Host: caller.ID,
		Tool: req.Tool, Arguments: req.Arguments})
	if err != nil {
		s.problem(w, r, err)
		return
	}
	w.Header().Set("Location", "/v1/formations/"+f.ID)
	status := http.StatusCreated
	if f.Status == record.StatusDenied {
		status = http.StatusForbidden
	}
	writeJSON(w, status, newWireFormation(f))
}

func (s *server) showFormation(w http.ResponseWriter, r *http.Request) {
	f, err := s.uc.Formations.Get(r.Context(), pathParam(r, "formation"))
	if err != nil {
		s.problem(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, newWireFormation(f))
}

// listFormations answers one page of formations, in id order: ?limit=
// (1-1000, default 100), ?after= (the next of the previous page) and
// ?status=. At most ListConcurrency pages are read at once per replica.
func (s *server) listFormations(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	req := authz.ListRequest{Status: record.Status(q.Get("status")), After: q.Get("after")}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			s.problem(w, r, fmt.Errorf("%w: limit=%q is not an integer (1 to %d)", errBadParameter, v, authz.MaxListLimit))
			return
		}
		if n == 0 {
			n = -1 // an explicit 0 is out of range, not the default
		}
		req.Limit = n
	}
	select {
	case s.listSlots <- struct{}{}:
		defer func() { <-s.listSlots }()
	case <-r.Context().Done():
		return // the client gave up waiting its turn
	}
	page, err := s.uc.Formations.List(r.Context(), req)
	if err != nil {
		s.problem(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, newWireFormationPage(page))
}

// approvalRequest is the body of POST /v1/formations/{id}/approvals.
type approvalRequest struct {
	Decision string `json:"decision"`
	Digest   string `json:"digest"`
	Reason   string `json:"reason"`
}

// approveFormation records a human decision bound to the digest the
// approver saw. The approver is the authenticated credential.
func (s *server) approveFormation(w http.ResponseWriter, r *http.Request) {
	var req approvalRequest
	if err := decodeJSON(r, &req, false); err != nil {
		s.problem(w, r, err)
		return
	}
	caller, _ := CallerFrom(r.Context())
	f, err := s.uc.Formations.Approve(r.Context(), pathParam(r, "formation"), authz.ApprovalRequest{
		Approver: caller.ID, Decision: record.ApprovalDecision(req.Decision), Digest: req.Digest, Reason: req.Reason,
	})
	if err != nil {
		s.problem(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, newWireFormation(f))
}

// compareFormation answers what changed for a formation's call: its tool
// in the source, the successor and the server's active epoch, and the
// differences (docs/approvals.md).
func (s *server) compareFormation(w http.ResponseWriter, r *http.Request) {
	c, err := s.uc.Compare(r.Context(), pathParam(r, "formation"))
	if err != nil {
		s.problem(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, newWireComparison(c))
}
