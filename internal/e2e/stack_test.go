package e2e_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/audit"
	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/internal/fixtures"
	"github.com/fcd-authz/fcd/internal/gatewaytest"
	"github.com/fcd-authz/fcd/internal/manifesttest"
	"github.com/fcd-authz/fcd/internal/servertest"
	"github.com/fcd-authz/fcd/internal/telemetry"
	"github.com/fcd-authz/fcd/internal/testutil"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/server"
	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

const issuerName = "fcd-e2e"

// Pools of the two github releases.
const (
	poolV14 = "github-v1-4"
	poolV13 = "github-v1-3"
)

// The clients the gateways authenticate (HTTP basic authentication), by
// name: the gateway names the user to authzd in Fcd-Caller, and authzd
// admits a formation only for its principal. Calls are formed for alice.
var gatewayUsers = map[string]string{"alice": "alice-password", "bob": "bob-password"}

// stack is a real authzd (server.New, serving real HTTP, on a real embedded etcd,
// the embedded default policies, a published EdDSA signing key) with the
// github v1.4 and v1.3 manifests registered and signed, and the github
// v1.4 and v1.3 fixtures (official MCP Go SDK) each served over real HTTP
// behind the real fencecheck middleware (keys from authzd's JWKS, outcomes
// reported to authzd with a backend credential limited to the fixture's
// pool), all recording into one effect recorder. Nothing is a stand-in.
type stack struct {
	t     testing.TB
	URL   string // authzd
	creds map[api.Role]api.Secret
	// Rec records every effect of both fixtures.
	Rec *fixtures.Recorder
	// Fixture is the base URL (no path; MCP at /mcp) of each pool's
	// fixture.
	Fixture map[string]string
	// Epoch is the epoch id of each pool.
	Epoch map[string]string
	// tokens holds the last Fcd-Dispatch-Token seen arriving at each
	// fixture, by jti, as the upstream received it (observed before
	// fencecheck, never changed).
	mu     sync.Mutex
	tokens map[string]string
	// hits counts requests arriving at each pool's fixture carrying a
	// dispatch token.
	hits map[string]*atomic.Int64
	reps []*fencecheck.Reporter
	// issuerKey signs compatibility certificates; authzd trusts it.
	issuerKey jwk.Key
	// operatorKey signs resolutions of uncertain leases; authzd trusts it.
	operatorKey jwk.Key
	// registrar signs manifests; authzd trusts it.
	registrar *manifesttest.Signer
	// poolCreds are the backend credentials limited to each pool.
	poolCreds map[string]api.Secret
	// approver2 is a second approver's credential, for calls that need
	// two distinct approvers.
	approver2 api.Secret
	// tokenLifetime is the lifetime of the dispatch tokens authzd issues.
	tokenLifetime time.Duration
	// holdFn, if set, holds every fixture call before its effect
	// (fixtures.Config.Hold); see setHold.
	holdMu sync.Mutex
	holdFn func(ctx context.Context, tool string)
	failFn func(ctx context.Context, tool string) string
}

// fail is the fixtures' Config.Fail: it asks the function setFail set.
func (s *stack) fail(ctx context.Context, tool string) string {
	s.holdMu.Lock()
	f := s.failFn
	s.holdMu.Unlock()
	if f == nil {
		return ""
	}
	return f(ctx, tool)
}

// setFail makes every fixture call of the stack answer the declared error
// f returns, if any, instead of acting; nil stops it.
func (s *stack) setFail(f func(ctx context.Context, tool string) string) {
	s.holdMu.Lock()
	defer s.holdMu.Unlock()
	s.failFn = f
}

// hold is the fixtures' Config.Hold: it runs the function setHold set.
func (s *stack) hold(ctx context.Context, tool string) {
	s.holdMu.Lock()
	f := s.holdFn
	s.holdMu.Unlock()
	if f != nil {
		f(ctx, tool)
	}
}

// setHold makes every fixture call of the stack run f before its effect;
// nil stops holding.
func (s *stack) setHold(f func(ctx context.Context, tool string)) {
	s.holdMu.Lock()
	defer s.holdMu.Unlock()
	s.holdFn = f
}

