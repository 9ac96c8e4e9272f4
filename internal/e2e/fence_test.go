package e2e_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/internal/apitest"
	"github.com/fcd-authz/fcd/internal/fixtures"
	"github.com/fcd-authz/fcd/internal/gatewaytest"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The fence's three invariants (issue 10), end to end: exact call, at most
// once per admission, outcomes from evidence; and the gateway's caller
// bound to the formation's principal. Every test here failed on the main
// before them: its effects, refusals or formation states differ.

// listArgs are the arguments the attacks' calls are formed with: only
// private repositories. The fixture's default visibility is "all", public
// repositories included: what a backend that did not read the arguments
// the fence verified would run.
const listArgs = `{"owner":"octo-org","visibility":"private"}`

// admission is what authzd's REST admission answered.
type admission struct {
	Token, Lease string
	Claims       fencecheck.Claims
}

// admit admits a formation as the host over REST (no gateway, so no
// caller binding) and returns its token.
func (s *stack) admit(f formation) admission {
	s.t.Helper()
	r, err := s.as(api.RoleHost).AdmitFormationWithResponse(s.t.Context(), f.ID)
	s.must("admit "+f.ID, err)
	if r.JSON200 == nil {
		s.t.Fatalf("admit %s: %d %s, want 200", f.ID, r.StatusCode(), r.Body)
	}
	a := admission{Token: r.JSON200.Token, Lease: r.JSON200.Lease}
	a.Claims = claimsOf(s.t, a.Token)
	if a.Token == "" || a.Lease == "" || a.Claims.ID != a.Lease {
		s.t.Fatalf("admission %s", r.Body)
	}
	return a
}

// readmit admits a formation again over REST and returns the refusal's
// status and problem slug; it fails the test if authzd issued a token.
func (s *stack) readmit(f formation) (int, string) {
	s.t.Helper()
	r, err := s.as(api.RoleHost).AdmitFormationWithResponse(s.t.Context(), f.ID)
	if err == nil {
		s.t.Fatalf("re-admission of %s issued a token: %d %s", f.ID, r.StatusCode(), r.Body)
	}
	p := s.problem("re-admit "+f.ID, err)
	return p.Status, p.Slug()
}

// formRead forms a read of tool (no approval needed: ready at once) in
// session, for alice.
func (s *stack) formRead(snapshot, session, tool, args string) formation {
	s.t.Helper()
	f := s.form(snapshot, session, tool, args)
	if f.Status != "ready" || f.Pool != poolV14 {
		s.t.Fatalf("read formation %+v: want ready on %s", f, poolV14)
	}
	return f
}

// leaseOf returns the lease of a formation, as authzd shows it.
func (s *stack) leaseOf(id string) string {
	s.t.Helper()
	if l := s.record(id).Lease; l != nil {
		return *l
	}
	return ""
}

// leaseState returns the state of an open lease under the v1.4 epoch as
// authzd lists it to the operator ("admitted", "running", "uncertain"),
// or "" when the lease is not open.
func (s *stack) leaseState(lease string) string {
	s.t.Helper()
	r, err := s.as(api.RoleOperator).ListEpochLeasesWithResponse(s.t.Context(), s.Epoch[poolV14])
	s.must("list the leases", err)
	if r.JSON200 == nil {
		s.t.Fatalf("list the leases: %d %s, want 200", r.StatusCode(), r.Body)
	}
	for _, l := range r.JSON200.Leases {
		if l.Id == lease {
			return string(l.State)
		}
	}
	return ""
}

// sessionFormations counts the formations of a session.
func (s *stack) sessionFormations(session string) int {
	s.t.Helper()
	r, err := s.as(api.RoleOperator).ListFormationsWithResponse(s.t.Context(), nil)
	s.must("list the formations", err)
	if r.JSON200 == nil {
		s.t.Fatalf("list the formations: %d %s, want 200", r.StatusCode(), r.Body)
	}
	n := 0
	for _, f := range r.JSON200.Formations {
		if f.Session == session {
			n++
		}
	}
	return n
}

