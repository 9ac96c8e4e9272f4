package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/internal/fixtures"
	"github.com/fcd-authz/fcd/internal/testutil"
)

// TestProxyAdoptsTheHostsSession: a host whose MCP session began on one
// pool (a real MCP server of the Go SDK) sends a verified call to another
// pool's proxy — a call substituted to the successor — with that session's
// id. The proxy opens a session of its own with its upstream, runs the call
// there and answers with the host's id; the host's event stream (GET)
// through the proxy is the upstream session's, and the host's DELETE
// through the proxy closes the upstream session (a second DELETE finds
// none). A call with an
// unknown session and no valid token opens nothing: the fence refuses it.
func TestProxyAdoptsTheHostsSession(t *testing.T) {
	serve := func(f *fixtures.Fixture) *httptest.Server {
		mux := http.NewServeMux()
		mux.Handle("/mcp", f)
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		return srv
	}
	source := serve(fixtures.MustNew("github", "v1.4", fixtures.Config{}))
	successor := fixtures.MustNew("github", "v1.4", fixtures.Config{})
	upstream := serve(successor)
	is := newIssuer(t)
	p := startProxy(t, is, upstream.URL, "--offline")

	do := func(method, url, session, token, body string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		if session != "" {
			req.Header.Set(sessionHeader, session)
		}
		if token != "" {
			req.Header.Set(fencecheck.Header, token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	// The session begins on the source pool.
	resp, _ := do("POST", source.URL+"/mcp", "", "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"host","version":"1"}}}`)
	host := resp.Header.Get(sessionHeader)
	if host == "" {
		t.Fatal("the source issued no session")
	}
	do("POST", source.URL+"/mcp", host, "", `{"jsonrpc":"2.0","method":"notifications/initialized"}`)

	// Unverified: refused by the fence, nothing adopted.
	const args = `{"owner":"octo-org","repo":"hello-world"}`
	call := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"get_repository","arguments":` + args + `}}`
	if resp, body := do("POST", p.url+"/mcp", host, "", call); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("an unverified call: %d %s", resp.StatusCode, body)
	}

	// The verified call, substituted to the successor's pool.
	tok, _ := is.tokenAdmitted(t, "github/get_repository", args, time.Now().Add(time.Minute))
	resp, body := do("POST", p.url+"/mcp", host, tok, call)
	if resp.StatusCode != http.StatusOK || strings.Contains(body, `"error"`) || !strings.Contains(body, "hello-world") {
		t.Fatalf("the substituted call: %d %s", resp.StatusCode, body)
	}
	if got := resp.Header.Get(sessionHeader); got != "" && got != host {
		t.Fatalf("the answer names session %q, the host's is %q", got, host)
	}
	effects := successor.Recorder().Effects(fixtures.Filter{Tool: "get_repository"})
	if len(effects) != 1 || effects[0].Session == "" || effects[0].Session == host {
		t.Fatalf("the successor ran %+v, want one call in a session of its own", effects)
	}
	upstreamSession := effects[0].Session

	// The host's event stream (GET) through this pool's proxy is the
	// adopted session's; a GET naming a session the proxy never adopted
	// opens nothing.
	stream := func(session string) *http.Response {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		req, _ := http.NewRequestWithContext(ctx, "GET", p.url+"/mcp", nil)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		req.Header.Set(sessionHeader, session)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	if resp := stream(host); resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("the host's event stream through the proxy: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if resp := stream("never-adopted"); resp.StatusCode/100 == 2 {
		t.Fatalf("a stream of a session never adopted: %d", resp.StatusCode)
	}

	// Closing the host's session closes the adopted one.
	if resp, body := do("DELETE", p.url+"/mcp", host, "", ""); resp.StatusCode/100 != 2 {
		t.Fatalf("DELETE through the proxy: %d %s", resp.StatusCode, body)
	}
	if resp, _ := do("DELETE", upstream.URL+"/mcp", upstreamSession, "", ""); resp.StatusCode/100 == 2 {
		t.Fatalf("the upstream session %s stayed open", upstreamSession)
	}

	// A host that closes its session on the pool it began on never sends
	// the adopted one a DELETE: the proxy closes it once idle.
	idle := startProxy(t, is, upstream.URL, "--offline", "--adopted-idle", "200ms")
	resp, _ = do("POST", source.URL+"/mcp", "", "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"host","version":"1"}}}`)
	other := resp.Header.Get(sessionHeader)
	tok, _ = is.tokenAdmitted(t, "github/get_repository", args, time.Now().Add(time.Minute))
	if resp, body := do("POST", idle.url+"/mcp", other, tok, call); resp.StatusCode != http.StatusOK {
		t.Fatalf("the second substituted call: %d %s", resp.StatusCode, body)
	}
	effects = successor.Recorder().Effects(fixtures.Filter{Tool: "get_repository"})
	adopted := effects[len(effects)-1].Session
	testutil.Eventually(t, 10*time.Second, "the proxy to close the idle adopted session "+adopted, func() bool {
		resp, _ := do("POST", upstream.URL+"/mcp", adopted, "", `{"jsonrpc":"2.0","id":9,"method":"ping"}`)
		return resp.StatusCode/100 != 2
	})
}

// TestAdopterForgetsTheLeastRecentlyUsed: the adopter keeps at most
// maxAdopted sessions of each kind and forgets the least recently used
// (one at a time, not half); closeIdle closes upstream exactly the
// adopted sessions idle for longer than the idle time, and all of them
// for a negative one.
func TestAdopterForgetsTheLeastRecentlyUsed(t *testing.T) {
	var mu sync.Mutex
	var deleted []string
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			mu.Lock()
			deleted = append(deleted, r.Header.Get(sessionHeader))
			mu.Unlock()
		}
	}))
	defer upstream.Close()
	closed := func() []string { // and forget
		mu.Lock()
		defer mu.Unlock()
		d := slices.Sorted(slices.Values(deleted))
		deleted = nil
		return d
	}
	target, err := url.Parse(upstream.URL)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	a := newSessionAdopter(http.NotFoundHandler(), target, slog.New(slog.DiscardHandler))
	a.now = func() time.Time { return now }

	for i := range maxAdopted {
		a.noteIssued(fmt.Sprint("is-", i))
	}
	a.issued.Get("is-0") // used: is-1 is now the least recent
	a.noteIssued("is-new")
	if _, ok := a.issued.Get("is-1"); ok {
		t.Error("the least recently used issued session is still kept")
	}
	for _, id := range []string{"is-0", "is-2", "is-new"} {
		if _, ok := a.issued.Get(id); !ok {
			t.Errorf("issued session %s was forgotten", id)
		}
	}
	if n := a.issued.Len(); n != maxAdopted {
		t.Errorf("issued sessions kept: %d, want %d", n, maxAdopted)
	}

	for _, s := range []struct {
		host string
		idle time.Duration
	}{{"old", time.Hour}, {"fresh", time.Second}, {"older", 2 * time.Hour}} {
		a.adopted.Put(s.host, &adoptedSess{upstream: "up-" + s.host, path: "/mcp", version: "2025-06-18", last: now.Add(-s.idle)})
	}
	a.closeIdle(t.Context(), time.Minute)
	if got, want := closed(), []string{"up-old", "up-older"}; !slices.Equal(got, want) {
		t.Errorf("closed upstream %v, want %v", got, want)
	}
	if _, ok := a.adopted.Get("fresh"); !ok || a.adopted.Len() != 1 {
		t.Errorf("the fresh session should be the one left (%d kept)", a.adopted.Len())
	}
	a.closeIdle(t.Context(), -1)
	if got, want := closed(), []string{"up-fresh"}; !slices.Equal(got, want) || a.adopted.Len() != 0 {
		t.Errorf("closing all closed %v (%d kept), want %v", got, a.adopted.Len(), want)
	}
}
