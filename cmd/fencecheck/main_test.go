package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/fencecheck/fencechecktest"
	"github.com/fcd-authz/fcd/internal/cmdtest"
	"github.com/fcd-authz/fcd/internal/testutil"
)

// issuer stands in for authzd's token signing: an Ed25519 key and the
// JWKS of its public half.
type issuer struct {
	key  *fencechecktest.Key
	jwks []byte
}

func newIssuer(t *testing.T) *issuer {
	t.Helper()
	key := fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1")
	return &issuer{key: key, jwks: fencechecktest.JWKS(key)}
}

var jti atomic.Int64

// token signs a dispatch token for a call of tool with args, as authzd
// would for the backend the tests guard, for a lease admitted now.
func (is *issuer) token(t *testing.T, tool, args string) (string, string) {
	t.Helper()
	return is.tokenAdmitted(t, tool, args, time.Now())
}

// tokenAdmitted is token for a lease admitted at admitted.
func (is *issuer) tokenAdmitted(t *testing.T, tool, args string, admitted time.Time) (string, string) {
	t.Helper()
	id := "lease-" + strconv.FormatInt(jti.Add(1), 10)
	return is.sign(t, id, tool, args, admitted), id
}

func (is *issuer) sign(t *testing.T, id, tool, args string, admitted time.Time) string {
	t.Helper()
	digest, err := fencecheck.ArgumentDigest(tool, json.RawMessage(args))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().Unix()
	return is.key.Issue(fencecheck.Claims{
		Issuer: "https://authzd.test", Audience: "github-prod", Subject: "s-1", ID: id,
		IssuedAt: now, NotBefore: now, Expiry: now + 30,
		Formation: "f-1", Tool: tool, ArgumentDigest: digest, Epoch: "sha256:e1",
		Artifact: "sha256:a1", Config: "sha256:c1", Generation: 4, Revision: 9, Cluster: "c1",
		Admitted: admitted.UnixMilli(),
	})
}

var listening = regexp.MustCompile(`fencecheck: listening on (http://\S+)`)

// authzdStandIn stands in for authzd's lease endpoints as fencecheck uses
// them, following their contract (api/ and docs/): POST
// /v1/leases/{lease}/claim {"claim","epoch","revision"} claims an admitted
// lease once (the same claim id again is 200; another is 409
// lease-claimed; a closed lease is 409 lease-closed), and POST
// /v1/leases/{lease}/complete {"outcome","detail","claim"} closes it: a
// claimed lease only under its claim, an unclaimed one only with outcome
// rejected (a release). The real endpoints are tested in api/ and, with
// this command as a process, in internal/e2e.
type authzdStandIn struct {
	srv *httptest.Server
	// failClaims makes every claim answer 500.
	failClaims atomic.Bool

	mu     sync.Mutex
	claims map[string]string // lease → claim id
	closed map[string]bool
	log    []string // "claim LEASE", "complete LEASE OUTCOME claimed|unclaimed"
}

