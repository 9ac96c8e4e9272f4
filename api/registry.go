package api

import (
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
)

// registerResponse is the answer to POST /v1/manifests.
type registerResponse struct {
	Epoch    string             `json:"epoch"`
	State    string             `json:"state"`
	Server   string             `json:"server"`
	Release  string             `json:"release"`
	Pool     string             `json:"pool"`
	Findings []manifest.Finding `json:"findings"`
}

// registerManifest takes a signed manifest: a JWS in compact or JSON
// serialization, as the body.
func (s *server) registerManifest(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		s.problem(w, r, err)
		return
	}
	reg, err := s.reg.Register(r.Context(), body)
	if err != nil {
		s.problem(w, r, err)
		return
	}
	status := http.StatusOK
	if reg.Created {
		status = http.StatusCreated
		w.Header().Set("Location", "/v1/epochs/"+reg.Epoch.ID)
	}
	findings := reg.Findings
	if findings == nil {
		findings = []manifest.Finding{}
	}
	writeJSON(w, status, registerResponse{
		Epoch: reg.Epoch.ID, State: string(reg.Epoch.State), Server: reg.Epoch.Server,
		Release: reg.Epoch.Release, Pool: reg.Epoch.Pool, Findings: findings,
	})
}

func (s *server) listEpochs(w http.ResponseWriter, r *http.Request) {
	f := record.EpochFilter{Server: r.URL.Query().Get("server"), State: record.State(r.URL.Query().Get("state"))}
	if f.State != "" && !f.State.Valid() {
		s.problem(w, r, fmt.Errorf("%w: state=%q (ACTIVE, DRAINING or STALE)", errBadParameter, f.State))
		return
	}
	eps, err := s.reg.Epochs(r.Context(), f)
	if err != nil {
		s.problem(w, r, err)
		return
	}
	out := mapAll(eps, newWireEpoch)
	if out == nil {
		out = []*wireEpoch{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"epochs": out})
}

func (s *server) showEpoch(w http.ResponseWriter, r *http.Request) {
	ep, err := s.reg.Epoch(r.Context(), pathParam(r, "epoch"))
	if err != nil {
		s.problem(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, newWireEpoch(ep))
}

func (s *server) epochLeases(w http.ResponseWriter, r *http.Request) {
	id := pathParam(r, "epoch")
	ls, err := s.reg.Leases(r.Context(), id)
	if err != nil {
		s.problem(w, r, err)
		return
	}
	out := make([]wireLease, len(ls))
	for i, l := range ls {
		out[i] = newWireLease(l)
	}
	writeJSON(w, http.StatusOK, map[string]any{"epoch": id, "leases": out})
}

func (s *server) drainEpoch(w http.ResponseWriter, r *http.Request) {
	id := pathParam(r, "epoch")
	caller, _ := CallerFrom(r.Context())
	st, err := s.reg.Drain(r.Context(), caller.ID, id)
	if err != nil {
		s.problem(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"epoch": id, "state": string(st)})
}

func (s *server) retireEpoch(w http.ResponseWriter, r *http.Request) {
	id := pathParam(r, "epoch")
	var wait time.Duration
	if v := r.URL.Query().Get("wait"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			s.problem(w, r, fmt.Errorf("%w: wait=%q is not a duration like 30s", errBadParameter, v))
			return
		}
		wait = d
	}
	caller, _ := CallerFrom(r.Context())
	st, err := s.reg.Retire(r.Context(), caller.ID, id, wait)
	if err != nil {
		s.problem(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"epoch": id, "state": string(st)})
}

type snapshotRequest struct {
	Servers []string `json:"servers,omitempty"`
}

func (s *server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	var req snapshotRequest
	if err := decodeJSON(r, &req, true); err != nil {
		s.problem(w, r, err)
		return
	}
	snap, err := s.reg.CreateSnapshot(r.Context(), req.Servers)
	if err != nil {
		s.problem(w, r, err)
		return
	}
	w.Header().Set("Location", "/v1/snapshots/"+snap.ID)
	writeJSON(w, http.StatusCreated, newWireSnapshot(snap))
}

func (s *server) showSnapshot(w http.ResponseWriter, r *http.Request) {
	id := pathParam(r, "snapshot")
	switch view := r.URL.Query().Get("view"); view {
	case "", "summary":
		snap, err := s.reg.Snapshot(r.Context(), id)
		if err != nil {
			s.problem(w, r, err)
			return
		}
		immutable(w)
		writeJSON(w, http.StatusOK, newWireSnapshot(snap))
	case "full":
		tools, err := s.reg.SnapshotFull(r.Context(), id)
		if err != nil {
			s.problem(w, r, err)
			return
		}
		immutable(w)
		writeJSON(w, http.StatusOK, wireSnapshotFull{ID: id, Tools: mapAll(tools, newWireFullTool)})
	default:
		s.problem(w, r, fmt.Errorf("%w: view=%q (summary or full)", errBadParameter, view))
	}
}

func (s *server) showSnapshotTool(w http.ResponseWriter, r *http.Request) {
	name := pathParam(r, "server") + "/" + pathParam(r, "tool")
	t, err := s.reg.SnapshotTool(r.Context(), pathParam(r, "snapshot"), name)
	if err != nil {
		s.problem(w, r, err)
		return
	}
	immutable(w)
	writeJSON(w, http.StatusOK, newWireFullTool(*t))
}

// immutable marks an answer that never changes: a snapshot is content
// addressed, so a replica answers it from memory once read, also while
// etcd is down, and a client may keep it as long as it likes (only the
// credential that read it: private).
func immutable(w http.ResponseWriter) {
	w.Header().Set("Cache-Control", "private, max-age=31536000, immutable")
}
