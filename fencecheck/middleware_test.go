package fencecheck_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/fencecheck/fencechecktest"
)

const backendCredential = "fcd_backend_test_credential"

// completion is one POST /v1/leases/{id}/complete as authzd received it.
type completion struct {
	Lease   string
	Outcome fencecheck.Outcome
	Detail  string
	// Claim is the body's claim; HasClaim tells whether the body had the
	// member at all (a release has none).
	Claim    string
	HasClaim bool
	Auth     string
	// Admission is what the report repeated of the token's admission.
	Admission *fencecheck.Admission
	// Failure is what the report said the backend answered.
	Failure *fencecheck.Failure
}

// claimBody is the body of POST /v1/leases/{lease}/claim (API.md).
type claimBody struct {
	Claim    string `json:"claim"`
	Epoch    string `json:"epoch"`
	Revision int64  `json:"revision"`
}

// authzdStub is a real HTTP server standing in for authzd's lease
// endpoints (API.md, "Calls"): POST /v1/leases/{lease}/complete, and
// POST /v1/leases/{lease}/claim with the contract of the real one — the
// first claim id wins, the same id again succeeds, another is answered
// 409 lease-claimed, a closed lease 409 lease-closed. The real endpoints
// live in api/ and authz/ and are tested there against etcd. It records
// what it receives, checks the bearer credential, and can be told to
// fail.
type authzdStub struct {
	*httptest.Server
	mu       sync.Mutex
	received []completion
	claims   map[string]string // lease → the claim id that won
	claimed  []claimBody       // every claim request, in order
	closed   map[string]bool
	failNext atomic.Int64                  // answer 503 to this many requests first
	status   atomic.Int64                  // answer this status (not 0) to every request
	block    atomic.Pointer[chan struct{}] // when set, requests wait for it to close
}

func newAuthzdStub(t *testing.T) *authzdStub {
	t.Helper()
	s := &authzdStub{claims: map[string]string{}, closed: map[string]bool{}}
	mux := http.NewServeMux()
	gate := func(w http.ResponseWriter, r *http.Request) bool {
		if b := s.block.Load(); b != nil {
			select {
			case <-*b:
			case <-r.Context().Done():
				return false
			}
		}
		if r.Header.Get("Authorization") != "Bearer "+backendCredential {
			problem(w, http.StatusUnauthorized, "unauthenticated")
			return false
		}
		if s.failNext.Add(-1) >= 0 {
			http.Error(w, "store unavailable", http.StatusServiceUnavailable)
			return false
		}
		if code := s.status.Load(); code != 0 {
			http.Error(w, "no", int(code))
			return false
		}
		return true
	}
	mux.HandleFunc("POST /v1/leases/{lease}/complete", func(w http.ResponseWriter, r *http.Request) {
		if !gate(w, r) {
			return
		}
		var body struct {
			Outcome   fencecheck.Outcome    `json:"outcome"`
			Detail    string                `json:"detail"`
			Claim     *string               `json:"claim"`
			Admission *fencecheck.Admission `json:"admission"`
			Failure   *fencecheck.Failure   `json:"failure"`
		}
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c := completion{Lease: r.PathValue("lease"), Outcome: body.Outcome, Detail: body.Detail,
			Auth: r.Header.Get("Authorization"), HasClaim: body.Claim != nil, Admission: body.Admission, Failure: body.Failure}
		if body.Claim != nil {
			c.Claim = *body.Claim
		}
		s.mu.Lock()
		s.received = append(s.received, c)
		if s.claims[c.Lease] == c.Claim { // authzd closes a lease only under its claim
			s.closed[c.Lease] = true
		}
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"lease":"`+c.Lease+`"}`)
	})
	mux.HandleFunc("POST /v1/leases/{lease}/claim", func(w http.ResponseWriter, r *http.Request) {
		if !gate(w, r) {
			return
		}
		var body claimBody
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&body); err != nil || body.Claim == "" || body.Epoch == "" || body.Revision <= 0 {
			problem(w, http.StatusBadRequest, "invalid-request")
			return
		}
		lease := r.PathValue("lease")
		s.mu.Lock()
		s.claimed = append(s.claimed, body)
		won, taken := s.claims[lease]
		closed := s.closed[lease]
		if !taken && !closed {
			s.claims[lease], won = body.Claim, body.Claim
		}
		s.mu.Unlock()
		switch {
		case closed:
			problem(w, http.StatusConflict, "lease-closed")
		case won == body.Claim:
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"lease":"`+lease+`","claim":"`+won+`","claimedAt":"2027-01-15T08:00:00Z"}`)
		default:
			problem(w, http.StatusConflict, "lease-claimed")
		}
	})
	s.Server = httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