// credFile writes the v1.4 pool's backend credential to a file, for
// `fencecheck proxy --credential-file`.
func (s *stack) credFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "backend.cred")
	if err := os.WriteFile(path, []byte(s.poolCreds[poolV14]), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// startSidecar runs `fencecheck proxy` as an instance of the v1.4 pool at
// generation 0, online (each lease claimed at the stack's authzd before
// the effect, outcomes reported there), in front of upstream.
func startSidecar(t *testing.T, s *stack, fenceBin, credFile, upstream string) *proc {
	t.Helper()
	rel, err := fixtures.Lookup("github", "v1.4")
	if err != nil {
		t.Fatal(err)
	}
	return startProc(t, "fencecheck proxy", fenceBin, "proxy", "--listen", "127.0.0.1:0", "--upstream", upstream,
		"--pool", rel.Pool, "--artifact", rel.Artifact, "--config", rel.Config, "--generation", "0",
		"--jwks", s.URL+"/.well-known/jwks.json", "--issuer", issuerName, "--server", "github",
		"--authzd", s.URL, "--credential-file", credFile, "--timeout", "30s", "--log-level", "warn")
}

func claimsOf(t testing.TB, token string) fencecheck.Claims {
	t.Helper()
	var c fencecheck.Claims
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("not a token: %q", token)
	}
	p, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil || json.Unmarshal(p, &c) != nil {
		t.Fatalf("token payload: %v", err)
	}
	return c
}

// fenceClient is an MCP host (the official SDK client) talking straight
// to a fence — the in-process middleware or a `fencecheck proxy` — in an
// MCP session, handing each call its dispatch token as a gateway would.
type fenceClient struct {
	cs     *mcp.ClientSession
	mu     sync.Mutex
	status int    // of the last tools/call
	reason string // error.data.reason of its answer, if it was refused
}

// connectFence connects a fenceClient to the MCP endpoint base+"/mcp".
// tamper, if set, rewrites every tools/call body after the SDK wrote it:
// a host (or anyone between the gateway and the fence) sending what was
// not admitted.
func connectFence(t *testing.T, base string, tamper func([]byte) []byte) *fenceClient {
	t.Helper()
	c := &fenceClient{}
	rt := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		// fixtures.TokenTransport puts the token on tools/call POSTs only.
		call := req.Header.Get(fencecheck.Header) != ""
		if call && tamper != nil {
			req = tamperedRequest(t, req, tamper)
		}
		resp, err := http.DefaultTransport.RoundTrip(req)
		if call && err == nil {
			reason := refusalOf(resp)
			c.mu.Lock()
			c.status, c.reason = resp.StatusCode, reason
			c.mu.Unlock()
		}
		return resp, err
	})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "fcd-e2e-fence-client", Version: "0"}, nil).
		Connect(ctx, fixtures.NewClientTransport(base+"/mcp", rt), nil)
	if err != nil {
		t.Fatalf("connect to the fence at %s: %v", base, err)
	}
	c.cs = cs
	t.Cleanup(func() { cs.Close() })
	return c
}

// call sends tools/call with token and returns the result, the HTTP status
// of the POST and the error. One call at a time per client.
func (c *fenceClient) call(token, tool, args string) (*mcp.CallToolResult, int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := c.cs.CallTool(fixtures.WithDispatchToken(ctx, token), &mcp.CallToolParams{Name: tool, Arguments: json.RawMessage(args)})
	c.mu.Lock()
	defer c.mu.Unlock()
	return res, c.status, err
}

// lastRefusal is the reason in the JSON-RPC error of the last tools/call's
// answer, if any.
func (c *fenceClient) lastRefusal() fencecheck.Reason {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fencecheck.Reason(c.reason)
}

// refusalOf reads the reason of a fence's refusal (a JSON-RPC error with
// error.data.reason) from an answer that is not 2xx, leaving the body for
// its reader. A refusal of a body the fence cannot read carries id null:
// the SDK client cannot match it to its request and reports only the
// HTTP status, so the reason is read here.
func refusalOf(resp *http.Response) string {
	if resp.StatusCode < 300 {
		return ""
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(raw))
	var rpc struct {
		Error struct {
			Data struct{ Reason string } `json:"data"`
		} `json:"error"`
	}
	_ = json.Unmarshal(raw, &rpc)
	return rpc.Error.Data.Reason
}

// attack is a tools/call body that some JSON parser reads otherwise than
// the fence would have to, made by replacing from with to in the body
// the host's SDK wrote for the call as formed (listArgs).
type attack struct {
	note     string
	reason   fencecheck.Reason
	from, to string
}

