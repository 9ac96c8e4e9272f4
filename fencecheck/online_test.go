package fencecheck_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/fencecheck/fencechecktest"
)

// waitFor polls cond until it holds, failing the test after 10 s (a
// bound for a slow machine, not a timed assertion).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestMiddlewareReleasesRefusedCalls: in online mode, a genuine token for
// this backend whose call the fence refuses before the effect — a body
// that could be read two ways, another tool, other arguments — releases
// its lease at once: outcome rejected with no claim. The lease is then
// closed, so the token cannot run afterwards even intact. A token that is
// not genuine for this backend costs authzd nothing, and an offline fence
// releases nothing.
func TestMiddlewareReleasesRefusedCalls(t *testing.T) {
	const args = `{"visibility":"private"}`
	genuine := func(b *mcpBackend, t *testing.T) (string, fencecheck.Claims) {
		return b.token(t, "create_repository", args)
	}
	cases := []struct {
		note    string
		offline bool
		token   func(b *mcpBackend, t *testing.T) (string, fencecheck.Claims)
		body    string
		headers map[string]string
		reason  fencecheck.Reason
		release bool
	}{
		{note: "Arguments", token: genuine, release: true, reason: fencecheck.ReasonMemberCase,
			body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_repository","Arguments":` + args + `}}`},
		{note: "duplicate arguments", token: genuine, release: true, reason: fencecheck.ReasonDuplicateMember,
			body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_repository","arguments":` + args + `,"arguments":{}}}`},
		{note: "batch", token: genuine, release: true, reason: fencecheck.ReasonBatch,
			body: `[` + toolsCall("create_repository", args) + `]`},
		{note: "Mcp-Name names another tool", token: genuine, release: true, reason: fencecheck.ReasonHeaders,
			body: toolsCall("create_repository", args), headers: map[string]string{"Mcp-Name": "delete_repository"}},
		{note: "other arguments", token: genuine, release: true, reason: fencecheck.ReasonArguments,
			body: toolsCall("create_repository", `{"visibility":"public"}`)},
		{note: "other tool", token: genuine, release: true, reason: fencecheck.ReasonTool,
			body: toolsCall("delete_repository", args)},

		{note: "forged token", reason: fencecheck.ReasonMemberCase,
			token: func(b *mcpBackend, t *testing.T) (string, fencecheck.Claims) {
				tok, c := genuine(b, t)
				return tok[:len(tok)-4] + "AAAA", c
			},
			body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_repository","Arguments":` + args + `}}`},
		{note: "forged token, other arguments", reason: fencecheck.ReasonSignature,
			token: func(b *mcpBackend, t *testing.T) (string, fencecheck.Claims) {
				tok, c := genuine(b, t)
				return tok[:len(tok)-4] + "AAAA", c
			},
			body: toolsCall("create_repository", `{"visibility":"public"}`)},
		{note: "token signed by an untrusted key", reason: fencecheck.ReasonSignature,
			token: func(b *mcpBackend, t *testing.T) (string, fencecheck.Claims) {
				c := claimsFor(t, "github/create_repository", args)
				now := time.Now()
				c.IssuedAt, c.NotBefore, c.Expiry, c.Admitted = now.Unix(), now.Unix(), now.Unix()+30, now.UnixMilli()
				return fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1").Issue(c), c
			},
			body: toolsCall("create_repository", `{"visibility":"public"}`)},
		{note: "token of another pool", reason: fencecheck.ReasonMemberCase,
			token: func(b *mcpBackend, t *testing.T) (string, fencecheck.Claims) {
				c := claimsFor(t, "github/create_repository", args)
				now := time.Now()
				c.IssuedAt, c.NotBefore, c.Expiry, c.Admitted = now.Unix(), now.Unix(), now.Unix()+30, now.UnixMilli()
				c.Audience = "github-canary"
				return b.key.Issue(c), c
			},
			body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_repository","ARGUMENTS":` + args + `}}`},
		{note: "expired token", reason: fencecheck.ReasonExpired,
			token: func(b *mcpBackend, t *testing.T) (string, fencecheck.Claims) {
				c := claimsFor(t, "github/create_repository", args)
				now := time.Now().Add(-time.Minute)
				c.IssuedAt, c.NotBefore, c.Expiry, c.Admitted = now.Unix(), now.Unix(), now.Unix()+30, now.UnixMilli()
				return b.key.Issue(c), c
			},
			body: toolsCall("create_repository", `{"visibility":"public"}`)},

		{note: "offline: Arguments", offline: true, token: genuine, reason: fencecheck.ReasonMemberCase,
			body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_repository","Arguments":` + args + `}}`},
		{note: "offline: other arguments", offline: true, token: genuine, reason: fencecheck.ReasonArguments,
			body: toolsCall("create_repository", `{"visibility":"public"}`)},
	}
	for _, tc := range cases {
		t.Run(tc.note, func(t *testing.T) {
			b := newBackend(t, backendConfig{online: !tc.offline})
			tok, claims := tc.token(b, t)
			req, _ := http.NewRequest("POST", b.url, strings.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(fencecheck.Header, tok)
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			wantRefused(t, send(t, req), tc.reason)
			if n := b.requests.Load(); n != 0 {
				t.Fatalf("handler ran %d times", n)
			}
			if tc.release {
				waitFor(t, "the release", func() bool { return len(b.authzd.completions()) > 0 })
				// The lease is closed: the token with the intact call
				// is refused too.
				wantRefused(t, mustDo(t, "POST", b.url, toolsCall("create_repository", args), tok), fencecheck.ReasonLeaseClosed)
			}
			if reqs := b.authzd.claimRequests(); len(reqs) != 0 && !tc.release {
				t.Fatalf("a refused call claimed its lease: %+v", reqs)
			}
			got := b.drained(t)
			if !tc.release {
				if len(got) != 0 {
					t.Fatalf("authzd received %+v, want nothing", got)
				}
				return
			}
			if len(got) != 1 || got[0].Lease != claims.ID || got[0].HasClaim || got[0].Claim != "" ||
				got[0].Outcome != fencecheck.OutcomeRejected || !strings.Contains(got[0].Detail, string(tc.reason)) {
				t.Fatalf("authzd received %+v, want one release (rejected, no claim) of %s", got, claims.ID)
			}
			if c := b.authzd.claimOf(claims.ID); c != "" {
				t.Fatalf("the released lease was claimed under %s", c)
			}
			if n := b.calls.Load(); n != 0 {
				t.Fatalf("handler ran %d calls", n)
			}
		})
	}
}

// send sends req and reads its answer like do.
func send(t *testing.T, req *http.Request) *rpcResult {
	t.Helper()
	res, err := doRequest(req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestMiddlewareOnlineAtMostOnce: the instances of one pool claim through
// one authzd: a token runs on one of them once — not again on a second
// instance, nor on a restarted one whose replay memory is empty.
func TestMiddlewareOnlineAtMostOnce(t *testing.T) {
	const args = `{"name":"payroll-exports"}`
	first := newBackend(t, backendConfig{online: true})
	second := newBackend(t, backendConfig{online: true, authzd: first.authzd, key: first.key})
	tok, claims := first.token(t, "create_repository", args)
	body := toolsCall("create_repository", args)

	if res := mustDo(t, "POST", first.url, body, tok); res.status != http.StatusOK {
		t.Fatalf("first instance: status %d (%s)", res.status, res.body)
	}
	for _, b := range []*mcpBackend{
		second,
		newBackend(t, backendConfig{online: true, authzd: first.authzd, key: first.key}), // restarted
	} {
		res := mustDo(t, "POST", b.url, body, tok)
		// Claimed elsewhere (replay), or already completed there
		// (lease_closed), depending on when the first outcome arrives.
		if res.err.Error == nil || (res.err.Error.Data.Reason != fencecheck.ReasonReplay && res.err.Error.Data.Reason != fencecheck.ReasonLeaseClosed) {
			t.Fatalf("another instance: %d %s, want replay or lease_closed", res.status, res.body)
		}
		if n := b.calls.Load(); n != 0 {
			t.Fatalf("another instance ran the call %d times", n)
		}
	}
	if n := first.calls.Load(); n != 1 {
		t.Fatalf("first instance ran the call %d times", n)
	}
	second.drained(t)
	got := first.drained(t) // one authzd: everything the pool reported
	if len(got) != 1 || got[0].Lease != claims.ID || got[0].Claim != first.authzd.claimOf(claims.ID) || got[0].Outcome != fencecheck.OutcomeEffect {
		t.Fatalf("authzd received %+v, want one effect of %s under its claim", got, claims.ID)
	}
}

// TestMiddlewareClaimUnavailable: an online fence that cannot reach
// authzd refuses the call (fail closed), runs nothing and reports
// nothing; once authzd is back the same token runs.
func TestMiddlewareClaimUnavailable(t *testing.T) {
	const args = `{"name":"payroll-exports"}`
	b := newBackend(t, backendConfig{online: true})
	tok, claims := b.token(t, "create_repository", args)
	body := toolsCall("create_repository", args)
	b.authzd.status.Store(http.StatusServiceUnavailable)
	wantRefused(t, mustDo(t, "POST", b.url, body, tok), fencecheck.ReasonClaimUnavailable)
	if n := b.calls.Load(); n != 0 {
		t.Fatalf("handler ran %d calls without a claim", n)
	}
	b.authzd.status.Store(0)
	if res := mustDo(t, "POST", b.url, body, tok); res.status != http.StatusOK {
		t.Fatalf("after authzd came back: %d %s", res.status, res.body)
	}
	got := b.drained(t)
	if len(got) != 1 || got[0].Lease != claims.ID || got[0].Claim == "" || got[0].Outcome != fencecheck.OutcomeEffect {
		t.Fatalf("authzd received %+v, want one effect", got)
	}
}