// problem answers an RFC 9457 problem of authzd's kind (docs/problems.md).
func problem(w http.ResponseWriter, status int, slug string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, `{"type":"https://github.com/fcd-authz/fcd/blob/main/docs/problems.md#`+slug+
		`","title":"`+slug+`","status":`+strconv.Itoa(status)+`}`)
}

// claimOf returns the claim id that won lease's claim, if any.
func (s *authzdStub) claimOf(lease string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.claims[lease]
}

// claimRequests returns every claim request received.
func (s *authzdStub) claimRequests() []claimBody {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]claimBody(nil), s.claimed...)
}

func (s *authzdStub) completions() []completion {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]completion(nil), s.received...)
}

// mcpBackend is an MCP server behind the middleware, served by a real
// HTTP server, with the reporter it posts outcomes through.
type mcpBackend struct {
	url      string
	calls    atomic.Int64 // tools/call requests the handler ran
	requests atomic.Int64 // every request the handler ran
	reporter *fencecheck.Reporter
	authzd   *authzdStub
	key      *fencechecktest.Key
	lastBody atomic.Pointer[[]byte]
	claims   atomic.Pointer[fencecheck.Claims]
}

// behaviour makes the handler do something for the tool it is called with.
var behaviour = map[string]func(w http.ResponseWriter, r *http.Request){
	"create_repository": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"created"}]}}`)
	},
	"explode": func(w http.ResponseWriter, r *http.Request) { panic("backend bug") },
	// A reverse proxy relaying an answer to a client that went away.
	"relay-aborted-after-answer": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",")
		_, _ = io.WriteString(w, "\"id\":1,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"created\"}]}}\n\n")
		panic(http.ErrAbortHandler)
	},
	// Aborted before any answer: the outcome is unknown.
	"relay-aborted-before-answer": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, ": keep-alive\n\n")
		panic(http.ErrAbortHandler)
	},
	// Tool output that quotes an answer-like text must not count.
	"relay-aborted-quoting": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"text\":\"{\\\"id\\\":1,\\\"result\\\":{}}\"}}\n\n")
		panic(http.ErrAbortHandler)
	},
	"hang": func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
		// Success after the timeout: too late, the call stays uncertain.
		w.WriteHeader(http.StatusOK)
	},
	"decline": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(fencecheck.OutcomeHeader, "rejected")
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"isError":true,"content":[]}}`)
	},
	"fail": func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "database down", http.StatusInternalServerError)
	},
}

// backendConfig says how a test backend runs.
type backendConfig struct {
	opts fencecheck.MiddlewareConfig
	// online gives the verifier a Claimer: a real LeaseClient of authzd.
	// Otherwise the verifier is offline, its process started a minute
	// ago.
	online bool
	// authzd and key are shared by the instances of one pool; nil makes
	// the backend its own.
	authzd *authzdStub
	key    *fencechecktest.Key
	// call, if set, answers every tools/call; else the behaviour of the
	// tool's name.
	call http.HandlerFunc
}

func newMCPBackend(t *testing.T, opts fencecheck.MiddlewareConfig) *mcpBackend {
	t.Helper()
	return newBackend(t, backendConfig{opts: opts})
}

