package authz_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/authz/policy"
	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/internal/authztest"
	"github.com/fcd-authz/fcd/internal/testutil"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
	"github.com/lestrrat-go/jwx/v2/jws"
)

// admitEnv is env with admission: a real signing key published in etcd.
type admitEnv struct {
	*env
	key jwk.Key
	iss *authz.TokenIssuer
}

func newAdmitEnv(t testing.TB, decider authz.Decider) *admitEnv {
	t.Helper()
	return newAdmitEnvAlg(t, decider, jwa.EdDSA)
}

func newAdmitEnvAlg(t testing.TB, decider authz.Decider, alg jwa.SignatureAlgorithm) *admitEnv {
	t.Helper()
	e := newEnv(t, nil, nil)
	key, iss := newIssuer(t, e.store, alg)
	if decider == nil {
		decider = defaultSet(t)
	}
	e.forms = authztest.New(t, authz.Config{Store: e.store, Decider: decider, Now: e.clock.Now, Issuer: iss, Logger: quiet})
	return &admitEnv{env: e, key: key, iss: iss}
}

// newIssuer returns a token issuer with a fresh key of alg, publishing it
// in store until the test ends, once it is published.
func newIssuer(t testing.TB, store *lease.Store, alg jwa.SignatureAlgorithm) (jwk.Key, *authz.TokenIssuer) {
	t.Helper()
	key, err := manifest.GenerateKey(alg)
	if err != nil {
		t.Fatal(err)
	}
	iss, err := authz.NewTokenIssuer(authz.TokenIssuerConfig{Key: key, Issuer: "fcd-test", Lifetime: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { iss.Publish(ctx, store); close(stopped) }()
	// Cleanups run last in, first out: the publisher stops before the
	// store it publishes in is closed.
	t.Cleanup(func() { cancel(); <-stopped })
	testutil.Eventually(t, 30*time.Second, "the signing key to be published", iss.Published)
	return key, iss
}

// claims verifies a token's signature with the published key and returns
// its claims.
func (e *admitEnv) claims(t *testing.T, tok string) fencecheck.Claims {
	t.Helper()
	pub, _ := e.key.PublicKey()
	payload, err := jws.Verify([]byte(tok), jws.WithKey(e.key.Algorithm(), pub))
	if err != nil {
		t.Fatalf("token does not verify: %v", err)
	}
	msg, _ := jws.Parse([]byte(tok))
	if h := msg.Signatures()[0].ProtectedHeaders(); h.Type() != fencecheck.TokenType || h.KeyID() != e.key.KeyID() {
		t.Fatalf("token header typ %q kid %q", h.Type(), h.KeyID())
	}
	var c fencecheck.Claims
	if err := json.Unmarshal(payload, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

func (e *admitEnv) ready(t *testing.T, session, tool, args string, attrs map[string]any, approvers ...string) *record.Formation {
	t.Helper()
	f, err := e.form(t, session, tool, args, "alice", attrs)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range approvers {
		if f, err = approve(e.env, f, a, "approve"); err != nil {
			t.Fatal(err)
		}
	}
	if f.Status != record.StatusReady {
		t.Fatalf("%s not ready: %s (%+v)", tool, f.Status, f.Decision)
	}
	return f
}

// claimRequest is the claim a backend makes for a's lease before the
// effect, under claim: the token's jti, fcd_epoch and fcd_revision.
func (e *admitEnv) claimRequest(t *testing.T, a *authz.Grant, claim string) authz.ClaimRequest {
	t.Helper()
	c := e.claims(t, a.Token)
	if c.ID != a.Lease || c.Epoch != a.Target.Epoch || c.Revision <= 0 {
		t.Fatalf("token claims %+v for admission %+v", c, a)
	}
	return authz.ClaimRequest{Lease: a.Lease, Epoch: c.Epoch, Revision: c.Revision, Claim: claim}
}

// claim claims a's lease under claim, as a backend does before the effect.
func (e *admitEnv) claim(t *testing.T, a *authz.Grant, claim string) (*record.Claim, error) {
	t.Helper()
	return e.forms.Leases.Claim(context.Background(), e.claimRequest(t, a, claim))
}

// mustClaim claims a's lease under a claim id of its own and returns it.
func (e *admitEnv) mustClaim(t *testing.T, a *authz.Grant) string {
	t.Helper()
	id := "cl_" + a.Lease
	if _, err := e.claim(t, a, id); err != nil {
		t.Fatalf("claim of %s: %v", a.Lease, err)
	}
	return id
}

// report claims a's lease and reports outcome under the claim, as a
// backend whose call ran does; it returns the claim id.
func (e *admitEnv) report(t *testing.T, a *authz.Grant, outcome record.Outcome) string {
	t.Helper()
	id := e.mustClaim(t, a)
	if _, err := e.forms.Leases.Complete(context.Background(), authz.CompleteRequest{Lease: a.Lease, Outcome: outcome, Claim: id}); err != nil {
		t.Fatalf("%s outcome of %s: %v", outcome, a.Lease, err)
	}
	return id
}

// complete reports outcome for lease under claim.
func (e *admitEnv) complete(lease, claim string, outcome record.Outcome) (*record.Lease, error) {
	return e.forms.Leases.Complete(context.Background(), authz.CompleteRequest{Lease: lease, Outcome: outcome, Claim: claim, Detail: "test"})
}

func TestAdmitIssuesBoundTokenOnce(t *testing.T) {
	e := newAdmitEnv(t, nil)
	ctx := context.Background()
	f := e.ready(t, "s1", "github/get_repository", `{"owner":"octo","repo":"demo"}`, nil)
	a, err := e.forms.Admissions.Admit(ctx, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	c := e.claims(t, a.Token)
	want, _ := fencecheck.ArgumentDigest("github/get_repository", json.RawMessage(`{"repo":"demo","owner":"octo"}`))
	switch {
	case c.ID != a.Lease, c.Audience != "github-v1-4", c.Subject != "s1", c.Formation != f.ID,
		c.Tool != "github/get_repository", c.ArgumentDigest != want, c.Epoch != f.Source.Epoch,
		c.Artifact != f.Source.Artifact.Digest, c.Config != f.Source.ConfigDigest, c.Issuer != "fcd-test",
		c.Revision <= 0, c.Cluster == "", c.Expiry-c.IssuedAt != 30, a.Target.Pool != "github-v1-4":
		t.Fatalf("claims %+v, admission %+v", c, a)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	got, _ := e.forms.Formations.Get(ctx, f.ID)
	if got.Status != record.StatusAdmitted || got.Lease != a.Lease {
		t.Fatalf("formation after admission: %s lease %s", got.Status, got.Lease)
	}

	// Admitting again while the lease is open: same lease, same jti, same
	// fencing revision; never a second lease.
	e.clock.Advance(5 * time.Second)
	again, err := e.forms.Admissions.Admit(ctx, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	c2 := e.claims(t, again.Token)
	if again.Lease != a.Lease || c2.ID != c.ID || c2.Revision != c.Revision || c2.IssuedAt == c.IssuedAt {
		t.Fatalf("re-admission: %+v vs %+v", c2, c)
	}
	ep, _ := e.store.GetEpoch(ctx, f.Source.Epoch)
	if ep.ActiveLeases != 1 {
		t.Fatalf("%d markers after two admissions of one formation", ep.ActiveLeases)
	}

	// Completing (under the backend's claim) releases the lease; a closed
	// lease is not re-admitted.
	claim := e.report(t, a, record.OutcomeEffect)
	if _, err := e.forms.Admissions.Admit(ctx, f.ID); !errors.Is(err, record.ErrLeaseClosed) {
		t.Fatalf("admission after completion: %v", err)
	}
	if _, err := e.complete(a.Lease, claim, record.OutcomeEffect); !errors.Is(err, record.ErrLeaseClosed) {
		t.Fatalf("second completion: %v", err)
	}
	if _, err := e.complete("ls_nope", claim, record.OutcomeEffect); !errors.Is(err, record.ErrLeaseNotFound) {
		t.Fatalf("unknown lease: %v", err)
	}
	if got, _ := e.forms.Formations.Get(ctx, f.ID); got.Status != record.StatusCompleted {
		t.Fatalf("formation after effect: %s", got.Status)
	}
}

func TestAdmitRefusals(t *testing.T) {
	e := newAdmitEnv(t, nil)
	ctx := context.Background()
	pending, _ := e.form(t, "s", "github/create_repository", `{"name":"a"}`, "alice", nil)
	denied, _ := e.form(t, "s", "github/delete_repository", `{"owner":"o","repo":"r"}`, "alice", nil)
	expiring := e.ready(t, "s", "github/get_repository", `{"owner":"o","repo":"x"}`, nil)
	for _, tc := range []struct {
		note string
		id   string
		want error
	}{
		{"pending approval", pending.ID, authz.ErrNotApproved},
		{"denied", denied.ID, authz.ErrFormationDenied},
		{"unknown", "fm_nope", record.ErrFormationNotFound},
	} {
		if _, err := e.forms.Admissions.Admit(ctx, tc.id); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.note, err, tc.want)
		}
	}
	e.clock.Advance(16 * time.Minute)
	if _, err := e.forms.Admissions.Admit(ctx, expiring.ID); !errors.Is(err, authz.ErrExpired) {
		t.Errorf("expired: %v", err)
	}
}

func TestAdmitAgainstLifecycle(t *testing.T) {
	e := newAdmitEnv(t, nil)
	ctx := context.Background()
	f1 := e.ready(t, "s", "github/get_repository", `{"owner":"o","repo":"1"}`, nil)
	f2 := e.ready(t, "s", "github/get_repository", `{"owner":"o","repo":"2"}`, nil)
	f3 := e.ready(t, "s", "github/get_repository", `{"owner":"o","repo":"3"}`, nil)
	a1, err := e.forms.Admissions.Admit(ctx, f1.ID)
	if err != nil {
		t.Fatal(err)
	}
	epoch := f1.Source.Epoch
	if _, err := e.store.Drain(ctx, epoch); err != nil {
		t.Fatal(err)
	}
	// A draining source never substitutes: 409, and nothing is admitted.
	if _, err := e.forms.Admissions.Admit(ctx, f2.ID); !errors.Is(err, authz.ErrSourceDraining) {
		t.Fatalf("admit on draining: %v", err)
	}
	// The open lease holds retirement back; an uncertain outcome keeps it.
	if _, err := e.store.Retire(ctx, epoch, 0); !isBlocked(err, 1, 0) {
		t.Fatalf("retire with an open lease: %v", err)
	}
	claim := e.report(t, a1, record.OutcomeUncertain)
	if _, err := e.store.Retire(ctx, epoch, 0); !isBlocked(err, 0, 1) {
		t.Fatalf("retire with an uncertain lease: %v", err)
	}
	if _, err := e.forms.Admissions.Admit(ctx, f1.ID); !errors.Is(err, record.ErrLeaseUncertain) {
		t.Fatalf("re-admission of an uncertain call: %v", err)
	}
	if _, err := e.complete(a1.Lease, claim, record.OutcomeEffect); !errors.Is(err, record.ErrLeaseUncertain) {
		t.Fatalf("backend completion of an uncertain lease: %v", err)
	}
	if _, err := e.forms.Leases.Resolve(ctx, "ops", a1.Lease, record.OutcomeNoEffect, "checked the backend"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.forms.Leases.Resolve(ctx, "ops", a1.Lease, record.OutcomeNoEffect, "again"); !errors.Is(err, record.ErrLeaseClosed) {
		t.Fatalf("second resolution: %v", err)
	}
	if st, err := e.store.Retire(ctx, epoch, 0); err != nil || st != record.StateStale {
		t.Fatalf("retire after resolution: %s %v", st, err)
	}
	// STALE, and no successor was captured: 410.
	if _, err := e.forms.Admissions.Admit(ctx, f3.ID); !errors.Is(err, authz.ErrSourceStale) {
		t.Fatalf("admit on stale: %v", err)
	}
}

func isBlocked(err error, active, uncertain int) bool {
	var rb *record.RetireBlockedError
	return errors.As(err, &rb) && rb.Active == active && rb.Uncertain == uncertain
}

func TestNewerGenerationReleasesUncertainLeases(t *testing.T) {
	e := newAdmitEnv(t, nil)
	ctx := context.Background()
	f := e.ready(t, "s", "github/get_repository", `{"owner":"o","repo":"1"}`, nil)
	a, err := e.forms.Admissions.Admit(ctx, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	if c := e.claims(t, a.Token); c.Generation != 0 {
		t.Fatalf("generation %d before any was recorded", c.Generation)
	}
	e.report(t, a, record.OutcomeUncertain)
	released, err := e.forms.Leases.SetGeneration(ctx, "ops", "github-v1-4", 2)
	if err != nil || len(released) != 1 || released[0] != a.Lease {
		t.Fatalf("generation 2 released %v, %v", released, err)
	}
	if again, err := e.forms.Leases.SetGeneration(ctx, "ops", "github-v1-4", 2); err != nil || len(again) != 0 {
		t.Fatalf("same generation again (finishing a release) = %v, %v", again, err)
	}
	if _, err := e.forms.Leases.SetGeneration(ctx, "ops", "github-v1-4", 1); !errors.Is(err, record.ErrStaleGeneration) {
		t.Fatalf("older generation: %v", err)
	}
	ep, _ := e.store.GetEpoch(ctx, f.Source.Epoch)
	if ep.UncertainLeases != 0 || ep.ActiveLeases != 0 {
		t.Fatalf("markers after release: %d/%d", ep.ActiveLeases, ep.UncertainLeases)
	}
	// New admissions carry the new generation.
	g := e.ready(t, "s", "github/get_repository", `{"owner":"o","repo":"2"}`, nil)
	a2, err := e.forms.Admissions.Admit(ctx, g.ID)
	if err != nil {
		t.Fatal(err)
	}
	if c := e.claims(t, a2.Token); c.Generation != 2 {
		t.Fatalf("generation in token %d, want 2", c.Generation)
	}
	if _, err := e.forms.Leases.SetGeneration(ctx, "ops", "github-v1-4", 0); !errors.Is(err, authz.ErrBadRequest) {
		t.Fatalf("generation 0: %v", err)
	}
	// An admitted lease whose backend vanished without reporting is
	// released by the next generation too.
	released, err = e.forms.Leases.SetGeneration(ctx, "ops", "github-v1-4", 10)
	if err != nil || len(released) != 1 || released[0] != a2.Lease {
		t.Fatalf("generation 10 released %v, %v", released, err)
	}
	if _, err := e.claim(t, a2, "cl_late"); !errors.Is(err, record.ErrLeaseClosed) {
		t.Fatalf("claim after release: %v", err)
	}
	if _, err := e.complete(a2.Lease, "cl_late", record.OutcomeEffect); !errors.Is(err, record.ErrLeaseClosed) {
		t.Fatalf("report after release: %v", err)
	}
}

func TestSessionOrderingAtAdmission(t *testing.T) {
	e := newAdmitEnv(t, nil)
	ctx := context.Background()
	// delete_repository requires get_repository and is exclusive with
	// create_repository. The formation-time policy already checks both
	// against the session history; admission must check them again against
	// the ledger as etcd orders it, because the session moves on between
	// formation and admission.

	// Session "x": the delete is formed after get_repository completed, so
	// the policy allows it; then create_repository is admitted in "x"
	// first: the delete's admission is refused as exclusive.
	gx := e.ready(t, "x", "github/get_repository", `{"owner":"o","repo":"r"}`, nil)
	ax, err := e.forms.Admissions.Admit(ctx, gx.ID)
	if err != nil {
		t.Fatal(err)
	}
	e.report(t, ax, record.OutcomeEffect)
	delX := e.ready(t, "x", "github/delete_repository", `{"owner":"o","repo":"r"}`, admins, "bob", "carol")
	createX := e.ready(t, "x", "github/create_repository", `{"name":"n"}`, nil, "bob")
	if _, err := e.forms.Admissions.Admit(ctx, createX.ID); err != nil {
		t.Fatal(err)
	}
	var de *record.DependencyError
	if _, err := e.forms.Admissions.Admit(ctx, delX.ID); !errors.As(err, &de) || !de.Exclusive || de.Tool != "github/create_repository" {
		t.Fatalf("exclusive conflict at admission: %v", err)
	}

	// Session "y", with a policy that allows everything so the delete can
	// be formed before get_repository ran: admission refuses it while its
	// required tool is not completed (admitted is not enough), and admits
	// it once get_repository's effect completed.
	e2 := newAdmitEnv(t, allowAll(t))
	gy := e2.ready(t, "y", "github/get_repository", `{"owner":"o","repo":"r"}`, nil)
	delY := e2.ready(t, "y", "github/delete_repository", `{"owner":"o","repo":"r"}`, nil, "bob")
	if _, err := e2.forms.Admissions.Admit(ctx, delY.ID); !errors.As(err, &de) || de.Exclusive || de.Tool != "github/get_repository" {
		t.Fatalf("requires unmet at admission: %v", err)
	}
	ay, err := e2.forms.Admissions.Admit(ctx, gy.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e2.forms.Admissions.Admit(ctx, delY.ID); !errors.As(err, &de) {
		t.Fatalf("requires only admitted, not completed: %v", err)
	}
	e2.report(t, ay, record.OutcomeEffect)
	if _, err := e2.forms.Admissions.Admit(ctx, delY.ID); err != nil {
		t.Fatalf("delete after get_repository completed: %v", err)
	}
}

// TestAdmissionRacesDrain: many admissions race one drain. Every admission
// either holds a lease committed before the drain, or was refused as
// draining; none committed after the drain.
func TestAdmissionRacesDrain(t *testing.T) {
	const n = 24
	// The drain is ordered against the admissions by events, not by time:
	// it ends before any admission starts, starts with them, starts once
	// some admissions have returned (the others still in flight: the race
	// under test), or once all have.
	for _, round := range []struct {
		note  string
		after int // admissions returned when the drain starts; -1: the drain ends before any starts
	}{
		{"drain first", -1},
		{"drain with the admissions", 0},
		{"drain after the first admission", 1},
		{"drain after half the admissions", n / 2},
		{"drain before the last admission", n - 1},
		{"admissions first", n},
	} {
		t.Run(round.note, func(t *testing.T) {
			e := newAdmitEnv(t, nil)
			ctx := context.Background()
			ids := make([]string, n)
			for i := range ids {
				ids[i] = e.ready(t, fmt.Sprint("s", i), "github/get_repository", fmt.Sprintf(`{"owner":"o","repo":"r%d"}`, i), nil).ID
			}
			epoch := e.snapshotEpoch(t)
			drain := func() {
				if _, err := e.store.Drain(ctx, epoch); err != nil {
					t.Error(err)
				}
			}
			var wg sync.WaitGroup
			results := make([]*authz.Grant, n)
			errs := make([]error, n)
			start := make(chan struct{})
			returned := make(chan struct{}, n)
			for i := range ids {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					results[i], errs[i] = e.forms.Admissions.Admit(ctx, ids[i])
					returned <- struct{}{}
				}()
			}
			if round.after < 0 {
				drain()
			} else {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					for range round.after {
						<-returned
					}
					drain()
				}()
			}
			close(start)
			wg.Wait()
			ep, err := e.store.GetEpoch(ctx, epoch)
			if err != nil || ep.State != record.StateDraining {
				t.Fatalf("epoch %+v %v", ep, err)
			}
			admitted := 0
			for i := range ids {
				switch {
				case errs[i] == nil:
					admitted++
					l, err := e.store.OpenLease(ctx, results[i].Lease)
					if err != nil {
						t.Fatal(err)
					}
					if l.Revision >= ep.StateRevision {
						t.Fatalf("lease %s committed at %d, after the drain at %d", l.ID, l.Revision, ep.StateRevision)
					}
					if c := e.claims(t, results[i].Token); c.Revision != l.Revision {
						t.Fatalf("token revision %d, lease %d", c.Revision, l.Revision)
					}
				case errors.Is(errs[i], authz.ErrSourceDraining):
				default:
					t.Fatalf("admission %d: %v", i, errs[i])
				}
			}
			if ep.ActiveLeases != admitted {
				t.Fatalf("%d markers for %d admissions", ep.ActiveLeases, admitted)
			}
			// The admissions that returned before the drain started were
			// admitted; none after a drain that came first.
			if want := max(round.after, 0); admitted < want || round.after < 0 && admitted != 0 {
				t.Fatalf("%d admitted, want at least %d (none if the drain came first)", admitted, want)
			}
			t.Logf("%d admitted before the drain, %d refused", admitted, n-admitted)
		})
	}
}

func (e *env) snapshotEpoch(t testing.TB) string {
	t.Helper()
	s, err := e.store.GetSnapshot(context.Background(), e.snapshot)
	if err != nil {
		t.Fatal(err)
	}
	return s.Tools[0].Epoch
}

// TestAdmissionRecheckNarrowsOnly: a policy change after formation is
// applied at admission; it may deny, never allow what was denied.
func TestAdmissionRecheckNarrowsOnly(t *testing.T) {
	dir, write := policyDir(t)
	allowRego, allowCedar := allowAllRego, allowAllCedar
	denyReads := allowAllRego + "\ndeny contains {\"rule\": \"no-reads\", \"reason\": \"reads are off\"} if input.tool.sideEffects == \"read\"\n"
	write(allowRego, allowCedar)
	pm, err := policy.NewManager(context.Background(), policy.Source{Dir: dir}, policy.ManagerConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	e := newAdmitEnv(t, pm)
	ctx := context.Background()
	f := e.ready(t, "s", "github/get_repository", `{"owner":"o","repo":"r"}`, nil)
	write(denyReads, allowCedar)
	if err := pm.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.forms.Admissions.Admit(ctx, f.ID); !errors.Is(err, authz.ErrPolicyNowDenies) {
		t.Fatalf("admission under a policy that now denies: %v", err)
	}
	// Back to allowing: the same formation is admitted (nothing was
	// widened: it was allowed at formation).
	write(allowRego, allowCedar)
	if err := pm.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.forms.Admissions.Admit(ctx, f.ID); err != nil {
		t.Fatalf("admission after the policy allows again: %v", err)
	}
	// A formation denied at formation stays denied whatever the policy
	// says now.
	write(denyReads, allowCedar)
	pm.Reload(ctx)
	d, _ := e.form(t, "s", "github/get_repository", `{"owner":"o","repo":"z"}`, "alice", nil)
	write(allowRego, allowCedar)
	pm.Reload(ctx)
	if _, err := e.forms.Admissions.Admit(ctx, d.ID); !errors.Is(err, authz.ErrFormationDenied) {
		t.Fatalf("a denied formation under a policy that now allows: %v", err)
	}
}

// TestAdmissionFailsClosedWithoutEtcd: with etcd stopped, admission is
// refused as unavailable; when it is back the call is admitted once.
func TestAdmissionFailsClosedWithoutEtcd(t *testing.T) {
	e := newAdmitEnv(t, nil)
	ctx := context.Background()
	f := e.ready(t, "s", "github/get_repository", `{"owner":"o","repo":"r"}`, nil)
	e.member.Stop()
	if _, err := e.forms.Admissions.Admit(ctx, f.ID); !errors.Is(err, record.ErrUnavailable) {
		t.Fatalf("admission with etcd down: %v", err)
	}
	e.member.Restart()
	// Retry until the store reaches etcd again (the client reconnects
	// with backoff); a bound for a slow machine, not a timed assertion.
	a := testutil.Await(t, 30*time.Second, "the admission once etcd is back", func() (*authz.Grant, error) { return e.forms.Admissions.Admit(ctx, f.ID) })
	ep, _ := e.store.GetEpoch(ctx, f.Source.Epoch)
	if ep.ActiveLeases != 1 || a.Lease == "" {
		t.Fatalf("after the outage: %d markers, lease %q", ep.ActiveLeases, a.Lease)
	}
}

// TestKeyRotation: two replicas publish their keys; the JWKS holds both.
// When one stops (a rotation or a crash), its key stays published for
// token lifetime + grace, so its last tokens still verify, then goes.
func TestKeyRotation(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := context.Background()
	forms := authztest.New(t, authz.Config{Store: e.store, Decider: defaultSet(t)})
	start := func() (stop func(), iss *authz.TokenIssuer) {
		key, err := manifest.GenerateKey(jwa.ES256)
		if err != nil {
			t.Fatal(err)
		}
		iss, err = authz.NewTokenIssuer(authz.TokenIssuerConfig{Key: key, Lifetime: 2 * time.Second, Grace: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		c, cancel := context.WithCancel(ctx)
		stopped := make(chan struct{})
		go func() { iss.Publish(c, e.store); close(stopped) }()
		// Stopping waits for the publisher to end: a stopped replica
		// publishes nothing more, and no publisher outlives the test.
		stop = sync.OnceFunc(func() { cancel(); <-stopped })
		t.Cleanup(stop)
		return stop, iss
	}
	kids := func() map[string]bool {
		t.Helper()
		raw, err := forms.Admissions.JWKS(ctx)
		if err != nil {
			t.Fatal(err)
		}
		set, err := jwk.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for i := range set.Len() {
			k, _ := set.Key(i)
			out[k.KeyID()] = true
		}
		return out
	}
	stopOld, old := start()
	_, fresh := start()
	testutil.EventuallyState(t, 30*time.Second, "both keys", func() bool { k := kids(); return k[old.KeyID()] && k[fresh.KeyID()] }, kids)
	stopOld()
	if !kids()[old.KeyID()] {
		t.Fatal("the old key vanished at once; its unexpired tokens could no longer be verified")
	}
	testutil.EventuallyState(t, 30*time.Second, "the old key to expire", func() bool { k := kids(); return !k[old.KeyID()] && k[fresh.KeyID()] }, kids)
}

// formsClaimer is a fencecheck.Claimer over the use case itself, mapping
// its errors as authzd's claim endpoint and fencecheck.LeaseClient do: the
// fence's online mode without HTTP in between.
type formsClaimer struct {
	forms *authz.UseCases
	pools []string
}

func (c formsClaimer) Claim(ctx context.Context, cl *fencecheck.Claims, id string) error {
	_, err := c.forms.Leases.Claim(ctx, authz.ClaimRequest{Lease: cl.ID, Epoch: cl.Epoch, Revision: cl.Revision, Claim: id, Pools: c.pools})
	switch {
	case errors.Is(err, record.ErrLeaseClaimed):
		return fmt.Errorf("%w: %v", fencecheck.ErrAlreadyClaimed, err)
	case errors.Is(err, record.ErrLeaseClosed), errors.Is(err, record.ErrLeaseUncertain), errors.Is(err, record.ErrLeaseNotFound):
		return fmt.Errorf("%w: %v", fencecheck.ErrLeaseGone, err)
	}
	return err
}

// TestTokensPassFencecheck: the tokens admission issues, EdDSA and ES256,
// pass the backend's verifier (online: it claims the lease) against the
// published JWKS for the call as formed, and fail it for any other call;
// a re-issued token of the same lease is a replay, for the instance that
// ran it (its memory) and for any other (the claim in etcd).
func TestTokensPassFencecheck(t *testing.T) {
	for _, alg := range []jwa.SignatureAlgorithm{jwa.EdDSA, jwa.ES256} {
		t.Run(alg.String(), func(t *testing.T) {
			e := newAdmitEnvAlg(t, nil, alg)
			ctx := context.Background()
			args := `{"owner":"octo","repo":"demo"}`
			f := e.ready(t, "s1", "github/get_repository", args, nil)
			a, err := e.forms.Admissions.Admit(ctx, f.ID)
			if err != nil {
				t.Fatal(err)
			}
			b, err := e.forms.Admissions.Admit(ctx, f.ID) // re-admission before any claim: same jti
			if err != nil || b.Lease != a.Lease {
				t.Fatalf("re-admission: %+v %v", b, err)
			}
			raw, err := e.forms.Admissions.JWKS(ctx)
			if err != nil {
				t.Fatal(err)
			}
			set, err := fencecheck.ParseJWKS(raw)
			if err != nil {
				t.Fatal(err)
			}
			verifier := func() *fencecheck.Verifier {
				return &fencecheck.Verifier{Pool: "github-v1-4", Artifact: f.Source.Artifact.Digest, Config: f.Source.ConfigDigest,
					Issuer: "fcd-test", Keys: set, Now: e.clock.Now, Claimer: formsClaimer{forms: e.forms, pools: []string{"github-v1-4"}}}
			}
			v, other := verifier(), verifier()
			c, err := v.Verify(ctx, a.Token, "github/get_repository", json.RawMessage(`{"repo":"demo","owner":"octo"}`))
			if err != nil {
				t.Fatalf("fencecheck refused an admitted call: %v", err)
			}
			l, err := e.store.OpenLease(ctx, a.Lease)
			if err != nil || l.State != record.LeaseRunning || l.Claim == nil || l.Claim.ID != c.ClaimID || c.ClaimID == "" {
				t.Fatalf("lease after the fence accepted its token: %+v %v (claim id %q)", l, err, c.ClaimID)
			}
			for note, v := range map[string]*fencecheck.Verifier{"same instance": v, "another instance": other} {
				if _, err := v.Verify(ctx, b.Token, "github/get_repository", json.RawMessage(args)); fencecheck.ReasonOf(err) != fencecheck.ReasonReplay {
					t.Fatalf("%s: re-issued token for the same lease: %v", note, err)
				}
			}
			g := e.ready(t, "s2", "github/get_repository", args, nil)
			d, err := e.forms.Admissions.Admit(ctx, g.ID)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := v.Verify(ctx, d.Token, "github/get_repository", json.RawMessage(`{"owner":"octo","repo":"other"}`)); fencecheck.ReasonOf(err) != fencecheck.ReasonArguments {
				t.Fatalf("token for other arguments: %v", err)
			}
			if l, err := e.store.OpenLease(ctx, d.Lease); err != nil || l.State != record.LeaseAdmitted || l.Claim != nil {
				t.Fatalf("a refused call claimed its lease: %+v %v", l, err)
			}
		})
	}
}

// TestCrossReplicaAdmission: replicas share only etcd. A call formed on
// one replica and admitted on another is admitted once; the first
// replica, whose cache still says "ready", answers with the same lease.
func TestCrossReplicaAdmission(t *testing.T) {
	e := newAdmitEnv(t, nil)
	ctx := context.Background()
	// A second replica: its own use case, policies and signing key, the
	// same etcd.
	_, iss := newIssuer(t, e.store, jwa.ES256)
	other := authztest.New(t, authz.Config{Store: e.store, Decider: defaultSet(t), Now: e.clock.Now, Issuer: iss, Logger: quiet})

	f := e.ready(t, "s", "github/get_repository", `{"owner":"o","repo":"r"}`, nil)
	onB, err := other.Admissions.Admit(ctx, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	onA, err := e.forms.Admissions.Admit(ctx, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	if onA.Lease != onB.Lease {
		t.Fatalf("two leases for one formation: %s on B, %s on A", onB.Lease, onA.Lease)
	}
	// Approved on one replica, admitted on the other.
	w, _ := e.form(t, "s", "github/create_repository", `{"name":"n"}`, "alice", nil)
	if _, err := other.Formations.Approve(ctx, w.ID, authz.ApprovalRequest{Approver: "bob", Decision: "approve", Digest: w.Digest}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.forms.Admissions.Admit(ctx, w.ID); err != nil {
		t.Fatalf("admission of a call approved on another replica: %v", err)
	}
	ep, _ := e.store.GetEpoch(ctx, f.Source.Epoch)
	if ep.ActiveLeases != 2 {
		t.Fatalf("%d leases, want 2", ep.ActiveLeases)
	}
}

// TestAdmissionNeedsAPublishedKey: a replica without a signing key does not
// admit; one whose key is not (yet) published in etcd admits nothing
// either, and opens no lease it could not give a token for.
func TestAdmissionNeedsAPublishedKey(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := context.Background()
	f, err := e.form(t, "s", "github/get_repository", `{"owner":"o","repo":"r"}`, "alice", nil)
	if err != nil || f.Status != record.StatusReady {
		t.Fatalf("form: %v %+v", err, f)
	}
	if _, err := e.forms.Admissions.Admit(ctx, f.ID); !errors.Is(err, authz.ErrAdmissionDisabled) {
		t.Fatalf("admission without a signing key: %v", err)
	}
	key, err := manifest.GenerateKey(jwa.EdDSA)
	if err != nil {
		t.Fatal(err)
	}
	iss, err := authz.NewTokenIssuer(authz.TokenIssuerConfig{Key: key, Issuer: "fcd-test", Lifetime: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	unpublished := authztest.New(t, authz.Config{Store: e.store, Decider: defaultSet(t), Now: e.clock.Now, Issuer: iss, Logger: quiet})
	if _, err := unpublished.Admissions.Admit(ctx, f.ID); !errors.Is(err, authz.ErrSigningKeyUnpublished) {
		t.Fatalf("admission with an unpublished key: %v", err)
	}
	got, _ := e.forms.Formations.Get(ctx, f.ID)
	ep, _ := e.store.GetEpoch(ctx, f.Source.Epoch)
	if got.Status != record.StatusReady || ep.ActiveLeases != 0 {
		t.Fatalf("refused admission left status %s and %d leases", got.Status, ep.ActiveLeases)
	}
	if _, err := authz.NewTokenIssuer(authz.TokenIssuerConfig{Key: func() jwk.Key { k, _ := key.PublicKey(); return k }()}); err == nil {
		t.Fatal("a public key was accepted as a signing key")
	}
	if _, err := authz.NewTokenIssuer(authz.TokenIssuerConfig{Key: key, Lifetime: time.Hour}); err == nil {
		t.Fatal("a token lifetime of an hour was accepted")
	}
}

// TestUnreportedLeasesBecomeUncertain: a token is issued again only within
// the report grace after admission; a lease whose outcome is never
// reported is marked uncertain — on a late re-admission, or by the sweep
// once 2×grace + the token lifetime have passed — and then holds its epoch
// like any uncertain lease until an operator resolves it.
func TestUnreportedLeasesBecomeUncertain(t *testing.T) {
	e := newAdmitEnv(t, nil)
	ctx := context.Background()
	retried := e.ready(t, "s", "github/get_repository", `{"owner":"o","repo":"retried"}`, nil)
	lost := e.ready(t, "s", "github/get_repository", `{"owner":"o","repo":"lost"}`, nil)
	reported := e.ready(t, "s", "github/get_repository", `{"owner":"o","repo":"reported"}`, nil)
	var leases []string
	var admissions []*authz.Grant
	for _, f := range []*record.Formation{retried, lost, reported} {
		a, err := e.forms.Admissions.Admit(ctx, f.ID)
		if err != nil {
			t.Fatal(err)
		}
		leases, admissions = append(leases, a.Lease), append(admissions, a)
	}
	state := func(id string) record.LeaseState {
		t.Helper()
		l, err := e.store.OpenLease(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return l.State
	}

	e.clock.Advance(4 * time.Minute)
	if a, err := e.forms.Admissions.Admit(ctx, retried.ID); err != nil || a.Lease != leases[0] {
		t.Fatalf("re-admission within the grace: %v", err)
	}
	if marked, err := e.forms.Leases.SweepUnreported(ctx); err != nil || len(marked) != 0 {
		t.Fatalf("sweep within the grace marked %v (%v)", marked, err)
	}
	e.report(t, admissions[2], record.OutcomeEffect)

	e.clock.Advance(time.Minute + time.Second) // past the grace
	if _, err := e.forms.Admissions.Admit(ctx, retried.ID); !errors.Is(err, record.ErrLeaseUncertain) {
		t.Fatalf("re-admission past the grace: %v, want ErrLeaseUncertain", err)
	}
	if st := state(leases[0]); st != record.LeaseUncertain {
		t.Fatalf("the late-retried lease is %s, want uncertain", st)
	}
	if st := state(leases[1]); st != record.LeaseAdmitted {
		t.Fatalf("the lost lease is %s before the sweep deadline", st)
	}

	e.clock.Advance(5*time.Minute + 30*time.Second) // 2×grace + lifetime since admission
	marked, err := e.forms.Leases.SweepUnreported(ctx)
	if err != nil || len(marked) != 1 || marked[0] != leases[1] {
		t.Fatalf("sweep marked %v (%v), want only %s", marked, err, leases[1])
	}
	if st := state(leases[1]); st != record.LeaseUncertain {
		t.Fatalf("the lost lease is %s after the sweep", st)
	}
	if f, _ := e.forms.Formations.Get(ctx, lost.ID); f.Status != record.StatusUncertain {
		t.Fatalf("the lost call is %s", f.Status)
	}
	// A report that comes after the mark does not close it: only an
	// operator's resolution (or a newer generation) does.
	if _, err := e.complete(leases[1], "cl_late", record.OutcomeEffect); !errors.Is(err, record.ErrLeaseUncertain) {
		t.Fatalf("late report: %v", err)
	}
	if _, err := e.claim(t, admissions[1], "cl_late"); !errors.Is(err, record.ErrLeaseUncertain) {
		t.Fatalf("late claim: %v", err)
	}
	epoch := lost.Source.Epoch
	if _, err := e.store.Drain(ctx, epoch); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Retire(ctx, epoch, 0); !isBlocked(err, 0, 2) {
		t.Fatalf("retire with two unreported leases: %v", err)
	}
	for _, id := range leases[:2] {
		if _, err := e.forms.Leases.Resolve(ctx, "ops", id, record.OutcomeNoEffect, "checked the backend"); err != nil {
			t.Fatal(err)
		}
	}
	if st, err := e.store.Retire(ctx, epoch, 0); err != nil || st != record.StateStale {
		t.Fatalf("retire after resolution: %s %v", st, err)
	}
	if marked, err := e.forms.Leases.SweepUnreported(ctx); err != nil || len(marked) != 0 {
		t.Fatalf("a second sweep marked %v (%v)", marked, err)
	}
}

// TestRunSweeperMarksOnItsOwn: the loop serve starts does sweep, and stops
// with its context.
func TestRunSweeperMarksOnItsOwn(t *testing.T) {
	e := newAdmitEnv(t, nil)
	ctx := context.Background()
	f := e.ready(t, "s", "github/get_repository", `{"owner":"o","repo":"r"}`, nil)
	a, err := e.forms.Admissions.Admit(ctx, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(11 * time.Minute) // past 2×grace + lifetime
	sctx, cancel := context.WithCancel(ctx)
	defer cancel() // a failed test stops the sweeper too
	done := make(chan struct{})
	go func() { e.forms.Leases.RunSweeper(sctx, 10*time.Millisecond); close(done) }()
	var state record.LeaseState
	testutil.EventuallyState(t, 30*time.Second, "the sweeper to mark the unreported lease uncertain", func() bool {
		l, err := e.store.OpenLease(ctx, a.Lease)
		if err != nil {
			t.Fatal(err)
		}
		state = l.State
		return state == record.LeaseUncertain
	}, func() record.LeaseState { return state })
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("RunSweeper did not stop with its context")
	}
}
