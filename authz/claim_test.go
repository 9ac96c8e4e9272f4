package authz_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/internal/authztest"
	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/internal/racetest"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/record"
	"github.com/lestrrat-go/jwx/v2/jwa"
)

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// leaseState returns an open lease's state and claim id, or the error
// of reading it (ErrLeaseClosed once it closed).
func (e *admitEnv) leaseState(t *testing.T, id string) (record.LeaseState, string, error) {
	t.Helper()
	return etcdtest.LeaseState(t, e.store, id)
}

func (e *admitEnv) status(t *testing.T, id string) record.Status {
	t.Helper()
	f, err := e.forms.Formations.Get(testCtx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	return f.Status
}

// admitRead admits a fresh read call in session and returns its
// formation and admission.
func (e *admitEnv) admitRead(t *testing.T, session string) (*record.Formation, *authz.Grant) {
	t.Helper()
	f := e.ready(t, session, "github/get_repository", fmt.Sprintf(`{"owner":"o","repo":%q}`, session), nil)
	a, err := e.forms.Admissions.Admit(testCtx(t), f.ID)
	if err != nil {
		t.Fatal(err)
	}
	return f, a
}

// TestClaimThroughFormations: the use case's claim — the backend's
// POST /v1/leases/{lease}/claim — moves the lease to running at the use
// case's clock, once; every refusal (another claim, another pool, a
// wrong revision, an unknown lease, a malformed request) changes nothing.
func TestClaimThroughFormations(t *testing.T) {
	e := newAdmitEnv(t, nil)
	ctx := testCtx(t)
	f, a := e.admitRead(t, "s")
	e.clock.Advance(10 * time.Second)

	req := e.claimRequest(t, a, "cl_first")
	req.Pools = []string{"github-v1-4"}
	c, err := e.forms.Leases.Claim(ctx, req)
	if err != nil || c.ID != "cl_first" || !c.At.Equal(e.clock.Now()) {
		t.Fatalf("first claim: %+v %v (clock %s)", c, err, e.clock.Now())
	}
	if st, claim, err := e.leaseState(t, a.Lease); err != nil || st != record.LeaseRunning || claim != "cl_first" {
		t.Fatalf("claimed lease: %s %q %v", st, claim, err)
	}
	if st := e.status(t, f.ID); st != record.StatusAdmitted {
		t.Fatalf("a running call's formation is %s", st)
	}
	e.clock.Advance(time.Second)
	if again, err := e.forms.Leases.Claim(ctx, req); err != nil || again.ID != c.ID || !again.At.Equal(c.At) {
		t.Fatalf("the same claim again (its answer lost): %+v %v", again, err)
	}

	_, open := e.admitRead(t, "s2")
	unknown, _ := lease.NewLeaseID()
	with := func(a *authz.Grant, edit func(*authz.ClaimRequest)) authz.ClaimRequest {
		r := e.claimRequest(t, a, "cl_other")
		edit(&r)
		return r
	}
	for _, tc := range []struct {
		note string
		req  authz.ClaimRequest
		want error
	}{
		{"another claim of the running lease", with(a, func(*authz.ClaimRequest) {}), record.ErrLeaseClaimed},
		{"a claimant of another pool", with(open, func(r *authz.ClaimRequest) { r.Pools = []string{"gitlab-v2"} }), authz.ErrLeaseOutOfScope},
		{"another admission's revision", with(open, func(r *authz.ClaimRequest) { r.Revision = e.claims(t, a.Token).Revision }), record.ErrLeaseNotFound},
		{"an unknown lease", with(open, func(r *authz.ClaimRequest) { r.Lease = unknown }), record.ErrLeaseNotFound},
		{"no claim id", with(open, func(r *authz.ClaimRequest) { r.Claim = "" }), authz.ErrBadRequest},
		{"a claim id too long", with(open, func(r *authz.ClaimRequest) { r.Claim = strings.Repeat("c", lease.MaxClaimIDLength+1) }), authz.ErrBadRequest},
		{"no revision", with(open, func(r *authz.ClaimRequest) { r.Revision = 0 }), authz.ErrBadRequest},
		{"no epoch", with(open, func(r *authz.ClaimRequest) { r.Epoch = "" }), authz.ErrBadRequest},
	} {
		t.Run(tc.note, func(t *testing.T) {
			type snap struct {
				st    record.LeaseState
				claim string
			}
			before := map[string]snap{}
			for _, id := range []string{a.Lease, open.Lease} {
				st, claim, _ := e.leaseState(t, id)
				before[id] = snap{st, claim}
			}
			if c, err := e.forms.Leases.Claim(ctx, tc.req); !errors.Is(err, tc.want) {
				t.Fatalf("claim = %+v, %v; want %v", c, err, tc.want)
			}
			for id, b := range before {
				if st, claim, err := e.leaseState(t, id); err != nil || st != b.st || claim != b.claim {
					t.Fatalf("the refused claim changed %s: %+v -> %s %q %v", id, b, st, claim, err)
				}
			}
		})
	}

	// An outcome from a reporter of another pool is refused, and tells
	// nothing about the lease.
	l, err := e.forms.Leases.Complete(ctx, authz.CompleteRequest{Lease: a.Lease, Outcome: record.OutcomeEffect, Claim: "cl_first", Pools: []string{"gitlab-v2"}})
	if !errors.Is(err, authz.ErrLeaseOutOfScope) || l != nil {
		t.Fatalf("report from another pool: %+v %v", l, err)
	}
	if st, claim, err := e.leaseState(t, a.Lease); err != nil || st != record.LeaseRunning || claim != "cl_first" {
		t.Fatalf("after the out-of-scope report: %s %q %v", st, claim, err)
	}
	if _, err := e.forms.Leases.Complete(ctx, authz.CompleteRequest{Lease: a.Lease, Outcome: record.OutcomeEffect, Claim: "cl_first", Pools: []string{"github-v1-4"}}); err != nil {
		t.Fatalf("report from its pool under its claim: %v", err)
	}
	if st := e.status(t, f.ID); st != record.StatusCompleted {
		t.Fatalf("formation after the effect: %s", st)
	}
}

// TestReadmissionAfterClaim: re-admitting an admitted, unclaimed formation
// issues the same jti again; once the lease is claimed no token is issued
// for it, within the report grace or after it, and the running lease is
// left as it is (not taken for unreported).
func TestReadmissionAfterClaim(t *testing.T) {
	e := newAdmitEnv(t, nil)
	ctx := testCtx(t)
	f, a := e.admitRead(t, "s")
	e.clock.Advance(2 * time.Second)
	again, err := e.forms.Admissions.Admit(ctx, f.ID)
	if err != nil || again.Lease != a.Lease || e.claims(t, again.Token).ID != a.Lease {
		t.Fatalf("re-admission before the claim: %+v %v", again, err)
	}
	e.mustClaim(t, a)
	for _, advance := range []time.Duration{0, time.Minute, 6 * time.Minute} { // the last past the report grace
		e.clock.Advance(advance)
		got, err := e.forms.Admissions.Admit(ctx, f.ID)
		if !errors.Is(err, record.ErrLeaseClaimed) || got != nil {
			t.Fatalf("re-admission of a claimed lease (+%s): %+v %v", advance, got, err)
		}
		if st, claim, err := e.leaseState(t, a.Lease); err != nil || st != record.LeaseRunning || claim != "cl_"+a.Lease {
			t.Fatalf("after the refused re-admission: %s %q %v", st, claim, err)
		}
	}
}

// TestConcurrentClaimsOnTwoReplicas: backends presenting one lease's
// token to two authzd replicas sharing etcd, at once, with distinct claim
// ids: exactly one claim succeeds, the others are ErrLeaseClaimed, and
// the winner reports through either replica.
func TestConcurrentClaimsOnTwoReplicas(t *testing.T) {
	e := newAdmitEnv(t, nil)
	ctx := testCtx(t)
	_, iss := newIssuer(t, e.store, jwa.ES256)
	replicas := []*authz.UseCases{e.forms,
		authztest.New(t, authz.Config{Store: e.store, Decider: defaultSet(t), Now: e.clock.Now, Issuer: iss, Logger: quiet})}
	for round := range 4 {
		_, a := e.admitRead(t, fmt.Sprint("s", round))
		const n = 16
		reqs := make([]authz.ClaimRequest, n)
		for i := range reqs {
			reqs[i] = e.claimRequest(t, a, fmt.Sprint("cl_", i))
		}
		errs := racetest.Each(n, func(i int) error {
			_, err := replicas[i%2].Leases.Claim(ctx, reqs[i])
			return err
		})
		winner, err := racetest.OneWinner(errs, record.ErrLeaseClaimed)
		if err != nil {
			t.Fatalf("round %d: claims: %v", round, err)
		}
		claim := fmt.Sprint("cl_", winner)
		if st, got, err := e.leaseState(t, a.Lease); err != nil || st != record.LeaseRunning || got != claim {
			t.Fatalf("round %d: lease %s %q %v, winner %s", round, st, got, err, claim)
		}
		loser := fmt.Sprint("cl_", (winner+1)%n)
		if _, err := replicas[round%2].Leases.Complete(ctx, authz.CompleteRequest{Lease: a.Lease, Outcome: record.OutcomeEffect, Claim: loser}); !errors.Is(err, record.ErrLeaseClaimed) {
			t.Fatalf("round %d: a loser's report: %v", round, err)
		}
		if _, err := replicas[round%2].Leases.Complete(ctx, authz.CompleteRequest{Lease: a.Lease, Outcome: record.OutcomeEffect, Claim: claim}); err != nil {
			t.Fatalf("round %d: the winner's report: %v", round, err)
		}
	}
}

// TestCompleteRules: who may report what, through the use case. A running
// lease takes outcomes only under its claim, an unclaimed one only a
// release (rejected, no claim); calls out of order — an outcome or a claim
// before admission, a claim after the outcome, a resolution of a lease
// that is not uncertain — are refused with their own error. A refused
// call changes nothing.
func TestCompleteRules(t *testing.T) {
	e := newAdmitEnv(t, nil)
	for i, tc := range []struct {
		note    string
		claimed bool // the lease is claimed ("cl_a") first
		call    func(t *testing.T, a *authz.Grant) error
		want    error
	}{
		{"running, effect under another claim", true, func(t *testing.T, a *authz.Grant) error {
			_, err := e.complete(a.Lease, "cl_b", record.OutcomeEffect)
			return err
		}, record.ErrLeaseClaimed},
		{"running, release (rejected, no claim)", true, func(t *testing.T, a *authz.Grant) error {
			_, err := e.complete(a.Lease, "", record.OutcomeRejected)
			return err
		}, record.ErrLeaseClaimed},
		{"running, resolved by an operator", true, func(t *testing.T, a *authz.Grant) error {
			_, err := e.forms.Leases.Resolve(testCtx(t), "ops", a.Lease, record.OutcomeNoEffect, "looked")
			return err
		}, record.ErrLeaseNotUncertain},
		{"running, an outcome a backend may not report", true, func(t *testing.T, a *authz.Grant) error {
			_, err := e.complete(a.Lease, "cl_a", record.OutcomeNoEffect)
			return err
		}, authz.ErrBadRequest},
		{"unclaimed, effect", false, func(t *testing.T, a *authz.Grant) error {
			_, err := e.complete(a.Lease, "", record.OutcomeEffect)
			return err
		}, record.ErrLeaseNotClaimed},
		{"unclaimed, failed under a claim it lacks", false, func(t *testing.T, a *authz.Grant) error {
			_, err := e.complete(a.Lease, "cl_a", record.OutcomeFailed)
			return err
		}, record.ErrLeaseNotClaimed},
		{"unclaimed, uncertain", false, func(t *testing.T, a *authz.Grant) error {
			_, err := e.complete(a.Lease, "", record.OutcomeUncertain)
			return err
		}, record.ErrLeaseNotClaimed},
		{"unclaimed, resolved by an operator", false, func(t *testing.T, a *authz.Grant) error {
			_, err := e.forms.Leases.Resolve(testCtx(t), "ops", a.Lease, record.OutcomeEffect, "looked")
			return err
		}, record.ErrLeaseNotUncertain},
		{"unclaimed, claimed with the token of another epoch", false, func(t *testing.T, a *authz.Grant) error {
			req := e.claimRequest(t, a, "cl_x")
			req.Epoch = "sha256:" + strings.Repeat("0", 64)
			_, err := e.forms.Leases.Claim(testCtx(t), req)
			return err
		}, nil},
	} {
		t.Run(tc.note, func(t *testing.T) {
			f, a := e.admitRead(t, fmt.Sprint("rules", i))
			want := struct {
				st    record.LeaseState
				claim string
			}{record.LeaseAdmitted, ""}
			if tc.claimed {
				if _, err := e.claim(t, a, "cl_a"); err != nil {
					t.Fatal(err)
				}
				want.st, want.claim = record.LeaseRunning, "cl_a"
			}
			err := tc.call(t, a)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if st, claim, err := e.leaseState(t, a.Lease); err != nil || st != want.st || claim != want.claim {
				t.Fatalf("the refused call changed the lease: %s %q %v, want %+v", st, claim, err, want)
			}
			if st := e.status(t, f.ID); st != record.StatusAdmitted {
				t.Fatalf("the refused call changed the formation: %s", st)
			}
		})
	}

	t.Run("out of order", func(t *testing.T) {
		ctx := testCtx(t)
		f := e.ready(t, "order", "github/get_repository", `{"owner":"o","repo":"order"}`, nil)
		never, _ := lease.NewLeaseID()
		if _, err := e.complete(never, "cl_a", record.OutcomeEffect); !errors.Is(err, record.ErrLeaseNotFound) {
			t.Fatalf("outcome before admission: %v", err)
		}
		if _, err := e.forms.Leases.Claim(ctx, authz.ClaimRequest{Lease: never, Epoch: f.Source.Epoch, Revision: 1, Claim: "cl_a"}); !errors.Is(err, record.ErrLeaseNotFound) {
			t.Fatalf("claim before admission: %v", err)
		}
		if st := e.status(t, f.ID); st != record.StatusReady {
			t.Fatalf("formation after the early calls: %s", st)
		}
		a, err := e.forms.Admissions.Admit(ctx, f.ID)
		if err != nil {
			t.Fatalf("admission after the early calls: %v", err)
		}
		claim := e.report(t, a, record.OutcomeEffect)
		for _, id := range []string{claim, "cl_late"} {
			if _, err := e.claim(t, a, id); !errors.Is(err, record.ErrLeaseClosed) {
				t.Fatalf("claim %s after the outcome: %v", id, err)
			}
		}
		if _, err := e.complete(a.Lease, claim, record.OutcomeFailed); !errors.Is(err, record.ErrLeaseClosed) {
			t.Fatalf("a second outcome: %v", err)
		}
		if st := e.status(t, f.ID); st != record.StatusCompleted {
			t.Fatalf("formation after the late calls: %s", st)
		}
	})

	t.Run("release", func(t *testing.T) {
		ctx := testCtx(t)
		f, a := e.admitRead(t, "release")
		if _, err := e.complete(a.Lease, "", record.OutcomeRejected); err != nil {
			t.Fatalf("release of an unclaimed lease: %v", err)
		}
		if st := e.status(t, f.ID); st != record.StatusRejected {
			t.Fatalf("released formation: %s", st)
		}
		if _, _, err := e.leaseState(t, a.Lease); !errors.Is(err, record.ErrLeaseClosed) {
			t.Fatalf("lease after release: %v", err)
		}
		ls, err := e.store.EpochLeases(ctx, a.Target.Epoch)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			if l.ID == a.Lease {
				t.Fatalf("the released lease's marker is still listed: %+v", l)
			}
		}
		if _, err := e.claim(t, a, "cl_after"); !errors.Is(err, record.ErrLeaseClosed) {
			t.Fatalf("claim after release: %v", err)
		}
		if got, err := e.forms.Admissions.Admit(ctx, f.ID); !errors.Is(err, record.ErrLeaseClosed) || got != nil {
			t.Fatalf("re-admission after release: %+v %v", got, err)
		}
	})
}