func newAuthzdStandIn(t *testing.T) *authzdStandIn {
	t.Helper()
	a := &authzdStandIn{claims: map[string]string{}, closed: map[string]bool{}}
	problem := func(w http.ResponseWriter, status int, slug string) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]any{"type": "https://github.com/fcd-authz/fcd/blob/main/docs/problems.md#" + slug, "status": status})
	}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer backend-secret" {
			problem(w, http.StatusUnauthorized, "unauthenticated")
			return
		}
		rest, ok := strings.CutPrefix(r.URL.Path, "/v1/leases/")
		lease, action, _ := strings.Cut(rest, "/")
		if !ok || r.Method != http.MethodPost {
			problem(w, http.StatusNotFound, "not-found")
			return
		}
		var body struct {
			Claim    string `json:"claim"`
			Epoch    string `json:"epoch"`
			Revision int64  `json:"revision"`
			Outcome  string `json:"outcome"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			problem(w, http.StatusBadRequest, "malformed-json")
			return
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		switch action {
		case "claim":
			a.log = append(a.log, "claim "+lease)
			switch {
			case a.failClaims.Load():
				problem(w, http.StatusInternalServerError, "internal")
			case body.Claim == "" || body.Epoch != "sha256:e1" || body.Revision != 9:
				problem(w, http.StatusBadRequest, "invalid-request")
			case a.closed[lease]:
				problem(w, http.StatusConflict, "lease-closed")
			case a.claims[lease] != "" && a.claims[lease] != body.Claim:
				problem(w, http.StatusConflict, "lease-claimed")
			default:
				a.claims[lease] = body.Claim
				_ = json.NewEncoder(w).Encode(map[string]string{"lease": lease, "claim": body.Claim})
			}
		case "complete":
			claimed := a.claims[lease] != ""
			switch {
			case a.closed[lease]:
				problem(w, http.StatusConflict, "lease-closed")
			case claimed && body.Claim != a.claims[lease]:
				problem(w, http.StatusConflict, "lease-claimed")
			case !claimed && (body.Claim != "" || body.Outcome != "rejected"):
				problem(w, http.StatusConflict, "lease-not-claimed")
			default:
				a.closed[lease] = true
				state := "unclaimed"
				if claimed {
					state = "claimed"
				}
				a.log = append(a.log, "complete "+lease+" "+body.Outcome+" "+state)
				_ = json.NewEncoder(w).Encode(map[string]string{"lease": lease})
			}
		default:
			problem(w, http.StatusNotFound, "not-found")
		}
	}))
	t.Cleanup(a.srv.Close)
	return a
}

// claim takes a lease for another call, as another instance would.
func (a *authzdStandIn) claim(lease, claim string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.claims[lease] = claim
}

func (a *authzdStandIn) events() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.log...)
}

// backendStandIn is an MCP backend that counts the tools/call requests it
// runs and answers each by the call's arguments.name: "fails" a result
// with isError, "errs" a JSON-RPC error, "gone" 404 without an answer (an
// unknown session), anything else a result.
type backendStandIn struct {
	srv   *httptest.Server
	calls atomic.Int64
}

func newBackend(t *testing.T) *backendStandIn {
	t.Helper()
	b := &backendStandIn{}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				Arguments struct {
					Name string `json:"name"`
				} `json:"arguments"`
			} `json:"params"`
		}
		_ = json.Unmarshal(body, &msg)
		if msg.Method == "tools/call" {
			b.calls.Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		switch msg.Params.Arguments.Name {
		case "gone":
			http.Error(w, "session not found", http.StatusNotFound)
		case "errs":
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":-32602,"message":"invalid params"}}`, msg.ID)
		case "fails":
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"content":[],"isError":true}}`, msg.ID)
		default:
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"ok":true}}`, msg.ID)
		}
	}))
	t.Cleanup(b.srv.Close)
	return b
}

// runningProxy is `fencecheck proxy` run in-process.
type runningProxy struct {
	*cmdtest.Command
	url string
}

// startProxy runs `fencecheck proxy` with the flags of the backend the
// tests guard (pool github-prod, generation 4) plus extra, until Stop or
// the test's end. Stop shuts the proxy down gracefully (its outcome
// reports drained) and checks that it exited 0.
func startProxy(t *testing.T, is *issuer, upstream string, extra ...string) *runningProxy {
	t.Helper()
	jwksSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(is.jwks)
	}))
	t.Cleanup(jwksSrv.Close)
	args := append([]string{"proxy", "--listen", "127.0.0.1:0", "--upstream", upstream,
		"--pool", "github-prod", "--artifact", "sha256:a1", "--config", "sha256:c1", "--generation", "4",
		"--jwks", jwksSrv.URL + "/.well-known/jwks.json", "--issuer", "https://authzd.test",
		"--server", "github", "--log-level", "error"}, extra...)
	c, url, err := cmdtest.Start(t, "fencecheck proxy", listening, func(ctx context.Context, stderr io.Writer) int {
		return run(ctx, args, nil, io.Discard, stderr)
	})
	if err != nil {
		t.Fatal(err)
	}
	return &runningProxy{Command: c, url: url}
}

