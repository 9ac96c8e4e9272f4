package e2e_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/front"
	"github.com/fcd-authz/fcd/internal/fixtures"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// postMCP sends one raw MCP POST to the front and returns the status and
// body.
func postMCP(t *testing.T, url, token, session, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

// TestFrontRefusesForeignSessionsAndBatches: a session id the front never
// gave, and a JSON-RPC batch holding a call, are refused with a clear
// error; nothing is formed.
func TestFrontRefusesForeignSessionsAndBatches(t *testing.T) {
	s := startStack(t, nil)
	url, _ := startFront(t, s)
	alice := connectFront(t, url, "alice-token")
	before := s.formationCount()
	call := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"get_repository","arguments":{"owner":"octo-org","repo":"hello-world"}}}`

	if status, body := postMCP(t, url, "alice-token", "no-such-session", call); status != http.StatusNotFound {
		t.Fatalf("a session id the front never gave: %d %s, want 404", status, body)
	}
	status, body := postMCP(t, url, "alice-token", alice.cs.ID(), "["+call+"]")
	if status < 400 && !strings.Contains(body, `"error"`) {
		t.Fatalf("a batch holding a call: %d %s, want an error", status, body)
	}
	if n := s.formationCount(); n != before {
		t.Fatalf("%d formations after the refused requests, were %d", n, before)
	}
	if n := len(s.Rec.Effects(fixtures.Filter{})); n != 0 {
		t.Fatalf("%d effects", n)
	}
}

// TestFrontFailsClosedWithoutAuthzd: authzd stops answering in the middle
// of a session — a real proxy between the front and authzd is closed —
// and the call is a tool error the model reads; nothing is sent to the
// server. When authzd is back, the session goes on.
func TestFrontFailsClosedWithoutAuthzd(t *testing.T) {
	s := startStack(t, nil)
	target, _ := url.Parse(s.URL)
	var down atomic.Bool
	proxy := httputil.NewSingleHostReverseProxy(target)
	relay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			// The connection is dropped, as an unreachable authzd's is.
			hj, ok := w.(http.Hijacker)
			if ok {
				if c, _, err := hj.Hijack(); err == nil {
					c.Close()
					return
				}
			}
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(relay.Close)
	pools := map[string]string{}
	for pool, u := range s.Fixture {
		pools[pool] = u + "/mcp"
	}
	f, err := front.New(t.Context(), front.Config{AuthzdURL: relay.URL, Credential: string(s.creds[api.RoleHost]),
		Servers: []string{"github"}, Pools: pools, Auth: frontUsers, PollInterval: 50 * time.Millisecond, RelistInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	h, err := f.Handler()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		srv.Close()
		_ = f.Close()
	})
	fc := connectFront(t, srv.URL+front.MCPPath, "alice-token")
	read := &mcp.CallToolParams{Name: "get_repository", Arguments: map[string]any{"owner": "octo-org", "repo": "hello-world"}}

	down.Store(true)
	res, err := fc.cs.CallTool(t.Context(), read)
	if err != nil {
		t.Fatal(err)
	}
	if r := frontRefusal(t, res); r.Problem != "authzd-unavailable" || !strings.Contains(textOf(res), "nothing was run") {
		t.Fatalf("a call while authzd is unreachable: %+v %q", r, textOf(res))
	}
	if n := len(s.Rec.Effects(fixtures.Filter{})); n != 0 {
		t.Fatalf("%d effects while authzd was unreachable", n)
	}
	if n := s.hits[poolV14].Load(); n != 0 {
		t.Fatalf("%d requests with a token reached the fixture", n)
	}

	down.Store(false)
	res, err = fc.cs.CallTool(t.Context(), read)
	if err != nil || res.IsError {
		t.Fatalf("the call once authzd is back: %v %+v", err, res)
	}
	if n := len(s.Rec.Effects(fixtures.Filter{Tool: "get_repository"})); n != 1 {
		t.Fatalf("the read ran %d times", n)
	}
}

// TestFrontWithoutAuthzdAtStart: a front whose authzd cannot be reached
// opens no session: the initialize is answered 503 with a JSON-RPC error
// that says why, not a session with an empty or invented catalog.
func TestFrontWithoutAuthzdAtStart(t *testing.T) {
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close() // a port nothing listens on
	f, err := front.New(t.Context(), front.Config{AuthzdURL: closed.URL, Credential: "host-credential",
		Pools: map[string]string{"p": "http://127.0.0.1:1/mcp"}, Auth: frontUsers, RelistInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	h, err := f.Handler()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		srv.Close()
		_ = f.Close()
	})
	status, body := postMCP(t, srv.URL+front.MCPPath, "alice-token", "",
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`)
	if status != http.StatusServiceUnavailable || !strings.Contains(body, "unreachable") {
		t.Fatalf("initialize without authzd: %d %s, want 503 saying why", status, body)
	}
}

// TestFrontSendsNothingWithoutARoute: a call admitted to a pool the front
// has no endpoint for (v1.4 left out of --pool), and one whose pool's
// fence cannot be reached, are refusals the model reads — no-route and
// upstream-unavailable — and nothing runs.
func TestFrontSendsNothingWithoutARoute(t *testing.T) {
	s := startStack(t, nil)
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	for _, tc := range []struct {
		name, problem string
		pools         map[string]string
	}{
		{"no endpoint for the pool", "no-route", map[string]string{poolV13: s.Fixture[poolV13] + "/mcp"}},
		{"the pool's fence unreachable", "upstream-unavailable", map[string]string{poolV14: closed.URL + "/mcp", poolV13: s.Fixture[poolV13] + "/mcp"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := front.New(t.Context(), front.Config{AuthzdURL: s.URL, Credential: string(s.creds[api.RoleHost]),
				Servers: []string{"github"}, Pools: tc.pools, Auth: frontUsers, RelistInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			h, err := f.Handler()
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(h)
			t.Cleanup(func() {
				srv.Close()
				_ = f.Close()
			})
			fc := connectFront(t, srv.URL+front.MCPPath, "alice-token")
			res, err := fc.cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "get_repository",
				Arguments: map[string]any{"owner": "octo-org", "repo": "hello-world"}})
			if err != nil {
				t.Fatal(err)
			}
			if r := frontRefusal(t, res); r.Problem != tc.problem || r.Formation == "" {
				t.Fatalf("refusal %+v, want %s naming the formation", r, tc.problem)
			}
			if n := len(s.Rec.Effects(fixtures.Filter{})); n != 0 {
				t.Fatalf("%d effects", n)
			}
		})
	}
}