var attacks = []attack{
	{"member Arguments", fencecheck.ReasonMemberCase, `"arguments":`, `"Arguments":`},
	{"member ARGUMENTS", fencecheck.ReasonMemberCase, `"arguments":`, `"ARGUMENTS":`},
	{"member argumentſ (U+017F folds to s)", fencecheck.ReasonMemberCase, `"arguments":`, `"argumentſ":`},
	{"member arguments twice", fencecheck.ReasonDuplicateMember, `"arguments":` + listArgs, `"arguments":` + listArgs + `,"arguments":{}`},
	{"argument names visibility and viſibility", fencecheck.ReasonNameCollision, `"visibility":"private"`, `"visibility":"private","viſibility":"all"`},
}

func (a attack) tamper(t *testing.T) func([]byte) []byte {
	return func(b []byte) []byte {
		if !bytes.Contains(b, []byte(a.from)) {
			t.Errorf("%s: the body %s holds no %s", a.note, b, a.from)
			return b
		}
		return bytes.Replace(b, []byte(a.from), []byte(a.to), 1)
	}
}

// TestExactCallMemberVariants: a genuine token for list_repositories
// {"owner":"octo-org","visibility":"private"} with a body whose arguments
// a case-insensitive, fold-insensitive, first-wins or last-wins parser
// reads otherwise ("Arguments", "ARGUMENTS", "argumentſ", arguments twice,
// visibility beside viſibility). The MCP Go SDK behind the fence reads
// only the exact member "arguments", so such a body would list every
// repository, public ones included. Through the in-process middleware, a
// `fencecheck proxy` sidecar, and real nginx (forward_auth, basic
// authentication) in front of that sidecar, each is refused before the
// handler: 403, JSON-RPC error.data.reason naming the reader's refusal;
// the token's lease is released at once (formation rejected, no lease
// left under the epoch); nothing is recorded. The same bodies sent to
// authzd's ext_authz in one-step mode are refused 400 malformed-mcp with
// the reason, and nothing is formed. The call as formed then runs once
// on each path.
func TestExactCallMemberVariants(t *testing.T) {
	_, fenceBin := buildBinaries(t)
	s := startStack(t, nil)
	snap := s.snapshot()
	sidecar := startSidecar(t, s, fenceBin, s.credFile(t), s.bareFixture(t, "v1.4", fixtures.Config{}))
	gw := gatewaytest.Start(t, gatewaytest.Nginx, gatewaytest.Config{
		Authzd: s.URL, Credential: string(s.creds[api.RoleGateway]), Default: poolV14,
		Pools: map[string]string{poolV14: sidecar.URL, poolV13: s.Fixture[poolV13]}, Users: gatewayUsers,
	})
	// send sends the call of f through a path, tampered when tamper is
	// set, and returns how the fence answered.
	type sendFunc func(t *testing.T, f formation, tamper func([]byte) []byte) (res *mcp.CallToolResult, status int, reason fencecheck.Reason, err error)
	direct := func(base string) sendFunc {
		return func(t *testing.T, f formation, tamper func([]byte) []byte) (*mcp.CallToolResult, int, fencecheck.Reason, error) {
			c := connectFence(t, base, tamper)
			res, status, err := c.call(s.admit(f).Token, "list_repositories", listArgs)
			return res, status, c.lastRefusal(), err
		}
	}
	paths := []struct {
		name string
		send sendFunc
	}{
		{"middleware", direct(s.Fixture[poolV14])},
		{"sidecar", direct(sidecar.URL)},
		{"nginx forward_auth then sidecar", func(t *testing.T, f formation, tamper func([]byte) []byte) (*mcp.CallToolResult, int, fencecheck.Reason, error) {
			h := connectHostAs(t, gw, "alice", tamper)
			res, err := h.call(f, "list_repositories", listArgs)
			a := h.last(f.ID)
			return res, a.Status, a.Reason, err
		}},
	}
	ran := 0
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			for i, a := range attacks {
				f := s.formRead(snap, fmt.Sprintf("sess-exact-%s-%d", p.name, i), "list_repositories", listArgs)
				_, status, reason, err := p.send(t, f, a.tamper(t))
				if err == nil || reason != a.reason || status != http.StatusForbidden {
					t.Errorf("%s: %d %q %v, want 403 with reason %s", a.note, status, reason, err, a.reason)
				}
				// Released at once, not at the sweep: the fence reported the
				// refused genuine token's lease rejected, unclaimed.
				s.waitStatus(f.ID, "rejected")
				if l := s.leaseOf(f.ID); l == "" || s.leaseState(l) != "" {
					t.Errorf("%s: lease %q still open (%s)", a.note, l, s.leaseState(l))
				}
				if es := s.Rec.Effects(fixtures.Filter{}); len(es) != ran {
					t.Fatalf("%s: effects %+v, want %d", a.note, es, ran)
				}
			}
			// The call as formed runs, once.
			f := s.formRead(snap, "sess-exact-"+p.name+"-ok", "list_repositories", listArgs)
			res, status, _, err := p.send(t, f, nil)
			if err != nil || res.IsError || status != http.StatusOK {
				t.Fatalf("the call as formed: %d %v %+v", status, err, res)
			}
			ran++
			es := s.Rec.Effects(fixtures.Filter{Tool: "list_repositories"})
			var got struct{ Visibility string }
			if len(es) != ran || json.Unmarshal(es[ran-1].Arguments, &got) != nil || got.Visibility != "private" {
				t.Fatalf("effects %+v, want %d, the last one private only", es, ran)
			}
		})
	}

	t.Run("ext_authz one-step", func(t *testing.T) {
		body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_repositories","arguments":` + listArgs + `}}`
		// The tampered bodies go as the bytes they are: the typed client's
		// WithBody call sends its body unchanged.
		gateway := s.as(api.RoleGateway)
		post := func(session, body string) (*client.ExtAuthzPostResponse, error) {
			t.Helper()
			return gateway.ExtAuthzPostWithBodyWithResponse(t.Context(), "mcp", &client.ExtAuthzPostParams{
				FcdSnapshot: &snap, FcdSession: &session, FcdServer: ptr("github"), FcdCaller: ptr("alice"),
			}, "application/json", strings.NewReader(body))
		}
		for i, a := range attacks {
			session := fmt.Sprintf("sess-exact-ext-authz-%d", i)
			_, err := post(session, string(a.tamper(t)([]byte(body))))
			var p *client.Problem
			if !errors.As(err, &p) || p.Status != http.StatusBadRequest || p.Slug() != "malformed-mcp" ||
				p.Details.Reason == nil || *p.Details.Reason != string(a.reason) || p.Header.Get(fencecheck.Header) != "" {
				t.Errorf("%s: %v, want 400 malformed-mcp with reason %s and no token", a.note, err, a.reason)
			}
			if n := s.sessionFormations(session); n != 0 {
				t.Errorf("%s: %d formations in its session, want none", a.note, n)
			}
		}
		// The body as the model formed it is formed and admitted.
		r, err := post("sess-exact-ext-authz-ok", body)
		if err != nil || r.StatusCode() != http.StatusOK || r.HTTPResponse.Header.Get(fencecheck.Header) == "" || s.sessionFormations("sess-exact-ext-authz-ok") != 1 {
			t.Errorf("the body as formed: %v %+v", err, r)
		}
	})
	if es := s.Rec.Effects(fixtures.Filter{}); len(es) != len(paths) {
		t.Errorf("effects %+v, want %d (the calls as formed)", es, len(paths))
	}
}