// TestOutcomesMeetRequiresOnlyByEffect: delete_repository requires
// get_repository. Only an effect of get_repository (a result) lets it be
// admitted; after a failed one (isError), a rejected one (the backend ran
// nothing), a release (the fence refused it) or an uncertain one, it is
// refused with requires unmet. Every outcome but uncertain releases the
// marker.
func TestOutcomesMeetRequiresOnlyByEffect(t *testing.T) {
	e := newAdmitEnv(t, allowAll(t))
	for _, tc := range []struct {
		outcome record.Outcome
		release bool // reported without a claim: the fence refused the call
		status  record.Status
		met     bool
	}{
		{record.OutcomeEffect, false, record.StatusCompleted, true},
		{record.OutcomeFailed, false, record.StatusFailed, false},
		{record.OutcomeRejected, false, record.StatusRejected, false},
		{record.OutcomeRejected, true, record.StatusRejected, false},
		{record.OutcomeUncertain, false, record.StatusUncertain, false},
	} {
		note := string(tc.outcome)
		if tc.release {
			note = "release"
		}
		t.Run(note, func(t *testing.T) {
			ctx := testCtx(t)
			session := "req-" + note
			get, a := e.admitRead(t, session)
			del := e.ready(t, session, "github/delete_repository", `{"owner":"o","repo":"r"}`, nil, "bob")
			if tc.release {
				if _, err := e.complete(a.Lease, "", record.OutcomeRejected); err != nil {
					t.Fatal(err)
				}
			} else {
				e.report(t, a, tc.outcome)
			}
			if st := e.status(t, get.ID); st != tc.status {
				t.Fatalf("formation of get_repository: %s, want %s", st, tc.status)
			}
			_, _, err := e.leaseState(t, a.Lease)
			if released := errors.Is(err, record.ErrLeaseClosed); released != (tc.outcome != record.OutcomeUncertain) {
				t.Fatalf("marker released: %v (%v)", released, err)
			}
			d, err := e.forms.Admissions.Admit(ctx, del.ID)
			var de *record.DependencyError
			switch {
			case tc.met && err != nil:
				t.Fatalf("dependent after an effect: %v", err)
			case !tc.met && (!errors.As(err, &de) || de.Exclusive || de.Tool != "github/get_repository" || d != nil):
				t.Fatalf("dependent after %s: %+v %v, want requires unmet", note, d, err)
			}
		})
	}
}