// bareFixture serves the github fixture of release name unguarded (for a
// `fencecheck proxy` in front of it), recording into the stack's
// recorder and held by setHold; it returns its base URL.
func (s *stack) bareFixture(t *testing.T, name string, opts fixtures.Config) string {
	t.Helper()
	opts.Sink, opts.Hold = s.Rec, s.hold
	mux := http.NewServeMux()
	mux.Handle("/mcp", fixtures.MustNew("github", name, opts))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// stackOptions vary a stack; the zero value is the default stack.
type stackOptions struct {
	// TokenLifetime is the lifetime of dispatch tokens; zero means 30 s.
	TokenLifetime time.Duration
	// GatewayCaller is authzd's gateway caller binding; empty means the
	// default (principal).
	GatewayCaller string
	// OTLPEndpoint, when set, has authzd and both fences export their
	// traces there (the fences as `fencecheck proxy --otlp-endpoint`
	// does: a server span per request, the verifier's Tracer).
	OTLPEndpoint string
}

// prefixSeq gives each stack its own key prefix on a shared etcd member,
// hence its own registry, ledger and epochs.
var prefixSeq atomic.Int64

// startStack starts a stack on member (nil: a member of its own). Draining
// is one-way, so a test that drains needs a stack of its own; stacks on
// one member are cheap.
func startStack(t *testing.T, member *etcdtest.Member) *stack {
	t.Helper()
	return startStackWith(t, member, stackOptions{})
}

// eachGateway runs test once per gateway kind, as a subtest named by the
// kind, each on a stack of its own; the stacks share one etcd member.
func eachGateway(t *testing.T, test func(t *testing.T, kind string, s *stack)) {
	t.Helper()
	m := etcdtest.Start(t)
	for _, kind := range gatewaytest.Kinds {
		t.Run(kind, func(t *testing.T) { test(t, kind, startStack(t, m)) })
	}
}

// startStackWith is startStack with options.
func startStackWith(t *testing.T, member *etcdtest.Member, opts stackOptions) *stack {
	t.Helper()
	if opts.TokenLifetime == 0 {
		opts.TokenLifetime = 30 * time.Second
	}
	if member == nil {
		member = etcdtest.Start(t)
	}
	registrar := manifesttest.NewSigner(t)
	s := &stack{registrar: registrar, t: t, creds: map[api.Role]api.Secret{}, Rec: fixtures.NewRecorder(), Fixture: map[string]string{},
		Epoch: map[string]string{}, tokens: map[string]string{}, hits: map[string]*atomic.Int64{},
		poolCreds: map[string]api.Secret{}, tokenLifetime: opts.TokenLifetime}
	var stored []api.Credential
	for _, role := range api.Roles() {
		secret, cred, err := api.NewCredential(string(role), role)
		if err != nil {
			t.Fatal(err)
		}
		s.creds[role] = secret
		stored = append(stored, cred)
	}
	secret, cred, err := api.NewCredential("approver-2", api.RoleApprover)
	if err != nil {
		t.Fatal(err)
	}
	s.approver2 = secret
	stored = append(stored, cred)
	// Each pool's backend claims and reports with a credential limited to
	// its pool.
	poolCreds := s.poolCreds
	for _, pool := range []string{poolV13, poolV14} {
		secret, cred, err := api.NewCredential("backend-"+pool, api.RoleBackend)
		if err != nil {
			t.Fatal(err)
		}
		cred.Pools = []string{pool}
		poolCreds[pool] = secret
		stored = append(stored, cred)
	}
	auth, err := api.NewAuthenticator(stored)
	if err != nil {
		t.Fatal(err)
	}
	issuer := manifesttest.NewSigner(t)
	s.issuerKey = issuer.Key
	// Operators resolve uncertain leases with signed documents only.
	operator := manifesttest.NewSigner(t)
	s.operatorKey = operator.Key
	log := slog.New(slog.DiscardHandler)
	sigKey, err := manifest.GenerateKey(jwa.EdDSA)
	if err != nil {
		t.Fatal(err)
	}
	// Every stack keeps an audit trail; when the test ends and the server
	// closed it, the trail of its run must verify clean: every chain
	// intact, every property held.
	trailRoot := t.TempDir()
	t.Cleanup(func() { verifyTrail(t, trailRoot, sigKey, s.operatorKey) })
	// The server that ships, on the stack's own prefix of member. The
	// formation rate limit is off: a test forms calls for one host faster
	// than a host may (the limit has its own tests in api and cmd/authzd).
	srv := servertest.Start(t, server.Config{
		EtcdEndpoints: member.Endpoints(), EtcdPrefix: fmt.Sprintf("/e2e/%d/", prefixSeq.Add(1)), EtcdQuota: member.Quota(),
		FormationRate: server.NoFormationLimit,
		Registrars:    registrar.Verifier, Issuers: issuer.Verifier, Operators: operator.Verifier, Auth: auth,
		Signer: sigKey, Issuer: issuerName, TokenLifetime: opts.TokenLifetime,
		AuditDir: trailRoot, Replica: "e2e", Logger: log, GatewayCaller: opts.GatewayCaller,
		OTLPEndpoint: opts.OTLPEndpoint,
	})
	var fenceTraces *telemetry.Provider
	if opts.OTLPEndpoint != "" {
		if fenceTraces, err = telemetry.New(context.Background(), telemetry.Config{Endpoint: opts.OTLPEndpoint, Service: "fencecheck"}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = fenceTraces.Shutdown(context.Background()) })
	}
	s.URL = srv.URL()
	// Before the server closes it, the trail (which follows the store's
	// history, docs/audit.md) catches up with every commit of the run.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		rev, err := srv.Store().Revision(ctx)
		if err == nil {
			err = srv.Follower().WaitRecorded(ctx, rev)
		}
		if err != nil {
			t.Errorf("the audit trail did not catch up with the store: %v", err)
		}
	})

	// v1.3 first, then v1.4: both ACTIVE, snapshots take v1.4.
	for _, name := range []string{"v1.3", "v1.4"} {
		rel, err := fixtures.Lookup("github", name)
		if err != nil {
			t.Fatal(err)
		}
		jws, err := manifest.Sign(rel.ManifestJSON(), registrar.Key, manifest.TypManifest)
		if err != nil {
			t.Fatal(err)
		}
		s.Epoch[rel.Pool] = s.registerManifest(jws)

		rep, err := fencecheck.NewReporter(fencecheck.ReporterConfig{AuthzdURL: s.URL, Credential: string(poolCreds[rel.Pool]), Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		s.reps = append(s.reps, rep)
		// Online: each call's lease is claimed at authzd before the effect.
		claimer, err := fencecheck.NewLeaseClient(fencecheck.LeaseClientConfig{AuthzdURL: s.URL, Credential: string(poolCreds[rel.Pool])})
		if err != nil {
			t.Fatal(err)
		}
		v := rel.Verifier(0)
		v.Issuer, v.JWKSURL, v.Claimer = issuerName, s.URL+"/.well-known/jwks.json", claimer
		if err := v.Validate(); err != nil {
			t.Fatal(err)
		}
		fx := fixtures.MustNew("github", name, fixtures.Config{Sink: s.Rec, Logger: log, Hold: s.hold, Fail: s.fail})
		if fenceTraces != nil {
			v.Tracer = telemetry.FenceTracer(fenceTraces)
		}
		guarded := v.Middleware(fx, fencecheck.MiddlewareConfig{Server: "github", Reporter: rep, Timeout: 10 * time.Second, Logger: log})
		if fenceTraces != nil {
			guarded = telemetry.Handler(guarded, telemetry.HandlerConfig{Provider: fenceTraces, Scope: "e2e"})
		}
		hits := &atomic.Int64{}
		s.hits[rel.Pool] = hits
		mux := http.NewServeMux()
		mux.Handle("/mcp", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if tok := r.Header.Get(fencecheck.Header); tok != "" {
				hits.Add(1)
				s.mu.Lock()
				s.tokens[jtiOf(tok)] = tok
				s.mu.Unlock()
			}
			guarded.ServeHTTP(w, r)
		}))
		fsrv := httptest.NewServer(mux)
		t.Cleanup(fsrv.Close)
		s.Fixture[rel.Pool] = fsrv.URL
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, r := range s.reps {
			_ = r.Close(ctx)
		}
	})
	return s
}