// holdCalls makes the stack's fixtures hold every call until release is
// closed (or the call's context ends), announcing each on entered.
func holdCalls(t *testing.T, s *stack) (entered chan string, release func()) {
	entered = make(chan string, 8)
	ch := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(ch) }) }
	s.setHold(func(ctx context.Context, tool string) {
		entered <- tool
		select {
		case <-ch:
		case <-ctx.Done():
		}
	})
	t.Cleanup(release)
	return entered, release
}

// TestTwoSidecarsOnePool: two `fencecheck proxy` instances of one pool
// (same pool, artifact, config and generation) in front of one fixture
// each get the same genuine token at once. Their replay memories are
// their own; the lease claim in etcd is not: one call runs (and is held
// in the fixture until the other answered), the other is refused 403
// replay. Exactly one effect; the formation completes.
func TestTwoSidecarsOnePool(t *testing.T) {
	_, fenceBin := buildBinaries(t)
	s := startStack(t, nil)
	upstream := s.bareFixture(t, "v1.4", fixtures.Config{JSONResponse: true})
	cred := s.credFile(t)
	clients := []*fenceClient{
		connectFence(t, startSidecar(t, s, fenceBin, cred, upstream).URL, nil),
		connectFence(t, startSidecar(t, s, fenceBin, cred, upstream).URL, nil),
	}
	f := s.formRead(s.snapshot(), "sess-two-sidecars", "list_repositories", listArgs)
	a := s.admit(f)
	entered, release := holdCalls(t, s)

	type result struct {
		res    *mcp.CallToolResult
		status int
		err    error
	}
	results := make(chan result, 2)
	start := make(chan struct{})
	for _, c := range clients {
		go func() {
			<-start
			res, status, err := c.call(a.Token, "list_repositories", listArgs)
			results <- result{res, status, err}
		}()
	}
	close(start)
	// The first answer is the refusal: the other call holds the lease.
	var first result
	select {
	case first = <-results:
	case <-time.After(30 * time.Second):
		t.Fatal("no answer in 30s: both instances let the call through to the fixture (or neither answered)")
	}
	if reason, ok := fixtures.RejectReason(first.err); !ok || reason != fencecheck.ReasonReplay || first.status != http.StatusForbidden {
		t.Fatalf("first answer %d %v %+v, want 403 replay", first.status, first.err, first.res)
	}
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("no call reached the fixture")
	}
	if st := s.leaseState(a.Lease); st != "running" {
		t.Errorf("lease %s is %q while its call runs, want running", a.Lease, st)
	}
	release()
	second := <-results
	if second.err != nil || second.res.IsError || second.status != http.StatusOK {
		t.Fatalf("the call that claimed the lease: %d %v %+v", second.status, second.err, second.res)
	}
	if es := s.Rec.Effects(fixtures.Filter{}); len(es) != 1 || es[0].Lease != a.Lease {
		t.Fatalf("effects %+v, want exactly one, under lease %s", es, a.Lease)
	}
	s.waitStatus(f.ID, "completed")
}

