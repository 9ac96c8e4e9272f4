// Package decisionlogtest is a real HTTP decision-log service for tests:
// it reads each upload the way an OPA-compatible consumer does (POST to
// /logs, gzip, a JSON array) and decodes the events strictly into OPA's
// own EventV1, so a member OPA does not define fails the test.
package decisionlogtest

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	"github.com/open-policy-agent/opa/v1/plugins/logs"
)

// Receiver is the service; its methods are safe for concurrent use.
type Receiver struct {
	t      testing.TB
	srv    *httptest.Server
	status func(n int) int

	mu       sync.Mutex
	requests int
	events   []logs.EventV1
	raw      []map[string]json.RawMessage
	sizes    []int
	auth     []string
}

// New starts a receiver, closed when t ends. status, if not nil, answers
// request n (from 1) with the status it returns instead of accepting it;
// 0 accepts.
func New(t testing.TB, status func(n int) int) *Receiver {
	r := &Receiver{t: t, status: status}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

// URL is the service URL (uploads go to URL + "/logs").
func (r *Receiver) URL() string { return r.srv.URL }

// Client is an HTTP client for the receiver.
func (r *Receiver) Client() *http.Client { return r.srv.Client() }

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	r.requests++
	n := r.requests
	r.mu.Unlock()
	if r.status != nil {
		if s := r.status(n); s != 0 {
			http.Error(w, "not now", s)
			return
		}
	}
	if req.Method != http.MethodPost || req.URL.Path != "/logs" ||
		req.Header.Get("Content-Encoding") != "gzip" || req.Header.Get("Content-Type") != "application/json" {
		r.t.Errorf("upload %s %s, Content-Encoding %q, Content-Type %q", req.Method, req.URL.Path,
			req.Header.Get("Content-Encoding"), req.Header.Get("Content-Type"))
		http.Error(w, "bad upload", http.StatusBadRequest)
		return
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		r.t.Error(err)
		return
	}
	zr, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		r.t.Errorf("body is not gzip: %v", err)
		http.Error(w, "not gzip", http.StatusBadRequest)
		return
	}
	plain, err := io.ReadAll(zr)
	if err != nil {
		r.t.Errorf("gunzip: %v", err)
		http.Error(w, "not gzip", http.StatusBadRequest)
		return
	}
	var events []logs.EventV1
	dec := json.NewDecoder(bytes.NewReader(plain))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&events); err != nil {
		r.t.Errorf("not an array of OPA's EventV1: %v\n%s", err, plain)
		http.Error(w, "bad events", http.StatusBadRequest)
		return
	}
	var raw []map[string]json.RawMessage
	if err := json.Unmarshal(plain, &raw); err != nil {
		r.t.Error(err)
	}
	r.mu.Lock()
	r.events = append(r.events, events...)
	r.raw = append(r.raw, raw...)
	r.sizes = append(r.sizes, len(body))
	r.auth = append(r.auth, req.Header.Get("Authorization"))
	r.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// Events are the events accepted so far, in order.
func (r *Receiver) Events() []logs.EventV1 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// Raw are the same events as JSON members, to check how they were written.
func (r *Receiver) Raw() []map[string]json.RawMessage {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.raw)
}

// Sizes are the compressed sizes of the uploads accepted.
func (r *Receiver) Sizes() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.sizes)
}

// Auth are the Authorization headers of the uploads accepted.
func (r *Receiver) Auth() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.auth)
}

// IDs are the decision ids of the events accepted, in order.
func (r *Receiver) IDs() []string {
	var ids []string
	for _, e := range r.Events() {
		ids = append(ids, e.DecisionID)
	}
	return ids
}