// verifyTrail requires audit verify's report over a stack's trail, once
// its server closed it, to be clean.
func verifyTrail(t *testing.T, root string, key, operatorKey jwk.Key) {
	t.Helper()
	keys, err := manifest.PublicSet(key)
	if err != nil {
		t.Fatal(err)
	}
	// authzd requires signed resolutions here: each one the trail keeps
	// must verify again against the operator's key.
	operators, err := manifest.PublicSet(operatorKey)
	if err != nil {
		t.Fatal(err)
	}
	r, err := audit.VerifyConfig{Keys: keys, OperatorKeys: operators}.Verify(root)
	if err != nil {
		t.Errorf("audit verify: %v", err)
		return
	}
	if !r.OK {
		t.Errorf("the audit trail of the run does not verify:\n%s", r.Summary())
	}
	// At least the two manifests and the policy set are in it.
	if len(r.Chains) != 1 || r.Chains[0].Events < 3 {
		t.Errorf("the audit trail of the run holds %+v", r.Chains)
	}
}

func jtiOf(token string) string {
	var c fencecheck.Claims
	if b := bytes.Split([]byte(token), []byte(".")); len(b) == 3 {
		if p, err := base64.RawURLEncoding.DecodeString(string(b[1])); err == nil {
			_ = json.Unmarshal(p, &c)
		}
	}
	return c.ID
}