// TestSidecarRestartSameGeneration: a call runs through a sidecar, which
// then goes away and is started again with the same --generation: its
// replay memory is gone. Killed (SIGKILL, a crash right after the answer,
// usually before its outcome report went out), the lease stays running:
// authzd does not admit the formation again (409 lease-claimed) and the
// old token sent to the restarted sidecar is refused as a replay — by the
// claim in etcd, not by memory. Stopped (SIGTERM: the report is drained),
// or killed after the report went out, the lease is closed: 409
// lease-closed, and the old token is refused lease_closed. Either way
// exactly one effect.
func TestSidecarRestartSameGeneration(t *testing.T) {
	_, fenceBin := buildBinaries(t)
	for _, tc := range []struct {
		note string
		end  func(*proc, *testing.T)
		// What a retry may find: a refusal of the re-admission, and of the
		// old token at the restarted sidecar. A killed sidecar's report
		// may still land (the request was sent before the kill), so
		// either pair, or the first then the second, may be seen.
		slugs   []string
		reasons []fencecheck.Reason
	}{
		{"killed", (*proc).kill, []string{"lease-claimed", "lease-closed"}, []fencecheck.Reason{fencecheck.ReasonReplay, fencecheck.ReasonLeaseClosed}},
		{"stopped", (*proc).stop, []string{"lease-closed"}, []fencecheck.Reason{fencecheck.ReasonLeaseClosed}},
	} {
		t.Run(tc.note, func(t *testing.T) {
			s := startStack(t, nil)
			upstream := s.bareFixture(t, "v1.4", fixtures.Config{JSONResponse: true})
			cred := s.credFile(t)
			first := startSidecar(t, s, fenceBin, cred, upstream)
			f := s.formRead(s.snapshot(), "sess-restart", "list_repositories", listArgs)
			a := s.admit(f)
			if res, _, err := connectFence(t, first.URL, nil).call(a.Token, "list_repositories", listArgs); err != nil || res.IsError {
				t.Fatalf("first call: %v %+v", err, res)
			}
			tc.end(first, t)
			restarted := startSidecar(t, s, fenceBin, cred, upstream)
			t.Logf("after the sidecar was %s: formation %s, lease %q", tc.note, s.status(f.ID), s.leaseState(a.Lease))

			if status, slug := s.readmit(f); status != http.StatusConflict || !slices.Contains(tc.slugs, slug) {
				t.Errorf("re-admission after the effect: %d %s, want 409 and one of %v", status, slug, tc.slugs)
			}
			_, code, err := connectFence(t, restarted.URL, nil).call(a.Token, "list_repositories", listArgs)
			if reason, ok := fixtures.RejectReason(err); !ok || code != http.StatusForbidden || !slices.Contains(tc.reasons, reason) {
				t.Errorf("the old token at the restarted sidecar: %d %v, want 403 and one of %v", code, err, tc.reasons)
			}
			if es := s.Rec.Effects(fixtures.Filter{}); len(es) != 1 {
				t.Fatalf("effects %+v, want exactly one", es)
			}
		})
	}
}