// post sends one request to the proxy, with token unless "".
func (p *runningProxy) post(t *testing.T, body, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", p.url+"/mcp", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set(fencecheck.Header, token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

func callBody(args string) string {
	return `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_repository","arguments":` + args + `}}`
}

// TestProxy runs `fencecheck proxy` in-process, online, in front of a real
// HTTP backend, with a real JWKS endpoint and a stand-in of authzd's lease
// endpoints: each accepted call is claimed before it reaches the backend
// and its outcome, classified from the backend's answer, is reported under
// the claim; refused calls never reach the backend, and a genuine token
// refused for its arguments releases its lease.
func TestProxy(t *testing.T) {
	is := newIssuer(t)
	authzd := newAuthzdStandIn(t)
	backend := newBackend(t)
	cred := filepath.Join(t.TempDir(), "credential")
	if err := os.WriteFile(cred, []byte("backend-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	online := []string{"--authzd", authzd.srv.URL, "--credential-file", cred}
	p := startProxy(t, is, backend.srv.URL, online...)
	other := startProxy(t, is, backend.srv.URL, online...) // a second instance of the pool

	const args = `{"private":true,"name":"demo"}`
	call := callBody(`{"name":"demo","private":true}`)
	tok, lease := is.token(t, "github/create_repository", args)
	wrongArgs, wrongLease := is.token(t, "github/create_repository", `{"private":false,"name":"demo"}`)
	taken, takenLease := is.token(t, "github/create_repository", args)
	authzd.claim(takenLease, "cl_someone_else")

	steps := []struct {
		note   string
		p      *runningProxy
		body   string
		token  string
		status int
		want   string // in the answer
		calls  int64  // the backend's tools/call count after the step
	}{
		{"tools/list passes without a token", p, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, "", 200, `"ok":true`, 0},
		{"no token", p, call, "", 403, `"reason":"missing"`, 0},
		{"token for other arguments", p, call, wrongArgs, 403, `"reason":"arguments"`, 0},
		{"lease claimed by another call", p, call, taken, 403, `"reason":"replay"`, 0},
		{"valid token", p, call, tok, 200, `"ok":true`, 1},
		{"replay at the same instance", p, call, tok, 403, `"reason":"replay"`, 1},
		{"replay at another instance of the pool", other, call, tok, 403, `"reason":"lease_closed"`, 1},
	}
	for _, s := range steps {
		code, body := s.p.post(t, s.body, s.token)
		if code != s.status || !strings.Contains(body, s.want) {
			t.Fatalf("%s: %d %s, want %d with %s", s.note, code, body, s.status, s.want)
		}
		if n := backend.calls.Load(); n != s.calls {
			t.Fatalf("%s: the backend ran %d calls, want %d", s.note, n, s.calls)
		}
		if s.note == "valid token" {
			// The replay at the other instance must find the lease closed:
			// wait for the outcome report.
			testutil.EventuallyState(t, 10*time.Second, "the effect reported (outcomes are reported asynchronously)", func() bool { return slices.Contains(authzd.events(), "complete "+lease+" effect claimed") }, authzd.events)
		}
	}
	// Outcomes from the backend's answer: a result with isError is failed,
	// a JSON-RPC error or a 404 without an answer is rejected.
	outcomes := []struct{ name, status, outcome, lease string }{
		{"fails", "200", "failed", ""}, {"errs", "200", "rejected", ""}, {"gone", "404", "rejected", ""},
	}
	for i, o := range outcomes {
		var tok string
		tok, outcomes[i].lease = is.token(t, "github/create_repository", `{"name":"`+o.name+`"}`)
		if code, body := p.post(t, callBody(`{"name":"`+o.name+`"}`), tok); strconv.Itoa(code) != o.status {
			t.Fatalf("%s: %d %s, want %s", o.name, code, body, o.status)
		}
	}

	// authzd failing: nothing runs without its claim (fail closed), and a
	// retry once authzd is back is decided by the claim, not refused as a
	// replay.
	authzd.failClaims.Store(true)
	down, downLease := is.token(t, "github/create_repository", args)
	if code, body := p.post(t, call, down); code != 403 || !strings.Contains(body, `"reason":"claim_unavailable"`) {
		t.Fatalf("authzd failing: %d %s", code, body)
	}
	authzd.failClaims.Store(false)
	if code, body := p.post(t, call, down); code != 200 {
		t.Fatalf("retry after authzd recovered: %d %s", code, body)
	}

	// Graceful shutdown drains the outcome reports.
	p.Stop(t)
	other.Stop(t)
	got := map[string]bool{}
	for _, e := range authzd.events() {
		got[e] = true
	}
	want := []string{
		"complete " + lease + " effect claimed",
		"complete " + wrongLease + " rejected unclaimed", // the release
		"complete " + downLease + " effect claimed",
	}
	for _, o := range outcomes {
		want = append(want, "complete "+o.lease+" "+o.outcome+" claimed")
	}
	for _, w := range want {
		if !got[w] {
			t.Errorf("authzd did not receive %q; it received %q", w, authzd.events())
		}
	}
	for _, e := range authzd.events() {
		if strings.HasPrefix(e, "complete "+takenLease) {
			t.Errorf("the instance that lost the claim reported %q", e)
		}
	}
	if n := backend.calls.Load(); n != 5 {
		t.Errorf("the backend ran %d calls, want 5", n)
	}
}

// TestProxyOffline: with --offline the proxy asks no authzd; its replay
// memory is the only check, so it refuses tokens of leases admitted
// before it started (an earlier process may have run them).
func TestProxyOffline(t *testing.T) {
	is := newIssuer(t)
	backend := newBackend(t)
	p := startProxy(t, is, backend.srv.URL, "--offline")
	const args = `{"name":"demo"}`
	before, _ := is.tokenAdmitted(t, "github/create_repository", args, time.Now().Add(-time.Minute))
	if code, body := p.post(t, callBody(args), before); code != 403 || !strings.Contains(body, `"reason":"admitted_before_start"`) {
		t.Fatalf("lease admitted before the start: %d %s", code, body)
	}
	// Admitted well after the start (beyond the 5 s skew).
	after, _ := is.tokenAdmitted(t, "github/create_repository", args, time.Now().Add(time.Minute))
	if code, body := p.post(t, callBody(args), after); code != 200 {
		t.Fatalf("lease admitted after the start: %d %s", code, body)
	}
	if code, body := p.post(t, callBody(args), after); code != 403 || !strings.Contains(body, `"reason":"replay"`) {
		t.Fatalf("replay: %d %s", code, body)
	}
	if n := backend.calls.Load(); n != 1 {
		t.Fatalf("the backend ran %d calls, want 1", n)
	}
}

// TestProxyCommandLine: the proxy runs online (--authzd with
// --credential-file) or, said explicitly, --offline; nothing else.
func TestProxyCommandLine(t *testing.T) {
	base := []string{"proxy", "--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:1", "--pool", "p",
		"--artifact", "a", "--config", "c", "--generation", "0", "--jwks", "http://127.0.0.1:1/jwks"}
	for _, tc := range []struct {
		extra []string
		want  string
	}{
		{nil, "--authzd (with --credential-file) is required, or --offline"},
		{[]string{"--authzd", "http://127.0.0.1:1"}, "--authzd needs --credential-file"},
		{[]string{"--authzd", "http://127.0.0.1:1", "--offline"}, "exclude each other"},
	} {
		var stderr bytes.Buffer
		if code := run(context.Background(), append(base, tc.extra...), nil, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", tc.extra, code, stderr.String(), tc.want)
		}
	}
}

func TestVerifyCommand(t *testing.T) {
	is := newIssuer(t)
	dir := t.TempDir()
	keys := filepath.Join(dir, "jwks.json")
	if err := os.WriteFile(keys, is.jwks, 0o600); err != nil {
		t.Fatal(err)
	}
	tok, lease := is.token(t, "github/create_repository", `{"name":"demo"}`)
	tokFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokFile, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	argsFile := filepath.Join(dir, "args.json")
	if err := os.WriteFile(argsFile, []byte(`{ "name": "demo" }`), 0o600); err != nil {
		t.Fatal(err)
	}
	backend := []string{"--pool", "github-prod", "--artifact", "sha256:a1", "--config", "sha256:c1", "--generation", "4", "--keys", keys}

	cases := []struct {
		note   string
		args   []string
		stdin  string
		code   int
		stdout string // prefix
	}{
		{"accepted", []string{"--token", tok, "--tool", "github/create_repository", "--arguments", `{"name":"demo"}`}, "", 0, "accept jti=" + lease},
		{"arguments from a file, token from a file", []string{"--token-file", tokFile, "--tool", "github/create_repository", "--arguments", "@" + argsFile}, "", 0, "accept"},
		{"token from stdin", []string{"--token-file", "-", "--tool", "github/create_repository", "--arguments", `{"name":"demo"}`}, tok, 0, "accept"},
		{"other arguments", []string{"--token", tok, "--tool", "github/create_repository", "--arguments", `{"name":"prod"}`}, "", 1, "reject arguments:"},
		{"other tool", []string{"--token", tok, "--tool", "github/delete_repository", "--arguments", `{"name":"demo"}`}, "", 1, "reject tool:"},
		{"not a token", []string{"--token", "abc", "--tool", "github/create_repository"}, "", 1, "reject malformed:"},
		{"other generation", append([]string{"--token", tok, "--tool", "github/create_repository", "--arguments", `{"name":"demo"}`},
			"--generation", "5"), "", 1, "reject generation:"},
		{"no tool", []string{"--token", tok}, "", 2, ""},
		{"no key source", []string{"--token", tok, "--tool", "t/t", "--keys", ""}, "", 2, ""},
	}
	for _, tc := range cases {
		t.Run(tc.note, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := append(append([]string{"verify"}, backend...), tc.args...)
			code := run(context.Background(), args, strings.NewReader(tc.stdin), &stdout, &stderr)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stdout %q stderr %q", code, tc.code, stdout.String(), stderr.String())
			}
			if !strings.HasPrefix(stdout.String(), tc.stdout) {
				t.Fatalf("stdout %q, want prefix %q", stdout.String(), tc.stdout)
			}
			if tc.stdout != "" {
				if sc := bufio.NewScanner(&stdout); sc.Scan() && sc.Scan() {
					t.Fatalf("more than one line: %q", stdout.String())
				}
			}
		})
	}
}

// TestVersionCommand: --version prints one line naming fencecheck and the
// Go version, exit 0.
func TestVersionCommand(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"--version"}, nil, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "fencecheck ") ||
		!strings.Contains(out.String(), "go1.") {
		t.Fatalf("exit %d, %q %q", code, out.String(), errb.String())
	}
}