// token returns the dispatch token of lease jti as it reached a fixture.
func (s *stack) token(jti string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tokens[jti]
}

// as is a typed client of authzd with role's credential.
func (s *stack) as(role api.Role) *client.ClientWithResponses {
	s.t.Helper()
	return s.with(s.creds[role])
}

// with is a typed client of authzd with the credential secret ("" for
// none): a second approver's, or a backend credential limited to a pool.
func (s *stack) with(secret api.Secret) *client.ClientWithResponses {
	s.t.Helper()
	c, err := client.New(s.URL, string(secret))
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// problem returns the problem authzd answered instead of what was called;
// it fails the test when the call succeeded or failed otherwise (the
// connection, a body the client could not read).
func (s *stack) problem(what string, err error) *client.Problem {
	s.t.Helper()
	var p *client.Problem
	if !errors.As(err, &p) {
		s.t.Fatalf("%s: %v, want a problem answer of authzd", what, err)
	}
	return p
}

// refused fails the test unless err is authzd's answer of status with the
// problem slug, and returns that problem.
func (s *stack) refused(what string, err error, status int, slug string) *client.Problem {
	s.t.Helper()
	p := s.problem(what, err)
	if p.Status != status || p.Slug() != slug {
		s.t.Fatalf("%s: %v, want %d %s", what, p, status, slug)
	}
	return p
}

// must fails the test on err, naming what was called.
func (s *stack) must(what string, err error) {
	s.t.Helper()
	if err != nil {
		s.t.Fatalf("%s: %v", what, err)
	}
}

// registerManifest registers a signed manifest as the registrar and
// returns its epoch id; the manifest must be new (201).
func (s *stack) registerManifest(jws []byte) string {
	s.t.Helper()
	r, err := s.as(api.RoleRegistrar).RegisterManifestWithBodyWithResponse(s.t.Context(), "application/jose", bytes.NewReader(jws))
	s.must("register the manifest", err)
	if r.JSON201 == nil {
		s.t.Fatalf("register the manifest: %d %s, want 201", r.StatusCode(), r.Body)
	}
	return r.JSON201.Epoch
}

// registerCertificate registers a signed compatibility certificate as the
// registrar and returns its id; the certificate must be new (201).
func (s *stack) registerCertificate(jws []byte) string {
	s.t.Helper()
	r, err := s.as(api.RoleRegistrar).RegisterCertificateWithBodyWithResponse(s.t.Context(), "application/jose", bytes.NewReader(jws))
	s.must("register the certificate", err)
	if r.JSON201 == nil {
		s.t.Fatalf("register the certificate: %d %s, want 201", r.StatusCode(), r.Body)
	}
	return r.JSON201.Id
}

// snapshot takes a snapshot of the github server as the host.
func (s *stack) snapshot() string {
	s.t.Helper()
	return s.snapshotOf("github")
}

// snapshotOf takes a snapshot of the servers as the host.
func (s *stack) snapshotOf(servers ...string) string {
	s.t.Helper()
	r, err := s.as(api.RoleHost).CreateSnapshotWithResponse(s.t.Context(), client.SnapshotRequest{Servers: &servers})
	s.must("snapshot", err)
	if r.JSON201 == nil {
		s.t.Fatalf("snapshot: %d %s, want 201", r.StatusCode(), r.Body)
	}
	return r.JSON201.Id
}

type formation struct {
	ID, Status, Digest, Pool string
	// Rules are the rules each policy engine decided by, engine after
	// engine.
	Rules []string
	// Successor is the pool of the successor captured at formation, if
	// any, and Certificate the certificate that gave it.
	Successor, Certificate string
}

// form forms a github call as the host, for principal alice (group dev).
func (s *stack) form(snapshot, session, tool, args string) formation {
	s.t.Helper()
	return s.formFor(snapshot, session, tool, args, `["dev"]`)
}

// formFor forms a github call as the host, for principal alice in the
// groups (a JSON array).
func (s *stack) formFor(snapshot, session, tool, args, groups string) formation {
	s.t.Helper()
	var inGroups []any
	if err := json.Unmarshal([]byte(groups), &inGroups); err != nil {
		s.t.Fatalf("groups %s: %v", groups, err)
	}
	r, err := s.as(api.RoleHost).CreateFormationWithResponse(s.t.Context(), client.FormationRequest{
		Snapshot: snapshot, Session: session, Tool: "github/" + tool, Arguments: object(s.t, args),
		Principal: &client.FormationRequest_Principal{Id: ptr("alice"), Attributes: &map[string]any{"groups": inGroups}},
	})
	s.must("form", err)
	rec := r.JSON201
	if rec == nil { // a denied call is recorded and answered 403 with its record
		rec = r.JSON403
	}
	if rec == nil {
		s.t.Fatalf("formation answered %d: %s", r.StatusCode(), r.Body)
	}
	return formationFrom(rec)
}

// formationFrom is what the tests read of a formation's record.
func formationFrom(rec *client.Formation) formation {
	f := formation{ID: rec.Id, Status: string(rec.Status), Digest: rec.Digest, Pool: rec.Source.Pool}
	for _, e := range rec.Decision.Engines {
		f.Rules = append(f.Rules, e.Rules...)
	}
	if rec.Successor != nil {
		f.Successor, f.Certificate = rec.Successor.Pool, rec.Successor.Certificate
	}
	return f
}

// create forms a call as the host with req and returns its record; the
// call must be formed (201), not denied.
func (s *stack) create(req client.FormationRequest) *client.Formation {
	s.t.Helper()
	r, err := s.as(api.RoleHost).CreateFormationWithResponse(s.t.Context(), req)
	s.must("form "+req.Tool, err)
	if r.JSON201 == nil {
		s.t.Fatalf("form %s: %d %s, want 201", req.Tool, r.StatusCode(), r.Body)
	}
	return r.JSON201
}

// object decodes a JSON object written in a test (a tool's arguments, as
// the MCP hosts send them too) for a request of the typed client.
func object(t testing.TB, doc string) *map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(doc), &m); err != nil {
		t.Fatalf("%s: %v", doc, err)
	}
	return &m
}