// TestCallLongerThanToken: authzd issues 2-second tokens; a call is held
// in the fixture until its token expired. Re-admitting the formation
// meanwhile issues no token (409 lease-claimed: the lease is running, as
// the operator's lease list shows). Released, the call completes: exactly
// one effect, and a re-admission then finds the lease closed.
func TestCallLongerThanToken(t *testing.T) {
	s := startStackWith(t, nil, stackOptions{TokenLifetime: 2 * time.Second})
	f := s.formRead(s.snapshot(), "sess-long-call", "list_repositories", listArgs)
	a := s.admit(f)
	if life := a.Claims.Expiry - a.Claims.IssuedAt; life != 2 {
		t.Fatalf("token lifetime %ds, want 2s", life)
	}
	entered, release := holdCalls(t, s)
	c := connectFence(t, s.Fixture[poolV14], nil)
	done := make(chan error, 1)
	go func() {
		res, _, err := c.call(a.Token, "list_repositories", listArgs)
		if err == nil && res.IsError {
			err = fmt.Errorf("tool error %+v", res)
		}
		done <- err
	}()
	select {
	case <-entered:
	case err := <-done:
		t.Fatalf("the call ended before its effect: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the call never reached the fixture")
	}
	// Wait, with the call in flight, until its token has expired.
	time.Sleep(time.Until(time.Unix(a.Claims.Expiry+1, 0)))
	if status, slug := s.readmit(f); status != http.StatusConflict || slug != "lease-claimed" {
		t.Errorf("re-admission during the call: %d %s, want 409 lease-claimed", status, slug)
	}
	if st := s.leaseState(a.Lease); st != "running" {
		t.Errorf("lease %s is %q during the call, want running", a.Lease, st)
	}
	release()
	if err := <-done; err != nil {
		t.Fatalf("the call: %v", err)
	}
	if es := s.Rec.Effects(fixtures.Filter{}); len(es) != 1 || es[0].Lease != a.Lease {
		t.Fatalf("effects %+v, want exactly one", es)
	}
	s.waitStatus(f.ID, "completed")
	if status, slug := s.readmit(f); status != http.StatusConflict || slug != "lease-closed" {
		t.Errorf("re-admission after the call: %d %s, want 409 lease-closed", status, slug)
	}
}

// rawCall posts a tools/call with a token to the MCP endpoint at base, as
// is, with the given headers (Mcp-Session-Id …), and returns the answer.
func rawCall(t *testing.T, base, token string, header map[string]string, tool, args string) (int, string) {
	t.Helper()
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":%q,"arguments":%s}}`, tool, args)
	h := map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream", fencecheck.Header: token}
	maps.Copy(h, header)
	r := apitest.Do(t, http.MethodPost, base+"/mcp", "", h, []byte(body))
	return r.Status, string(r.Raw)
}