// TestProxyCheck: proxy --check validates the command line as proxy does
// before it listens, without reading --keys or --credential-file: 0 and
// "command line ok", else 2 naming the flag.
func TestProxyCheck(t *testing.T) {
	base := []string{"proxy", "--check", "--listen", "0.0.0.0:8090", "--upstream", "http://127.0.0.1:3000",
		"--pool", "p", "--artifact", "sha256:a", "--config", "sha256:c", "--generation", "0"}
	for _, tc := range []struct {
		name   string
		args   []string
		status int
		out    string
	}{
		{name: "jwks", args: []string{"--jwks", "http://authzd:8080/.well-known/jwks.json", "--authzd", "http://authzd:8080", "--credential-file", "/nonexistent"}, status: 0, out: "fencecheck: command line ok"},
		{name: "keys file", args: []string{"--keys", "/nonexistent/jwks.json", "--offline"}, status: 0, out: "command line ok"},
		{name: "no key source", args: []string{"--offline"}, status: 2, out: "--jwks"},
		{name: "no credential", args: []string{"--jwks", "http://a/jwks", "--authzd", "http://a"}, status: 2, out: "--credential-file"},
		{name: "unknown flag", args: []string{"--jwks", "http://a/jwks", "--offline", "--upstreams", "x"}, status: 2, out: "upstreams"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			status := run(context.Background(), append(slices.Clone(base), tc.args...), nil, &out, &errb)
			if status != tc.status || !strings.Contains(errb.String(), tc.out) {
				t.Fatalf("exit %d (want %d), stderr %q (want %q)", status, tc.status, errb.String(), tc.out)
			}
		})
	}
}