// TestExclusiveAfterOutcome: delete_repository and create_repository are
// exclusive. A create_repository that ran — with a result or an error
// result — holds the exclusion; one that never ran (released) does not.
func TestExclusiveAfterOutcome(t *testing.T) {
	e := newAdmitEnv(t, allowAll(t))
	for _, tc := range []struct {
		note     string
		outcome  record.Outcome
		release  bool
		excluded bool
	}{
		{"effect", record.OutcomeEffect, false, true},
		{"failed", record.OutcomeFailed, false, true},
		{"released", record.OutcomeRejected, true, false},
	} {
		t.Run(tc.note, func(t *testing.T) {
			ctx := testCtx(t)
			session := "excl-" + tc.note
			_, get := e.admitRead(t, session)
			e.report(t, get, record.OutcomeEffect) // meets delete's requires
			create := e.ready(t, session, "github/create_repository", `{"name":"n"}`, nil, "bob")
			del := e.ready(t, session, "github/delete_repository", `{"owner":"o","repo":"r"}`, nil, "bob")
			a, err := e.forms.Admissions.Admit(ctx, create.ID)
			if err != nil {
				t.Fatal(err)
			}
			if tc.release {
				if _, err := e.complete(a.Lease, "", record.OutcomeRejected); err != nil {
					t.Fatal(err)
				}
			} else {
				e.report(t, a, tc.outcome)
			}
			_, err = e.forms.Admissions.Admit(ctx, del.ID)
			var de *record.DependencyError
			switch {
			case tc.excluded && (!errors.As(err, &de) || !de.Exclusive || de.Tool != "github/create_repository"):
				t.Fatalf("delete after a create that %s: %v, want exclusive", tc.note, err)
			case !tc.excluded && err != nil:
				t.Fatalf("delete after a create that never ran: %v", err)
			}
		})
	}
}

