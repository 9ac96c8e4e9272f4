package api

import (
	"fmt"
	"net/http"

	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/manifest"
)

// resolveSigned is POST /v1/leases/{lease}/resolve with a signed
// resolution: the document says the outcome and the reason, so the body
// carries nothing else.
func (s *server) resolveSigned(w http.ResponseWriter, r *http.Request, by string, req resolveRequest) {
	if req.Outcome != "" || req.Reason != "" {
		s.problem(w, r, fmt.Errorf("%w: a signed resolution carries its outcome and reason; send {\"resolution\"} alone", authz.ErrBadRequest))
		return
	}
	l, sr, err := s.uc.Leases.ResolveSigned(r.Context(), by, pathParam(r, "lease"), []byte(req.Resolution))
	if err != nil {
		s.problem(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"lease": l.ID, "outcome": sr.Resolution.Outcome, "formation": l.Formation,
		"signer": sr.KeyID, "operator": sr.Resolution.Operator, "digest": sr.Digest})
}

// resolutionView is a signed resolution kept with the lease it closed.
type resolutionView struct {
	*manifest.Resolution
	// Signer is the kid of the operator key that signed it.
	Signer string `json:"signer"`
	// Digest is the digest of its canonical payload.
	Digest string `json:"digest"`
	// JWS is the signed document itself.
	JWS string `json:"resolution"`
}

// showResolution is GET /v1/leases/{lease}/resolution: the signed
// resolution that closed the lease, while etcd keeps it.
func (s *server) showResolution(w http.ResponseWriter, r *http.Request) {
	sr, err := s.uc.Leases.Resolution(r.Context(), pathParam(r, "lease"))
	if err != nil {
		s.problem(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, resolutionView{Resolution: sr.Resolution, Signer: sr.KeyID, Digest: sr.Digest, JWS: sr.JWS})
}