func newBackend(t *testing.T, cfg backendConfig) *mcpBackend {
	t.Helper()
	b := &mcpBackend{authzd: cfg.authzd, key: cfg.key}
	if b.authzd == nil {
		b.authzd = newAuthzdStub(t)
	}
	if b.key == nil {
		b.key = fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1")
	}
	rep, err := fencecheck.NewReporter(fencecheck.ReporterConfig{
		AuthzdURL: b.authzd.URL, Credential: backendCredential, Backoff: time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	b.reporter = rep
	t.Cleanup(func() { _ = rep.Close(context.Background()) })
	v := newVerifier(fencechecktest.Keys(b.key))
	v.Now = time.Now // tokens below are issued at the real now
	v.Started = time.Now().Add(-time.Minute)
	if cfg.online {
		v.Claimer = newLeaseClient(t, b.authzd.URL, fencecheck.LeaseClientConfig{})
	}

	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.requests.Add(1)
		body, _ := io.ReadAll(r.Body)
		b.lastBody.Store(&body)
		var msg struct {
			Method string `json:"method"`
			Params struct {
				Name string `json:"name"`
			} `json:"params"`
		}
		_ = json.Unmarshal(body, &msg)
		if msg.Method != "tools/call" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
			return
		}
		b.calls.Add(1)
		if c, ok := fencecheck.ClaimsFromContext(r.Context()); ok {
			b.claims.Store(c)
		}
		if cfg.call != nil {
			r.Body = io.NopCloser(bytes.NewReader(body))
			cfg.call(w, r)
			return
		}
		behaviour[msg.Params.Name](w, r)
	})
	opts := cfg.opts
	opts.Server = "github"
	opts.Reporter = rep
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := httptest.NewUnstartedServer(v.Middleware(handler, opts))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the panic tests' stack traces
	srv.Start()
	t.Cleanup(srv.Close)
	b.url = srv.URL
	return b
}

// token is a token for a call of github/<tool> with args, issued and
// admitted now.
func (b *mcpBackend) token(t *testing.T, tool, args string) (string, fencecheck.Claims) {
	t.Helper()
	c := claimsFor(t, "github/"+tool, args)
	now := time.Now()
	c.IssuedAt, c.NotBefore, c.Expiry = now.Unix(), now.Unix(), now.Unix()+30
	c.Admitted = now.UnixMilli()
	return b.key.Issue(c), c
}

// drained closes the reporter and returns what authzd received.
func (b *mcpBackend) drained(t *testing.T) []completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.reporter.Close(ctx); err != nil {
		t.Fatal(err)
	}
	return b.authzd.completions()
}

func toolsCall(tool, args string) string {
	return `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"` + tool + `","arguments":` + args + `}}`
}

// rpcResult is an HTTP answer with its JSON-RPC error, if any.
type rpcResult struct {
	status int
	header http.Header
	body   []byte
	err    struct {
		ID    json.RawMessage `json:"id"`
		Error *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Data    struct {
				Reason     fencecheck.Reason `json:"reason"`
				Type       string            `json:"type"`
				RetryAfter int               `json:"retryAfter"`
			} `json:"data"`
		} `json:"error"`
	}
}

func do(t *testing.T, method, url, body, token string) (*rpcResult, error) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set(fencecheck.Header, token)
	}
	return doRequest(req)
}

// doRequest sends req and reads the answer and its JSON-RPC error.
func doRequest(req *http.Request) (*rpcResult, error) {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	res := &rpcResult{status: resp.StatusCode, header: resp.Header}
	res.body, err = io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	_ = json.Unmarshal(res.body, &res.err)
	return res, nil
}

func mustDo(t *testing.T, method, url, body, token string) *rpcResult {
	t.Helper()
	res, err := do(t, method, url, body, token)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// wantRefused checks an HTTP 403 with a JSON-RPC error of reason.
func wantRefused(t *testing.T, res *rpcResult, reason fencecheck.Reason) {
	t.Helper()
	if res.status != http.StatusForbidden {
		t.Fatalf("status = %d (%s), want 403", res.status, res.body)
	}
	if ct := res.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type = %q", ct)
	}
	e := res.err.Error
	if e == nil || e.Code != fencecheck.ErrorCodeRejected || e.Data.Reason != reason {
		t.Fatalf("body = %s, want code %d reason %s", res.body, fencecheck.ErrorCodeRejected, reason)
	}
	if got := res.header.Get(fencecheck.ProblemHeader); got != string(reason) || e.Data.Type != fencecheck.ProblemBase+string(reason) {
		t.Fatalf("%s %q, data.type %q, want the reason %s", fencecheck.ProblemHeader, got, e.Data.Type, reason)
	}
	transient := reason == fencecheck.ReasonKeySource || reason == fencecheck.ReasonReplayStore || reason == fencecheck.ReasonClaimUnavailable
	if ra := res.header.Get("Retry-After"); transient != (ra == "1" && e.Data.RetryAfter == 1) || (!transient && (ra != "" || e.Data.RetryAfter != 0)) {
		t.Fatalf("reason %s: Retry-After %q, data.retryAfter %d", reason, ra, e.Data.RetryAfter)
	}
}