func ptr[T any](v T) *T { return &v }

// approve approves a formation as the approver, over REST.
func (s *stack) approve(f formation) {
	s.t.Helper()
	if st := s.approveAs(s.creds[api.RoleApprover], f); st != client.FormationStatusReady {
		s.t.Fatalf("after approval the formation is %s, want ready", st)
	}
}

// approveAs approves a formation with an approver's credential and
// returns the formation's status after it (one approval of several leaves
// it pending_approval).
func (s *stack) approveAs(approver api.Secret, f formation) client.FormationStatus {
	s.t.Helper()
	r, err := s.with(approver).ApproveFormationWithResponse(s.t.Context(), f.ID,
		client.ApprovalRequest{Decision: client.ApprovalRequestDecisionApprove, Digest: f.Digest, Reason: ptr("e2e")})
	s.must("approve", err)
	if r.JSON200 == nil {
		s.t.Fatalf("approve: %d %s, want 200", r.StatusCode(), r.Body)
	}
	return r.JSON200.Status
}

// formReady forms create_repository {name} (private omitted) and approves
// it: a ready write formed on v1.4.
func (s *stack) formReady(snapshot, session, name string) formation {
	s.t.Helper()
	f := s.form(snapshot, session, "create_repository", fmt.Sprintf(`{"name":%q}`, name))
	if f.Status != "pending_approval" || f.Pool != poolV14 {
		s.t.Fatalf("write formation %+v: want pending_approval on %s", f, poolV14)
	}
	s.approve(f)
	return f
}

