package api

import (
	"fmt"
	"net/http"

	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/record"
)

// admitFormation performs the etcd-ordered admission and answers the
// dispatch token.
func (s *server) admitFormation(w http.ResponseWriter, r *http.Request) {
	a, err := s.uc.Admissions.Admit(r.Context(), pathParam(r, "formation"))
	if err != nil {
		s.problem(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, newWireGrant(a))
}

type claimRequest struct {
	Claim    string `json:"claim"`
	Epoch    string `json:"epoch"`
	Revision int64  `json:"revision"`
}

// claimLease is a backend's claim on a lease before the effect.
func (s *server) claimLease(w http.ResponseWriter, r *http.Request) {
	var req claimRequest
	if err := decodeJSON(r, &req, false); err != nil {
		s.problem(w, r, err)
		return
	}
	caller, _ := CallerFrom(r.Context())
	id := pathParam(r, "lease")
	c, err := s.uc.Leases.Claim(r.Context(), authz.ClaimRequest{
		Lease: id, Epoch: req.Epoch, Revision: req.Revision, Claim: req.Claim, Pools: caller.Pools,
	})
	if err != nil {
		s.problem(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, map[string]any{"lease": id, "claim": c.ID, "claimedAt": c.At})
}

type completeRequest struct {
	Outcome   string              `json:"outcome"`
	Detail    string              `json:"detail"`
	Claim     string              `json:"claim"`
	Admission *wireAdmissionFacts `json:"admission"`
	Failure   *wireFailure        `json:"failure"`
}

// complete is the use case's request of a report of lease by caller.
func (req *completeRequest) complete(lease string, caller Credential) authz.CompleteRequest {
	return authz.CompleteRequest{Lease: lease, Outcome: record.Outcome(req.Outcome), Detail: req.Detail, Claim: req.Claim,
		Pools: caller.Pools, Admission: req.Admission.admission(), Failure: req.Failure.failure()}
}

func (s *server) completeLease(w http.ResponseWriter, r *http.Request) {
	var req completeRequest
	if err := decodeJSON(r, &req, false); err != nil {
		s.problem(w, r, err)
		return
	}
	caller, _ := CallerFrom(r.Context())
	l, err := s.uc.Leases.Complete(r.Context(), req.complete(pathParam(r, "lease"), caller))
	if err != nil {
		s.problem(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"lease": l.ID, "outcome": req.Outcome, "formation": l.Formation})
}

// outcomesRequest is the body of POST /v1/leases/outcomes.
type outcomesRequest struct {
	Reports []struct {
		Lease string `json:"lease"`
		completeRequest
	} `json:"reports"`
}

// outcomeResult is one report's answer in a batch: 200 with the lease's
// formation, or the problem a single report would have been answered.
type outcomeResult struct {
	Lease     string   `json:"lease"`
	Status    int      `json:"status"`
	Outcome   string   `json:"outcome,omitempty"`
	Formation string   `json:"formation,omitempty"`
	Problem   *Problem `json:"problem,omitempty"`
}

// completeLeases applies many outcome reports in one request: one round
// trip for a fence's reporter, and one etcd transaction for the common
// reports among them. Each report is answered as POST
// /v1/leases/{lease}/complete would answer it alone.
func (s *server) completeLeases(w http.ResponseWriter, r *http.Request) {
	var req outcomesRequest
	if err := decodeJSON(r, &req, false); err != nil {
		s.problem(w, r, err)
		return
	}
	if n := len(req.Reports); n == 0 || n > authz.MaxCompleteBatch {
		s.problem(w, r, fmt.Errorf("%w: %d reports; a batch holds 1-%d", authz.ErrBadRequest, n, authz.MaxCompleteBatch))
		return
	}
	caller, _ := CallerFrom(r.Context())
	reqs := make([]authz.CompleteRequest, len(req.Reports))
	for i, rep := range req.Reports {
		reqs[i] = rep.complete(rep.Lease, caller)
	}
	leases, errs := s.uc.Leases.CompleteAll(r.Context(), reqs)
	results := make([]outcomeResult, len(reqs))
	for i, req := range reqs {
		results[i] = outcomeResult{Lease: req.Lease, Status: http.StatusOK}
		if err := errs[i]; err != nil {
			p := toProblem(err)
			p.Instance = "/v1/leases/" + req.Lease + "/complete"
			if p.Status >= 500 {
				s.log.ErrorContext(r.Context(), "outcome report failed", "lease", req.Lease, "status", p.Status, "err", err)
			}
			results[i].Status, results[i].Problem = p.Status, &p
			continue
		}
		results[i].Outcome, results[i].Formation = string(req.Outcome), leases[i].Formation
	}
	writeJSON(w, http.StatusOK, map[string]any{"results": results})
}

// resolveRequest is an operator's resolution: the signed document alone
// (resolution), or, on a server without operator keys, the bare outcome
// and reason.
type resolveRequest struct {
	Outcome    string `json:"outcome"`
	Reason     string `json:"reason"`
	Resolution string `json:"resolution"`
}

func (s *server) resolveLease(w http.ResponseWriter, r *http.Request) {
	var req resolveRequest
	if err := decodeJSON(r, &req, false); err != nil {
		s.problem(w, r, err)
		return
	}
	caller, _ := CallerFrom(r.Context())
	if req.Resolution != "" {
		s.resolveSigned(w, r, caller.ID, req)
		return
	}
	l, err := s.uc.Leases.Resolve(r.Context(), caller.ID, pathParam(r, "lease"), record.Outcome(req.Outcome), req.Reason)
	if err != nil {
		s.problem(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"lease": l.ID, "outcome": req.Outcome, "formation": l.Formation})
}

type generationRequest struct {
	Generation int64 `json:"generation"`
}

func (s *server) setGeneration(w http.ResponseWriter, r *http.Request) {
	var req generationRequest
	if err := decodeJSON(r, &req, false); err != nil {
		s.problem(w, r, err)
		return
	}
	pool := pathParam(r, "pool")
	caller, _ := CallerFrom(r.Context())
	released, err := s.uc.Leases.SetGeneration(r.Context(), caller.ID, pool, req.Generation)
	if err != nil {
		s.problem(w, r, err)
		return
	}
	if released == nil {
		released = []string{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"pool": pool, "generation": req.Generation, "released": released})
}

// jwks serves the public keys of every replica's dispatch-token signer.
func (s *server) jwks(w http.ResponseWriter, r *http.Request) {
	body, err := s.uc.Admissions.JWKS(r.Context())
	if err != nil {
		s.problem(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/jwk-set+json")
	w.Header().Set("Cache-Control", "max-age=5")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(body)
}
