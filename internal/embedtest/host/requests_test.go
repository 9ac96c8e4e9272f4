package host_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/host"
	"github.com/fcd-authz/fcd/internal/fixtures"
	"github.com/fcd-authz/fcd/internal/testutil"
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
		resp, err := tr.RoundTrip(post(context.Background(), t, s.serve(t, fixtures.Config{Stateless: true}), body, map[string]string{
			"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}))
		if err != nil {
			t.Fatal(err)
		}
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(answer), "hello-world") {
			t.Fatalf("the call's answer: %d %s", resp.StatusCode, answer)
		}
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

// statusTap records the answers authzd gives the transport.
type statusTap struct {
	mu       sync.Mutex
	statuses []string // "GET /v1/formations/fm_… 503"
}

func (st *statusTap) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err == nil {
		st.mu.Lock()
		st.statuses = append(st.statuses, fmt.Sprintf("%s %s %d", req.Method, req.URL.Path, resp.StatusCode))
		st.mu.Unlock()
	}
	return resp, err
}

func (st *statusTap) saw(s string) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return slices.Contains(st.statuses, s)
}

// seen returns the answers recorded so far.
func (st *statusTap) seen() []string {
	st.mu.Lock()
	defer st.mu.Unlock()
	return slices.Clone(st.statuses)
}

// TestWaitingOutlastsAStoreOutage: while a call waits for approval,
// authzd's etcd stops; reading the formation is answered 503
// store-unavailable with Retry-After, and the transport keeps waiting
// instead of failing the call. Once etcd is back and an approver
// approves, the call is sent and runs once.
func TestWaitingOutlastsAStoreOutage(t *testing.T) {
	s := startStack(t)
	// A stateless server runs a call that comes without a session.
	stateless := s.serve(t, fixtures.Config{Stateless: true})
	tp, authzdTap := &tap{}, &statusTap{}
	pending, stopped := make(chan *host.PendingError, 1), make(chan struct{})
	tr := newTransport(t, s, tp, host.Config{WaitForApproval: true, PollInterval: 20 * time.Millisecond,
		AuthzdClient: &http.Client{Transport: authzdTap},
		OnPending: func(_ context.Context, p *host.PendingError) {
			pending <- p
			<-stopped // the first read of the formation meets the outage
		}})
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_repository","arguments":{"name":"outlasted"}}}`
	type result struct {
		resp *http.Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := tr.RoundTrip(post(context.Background(), t, stateless, body, map[string]string{
			"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}))
		done <- result{resp, err}
	}()
	p := <-pending
	s.member.Stop()
	close(stopped)
	unavailable := "GET /v1/formations/" + p.Formation.ID + " 503"
	testutil.EventuallyState(t, 60*time.Second, "the formation read during the outage ("+unavailable+")", func() bool { return authzdTap.saw(unavailable) },
		authzdTap.seen)
	s.member.Restart()
	reason := "after the outage"
	testutil.Await(t, 60*time.Second, "the approval once etcd is back", func() (*client.ApproveFormationResponse, error) {
		resp, err := s.as(api.RoleApprover).ApproveFormationWithResponse(context.Background(), p.Formation.ID,
			client.ApprovalRequest{Decision: client.ApprovalRequestDecisionApprove, Digest: p.Formation.Digest, Reason: &reason})
		if err == nil && resp.JSON200 == nil {
			err = fmt.Errorf("approve answered %d without a formation", resp.StatusCode())
		}
		if pr, ok := errors.AsType[*client.Problem](err); err != nil && (!ok || pr.Slug() != "store-unavailable") {
			t.Fatalf("approve after the outage: %v", err) // not the outage's answer: no retry
		}
		return resp, err
	})
	r := <-done
	if r.err != nil {
		t.Fatalf("the waiting call: %v", r.err)
	}
	answer, _ := io.ReadAll(r.resp.Body)
	r.resp.Body.Close()
	if r.resp.StatusCode != http.StatusOK || !strings.Contains(string(answer), "outlasted") {
		t.Fatalf("the call's answer: %d %s", r.resp.StatusCode, answer)
	}
	if ids := tp.sent(); len(ids) != 1 || ids[0].Formation != p.Formation.ID {
		t.Fatalf("sent %+v, want the call with formation %s", ids, p.Formation.ID)
	}
	s.waitStatus(p.Formation.ID, "completed")
	if es := repoEffects(s.Rec, "outlasted"); len(es) != 1 {
		t.Fatalf("effects %+v, want one", es)
	}
}