// TestTransportRefusalIsRejected: a tools/call with a genuine token that
// the MCP server (official Go SDK, stateful) refuses before any handler
// runs ran nothing: 404 for an unknown Mcp-Session-Id, 400 for an
// unsupported protocol version in a live session, a JSON-RPC error for a
// call without a session. The fence reports each rejected: the formation
// is rejected, not completed, its lease is closed, and the token is spent
// (refused as a replay at the same fence, lease_closed at another
// instance, each time in a live session). No effect.
func TestTransportRefusalIsRejected(t *testing.T) {
	_, fenceBin := buildBinaries(t)
	s := startStack(t, nil)
	snap := s.snapshot()
	sidecar := startSidecar(t, s, fenceBin, s.credFile(t), s.bareFixture(t, "v1.4", fixtures.Config{}))
	live := connectFence(t, s.Fixture[poolV14], nil).cs.ID()
	for _, tc := range []struct {
		note   string
		header map[string]string
		status int
		answer string
	}{
		{"unknown session", map[string]string{"Mcp-Session-Id": "no-such-session"}, http.StatusNotFound, "session not found"},
		{"unsupported protocol version", map[string]string{"Mcp-Session-Id": live, "Mcp-Protocol-Version": "1999-01-01"}, http.StatusBadRequest, "protocol version"},
		{"no session", nil, http.StatusOK, `"error"`},
	} {
		t.Run(tc.note, func(t *testing.T) {
			f := s.formRead(snap, "sess-transport-"+tc.note, "list_repositories", listArgs)
			a := s.admit(f)
			if code, body := rawCall(t, s.Fixture[poolV14], a.Token, tc.header, "list_repositories", listArgs); code != tc.status || !strings.Contains(body, tc.answer) {
				t.Fatalf("answered %d %s, want %d with %s", code, body, tc.status, tc.answer)
			}
			s.waitStatus(f.ID, "rejected")
			if st := s.leaseState(a.Lease); st != "" {
				t.Errorf("lease %s is still %s", a.Lease, st)
			}
			for _, replay := range []struct {
				base   string
				reason fencecheck.Reason
			}{{s.Fixture[poolV14], fencecheck.ReasonReplay}, {sidecar.URL, fencecheck.ReasonLeaseClosed}} {
				if _, code, err := connectFence(t, replay.base, nil).call(a.Token, "list_repositories", listArgs); !isRefusal(err, code, replay.reason) {
					t.Errorf("the token again, in a session: %d %v, want 403 %s", code, err, replay.reason)
				}
			}
			if es := s.Rec.Effects(fixtures.Filter{}); len(es) != 0 {
				t.Fatalf("effects %+v, want none", es)
			}
		})
	}
}

func isRefusal(err error, status int, want fencecheck.Reason) bool {
	got, ok := fixtures.RejectReason(err)
	return ok && got == want && status == http.StatusForbidden
}

// TestRequiresMetOnlyByEffect: delete_repository requires get_repository
// earlier in its session (github v1.4's manifest; no fixture manifest has
// another requires). In one session, get_repository is admitted and sent
// with an unknown Mcp-Session-Id, so the server ran nothing (404:
// rejected); then sent for a repository that does not exist, so it ran
// and failed (isError: failed). Neither meets the requirement: a
// delete_repository formed after each (by a repo admin, whom the policy
// lets delete) is denied by both policy engines for deny-requires-unmet,
// and its admission is refused 403 formation-denied. After a
// get_repository that ran and answered, delete_repository is formed,
// approved by two approvers, admitted and runs.
//
// The default policies refuse an unmet requirement at formation, so the
// admission transaction's own check (403 dependency-unmet) is never the
// first to see it here; authz's tests drive that one.
func TestRequiresMetOnlyByEffect(t *testing.T) {
	s := startStack(t, nil)
	snap := s.snapshot()
	const session = "sess-requires"
	const repo = `{"owner":"octo-org","repo":"hello-world"}`
	const admin = `["dev","repo-admins"]`
	c := connectFence(t, s.Fixture[poolV14], nil)
	unmet := func(after string) {
		t.Helper()
		del := s.formFor(snap, session, "delete_repository", repo, admin)
		if del.Status != "denied" || count(del.Rules, "deny-requires-unmet") != 2 {
			t.Fatalf("delete formed after %s: %+v, want denied for deny-requires-unmet by both engines", after, del)
		}
		_, err := s.as(api.RoleHost).AdmitFormationWithResponse(t.Context(), del.ID)
		s.refused("admitting the delete formed after "+after, err, http.StatusForbidden, "formation-denied")
	}

	never := s.formRead(snap, session, "get_repository", repo)
	if code, body := rawCall(t, s.Fixture[poolV14], s.admit(never).Token, map[string]string{"Mcp-Session-Id": "no-such-session"}, "get_repository", repo); code != http.StatusNotFound {
		t.Fatalf("get_repository with an unknown session: %d %s", code, body)
	}
	s.waitStatus(never.ID, "rejected")
	unmet("a get_repository that never ran")

	const missing = `{"owner":"octo-org","repo":"no-such-repo"}`
	failed := s.formRead(snap, session, "get_repository", missing)
	if res, _, err := c.call(s.admit(failed).Token, "get_repository", missing); err != nil || !res.IsError {
		t.Fatalf("get_repository of a missing repository: %v %+v, want a tool error", err, res)
	}
	s.waitStatus(failed.ID, "failed")
	unmet("a get_repository that failed")

	got := s.formRead(snap, session, "get_repository", repo)
	if res, _, err := c.call(s.admit(got).Token, "get_repository", repo); err != nil || res.IsError {
		t.Fatalf("get_repository: %v %+v", err, res)
	}
	s.waitStatus(got.ID, "completed")
	del := s.formFor(snap, session, "delete_repository", repo, admin)
	if del.Status != "pending_approval" {
		t.Fatalf("delete formed after get_repository ran: %+v, want pending_approval", del)
	}
	for _, approver := range []api.Secret{s.creds[api.RoleApprover], s.approver2} {
		s.approveAs(approver, del)
	}
	if res, _, err := c.call(s.admit(del).Token, "delete_repository", repo); err != nil || res.IsError {
		t.Fatalf("delete_repository after its requirement ran: %v %+v", err, res)
	}
	s.waitStatus(del.ID, "completed")
	var effects []string
	for _, e := range s.Rec.Effects(fixtures.Filter{}) {
		effects = append(effects, fmt.Sprintf("%s %s found=%v deleted=%v", e.Tool, e.Kind, e.Did["found"], e.Did["deleted"]))
	}
	want := []string{
		"get_repository read found=false deleted=<nil>",
		"get_repository read found=true deleted=<nil>",
		"delete_repository delete found=<nil> deleted=true",
	}
	if !slices.Equal(effects, want) {
		t.Errorf("effects %q, want %q", effects, want)
	}
}

