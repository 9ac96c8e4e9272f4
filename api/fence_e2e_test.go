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
// that fetches authzd's JWKS and reports outcomes to authzd's lease
// endpoint. An admitted call runs once and its lease closes with the
// effect; a replay and a call with other arguments never reach the
// handler.
func TestFenceEndToEnd(t *testing.T) {
	f := newFixture(t, 0)
	snap := f.registerAndSnapshot()
	f.waitPublished()

	var effects atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		effects.Add(1)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"ok"}]}}`)
	})
	form := f.do("POST", "/v1/formations", api.RoleHost, formationBody(snap, "s1", "github/get_repository", `{"owner":"octo","repo":"demo"}`, ""))
	f.expect(form, http.StatusCreated, "")
	src := form.body["source"].(map[string]any)
	verifier := &fencecheck.Verifier{
		Pool: "github-v1-4", Artifact: src["artifact"].(map[string]any)["digest"].(string), Config: src["configDigest"].(string),
		Issuer: "fcd-test", JWKSURL: f.srv.URL + "/.well-known/jwks.json",
	}
	if err := verifier.Validate(); err != nil {
		t.Fatal(err)
	}
	rep, err := fencecheck.NewReporter(fencecheck.ReporterOptions{AuthzdURL: f.srv.URL, Credential: string(f.creds[api.RoleBackend])})
	if err != nil {
		t.Fatal(err)
	}
	backend := httptest.NewServer(verifier.Middleware(handler, fencecheck.MiddlewareOptions{Server: "github", Reporter: rep, Timeout: 10 * time.Second}))
	defer backend.Close()

	adm := f.do("POST", "/v1/formations/"+form.body["id"].(string)+"/admit", api.RoleGateway, nil)
	f.expect(adm, http.StatusOK, "")
	token := adm.body["token"].(string)
	call := func(args string) int {
		t.Helper()
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_repository","arguments":%s}}`, args)
		req, _ := http.NewRequest("POST", backend.URL, bytes.NewReader([]byte(body)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(fencecheck.Header, token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp.StatusCode
	}
	if got := call(`{"owner":"octo","repo":"other"}`); got != http.StatusForbidden || effects.Load() != 0 {
		t.Fatalf("call with other arguments: %d, effects %d", got, effects.Load())
	}
	if got := call(`{"repo":"demo","owner":"octo"}`); got != http.StatusOK || effects.Load() != 1 {
		t.Fatalf("admitted call: %d, effects %d", got, effects.Load())
	}
	if got := call(`{"repo":"demo","owner":"octo"}`); got != http.StatusForbidden || effects.Load() != 1 {
		t.Fatalf("replay: %d, effects %d", got, effects.Load())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := rep.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if st := rep.Stats(); st.Sent != 1 || st.Failed != 0 || st.Dropped != 0 {
		t.Fatalf("reporter stats %+v", st)
	}
	// authzd recorded the effect: the lease is closed, the formation
	// completed, the tool completed in the session.
	got := f.do("GET", "/v1/formations/"+form.body["id"].(string), api.RoleHost, nil)
	if got.body["status"] != "completed" {
		t.Fatalf("formation after the effect: %s", got.raw)
	}
	var ep map[string]any
	json.Unmarshal(f.do("GET", "/v1/epochs/"+src["epoch"].(string), api.RoleOperator, nil).raw, &ep)
	if ep["activeLeases"] != float64(0) {
		t.Fatalf("lease still open: %v", ep["activeLeases"])
	}
}
