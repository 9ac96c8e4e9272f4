package host_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/host"
)

// newTransport returns a host transport on the stack sending through tp.
func newTransport(t *testing.T, s *stack, tp *tap, cfg host.Config) *host.Transport {
	t.Helper()
	cfg.AuthzdURL, cfg.Credential, cfg.Servers, cfg.Server, cfg.Base = s.URL, host.Credential(s.creds[api.RoleHost]), []string{"github"}, "github", tp
	cfg.Principal = host.Principal{ID: user}
	tr, err := host.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func post(ctx context.Context, t *testing.T, url, body string, header map[string]string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	return req
}

// TestRequestsOtherThanOneCall: every request but a single tools/call
// leaves untouched (no formation, the body as it was); a batch holding a
// call is refused before anything is sent.
func TestRequestsOtherThanOneCall(t *testing.T) {
	s := startStack(t)
	tp := &tap{}
	tr := newTransport(t, s, tp, host.Config{})
	call := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_repository","arguments":` + helloWorld + `}}`
	for _, c := range []struct {
		name, method, body string
		err                error
	}{
		{name: "initialize", method: "POST", body: `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"0"}}}`},
		{name: "a notification", method: "POST", body: `{"jsonrpc":"2.0","method":"notifications/initialized"}`},
		{name: "tools/list", method: "POST", body: `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`},
		{name: "a response", method: "POST", body: `{"jsonrpc":"2.0","id":7,"result":{}}`},
		{name: "not JSON", method: "POST", body: `tools/call`},
		{name: "a batch without a call", method: "POST", body: `[{"jsonrpc":"2.0","id":3,"method":"ping"}]`},
		{name: "the event stream", method: "GET"},
		{name: "closing the session", method: "DELETE"},
		{name: "a batch with a call", method: "POST", body: `[{"jsonrpc":"2.0","id":3,"method":"ping"},` + call + `]`, err: host.ErrBatchedCall},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := len(tp.sent())
			var body io.Reader
			if c.body != "" {
				body = strings.NewReader(c.body)
			}
			req, err := http.NewRequest(c.method, s.MCP, body)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Mcp-Session-Id", "sess-1")
			resp, err := tr.RoundTrip(req)
			if c.err != nil {
				if !errors.Is(err, c.err) || len(tp.sent()) != before {
					t.Fatalf("RoundTrip: %v, %d requests sent; want %v and none sent", err, len(tp.sent())-before, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			got := tp.sent()
			if len(got) != before+1 {
				t.Fatalf("%d requests sent, want one", len(got)-before)
			}
			if r := got[len(got)-1]; r.Formation != "" || r.McpMethod != "" || r.HTTPMethod != c.method || r.Session != "sess-1" {
				t.Fatalf("sent %+v, want it untouched", r)
			}
		})
	}
	t.Run("the body of a call is sent byte for byte", func(t *testing.T) {
		// Member order and spacing the fence compares against what was
		// formed.
		body := `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"arguments":{"repo":"hello-world", "owner":"octo-org"},"name":"get_repository"}}`
		var seen []byte
		tr := newTransport(t, s, tp, host.Config{})
		tp.inspect = func(b []byte) { seen = b }
		defer func() { tp.inspect = nil }()
		resp, err := tr.RoundTrip(post(context.Background(), t, s.MCP, body, map[string]string{
			"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if !bytes.Equal(seen, []byte(body)) {
			t.Fatalf("sent %s, want %s", seen, body)
		}
	})
}

// TestWaitingEndsWithTheContext: a call waiting for approval ends when its
// context does, and nothing is sent; a request without Mcp-Session-Id (a
// stateless server) is formed in Config.Session.
func TestWaitingEndsWithTheContext(t *testing.T) {
	s := startStack(t)
	tp := &tap{}
	ctx, cancel := context.WithCancelCause(context.Background())
	stop := errors.New("the user gave up")
	var formation string
	tr := newTransport(t, s, tp, host.Config{WaitForApproval: true, Session: "host-stateless",
		OnPending: func(_ context.Context, p *host.PendingError) { formation = p.Formation.ID; cancel(stop) }})
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_repository","arguments":{"name":"never"}}}`
	_, err := tr.RoundTrip(post(ctx, t, s.MCP, body, nil))
	if !errors.Is(err, stop) || !strings.Contains(err.Error(), formation) || formation == "" {
		t.Fatalf("RoundTrip: %v, want the context's cause naming formation %q", err, formation)
	}
	if n := len(tp.sent()); n != 0 {
		t.Fatalf("%d requests sent", n)
	}
	if f := s.formation(formation); f.Session != "host-stateless" || f.Status != client.FormationStatusPendingApproval {
		t.Fatalf("the formation: %+v", f)
	}
}

// TestConfigIsChecked: New explains a bad configuration, and a snapshot
// authzd cannot take.
func TestConfigIsChecked(t *testing.T) {
	s := startStack(t)
	cred := host.Credential(s.creds[api.RoleHost])
	for _, c := range []struct {
		name string
		cfg  host.Config
		want string
	}{
		{"no URL", host.Config{Credential: cred}, `AuthzdURL "" is not an http(s) URL`},
		{"no credential", host.Config{AuthzdURL: s.URL}, "Credential is empty"},
		{"an unknown server", host.Config{AuthzdURL: s.URL, Credential: cred, Servers: []string{"gitlab"}}, "take a snapshot of gitlab: authzd answered 409 no-active-epochs"},
		{"an unknown snapshot", host.Config{AuthzdURL: s.URL, Credential: cred, Snapshot: "sha256:00"}, "read snapshot sha256:00: authzd answered 404 snapshot-not-found"},
		{"a wrong credential", host.Config{AuthzdURL: s.URL, Credential: "nope"}, "authzd answered 401 unauthenticated"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := host.New(context.Background(), c.cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New: %v, want %q", err, c.want)
			}
		})
	}
}

// TestCredentialIsNeverPrinted: a Config printed or logged whole does not
// show the credential.
func TestCredentialIsNeverPrinted(t *testing.T) {
	cfg := host.Config{AuthzdURL: "http://authzd", Credential: "s3cret-host-credential"}
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("config", "cfg", cfg, "credential", cfg.Credential)
	for _, out := range []string{fmt.Sprint(cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg), fmt.Sprint(cfg.Credential), logged.String()} {
		if strings.Contains(out, "s3cret") || !strings.Contains(out, "[redacted]") {
			t.Errorf("printed %s", out)
		}
	}
}