// TestRunningAndFailedLeasesAndTheEpoch: a running lease holds its epoch's
// retirement back like an admitted one; a failed outcome releases it.
func TestRunningAndFailedLeasesAndTheEpoch(t *testing.T) {
	e := newAdmitEnv(t, nil)
	ctx := testCtx(t)
	f, a := e.admitRead(t, "s")
	claim := e.mustClaim(t, a)
	if _, err := e.store.Drain(ctx, a.Target.Epoch); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Retire(ctx, a.Target.Epoch, 0); !isBlocked(err, 1, 0) {
		t.Fatalf("retire with a running lease: %v", err)
	}
	if _, err := e.complete(a.Lease, claim, record.OutcomeFailed); err != nil {
		t.Fatal(err)
	}
	if st := e.status(t, f.ID); st != record.StatusFailed {
		t.Fatalf("formation after a failed outcome: %s", st)
	}
	if st, err := e.store.Retire(ctx, a.Target.Epoch, 0); err != nil || st != record.StateStale {
		t.Fatalf("retire after the failed outcome: %s %v", st, err)
	}
	if _, err := e.forms.Admissions.Admit(ctx, f.ID); !errors.Is(err, record.ErrLeaseClosed) {
		t.Fatalf("re-admission of a failed call: %v", err)
	}
}

