package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/fencecheck"
)

// TestFenceEndToEnd wires the real parts together: authzd's HTTP API on a
// real embedded etcd, and a backend protected by fencecheck's middleware
// in online mode, which fetches authzd's JWKS, claims each lease at
// authzd before the effect and reports the outcome under the claim. An
// admitted call runs once and its lease closes with the effect; a call
// with other arguments never reaches the handler (and, since the lease was
// not yet claimed, does not release it here: the intact call comes first
// in this test); a replay, on this instance or on a second instance with
// its own memory, never runs.
func TestFenceEndToEnd(t *testing.T) {
	f, snap := newReadyFixture(t)

	var effects atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		effects.Add(1)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"ok"}]}}`)
	})
	form := f.do("POST", "/v1/formations", api.RoleHost, formationBody(snap, "s1", "github/get_repository", `{"owner":"octo","repo":"demo"}`, ""))
	f.expect(form, http.StatusCreated, "")
	src := form.Body["source"].(map[string]any)
	claimer, err := fencecheck.NewLeaseClient(fencecheck.LeaseClientConfig{AuthzdURL: f.url, Credential: string(f.byID["backend-v1-4"])})
	if err != nil {
		t.Fatal(err)
	}
	newVerifier := func() *fencecheck.Verifier {
		v := &fencecheck.Verifier{
			Pool: "github-v1-4", Artifact: src["artifact"].(map[string]any)["digest"].(string), Config: src["configDigest"].(string),
			Issuer: "fcd-test", JWKSURL: f.url + "/.well-known/jwks.json", Claimer: claimer,
		}
		if err := v.Validate(); err != nil {
			t.Fatal(err)
		}
		return v
	}
	rep, err := fencecheck.NewReporter(fencecheck.ReporterConfig{AuthzdURL: f.url, Credential: string(f.byID["backend-v1-4"])})
	if err != nil {
		t.Fatal(err)
	}
	backend := httptest.NewServer(newVerifier().Middleware(handler, fencecheck.MiddlewareConfig{Server: "github", Reporter: rep, Timeout: 10 * time.Second}))
	defer backend.Close()
	// A second instance of the pool, with a replay memory of its own.
	second := httptest.NewServer(newVerifier().Middleware(handler, fencecheck.MiddlewareConfig{Server: "github", Reporter: rep, Timeout: 10 * time.Second}))
	defer second.Close()

	adm := f.do("POST", "/v1/formations/"+form.Body["id"].(string)+"/admit", api.RoleGateway, nil)
	f.expect(adm, http.StatusOK, "")
	token := adm.Body["token"].(string)
	callAt := func(url, args string) int {
		t.Helper()
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_repository","arguments":%s}}`, args)
		req, _ := http.NewRequest("POST", url, bytes.NewReader([]byte(body)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(fencecheck.Header, token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp.StatusCode
	}
	call := func(args string) int { t.Helper(); return callAt(backend.URL, args) }
	if got := call(`{"repo":"demo","owner":"octo"}`); got != http.StatusOK || effects.Load() != 1 {
		t.Fatalf("admitted call: %d, effects %d", got, effects.Load())
	}
	if got := call(`{"owner":"octo","repo":"other"}`); got != http.StatusForbidden || effects.Load() != 1 {
		t.Fatalf("call with other arguments: %d, effects %d", got, effects.Load())
	}
	if got := call(`{"repo":"demo","owner":"octo"}`); got != http.StatusForbidden || effects.Load() != 1 {
		t.Fatalf("replay: %d, effects %d", got, effects.Load())
	}
	if got := callAt(second.URL, `{"repo":"demo","owner":"octo"}`); got != http.StatusForbidden || effects.Load() != 1 {
		t.Fatalf("replay on a second instance: %d, effects %d", got, effects.Load())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := rep.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// The outcome, and the release the refused call asked for (authzd
	// keeps the running lease: nothing to release).
	if st := rep.Stats(); st.Sent != 1 || st.NotReleased != 1 || st.Failed != 0 || st.Dropped != 0 {
		t.Fatalf("reporter stats %+v", st)
	}
	// authzd recorded the effect: the lease is closed, the formation
	// completed, the tool completed in the session.
	got := f.do("GET", "/v1/formations/"+form.Body["id"].(string), api.RoleHost, nil)
	if got.Body["status"] != "completed" {
		t.Fatalf("formation after the effect: %s", got.Raw)
	}
	var ep map[string]any
	json.Unmarshal(f.do("GET", "/v1/epochs/"+src["epoch"].(string), api.RoleOperator, nil).Raw, &ep)
	if ep["activeLeases"] != float64(0) {
		t.Fatalf("lease still open: %v", ep["activeLeases"])
	}
}

// heldTransport holds the first request until release closes, so that
// what a reporter queues meanwhile goes in its next request.
type heldTransport struct {
	first   atomic.Bool
	arrived chan struct{}
	release chan struct{}
}

func (h *heldTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if h.first.CompareAndSwap(false, true) {
		h.arrived <- struct{}{}
		<-h.release
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestReporterBatchesToAuthzd: fencecheck's reporter sends what queued
// while it was busy in one POST /v1/leases/outcomes to the real authzd,
// which applies every report (effect under its claim, with the token's
// admission facts) and answers each; a report authzd refuses (another
// claim) is counted failed and changes nothing.
func TestReporterBatchesToAuthzd(t *testing.T) {
	f, snap := newReadyFixture(t)
	type leased struct {
		id    string
		facts map[string]any
	}
	var ls []leased
	for i := range 6 {
		id, facts := f.admittedAndClaimed(snap, fmt.Sprint("rep-", i))
		ls = append(ls, leased{id, facts})
	}
	held := &heldTransport{arrived: make(chan struct{}, 1), release: make(chan struct{})}
	rep, err := fencecheck.NewReporter(fencecheck.ReporterConfig{AuthzdURL: f.url, Credential: string(f.byID["backend-v1-4"]),
		Workers: 1, HTTPClient: &http.Client{Transport: held, Timeout: 30 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	report := func(i int, claim string) {
		a := ls[i].facts
		rep.Report(fencecheck.OutcomeReport{Lease: ls[i].id, Claim: claim, Outcome: fencecheck.OutcomeEffect, Admission: &fencecheck.Admission{
			Epoch: a["epoch"].(string), Revision: int64(a["revision"].(float64)), Formation: a["formation"].(string),
			Session: a["session"].(string), Tool: a["tool"].(string)}})
	}
	report(0, "cl_rep-0")
	<-held.arrived
	for i := 1; i < 5; i++ {
		report(i, fmt.Sprint("cl_rep-", i))
	}
	report(5, "cl_not-its-claim")
	close(held.release)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := rep.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if s := rep.Stats(); s.Sent != 5 || s.Failed != 1 || s.Requests != 2 || s.Batched != 5 {
		t.Errorf("reporter stats %+v, want 5 sent, 1 failed, in 2 requests (5 reports batched)", s)
	}
	for i, l := range ls {
		want := "completed"
		if i == 5 {
			want = "admitted"
		}
		g := f.do("GET", "/v1/formations/"+l.facts["formation"].(string), api.RoleOperator, nil)
		if g.Body["status"] != want {
			t.Errorf("formation %d is %v, want %s", i, g.Body["status"], want)
		}
	}
}
