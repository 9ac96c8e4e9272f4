package lease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/internal/racetest"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/record"
)

// claimEnv is a store with one registered epoch, in which formations are
// admitted the way authz admits them (CreateFormation, then Admit).
type claimEnv struct {
	m  *etcdtest.Member
	s  *lease.Store
	ep *record.Epoch
	t0 time.Time
	n  int
}

func newClaimEnv(t *testing.T) *claimEnv {
	t.Helper()
	m := etcdtest.Start(t)
	s := m.Store(t, "/claims/")
	return &claimEnv{m: m, s: s, ep: register(t, s, testManifest(t, "github", "v1.4.0", "private")),
		t0: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// admit opens a lease for a fresh formation in its own session at
// generation gen (of the epoch's pool), admitted at e.t0, and returns it
// as read back (with the revision its token would carry).
func (e *claimEnv) admit(t *testing.T, gen int64) *record.Lease {
	return e.admitTo(t, e.ep, gen)
}

func (e *claimEnv) admitTo(t *testing.T, ep *record.Epoch, gen int64) *record.Lease {
	t.Helper()
	ctx := testCtx(t)
	p := e.prepareOn(t, ep, fmt.Sprint("s", e.n+1), "github/get_repository", gen)
	l := p.req.Lease
	if err := e.s.Admit(ctx, p.req); err != nil {
		t.Fatal(err)
	}
	got, err := e.s.OpenLease(ctx, l.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != record.LeaseAdmitted || got.Claim != nil || got.Revision != l.Revision {
		t.Fatalf("admitted lease reads %+v (revision %d, want %d)", got, got.Revision, l.Revision)
	}
	return got
}

// pendingAdmission is a formation stored and ready, and the admission
// that would open its lease.
type pendingAdmission struct {
	req lease.AdmitRequest
}

// prepareOn stores a ready formation of tool in session and returns its
// admission to ep at generation gen, not yet run.
func (e *claimEnv) prepareOn(t *testing.T, ep *record.Epoch, session, tool string, gen int64) *pendingAdmission {
	t.Helper()
	e.n++
	fid, err := lease.NewFormationID()
	if err != nil {
		t.Fatal(err)
	}
	lid, err := lease.NewLeaseID()
	if err != nil {
		t.Fatal(err)
	}
	f := &record.Formation{Call: record.Call{ID: fid, Session: session, Tool: tool,
		CreatedAt: e.t0, ExpiresAt: e.t0.Add(time.Hour)}, Status: record.StatusReady}
	rev, err := e.s.CreateFormation(testCtx(t), f, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	l := &record.Lease{ID: lid, Formation: fid, Session: session, Tool: tool, Generation: gen, AdmittedAt: e.t0,
		Target: record.Target{Epoch: ep.ID, Server: "github", Release: "v1.4.0", Pool: ep.Pool}}
	return &pendingAdmission{req: lease.AdmitRequest{Formation: f, FormationRev: rev, Lease: l}}
}

// req is the claim of l's token under claim, taken at e.t0 plus at.
func (e *claimEnv) req(l *record.Lease, claim string, at time.Duration) lease.ClaimRequest {
	return lease.ClaimRequest{Lease: l.ID, Epoch: l.Target.Epoch, Revision: l.Revision, Claim: claim, At: e.t0.Add(at)}
}

func (e *claimEnv) mustClaim(t *testing.T, l *record.Lease, claim string) {
	t.Helper()
	if _, err := e.s.ClaimLease(testCtx(t), e.req(l, claim, time.Minute), nil); err != nil {
		t.Fatalf("claim %s: %v", l.ID, err)
	}
}

// state returns the open lease's state and claim id, or the error of
// reading it (ErrLeaseClosed once closed).
func (e *claimEnv) state(t *testing.T, id string) (record.LeaseState, string, error) {
	t.Helper()
	return etcdtest.LeaseState(t, e.s, id)
}

func (e *claimEnv) status(t *testing.T, l *record.Lease) record.Status {
	t.Helper()
	f, err := e.s.GetFormation(testCtx(t), l.Formation)
	if err != nil {
		t.Fatal(err)
	}
	return f.Status
}

// TestClaimLease: the claim moves an admitted lease to running once; the
// same claim again is answered as the first, any other is refused, and a
// claim of a lease that is closed, uncertain, unknown, or named with
// another admission's revision or epoch is refused and changes nothing.
func TestClaimLease(t *testing.T) {
	e := newClaimEnv(t)
	ctx := testCtx(t)
	running := e.admit(t, 0)

	c, err := e.s.ClaimLease(ctx, e.req(running, "cl_a", time.Minute), nil)
	if err != nil || c.ID != "cl_a" || !c.At.Equal(e.t0.Add(time.Minute)) {
		t.Fatalf("first claim: %+v %v", c, err)
	}
	if st, claim, err := e.state(t, running.ID); err != nil || st != record.LeaseRunning || claim != "cl_a" {
		t.Fatalf("claimed lease: %s %q %v", st, claim, err)
	}
	// The claimant's first answer was lost: its retry finds its claim,
	// taken when it was first taken.
	c, err = e.s.ClaimLease(ctx, e.req(running, "cl_a", 2*time.Minute), nil)
	if err != nil || c.ID != "cl_a" || !c.At.Equal(e.t0.Add(time.Minute)) {
		t.Fatalf("same claim again: %+v %v", c, err)
	}

	closed := e.admit(t, 0)
	if _, err := e.s.CloseLease(ctx, lease.CloseRequest{Lease: closed.ID, Outcome: record.OutcomeRejected}); err != nil {
		t.Fatal(err)
	}
	uncertain := e.admit(t, 0)
	if m, err := e.s.MarkLeaseUnreported(ctx, uncertain.ID, e.t0.Add(time.Hour)); m == nil || err != nil {
		t.Fatalf("mark uncertain: %v %v", m, err)
	}
	admitted := e.admit(t, 0)
	other := register(t, e.s, testManifest(t, "github", "v1.5.0", "private"))
	unknownID, _ := lease.NewLeaseID()
	errNotMine := errors.New("not this claimant's pool")

	for _, tc := range []struct {
		note  string
		req   lease.ClaimRequest
		allow func(string) error
		want  error // nil: any refusal
		// lease whose state must not change, and its state before
		lease string
	}{
		{note: "another claim of a running lease", req: e.req(running, "cl_b", 0), want: record.ErrLeaseClaimed, lease: running.ID},
		{note: "closed lease", req: e.req(closed, "cl_c", 0), want: record.ErrLeaseClosed},
		{note: "uncertain lease", req: e.req(uncertain, "cl_u", 0), want: record.ErrLeaseUncertain, lease: uncertain.ID},
		{note: "unknown lease", req: lease.ClaimRequest{Lease: unknownID, Epoch: e.ep.ID, Revision: admitted.Revision, Claim: "cl_x"},
			want: record.ErrLeaseNotFound},
		{note: "a later revision", req: func() lease.ClaimRequest { r := e.req(admitted, "cl_r", 0); r.Revision++; return r }(),
			want: record.ErrLeaseNotFound, lease: admitted.ID},
		{note: "an earlier revision", req: func() lease.ClaimRequest { r := e.req(admitted, "cl_r", 0); r.Revision--; return r }(),
			want: record.ErrLeaseNotFound, lease: admitted.ID},
		{note: "another epoch", req: func() lease.ClaimRequest { r := e.req(admitted, "cl_e", 0); r.Epoch = other.ID; return r }(),
			lease: admitted.ID},
		{note: "no claim id", req: e.req(admitted, "", 0), lease: admitted.ID},
		{note: "claim id too long", req: e.req(admitted, "cl_"+strings.Repeat("x", lease.MaxClaimIDLength), 0), lease: admitted.ID},
		{note: "no revision", req: func() lease.ClaimRequest { r := e.req(admitted, "cl_0", 0); r.Revision = 0; return r }(), lease: admitted.ID},
		{note: "refused by allow", req: e.req(admitted, "cl_p", 0), lease: admitted.ID, want: errNotMine,
			allow: func(pool string) error {
				if pool != e.ep.Pool {
					t.Errorf("allow asked with pool %q, want %q", pool, e.ep.Pool)
				}
				return errNotMine
			}},
	} {
		t.Run(tc.note, func(t *testing.T) {
			var st record.LeaseState
			var claim string
			if tc.lease != "" {
				st, claim, _ = e.state(t, tc.lease)
			}
			c, err := e.s.ClaimLease(ctx, tc.req, tc.allow)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("claim = %+v, %v; want %v", c, err, tc.want)
			}
			if tc.lease != "" {
				if st2, claim2, err := e.state(t, tc.lease); err != nil || st2 != st || claim2 != claim {
					t.Fatalf("the refused claim changed the lease: %s %q -> %s %q (%v)", st, claim, st2, claim2, err)
				}
			}
		})
	}
	// The one admitted lease the refusals were tried on is still
	// claimable, by its own token.
	if _, err := e.s.ClaimLease(ctx, e.req(admitted, "cl_ok", 0), nil); err != nil {
		t.Fatalf("claim after the refusals: %v", err)
	}
	// Without At, the claim is stamped by the store's clock.
	plain := e.admit(t, 0)
	before := time.Now()
	c, err = e.s.ClaimLease(ctx, lease.ClaimRequest{Lease: plain.ID, Epoch: plain.Target.Epoch, Revision: plain.Revision, Claim: "cl_now"}, nil)
	if err != nil || c.At.Before(before.Add(-time.Second)) || c.At.After(time.Now().Add(time.Second)) {
		t.Fatalf("claim without At: %+v %v", c, err)
	}
}

// TestConcurrentClaims: of many claims of one lease with distinct ids,
// racing, exactly one succeeds and the lease holds its id.
func TestConcurrentClaims(t *testing.T) {
	e := newClaimEnv(t)
	ctx := testCtx(t)
	for round := range 4 {
		l := e.admit(t, 0)
		errs := racetest.Each(12, func(i int) error {
			_, err := e.s.ClaimLease(ctx, e.req(l, fmt.Sprint("cl_", i), 0), nil)
			return err
		})
		winner, err := racetest.OneWinner(errs, record.ErrLeaseClaimed)
		if err != nil {
			t.Fatalf("round %d: claims: %v", round, err)
		}
		if st, claim, err := e.state(t, l.ID); err != nil || st != record.LeaseRunning || claim != fmt.Sprint("cl_", winner) {
			t.Fatalf("round %d: lease %s %q %v, winner %d", round, st, claim, err, winner)
		}
	}
}

// TestReleaseRacesClaim: a release of an unclaimed lease (the fence
// refused the call) and a claim of it (another instance accepted it)
// race; exactly one wins, and the loser says why.
func TestReleaseRacesClaim(t *testing.T) {
	e := newClaimEnv(t)
	ctx := testCtx(t)
	wins := map[string]int{}
	for range 8 {
		l := e.admit(t, 0)
		var claimErr, releaseErr error
		racetest.Together(func() {
			_, claimErr = e.s.ClaimLease(ctx, e.req(l, "cl_a", 0), nil)
		}, func() {
			_, releaseErr = e.s.CloseLease(ctx, lease.CloseRequest{Lease: l.ID, Outcome: record.OutcomeRejected})
		})
		st, claim, err := e.state(t, l.ID)
		switch {
		case claimErr == nil && errors.Is(releaseErr, record.ErrLeaseClaimed):
			if err != nil || st != record.LeaseRunning || claim != "cl_a" {
				t.Fatalf("claim won, lease %s %q %v", st, claim, err)
			}
			wins["claim"]++
		case releaseErr == nil && errors.Is(claimErr, record.ErrLeaseClosed):
			if !errors.Is(err, record.ErrLeaseClosed) || e.status(t, l) != record.StatusRejected {
				t.Fatalf("release won, lease %s %v", st, err)
			}
			wins["release"]++
		default:
			t.Fatalf("claim: %v, release: %v", claimErr, releaseErr)
		}
	}
	t.Logf("wins: %v", wins)
}

// TestSetGenerationReleasesRunningLeases: a newer generation of the pool
// releases its open leases of older generations — admitted, running
// (claim deleted) and uncertain — and none of the current one; a claim
// or report of a released lease then fails as closed.
func TestSetGenerationReleasesRunningLeases(t *testing.T) {
	e := newClaimEnv(t)
	ctx := testCtx(t)
	admitted, running, uncertain := e.admit(t, 0), e.admit(t, 0), e.admit(t, 0)
	e.mustClaim(t, running, "cl_r")
	e.mustClaim(t, uncertain, "cl_u")
	if _, err := e.s.CloseLease(ctx, lease.CloseRequest{Lease: uncertain.ID, Outcome: record.OutcomeUncertain, Claim: "cl_u"}); err != nil {
		t.Fatal(err)
	}
	ch, err := e.s.SetGeneration(ctx, e.ep.Pool, 1, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	released := ch.IDs()
	for _, l := range ch.Released {
		if ch.Revision <= 0 || l.Closed <= ch.Revision {
			t.Fatalf("generation set at revision %d, %s released at %d", ch.Revision, l.ID, l.Closed)
		}
	}
	want := map[string]bool{admitted.ID: true, running.ID: true, uncertain.ID: true}
	if len(released) != len(want) {
		t.Fatalf("released %v, want %d leases", released, len(want))
	}
	for _, id := range released {
		if !want[id] {
			t.Fatalf("released %s, not an old lease", id)
		}
	}
	for _, l := range []*record.Lease{admitted, running, uncertain} {
		if _, _, err := e.state(t, l.ID); !errors.Is(err, record.ErrLeaseClosed) {
			t.Fatalf("%s after release: %v", l.ID, err)
		}
		if v, ok := lease.ClaimKeyForTest(t, e.s, l.ID); ok {
			t.Fatalf("claim of released %s kept: %s", l.ID, v)
		}
		if _, err := e.s.ClaimLease(ctx, e.req(l, "cl_late", 0), nil); !errors.Is(err, record.ErrLeaseClosed) {
			t.Fatalf("claim of released %s: %v", l.ID, err)
		}
		if st := e.status(t, l); st != record.StatusUncertain {
			t.Fatalf("released formation is %s, want uncertain (nobody knows what ran)", st)
		}
	}
	if _, err := e.s.CloseLease(ctx, lease.CloseRequest{Lease: running.ID, Outcome: record.OutcomeEffect, Claim: "cl_r"}); !errors.Is(err, record.ErrLeaseClosed) {
		t.Fatalf("report of a released running lease: %v", err)
	}
	// A running lease of the current generation stays.
	current := e.admit(t, 1)
	e.mustClaim(t, current, "cl_c")
	if again, err := e.s.SetGeneration(ctx, e.ep.Pool, 1, time.Hour); err != nil || len(again.Released) != 0 {
		t.Fatalf("the current generation again released %v (%v)", again, err)
	}
	if st, claim, err := e.state(t, current.ID); err != nil || st != record.LeaseRunning || claim != "cl_c" {
		t.Fatalf("current lease: %s %q %v", st, claim, err)
	}
	ep, err := e.s.GetEpoch(ctx, e.ep.ID)
	if err != nil || ep.ActiveLeases != 1 || ep.UncertainLeases != 0 {
		t.Fatalf("epoch after the release: %+v %v", ep, err)
	}
}

// TestEpochLeasesShowClaims: an epoch's listing shows each open lease
// with its state and claim: admitted (none), running (its claim),
// uncertain after a claim (the claim kept); a lease of another epoch,
// claimed, is not listed.
func TestEpochLeasesShowClaims(t *testing.T) {
	e := newClaimEnv(t)
	ctx := testCtx(t)
	other := register(t, e.s, testManifest(t, "github", "v1.5.0", "private"))
	admitted, running, uncertain := e.admit(t, 0), e.admit(t, 0), e.admit(t, 0)
	elsewhere := e.admitTo(t, other, 0)
	for _, c := range []struct {
		l  *record.Lease
		id string
	}{{running, "cl_r"}, {uncertain, "cl_u"}, {elsewhere, "cl_o"}} {
		e.mustClaim(t, c.l, c.id)
	}
	if _, err := e.s.CloseLease(ctx, lease.CloseRequest{Lease: uncertain.ID, Outcome: record.OutcomeUncertain, Claim: "cl_u"}); err != nil {
		t.Fatal(err)
	}
	leases, err := e.s.EpochLeases(ctx, e.ep.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		id    string
		state record.LeaseState
		claim string
	}{{admitted.ID, record.LeaseAdmitted, ""}, {running.ID, record.LeaseRunning, "cl_r"}, {uncertain.ID, record.LeaseUncertain, "cl_u"}}
	if len(leases) != len(want) {
		t.Fatalf("%d leases listed, want %d: %+v", len(leases), len(want), leases)
	}
	for i, w := range want {
		l := leases[i]
		claim := ""
		if l.Claim != nil {
			claim = l.Claim.ID
			if !l.Claim.At.Equal(e.t0.Add(time.Minute)) {
				t.Errorf("%s claimed at %s", l.ID, l.Claim.At)
			}
		}
		if l.ID != w.id || l.State != w.state || claim != w.claim || l.Revision <= 0 {
			t.Errorf("lease %d: %s %s claim %q rev %d, want %s %s %q", i, l.ID, l.State, claim, l.Revision, w.id, w.state, w.claim)
		}
	}
	ep, err := e.s.GetEpoch(ctx, e.ep.ID)
	if err != nil || ep.ActiveLeases != 2 || ep.UncertainLeases != 1 {
		t.Fatalf("epoch counts: %+v %v", ep, err)
	}
	// A running lease holds the epoch back like an admitted one.
	if _, err := e.s.Drain(ctx, e.ep.ID); err != nil {
		t.Fatal(err)
	}
	var rb *record.RetireBlockedError
	if _, err := e.s.Retire(ctx, e.ep.ID, 0); !errors.As(err, &rb) || rb.Active != 2 || rb.Uncertain != 1 {
		t.Fatalf("retire with running leases: %v", err)
	}
}

// TestSetGenerationReleasesInBatches: a generation change releases many
// leases with their writes batched (fewer etcd transactions than leases),
// each released once, in id order, with none pending.
func TestSetGenerationReleasesInBatches(t *testing.T) {
	e := newClaimEnv(t)
	ctx := testCtx(t)
	const n = 120
	want := map[string]bool{}
	for range n {
		want[e.admit(t, 0).ID] = true
	}
	before := e.s.CommitStats()
	ch, err := e.s.SetGeneration(ctx, e.ep.Pool, 1, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	after := e.s.CommitStats()
	if len(ch.Released) != n || ch.Pending != 0 {
		t.Fatalf("released %d, pending %d; want %d, 0", len(ch.Released), ch.Pending, n)
	}
	for i, l := range ch.Released {
		if !want[l.ID] || (i > 0 && ch.Released[i-1].ID >= l.ID) {
			t.Fatalf("released %s at %d: not one of the older leases once, in order", l.ID, i)
		}
		delete(want, l.ID)
	}
	if txns := after.Transactions - before.Transactions; txns >= n || after.Batched == before.Batched {
		t.Fatalf("%d releases took %d transactions (%d batched)", n, txns, after.Batched-before.Batched)
	}
	if shown, err := e.s.GetEpoch(ctx, e.ep.ID); err != nil || shown.ActiveLeases != 0 {
		t.Fatalf("epoch after the release: %+v %v", shown, err)
	}
}