// TestSweeperMarksRunningLeasesByClaimTime: a running lease never
// reported is marked uncertain once its claim (not its admission) is
// older than the sweep's wait; one claimed later is left running until its
// own claim is that old.
func TestSweeperMarksRunningLeasesByClaimTime(t *testing.T) {
	e := newAdmitEnv(t, nil)
	ctx := testCtx(t)
	_, early := e.admitRead(t, "early")
	_, late := e.admitRead(t, "late")
	_, idle := e.admitRead(t, "idle") // never claimed
	earlyClaim := e.mustClaim(t, early)
	e.clock.Advance(5 * time.Minute)
	lateClaim := e.mustClaim(t, late)

	// The wait is 2×grace + token lifetime (10m30s): past it for the
	// early claim and the idle admission, not for the late claim.
	e.clock.Advance(7 * time.Minute)
	marked, err := e.forms.Leases.SweepUnreported(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{early.Lease: true, idle.Lease: true}
	if len(marked) != len(want) || !want[marked[0]] || !want[marked[len(marked)-1]] {
		t.Fatalf("sweep marked %v, want %s and %s", marked, early.Lease, idle.Lease)
	}
	if st, claim, err := e.leaseState(t, early.Lease); err != nil || st != record.LeaseUncertain || claim != earlyClaim {
		t.Fatalf("early lease: %s %q %v", st, claim, err)
	}
	if st, claim, err := e.leaseState(t, late.Lease); err != nil || st != record.LeaseRunning || claim != lateClaim {
		t.Fatalf("late lease: %s %q %v", st, claim, err)
	}
	// The early lease's report comes too late: only a resolution closes
	// it now.
	if _, err := e.complete(early.Lease, earlyClaim, record.OutcomeEffect); !errors.Is(err, record.ErrLeaseUncertain) {
		t.Fatalf("report after the mark: %v", err)
	}

	e.clock.Advance(4 * time.Minute) // the late claim is now 11m old
	marked, err = e.forms.Leases.SweepUnreported(ctx)
	if err != nil || len(marked) != 1 || marked[0] != late.Lease {
		t.Fatalf("second sweep marked %v (%v), want %s", marked, err, late.Lease)
	}
	for _, id := range []string{early.Lease, late.Lease, idle.Lease} {
		if _, err := e.forms.Leases.Resolve(ctx, "ops", id, record.OutcomeNoEffect, "checked"); err != nil {
			t.Fatalf("resolve %s: %v", id, err)
		}
	}
}