func TestMiddlewareToolsCall(t *testing.T) {
	args := `{"name":"payroll-exports","private":true}`

	t.Run("no token: 403 before the handler", func(t *testing.T) {
		b := newMCPBackend(t, fencecheck.MiddlewareConfig{})
		res := mustDo(t, "POST", b.url, toolsCall("create_repository", args), "")
		wantRefused(t, res, fencecheck.ReasonMissing)
		if string(res.err.ID) != "1" {
			t.Fatalf("id = %s, want the request's id 1", res.err.ID)
		}
		if n := b.requests.Load(); n != 0 {
			t.Fatalf("handler ran %d times", n)
		}
		if got := b.drained(t); len(got) != 0 {
			t.Fatalf("reported %+v for a refused call", got)
		}
	})

	t.Run("valid token: handler once, effect reported, replay refused", func(t *testing.T) {
		b := newMCPBackend(t, fencecheck.MiddlewareConfig{})
		tok, claims := b.token(t, "create_repository", args)
		body := toolsCall("create_repository", "{\n  \"private\": true, \"name\": \"payroll-exports\"}")
		res := mustDo(t, "POST", b.url, body, tok)
		if res.status != http.StatusOK || !bytes.Contains(res.body, []byte("created")) {
			t.Fatalf("status %d body %s", res.status, res.body)
		}
		if got := string(*b.lastBody.Load()); got != body {
			t.Fatalf("handler read body %q, want the request's", got)
		}
		if c := b.claims.Load(); c == nil || c.ID != claims.ID {
			t.Fatalf("claims in context = %+v", c)
		}
		// The same token again.
		wantRefused(t, mustDo(t, "POST", b.url, body, tok), fencecheck.ReasonReplay)
		if n := b.calls.Load(); n != 1 {
			t.Fatalf("handler ran %d calls, want 1", n)
		}
		got := b.drained(t)
		want := completion{Lease: claims.ID, Outcome: fencecheck.OutcomeEffect, Auth: "Bearer " + backendCredential}
		if len(got) != 1 || got[0].Lease != want.Lease || got[0].Outcome != want.Outcome || got[0].Auth != want.Auth {
			t.Fatalf("authzd received %+v, want one %+v", got, want)
		}
		// The report repeats the token's admission, for authzd's no-read
		// path.
		wantFacts := fencecheck.Admission{Epoch: claims.Epoch, Revision: claims.Revision, Formation: claims.Formation,
			Session: claims.Subject, Tool: claims.Tool}
		if got[0].Admission == nil || *got[0].Admission != wantFacts || wantFacts.Epoch == "" || wantFacts.Revision == 0 {
			t.Fatalf("report's admission facts %+v, want %+v", got[0].Admission, wantFacts)
		}
	})

	t.Run("offline: refused tokens are not reported", func(t *testing.T) {
		// Offline there is no claim to tell a release from a call
		// running elsewhere: nothing is released (online:
		// TestMiddlewareReleasesRefusedCalls).
		b := newMCPBackend(t, fencecheck.MiddlewareConfig{})
		tok, _ := b.token(t, "create_repository", args)
		wantRefused(t, mustDo(t, "POST", b.url, toolsCall("create_repository", `{"name":"payroll-exports","private":false}`), tok),
			fencecheck.ReasonArguments)
		forged := tok[:len(tok)-4] + "AAAA"
		wantRefused(t, mustDo(t, "POST", b.url, toolsCall("create_repository", args), forged), fencecheck.ReasonSignature)
		wantRefused(t, mustDo(t, "POST", b.url, toolsCall("delete_repository", args), tok), fencecheck.ReasonTool)
		req, _ := http.NewRequest("POST", b.url, strings.NewReader(toolsCall("create_repository", args)))
		req.Header.Add(fencecheck.Header, tok)
		req.Header.Add(fencecheck.Header, tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("two token headers: status %d", resp.StatusCode)
		}
		if n := b.requests.Load(); n != 0 {
			t.Fatalf("handler ran %d times", n)
		}
		if got := b.drained(t); len(got) != 0 {
			t.Fatalf("reported %+v", got)
		}
	})

	outcomes := []struct {
		note    string
		tool    string
		opts    fencecheck.MiddlewareConfig
		want    fencecheck.Outcome
		status  int // 0: the connection breaks; -1: either (a flushed answer may arrive)
		checkFn func(t *testing.T, res *rpcResult)
	}{
		{note: "handler panics", tool: "explode", want: fencecheck.OutcomeUncertain},
		{note: "relay aborted after the answer", tool: "relay-aborted-after-answer", want: fencecheck.OutcomeEffect, status: -1},
		{note: "relay aborted before the answer", tool: "relay-aborted-before-answer", want: fencecheck.OutcomeUncertain, status: -1},
		{note: "relay aborted, answer only quoted", tool: "relay-aborted-quoting", want: fencecheck.OutcomeUncertain, status: -1},
		{note: "handler exceeds the timeout", tool: "hang", want: fencecheck.OutcomeUncertain, status: http.StatusOK,
			opts: fencecheck.MiddlewareConfig{Timeout: 50 * time.Millisecond}},
		{note: "handler answers 500", tool: "fail", want: fencecheck.OutcomeUncertain, status: http.StatusInternalServerError},
		{note: "handler declares rejected", tool: "decline", want: fencecheck.OutcomeRejected, status: http.StatusOK,
			checkFn: func(t *testing.T, res *rpcResult) {
				if v := res.header.Get(fencecheck.OutcomeHeader); v != "" {
					t.Fatalf("%s leaked to the client: %q", fencecheck.OutcomeHeader, v)
				}
			}},
	}
	for _, tc := range outcomes {
		t.Run(tc.note, func(t *testing.T) {
			b := newMCPBackend(t, tc.opts)
			tok, claims := b.token(t, tc.tool, args)
			start := time.Now()
			res, err := do(t, "POST", b.url, toolsCall(tc.tool, args), tok)
			switch {
			case tc.status == -1:
			case tc.status == 0 && err == nil:
				t.Fatalf("status %d, want a broken connection", res.status)
			case tc.status != 0 && err != nil:
				t.Fatal(err)
			case tc.status != 0 && res.status != tc.status:
				t.Fatalf("status = %d, want %d", res.status, tc.status)
			}
			if tc.opts.Timeout > 0 && time.Since(start) > 5*time.Second {
				t.Fatal("the handler's context was not cancelled at the timeout")
			}
			if tc.checkFn != nil {
				tc.checkFn(t, res)
			}
			got := b.drained(t)
			if len(got) != 1 || got[0].Lease != claims.ID || got[0].Outcome != tc.want {
				t.Fatalf("authzd received %+v, want one %s for %s", got, tc.want, claims.ID)
			}
		})
	}
}