// certify registers, as the registrar, a compatibility certificate signed
// by the trusted issuer: github v1.4 → v1.3, create_repository, with the
// envelope and modeled effects of examples/github/certificate-v1.4-to-v1.3.json
// (private must be present and true; the effect is private). It returns
// the certificate id.
func (s *stack) certify() string {
	s.t.Helper()
	raw, err := os.ReadFile("../../examples/github/certificate-v1.4-to-v1.3.json")
	if err != nil {
		s.t.Fatal(err)
	}
	c, err := manifest.DecodeCertificate(raw)
	if err != nil {
		s.t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Second)
	c.Source, c.Target = s.Epoch[poolV14], s.Epoch[poolV13]
	c.IssuedAt, c.ExpiresAt = now.Add(-time.Minute), now.Add(time.Hour)
	doc, err := json.Marshal(c)
	if err != nil {
		s.t.Fatal(err)
	}
	jws, err := manifest.Sign(doc, s.issuerKey, manifest.TypCertificate)
	if err != nil {
		s.t.Fatal(err)
	}
	return s.registerCertificate(jws)
}

// retire drains and retires a pool's epoch as the operator.
func (s *stack) retire(pool string) {
	s.t.Helper()
	s.drain(pool)
	s.retireDrained(pool)
}

// retireDrained retires a drained pool's epoch as the operator.
func (s *stack) retireDrained(pool string) {
	s.t.Helper()
	r, err := s.as(api.RoleOperator).RetireEpochWithResponse(s.t.Context(), s.Epoch[pool], nil)
	s.must("retire", err)
	if r.JSON200 == nil || r.JSON200.State != client.EpochStateSTALE {
		s.t.Fatalf("retire: %s", r.Body)
	}
}

// drain drains a pool's epoch as the operator.
func (s *stack) drain(pool string) {
	s.t.Helper()
	r, err := s.as(api.RoleOperator).DrainEpochWithResponse(s.t.Context(), s.Epoch[pool])
	s.must("drain", err)
	if r.JSON200 == nil {
		s.t.Fatalf("drain: %d %s, want 200", r.StatusCode(), r.Body)
	}
}

// record returns a formation's record as the host reads it.
func (s *stack) record(id string) *client.Formation {
	s.t.Helper()
	r, err := s.as(api.RoleHost).GetFormationWithResponse(s.t.Context(), id)
	s.must("read formation "+id, err)
	if r.JSON200 == nil {
		s.t.Fatalf("read formation %s: %d %s, want 200", id, r.StatusCode(), r.Body)
	}
	return r.JSON200
}

// status returns a formation's status.
func (s *stack) status(id string) string {
	s.t.Helper()
	return string(s.record(id).Status)
}

// waitStatus waits until a formation has the status (fencecheck reports
// outcomes asynchronously).
func (s *stack) waitStatus(id, want string) {
	s.t.Helper()
	var got string
	testutil.EventuallyState(s.t, 10*time.Second, "formation "+id+" to be "+want, func() bool { got = s.status(id); return got == want },
		func() string { return got })
}

// gateway starts a gateway of kind in front of the stack; pools maps each
// pool authzd may name to the fixture pool it is routed to (nil: each to
// its own), and session traffic goes to whatever github-v1-4 is routed to.
func (s *stack) gateway(t *testing.T, kind string, route map[string]string) *gatewaytest.Gateway {
	t.Helper()
	pools := map[string]string{}
	for pool, url := range s.Fixture {
		pools[pool] = url
	}
	for from, to := range route {
		pools[from] = s.Fixture[to]
	}
	return gatewaytest.Start(t, kind, gatewaytest.Config{
		Authzd: s.URL, Credential: string(s.creds[api.RoleGateway]), Pools: pools, Default: poolV14,
		Users: gatewayUsers,
	})
}

// answer is what the host saw for one tools/call POST.
type answer struct {
	Status  int
	Problem string // Fcd-Problem
	Reason  fencecheck.Reason
}

// host is the MCP host: the official SDK client connected through a
// gateway, putting each call's formation id in params._meta (and, through
// gatewaytest.FormationTransport, in the Fcd-Formation header).
//
// The SDK client (v1.8.0) ends its session when a tools/call POST is
// answered with an HTTP error whose body is not JSON-RPC, which is what a
// gateway's refusal is (nginx's and Caddy's 403 problem+json); only
// fencecheck's refusals (a JSON-RPC error) leave it usable. So after such
// a refusal the host connects again, as a real host must.
type host struct {
	t  *testing.T
	gw *gatewaytest.Gateway
	// user is who the host authenticates to the gateway as.
	user string
	// tamper, if set, rewrites the body of each tools/call POST: an
	// attacker's host.
	tamper func(body []byte) []byte
	mu     sync.Mutex
	cs     *mcp.ClientSession
	// answers by formation id, in order.
	answers map[string][]answer
}

