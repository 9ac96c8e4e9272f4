package api

import (
	"io"
	"net/http"
)

// registerCertificate takes a signed compatibility certificate (a JWS, as
// the body) from a registrar.
func (s *server) registerCertificate(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		s.problem(w, r, err)
		return
	}
	rec, created, err := s.reg.Certificates.Register(r.Context(), body)
	if err != nil {
		s.problem(w, r, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
		w.Header().Set("Location", "/v1/certificates/"+rec.ID)
	}
	writeJSON(w, status, newWireCertificate(rec))
}

// revokeCertificate revokes a certificate.
func (s *server) revokeCertificate(w http.ResponseWriter, r *http.Request) {
	caller, _ := CallerFrom(r.Context())
	rec, err := s.reg.Certificates.Revoke(r.Context(), caller.ID, pathParam(r, "certificate"))
	if err != nil {
		s.problem(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, newWireCertificate(rec))
}

// showCertificate shows one registered certificate.
func (s *server) showCertificate(w http.ResponseWriter, r *http.Request) {
	rec, err := s.reg.Certificates.Get(r.Context(), pathParam(r, "certificate"))
	if err != nil {
		s.problem(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, newWireCertificate(rec))
}

// listCertificates lists registered certificates, optionally of one
// source epoch (?source=) and tool (&tool=).
func (s *server) listCertificates(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	recs, err := s.reg.Certificates.List(r.Context(), q.Get("source"), q.Get("tool"))
	if err != nil {
		s.problem(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"certificates": mapAll(recs, newWireCertificate)})
}