func count(xs []string, x string) int {
	n := 0
	for _, y := range xs {
		if y == x {
			n++
		}
	}
	return n
}

// TestGatewayCallerBinding: through real nginx and Caddy, which
// authenticate their clients and name them to authzd in Fcd-Caller, a
// formation of alice's runs only for alice. Without credentials the
// gateway answers 401 and asks authzd nothing (the formation stays
// ready); bob — also when he sends Fcd-Caller: alice himself — is refused
// 403 caller-mismatch with no admission and no effect; alice's call runs
// once.
func TestGatewayCallerBinding(t *testing.T) {
	eachGateway(t, func(t *testing.T, kind string, s *stack) {
		f := s.formReady(s.snapshot(), "sess-identity", "identity-bound")
		gw := s.gateway(t, kind, nil)
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":{%q:%q},"name":"create_repository","arguments":{"name":"identity-bound"}}}`,
			gatewaytest.FormationMetaKey, f.ID)
		raw := func(user, password string, header map[string]string) (int, string) {
			req, _ := http.NewRequest(http.MethodPost, gw.URL+"/mcp", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			req.Header.Set(gatewaytest.FormationHeader, f.ID)
			for k, v := range header {
				req.Header.Set(k, v)
			}
			if user != "" {
				req.SetBasicAuth(user, password)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode, resp.Header.Get("Fcd-Problem")
		}
		for _, c := range []struct {
			note, user, password string
		}{{"no credentials", "", ""}, {"alice with a wrong password", "alice", "guess"}} {
			if status, problem := raw(c.user, c.password, map[string]string{"Fcd-Caller": "alice"}); status != http.StatusUnauthorized || problem != "" {
				t.Errorf("%s: %d %q, want the gateway's own 401", c.note, status, problem)
			}
		}
		if st := s.status(f.ID); st != "ready" {
			t.Fatalf("after unauthenticated calls the formation is %s, want ready (never admitted)", st)
		}

		if status, problem := raw("bob", gatewayUsers["bob"], map[string]string{"Fcd-Caller": "alice"}); status != http.StatusForbidden || problem != "caller-mismatch" {
			t.Errorf("bob claiming to be alice: %d %q, want 403 caller-mismatch", status, problem)
		}
		bob := connectHostAs(t, gw, "bob", nil)
		_, err := bob.call(f, "create_repository", fmt.Sprintf(createArgsFmt, "identity-bound"))
		refusedBy(t, bob, f, err, "caller-mismatch")
		if st := s.status(f.ID); st != "ready" {
			t.Fatalf("after bob's calls the formation is %s, want ready (never admitted)", st)
		}
		if es := s.Rec.Effects(fixtures.Filter{}); len(es) != 0 || s.hits[poolV14].Load() != 0 {
			t.Fatalf("effects %+v, %d tokens at v1.4, want none", es, s.hits[poolV14].Load())
		}

		mustRun(t, s, connectHost(t, gw), f, "identity-bound")
		s.waitStatus(f.ID, "completed")
	})
}