func TestMiddlewareOtherTraffic(t *testing.T) {
	b := newMCPBackend(t, fencecheck.MiddlewareConfig{MaxBodyBytes: 4096})
	pass := []struct{ method, body string }{
		{"POST", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`},
		{"POST", `{"jsonrpc":"2.0","method":"notifications/initialized"}`},
		{"POST", `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`},
		{"POST", `{"jsonrpc":"2.0","id":7,"result":{"action":"accept"}}`}, // a response to the server
		{"POST", `[{"jsonrpc":"2.0","id":3,"method":"tools/list"},{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}]`},
		{"GET", ""},
		{"DELETE", ""},
	}
	for _, p := range pass {
		before := b.requests.Load()
		res := mustDo(t, p.method, b.url, p.body, "")
		if res.status != http.StatusOK || b.requests.Load() != before+1 {
			t.Fatalf("%s %s: status %d, handler ran %d", p.method, p.body, res.status, b.requests.Load()-before)
		}
	}

	refused := []struct {
		note   string
		body   string
		status int
		reason fencecheck.Reason
	}{
		{"batch holding a tools/call", `[{"jsonrpc":"2.0","id":3,"method":"tools/list"},` + toolsCall("create_repository", "{}") + `]`,
			http.StatusForbidden, fencecheck.ReasonBatch},
		{"method in another case", `{"jsonrpc":"2.0","id":1,"Method":"tools/call","params":{"name":"create_repository"}}`,
			http.StatusForbidden, fencecheck.ReasonMemberCase},
		{"method value in another case", `{"jsonrpc":"2.0","id":1,"method":"Tools/Call","params":{"name":"create_repository"}}`,
			http.StatusForbidden, fencecheck.ReasonMemberCase},
		{"two methods differing in case", `{"jsonrpc":"2.0","id":1,"method":"tools/list","METHOD":"tools/call"}`,
			http.StatusForbidden, fencecheck.ReasonMemberCase},
		{"duplicate method", `{"jsonrpc":"2.0","id":1,"method":"tools/call","method":"tools/list"}`,
			http.StatusForbidden, fencecheck.ReasonDuplicateMember},
		{"duplicate tool name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","Name":"b"}}`,
			http.StatusForbidden, fencecheck.ReasonMemberCase},
		{"not JSON", `{"jsonrpc":"2.0", method: "tools/call"}`, http.StatusBadRequest, fencecheck.ReasonParse},
		{"not an object", `"tools/call"`, http.StatusBadRequest, fencecheck.ReasonInvalidRequest},
		{"too large", `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"pad":"` + strings.Repeat("x", 5000) + `"}}`,
			http.StatusRequestEntityTooLarge, ""},
	}
	before := b.requests.Load()
	for _, r := range refused {
		t.Run(r.note, func(t *testing.T) {
			res := mustDo(t, "POST", b.url, r.body, "")
			if r.status == http.StatusForbidden {
				wantRefused(t, res, r.reason)
				return
			}
			if res.status != r.status || res.err.Error == nil ||
				(r.reason != "" && !strings.Contains(string(res.body), `"reason":"`+string(r.reason)+`"`)) {
				t.Fatalf("status = %d body %s, want %d with a JSON-RPC error", res.status, res.body, r.status)
			}
		})
	}
	if n := b.requests.Load() - before; n != 0 {
		t.Fatalf("handler ran %d times for refused bodies", n)
	}

	// A chunked body (no Content-Length) over the limit is cut off too.
	pr, pw := io.Pipe()
	go func() {
		_, _ = pw.Write([]byte(`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"pad":"`))
		_, _ = pw.Write(bytes.Repeat([]byte("x"), 8192))
		_ = pw.CloseWithError(io.ErrUnexpectedEOF)
	}()
	req, _ := http.NewRequest("POST", b.url, pr)
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("chunked oversized body: status %d", resp.StatusCode)
		}
	}
	if n := b.requests.Load() - before; n != 0 {
		t.Fatalf("handler ran %d times for refused bodies", n)
	}
	if got := b.drained(t); len(got) != 0 {
		t.Fatalf("reported %+v", got)
	}
}