// connectHost connects an MCP host through gw, authenticated as alice.
func connectHost(t *testing.T, gw *gatewaytest.Gateway) *host {
	t.Helper()
	return connectHostAs(t, gw, "alice", nil)
}

// connectHostAs connects an MCP host through gw, authenticated as user,
// rewriting each tools/call body with tamper if it is not nil.
func connectHostAs(t *testing.T, gw *gatewaytest.Gateway, user string, tamper func([]byte) []byte) *host {
	t.Helper()
	h := &host{t: t, gw: gw, user: user, tamper: tamper, answers: map[string][]answer{}}
	h.cs = h.connect()
	t.Cleanup(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.cs.Close()
	})
	return h
}

func (h *host) connect() *mcp.ClientSession {
	h.t.Helper()
	tap := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if h.tamper != nil && req.Header.Get(gatewaytest.FormationHeader) != "" {
			req = tamperedRequest(h.t, req, h.tamper)
		}
		resp, err := http.DefaultTransport.RoundTrip(req)
		if id := req.Header.Get(gatewaytest.FormationHeader); id != "" && err == nil {
			h.mu.Lock()
			h.answers[id] = append(h.answers[id], answer{resp.StatusCode, resp.Header.Get("Fcd-Problem"), fencecheck.Reason(refusalOf(resp))})
			h.mu.Unlock()
		}
		return resp, err
	})
	tr := &mcp.StreamableClientTransport{
		Endpoint:             h.gw.URL + "/mcp",
		HTTPClient:           &http.Client{Transport: gatewaytest.FormationTransport(gatewaytest.BasicAuth(tap, h.user, gatewayUsers[h.user]))},
		DisableStandaloneSSE: true,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "fcd-e2e-host", Version: "0"}, nil).Connect(ctx, tr, nil)
	if err != nil {
		h.t.Fatalf("connect through %s: %v", h.gw.Kind, err)
	}
	return cs
}

// call sends tools/call of a formed call through the gateway. Not for
// concurrent use: give each concurrent caller a host of its own.
func (h *host) call(f formation, tool, args string) (*mcp.CallToolResult, error) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	h.mu.Lock()
	cs := h.cs
	h.mu.Unlock()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{
		Name: tool, Arguments: json.RawMessage(args),
		Meta: mcp.Meta{gatewaytest.FormationMetaKey: f.ID},
	})
	if _, fenced := fixtures.RejectReason(err); err != nil && !fenced {
		cs.Close()
		ncs := h.connect()
		h.mu.Lock()
		h.cs = ncs
		h.mu.Unlock()
	}
	return res, err
}

// last is the last answer the host saw for a formation.
func (h *host) last(id string) answer {
	h.mu.Lock()
	defer h.mu.Unlock()
	as := h.answers[id]
	if len(as) == 0 {
		return answer{}
	}
	return as[len(as)-1]
}

// tamperedRequest returns a copy of req whose body is tamper(body).
func tamperedRequest(t *testing.T, req *http.Request, tamper func([]byte) []byte) *http.Request {
	body, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		t.Errorf("tamper: %v", err)
	}
	body = tamper(body)
	out := req.Clone(req.Context())
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.ContentLength = int64(len(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return out
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// effects returns the effects of the named repository.
func effectsOf(rec *fixtures.Recorder, repo string) []fixtures.Effect {
	var out []fixtures.Effect
	for _, e := range rec.Effects(fixtures.Filter{Tool: "create_repository"}) {
		if e.Did["repository"] == fixtures.GitHubAccount+"/"+repo {
			out = append(out, e)
		}
	}
	return out
}

// noDrift fails the test on any effect not private on v1.4.
func noDrift(t *testing.T, rec *fixtures.Recorder) {
	t.Helper()
	for _, e := range rec.Effects(fixtures.Filter{}) {
		if e.Release != "v1.4" || (e.Tool == "create_repository" && e.Did["visibility"] != "private") {
			t.Errorf("drifted effect: %+v", e)
		}
	}
}