// TestMiddlewareAgreesWithMCPHeaders: a server may dispatch on the
// Mcp-Method and Mcp-Name headers instead of the body, or accept JSON-RPC
// with another HTTP method; none of these carries a call past the guard.
func TestMiddlewareAgreesWithMCPHeaders(t *testing.T) {
	b := newMCPBackend(t, fencecheck.MiddlewareConfig{})
	tok, _ := b.token(t, "create_repository", `{"name":"demo"}`)
	call := toolsCall("create_repository", `{"name":"demo"}`)
	cases := []struct {
		note    string
		method  string
		body    string
		headers map[string]string
		status  int
		reason  fencecheck.Reason
	}{
		{note: "PUT with a tools/call body", method: "PUT", body: call, status: 403, reason: fencecheck.ReasonMissing},
		{note: "header says tools/call, body says tools/list", method: "POST", body: `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`,
			headers: map[string]string{"Mcp-Method": "tools/call", "Mcp-Name": "create_repository"}, status: 403, reason: fencecheck.ReasonHeaders},
		{note: "header says tools/call, no body", method: "GET",
			headers: map[string]string{"Mcp-Method": "tools/call"}, status: 403, reason: fencecheck.ReasonHeaders},
		{note: "Mcp-Name names another tool", method: "POST", body: call,
			headers: map[string]string{"Mcp-Method": "tools/call", "Mcp-Name": "delete_repository", fencecheck.Header: tok}, status: 403, reason: fencecheck.ReasonHeaders},
		{note: "Mcp-Method in another case", method: "POST", body: call,
			headers: map[string]string{"Mcp-Method": "TOOLS/CALL", fencecheck.Header: tok}, status: 403, reason: fencecheck.ReasonHeaders},
		{note: "headers agree", method: "POST", body: call,
			headers: map[string]string{"Mcp-Method": "tools/call", "Mcp-Name": "create_repository", fencecheck.Header: tok}, status: 200},
	}
	for _, tc := range cases {
		t.Run(tc.note, func(t *testing.T) {
			before := b.calls.Load()
			req, _ := http.NewRequest(tc.method, b.url, strings.NewReader(tc.body))
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, body, tc.status)
			}
			if tc.reason != "" && !bytes.Contains(body, []byte(`"reason":"`+string(tc.reason)+`"`)) {
				t.Fatalf("body %s, want reason %s", body, tc.reason)
			}
			if ran := b.calls.Load() - before; (tc.status == 200) != (ran == 1) {
				t.Fatalf("handler ran %d calls", ran)
			}
		})
	}
}

// TestMiddlewareIssue10Attack: the attack of issue 10 through the
// in-process middleware. A genuine token for {"visibility":"private"}
// comes with a body that a case-insensitive reader takes for those
// arguments while the MCP SDKs read other ones (or none, running the
// tool's defaults). Each is refused 403 with its reason before the
// handler runs, and does not spend the token: the call as formed still
// runs once, with the arguments that were verified.
func TestMiddlewareIssue10Attack(t *testing.T) {
	const args = `{"visibility":"private"}`
	var ran atomic.Pointer[string]
	b := newBackend(t, backendConfig{call: func(w http.ResponseWriter, r *http.Request) {
		// The backend decodes the way the MCP Go SDK does: exact names.
		var msg struct {
			Params struct {
				Arguments json.RawMessage `json:"arguments"`
			} `json:"params"`
		}
		body, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(body, &msg)
		got := string(msg.Params.Arguments)
		ran.Store(&got)
		answerJSON(200, `{"jsonrpc":"2.0","id":1,"result":{"content":[]}}`)(w, r)
	}})
	tok, claims := b.token(t, "create_repository", args)
	params := func(p string) string {
		return `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_repository",` + p + `}}`
	}
	cases := []struct {
		note, body string
		reason     fencecheck.Reason
	}{
		{"Arguments", params(`"Arguments":` + args), fencecheck.ReasonMemberCase},
		{"ARGUMENTS", params(`"ARGUMENTS":` + args), fencecheck.ReasonMemberCase},
		{"argumentſ (U+017F)", params(`"argumentſ":` + args), fencecheck.ReasonMemberCase},
		{"argument\\u017f escaped", params(`"argument\u017f":` + args), fencecheck.ReasonMemberCase},
		{"ARGUMENTS beside arguments", params(`"arguments":` + args + `,"ARGUMENTS":{"visibility":"public"}`), fencecheck.ReasonMemberCase},
		{"arguments twice, the last empty", params(`"arguments":` + args + `,"arguments":{}`), fencecheck.ReasonDuplicateMember},
		{"arguments twice, the first empty", params(`"arguments":{},"arguments":` + args), fencecheck.ReasonDuplicateMember},
		{"visibility and viſibility", params(`"arguments":{"visibility":"private","viſibility":"public"}`), fencecheck.ReasonNameCollision},
		{"Name", params(`"Name":"delete_repository","arguments":` + args), fencecheck.ReasonMemberCase},
		{"method Tools/call", `{"jsonrpc":"2.0","id":1,"method":"Tools/call","params":{"name":"create_repository","arguments":` + args + `}}`,
			fencecheck.ReasonMemberCase},
		{"lone surrogate in an argument", params(`"arguments":{"visibility":"private\ud800"}`), fencecheck.ReasonEncoding},
	}
	for _, tc := range cases {
		t.Run(tc.note, func(t *testing.T) {
			wantRefused(t, mustDo(t, "POST", b.url, tc.body, tok), tc.reason)
			if n := b.requests.Load(); n != 0 {
				t.Fatalf("handler ran %d times", n)
			}
		})
	}
	res := mustDo(t, "POST", b.url, params(`"arguments":`+args), tok)
	if res.status != http.StatusOK {
		t.Fatalf("the call as formed: %d %s", res.status, res.body)
	}
	if got := ran.Load(); got == nil || *got != args {
		t.Fatalf("the handler ran with arguments %q, want %s", deref(got), args)
	}
	got := b.drained(t)
	if len(got) != 1 || got[0].Lease != claims.ID || got[0].Outcome != fencecheck.OutcomeEffect {
		t.Fatalf("authzd received %+v, want one effect (and no release: offline)", got)
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
