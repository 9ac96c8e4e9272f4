package lease_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/record"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// admitMarkerAndCompares: an admission writes the marker under its epoch,
// the lease, the session's admitted entry and the formation (admitted,
// with the lease), all at one revision; each failed compare is reported
// as such and writes nothing.
func admitMarkerAndCompares(t *testing.T, x *fixture) {
	ctx := testCtx(t)
	ep := register(t, x.s, testManifest(t, "github", "v1.4.0", "private"))
	f, frev := x.form(t, "s-admit", "github/create_repository")
	lid, err := lease.NewLeaseID()
	if err != nil {
		t.Fatal(err)
	}
	l := &record.Lease{ID: lid, Formation: f.ID, Session: "s-admit", Tool: f.Tool, ArgumentDigest: "sha256:args",
		AdmittedAt: x.t0, Target: ep.Target()}
	check(t, "admit", x.s.Admit(ctx, lease.AdmitRequest{Formation: f, FormationRev: frev, Lease: l}), nil)
	if l.Revision <= frev || l.Cluster == "" || l.State != record.LeaseAdmitted {
		t.Fatalf("admitted lease: revision %d (formation at %d), cluster %q, state %s", l.Revision, frev, l.Cluster, l.State)
	}
	got, err := x.s.OpenLease(ctx, lid)
	if err != nil {
		t.Fatal(err)
	}
	if got.Revision != l.Revision || got.Cluster != l.Cluster || got.State != record.LeaseAdmitted || got.Claim != nil ||
		got.Formation != f.ID || got.Session != "s-admit" || got.Tool != f.Tool || got.ArgumentDigest != "sha256:args" ||
		got.Target != ep.Target() || !got.AdmittedAt.Equal(x.t0) {
		t.Fatalf("lease read back:\n%+v\nwant\n%+v", got, l)
	}
	rec, rrev, err := x.s.GetFormationRevision(ctx, f.ID)
	if err != nil || rec.Status != record.StatusAdmitted || rec.Lease != lid || !rec.UpdatedAt.Equal(x.t0) || rrev != l.Revision {
		t.Fatalf("admitted formation: %s lease %q at %d (want %d), %v", rec.Status, rec.Lease, rrev, l.Revision, err)
	}
	if leases, err := x.s.EpochLeases(ctx, ep.ID); err != nil || len(leases) != 1 || leases[0].ID != lid || leases[0].Revision != l.Revision {
		t.Fatalf("epoch leases: %+v, %v", leases, err)
	}
	if shown, err := x.s.GetEpoch(ctx, ep.ID); err != nil || shown.ActiveLeases != 1 || shown.UncertainLeases != 0 {
		t.Fatalf("epoch counts: %+v, %v", shown, err)
	}
	if h, err := x.s.SessionHistory(ctx, "s-admit"); err != nil || !slices.Equal(h.Admitted, []string{f.Tool}) || len(h.Completed) != 0 {
		t.Fatalf("session history: %+v, %v", h, err)
	}
	// The formation as read before is admitted now: admitting it again
	// (a second lease) is refused.
	f.Status = record.StatusReady
	again := *l
	again.ID, again.Revision = "ls_again", 0
	check(t, "admit twice", x.s.Admit(ctx, lease.AdmitRequest{Formation: f, FormationRev: frev, Lease: &again}), is(lease.ErrFormationChanged))

	gen := register(t, x.s, testManifest(t, "github", "v1.5.0", "private"))
	if _, err := x.s.SetGeneration(ctx, gen.Pool, 2, time.Hour); err != nil {
		t.Fatal(err)
	}
	drained := register(t, x.s, testManifest(t, "github", "v1.6.0", "private"))
	if _, err := x.s.Drain(ctx, drained.ID); err != nil {
		t.Fatal(err)
	}
	unknown := *ep
	unknown.ID = "sha256:unknown"

	for _, tc := range []struct {
		note   string
		ep     *record.Epoch
		gen    int64
		before func(f *record.Formation) // runs between the formation's read and its admission
		want   func(error) bool
	}{
		{note: "at the pool's generation", ep: gen, gen: 2},
		{note: "formation changed since read", ep: ep, want: is(lease.ErrFormationChanged),
			before: func(f *record.Formation) {
				if _, _, err := x.s.UpdateFormation(ctx, f.ID, func(f *record.Formation) error { f.UpdatedAt = x.t0.Add(time.Second); return nil }); err != nil {
					t.Fatal(err)
				}
			}},
		{note: "epoch DRAINING", ep: drained, want: func(err error) bool {
			var se *record.StateError
			return errors.As(err, &se) && se.Epoch == drained.ID && se.State == record.StateDraining && se.Want == record.StateActive
		}},
		{note: "epoch unknown", ep: &unknown, want: is(record.ErrEpochNotFound)},
		{note: "no generation, pool has one", ep: gen, gen: 0, want: is(lease.ErrGenerationChanged)},
		{note: "older generation", ep: gen, gen: 1, want: is(lease.ErrGenerationChanged)},
		{note: "newer generation", ep: gen, gen: 3, want: is(lease.ErrGenerationChanged)},
		{note: "generation, pool has none", ep: ep, gen: 1, want: is(lease.ErrGenerationChanged)},
	} {
		t.Run(tc.note, func(t *testing.T) {
			session := "s-" + tc.note
			f, frev := x.form(t, session, "github/get_repository")
			if tc.before != nil {
				tc.before(f)
			}
			_, wrev, err := x.s.GetFormationRevision(ctx, f.ID)
			if err != nil {
				t.Fatal(err)
			}
			leasesBefore, _ := x.s.EpochLeases(ctx, tc.ep.ID)
			lid, _ := lease.NewLeaseID()
			err = x.s.Admit(ctx, lease.AdmitRequest{Formation: f, FormationRev: frev, Lease: &record.Lease{ID: lid, Formation: f.ID,
				Session: session, Tool: f.Tool, Generation: tc.gen, AdmittedAt: x.t0, Target: tc.ep.Target()}})
			check(t, "admit", err, tc.want)
			if tc.want == nil {
				return
			}
			// Nothing written: not the lease, not the formation, not the ledger.
			_, err = x.s.OpenLease(ctx, lid)
			check(t, "the refused lease", err, is(record.ErrLeaseNotFound))
			if rec, r, err := x.s.GetFormationRevision(ctx, f.ID); err != nil || r != wrev || rec.Status != record.StatusReady {
				t.Fatalf("the refused admission wrote the formation: %s at %d (want %d), %v", rec.Status, r, wrev, err)
			}
			if after, _ := x.s.EpochLeases(ctx, tc.ep.ID); len(after) != len(leasesBefore) {
				t.Fatalf("the refused admission wrote a marker: %d leases, were %d", len(after), len(leasesBefore))
			}
			if h, err := x.s.SessionHistory(ctx, session); err != nil || len(h.Admitted) != 0 {
				t.Fatalf("the refused admission wrote the ledger: %+v, %v", h, err)
			}
		})
	}
}

// claimFirstWins: the first claim of an admitted lease wins and reads
// back; the same claim id again is answered as the first was; every other
// claim is refused and changes nothing.
func claimFirstWins(t *testing.T, x *fixture) {
	ctx := testCtx(t)
	ep := register(t, x.s, testManifest(t, "github", "v1.4.0", "private"))
	e := x.env(ep)
	l := x.admit(t, call{ep: ep})
	c, err := x.s.ClaimLease(ctx, e.req(l, "cl_a", time.Minute), nil)
	if err != nil || c.ID != "cl_a" || !c.At.Equal(x.t0.Add(time.Minute)) {
		t.Fatalf("first claim: %+v, %v", c, err)
	}
	got, err := x.s.OpenLease(ctx, l.ID)
	if err != nil || got.State != record.LeaseRunning || got.Claim == nil || got.Claim.ID != "cl_a" || !got.Claim.At.Equal(c.At) || got.Revision != l.Revision {
		t.Fatalf("claimed lease reads %+v (claim %+v), %v", got, got.Claim, err)
	}
	if again, err := x.s.ClaimLease(ctx, e.req(l, "cl_a", 2*time.Minute), nil); err != nil || again.ID != "cl_a" || !again.At.Equal(c.At) {
		t.Fatalf("the same claim again: %+v, %v; want the first claim", again, err)
	}

	closed := x.admit(t, call{ep: ep})
	x.release(t, closed)
	uncertain := x.admit(t, call{ep: ep})
	if m, err := x.s.MarkLeaseUnreported(ctx, uncertain.ID, x.t0.Add(time.Second)); err != nil || m == nil {
		t.Fatalf("mark unreported: %v %v", m, err)
	}
	fresh := x.admit(t, call{ep: ep})
	unknown, _ := lease.NewLeaseID()
	errNo := errors.New("not this claimant's pool")
	var asked []string
	for _, tc := range []struct {
		note  string
		req   lease.ClaimRequest
		allow func(string) error
		want  error
		lease *record.Lease // an open lease the refusal must leave as it was
	}{
		{"another claim", e.req(l, "cl_b", 0), nil, record.ErrLeaseClaimed, l},
		{"a wrong revision", func() lease.ClaimRequest { r := e.req(fresh, "cl_w", 0); r.Revision = l.Revision; return r }(), nil,
			record.ErrLeaseNotFound, fresh},
		{"a closed lease", e.req(closed, "cl_c", 0), nil, record.ErrLeaseClosed, nil},
		{"an uncertain lease", e.req(uncertain, "cl_u", 0), nil, record.ErrLeaseUncertain, uncertain},
		{"an unknown lease", lease.ClaimRequest{Lease: unknown, Epoch: ep.ID, Revision: l.Revision, Claim: "cl_x"}, nil,
			record.ErrLeaseNotFound, nil},
		{"refused by allow", e.req(fresh, "cl_p", 0), func(pool string) error { asked = append(asked, pool); return errNo }, errNo, fresh},
	} {
		var before *record.Lease
		if tc.lease != nil {
			before, _ = x.s.OpenLease(ctx, tc.lease.ID)
		}
		c, err := x.s.ClaimLease(ctx, tc.req, tc.allow)
		if !errors.Is(err, tc.want) {
			t.Fatalf("claim of %s: %+v, %v; want %v", tc.note, c, err, tc.want)
		}
		if tc.lease != nil {
			after, err := x.s.OpenLease(ctx, tc.lease.ID)
			if err != nil || after.State != before.State || !sameJSON(t, after.Claim, before.Claim) {
				t.Fatalf("the refused claim of %s changed the lease: %+v -> %+v (%v)", tc.note, before, after, err)
			}
		}
	}
	if !slices.Equal(asked, []string{ep.Pool}) {
		t.Fatalf("allow was asked with pools %v, want [%s]", asked, ep.Pool)
	}
	if c, err := x.s.ClaimLease(ctx, e.req(fresh, "cl_ok", 0), func(pool string) error { return nil }); err != nil || c.ID != "cl_ok" {
		t.Fatalf("claim allowed: %+v, %v", c, err)
	}

	// Racing claims with distinct ids: exactly one wins.
	raced := x.admit(t, call{ep: ep})
	const n = 8
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = x.s.ClaimLease(ctx, e.req(raced, fmt.Sprint("cl_", i), 0), nil)
		}()
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			t.Fatalf("claims %d and %d both won", winner, i)
		case err == nil:
			winner = i
		case !errors.Is(err, record.ErrLeaseClaimed):
			t.Fatalf("claim %d: %v", i, err)
		}
	}
	if st, claim, err := e.state(t, raced.ID); winner < 0 || err != nil || st != record.LeaseRunning || claim != fmt.Sprint("cl_", winner) {
		t.Fatalf("after the race (winner %d): %s %q %v", winner, st, claim, err)
	}
}

// closeWhoMayClose: a running lease closes only under its claim; an
// unclaimed one only as rejected without a claim (a release), else
// ErrLeaseNotClaimed; an uncertain one only by a resolution. Refusals
// change nothing; a closed lease stays closed.
func closeWhoMayClose(t *testing.T, x *fixture) {
	ctx := testCtx(t)
	ep := register(t, x.s, testManifest(t, "github", "v1.4.0", "private"))
	e := x.env(ep)
	const (
		admitted = "admitted"
		running  = "running"
		unsure   = "uncertain" // running, then reported uncertain
	)
	errNo := errors.New("not yours")
	for _, tc := range []struct {
		from string
		req  lease.CloseRequest
		want error
		// After: the lease's state if it stays open (else closed), the
		// formation's status.
		open   record.LeaseState
		status record.Status
	}{
		{from: running, req: lease.CloseRequest{Outcome: record.OutcomeEffect, Claim: "cl_a"}, status: record.StatusCompleted},
		{from: running, req: lease.CloseRequest{Outcome: record.OutcomeFailed, Claim: "cl_a"}, status: record.StatusFailed},
		{from: running, req: lease.CloseRequest{Outcome: record.OutcomeRejected, Claim: "cl_a"}, status: record.StatusRejected},
		{from: running, req: lease.CloseRequest{Outcome: record.OutcomeUncertain, Claim: "cl_a"}, open: record.LeaseUncertain, status: record.StatusUncertain},
		{from: running, req: lease.CloseRequest{Outcome: record.OutcomeNoEffect, Resolve: true}, want: record.ErrLeaseNotUncertain, open: record.LeaseRunning},
		{from: running, req: lease.CloseRequest{Outcome: record.OutcomeEffect, Claim: "cl_b"}, want: record.ErrLeaseClaimed, open: record.LeaseRunning},
		{from: running, req: lease.CloseRequest{Outcome: record.OutcomeRejected}, want: record.ErrLeaseClaimed, open: record.LeaseRunning},
		{from: running, req: lease.CloseRequest{Outcome: record.OutcomeEffect, Claim: "cl_a", AllowPool: func(string) error { return errNo }},
			want: errNo, open: record.LeaseRunning},
		{from: admitted, req: lease.CloseRequest{Outcome: record.OutcomeRejected}, status: record.StatusRejected},
		{from: admitted, req: lease.CloseRequest{Outcome: record.OutcomeRejected, Claim: "cl_a"}, want: record.ErrLeaseNotClaimed, open: record.LeaseAdmitted},
		{from: admitted, req: lease.CloseRequest{Outcome: record.OutcomeEffect}, want: record.ErrLeaseNotClaimed, open: record.LeaseAdmitted},
		{from: admitted, req: lease.CloseRequest{Outcome: record.OutcomeEffect, Claim: "cl_a"}, want: record.ErrLeaseNotClaimed, open: record.LeaseAdmitted},
		{from: admitted, req: lease.CloseRequest{Outcome: record.OutcomeFailed}, want: record.ErrLeaseNotClaimed, open: record.LeaseAdmitted},
		{from: admitted, req: lease.CloseRequest{Outcome: record.OutcomeUncertain}, want: record.ErrLeaseNotClaimed, open: record.LeaseAdmitted},
		{from: admitted, req: lease.CloseRequest{Outcome: record.OutcomeNoEffect, Resolve: true}, want: record.ErrLeaseNotUncertain, open: record.LeaseAdmitted},
		{from: unsure, req: lease.CloseRequest{Outcome: record.OutcomeEffect, Claim: "cl_a"}, want: record.ErrLeaseUncertain, open: record.LeaseUncertain},
		{from: unsure, req: lease.CloseRequest{Outcome: record.OutcomeRejected}, want: record.ErrLeaseUncertain, open: record.LeaseUncertain},
		{from: unsure, req: lease.CloseRequest{Outcome: record.OutcomeNoEffect, Resolve: true}, status: record.StatusRejected},
		{from: unsure, req: lease.CloseRequest{Outcome: record.OutcomeEffect, Resolve: true}, status: record.StatusCompleted},
	} {
		// Each case with and without the token's admission facts: with
		// them the common report takes the store's no-read path, and must
		// answer and change exactly what the read path does.
		for _, facts := range []bool{false, true} {
			name := fmt.Sprintf("%s %s claim %q resolve %v facts %v", tc.from, tc.req.Outcome, tc.req.Claim, tc.req.Resolve, facts)
			l := x.admit(t, call{ep: ep})
			if tc.from != admitted {
				e.mustClaim(t, l, "cl_a")
			}
			if tc.from == unsure {
				if _, err := x.s.CloseLease(ctx, lease.CloseRequest{Lease: l.ID, Outcome: record.OutcomeUncertain, Claim: "cl_a"}); err != nil {
					t.Fatal(err)
				}
			}
			before := e.status(t, l)
			req := tc.req
			req.Lease = l.ID
			if facts {
				req.Admission = admissionOf(l)
			}
			closed, err := x.s.CloseLease(ctx, req)
			if !errors.Is(err, tc.want) {
				t.Fatalf("%s: %v, want %v", name, err, tc.want)
			}
			if err == nil && (closed == nil || closed.ID != l.ID) {
				t.Fatalf("%s: closed %+v", name, closed)
			}
			st, _, err := e.state(t, l.ID)
			switch {
			case tc.open == "" && !errors.Is(err, record.ErrLeaseClosed):
				t.Fatalf("%s: the lease is %s (%v), want closed", name, st, err)
			case tc.open != "" && (err != nil || st != tc.open):
				t.Fatalf("%s: the lease is %s (%v), want %s", name, st, err, tc.open)
			}
			want := tc.status
			if tc.want != nil {
				want = before
			}
			if got := e.status(t, l); got != want {
				t.Fatalf("%s: formation %s, want %s", name, got, want)
			}
			// The claim stays with the lease while it is open under one.
			if _, ok := lease.ClaimKeyForTest(t, x.s, l.ID); ok != (tc.from != admitted && tc.open != "") {
				t.Fatalf("%s: claim key exists %v", name, ok)
			}
			if tc.open == "" {
				_, err := x.s.CloseLease(ctx, lease.CloseRequest{Lease: l.ID, Outcome: tc.req.Outcome, Claim: tc.req.Claim, Resolve: tc.req.Resolve})
				check(t, name+", again", err, is(record.ErrLeaseClosed))
				// Closed: its token can claim it no more, under any id.
				for _, id := range []string{"cl_a", "cl_late"} {
					if _, err := x.s.ClaimLease(ctx, e.req(l, id, 0), nil); !errors.Is(err, record.ErrLeaseClosed) {
						t.Fatalf("%s: claim %s after the close: %v", name, id, err)
					}
				}
			}
		}
	}
	l := x.admit(t, call{ep: ep})
	e.mustClaim(t, l, "cl_a")
	_, err := x.s.CloseLease(ctx, lease.CloseRequest{Lease: l.ID, Outcome: "exploded", Claim: "cl_a"})
	if err == nil {
		t.Fatal("an unknown outcome was accepted")
	}
	if st, claim, err := e.state(t, l.ID); err != nil || st != record.LeaseRunning || claim != "cl_a" {
		t.Fatalf("an unknown outcome changed the lease: %s %q %v", st, claim, err)
	}
	for _, withFacts := range []bool{false, true} {
		l := x.admit(t, call{ep: ep})
		e.mustClaim(t, l, "cl_a")
		var facts *record.Admission
		if withFacts {
			facts = admissionOf(l)
		}
		var seen string
		_, err = x.s.CloseLease(ctx, lease.CloseRequest{Lease: l.ID, Outcome: record.OutcomeEffect, Claim: "cl_a", Admission: facts,
			AllowPool: func(pool string) error { seen = pool; return nil }})
		if err != nil || seen != ep.Pool {
			t.Fatalf("allow saw pool %q (want %q), close %v", seen, ep.Pool, err)
		}
	}
	unknown, _ := lease.NewLeaseID()
	_, err = x.s.CloseLease(ctx, lease.CloseRequest{Lease: unknown, Outcome: record.OutcomeRejected})
	check(t, "close of an unknown lease", err, is(record.ErrLeaseNotFound))
	if shown, err := x.s.GetEpoch(ctx, ep.ID); err != nil {
		t.Fatal(err)
	} else {
		// Open after the table, run with and without facts: the refused
		// closes (4 running, 6 admitted, 2 uncertain) and the one reported
		// uncertain, twice; and the lease an unknown outcome left running.
		if shown.ActiveLeases != 21 || shown.UncertainLeases != 6 {
			t.Fatalf("epoch counts %d/%d, want 21/6", shown.ActiveLeases, shown.UncertainLeases)
		}
	}
}

// closeSessionLedger: effect records the tool completed in the session
// (meeting requires, conflicting with exclusive); failed records it
// failed (conflicting with exclusive, not meeting requires); rejected
// records nothing; an open admission conflicts with exclusive. Sessions
// are opaque ids.
func closeSessionLedger(t *testing.T, x *fixture) {
	ctx := testCtx(t)
	ep := register(t, x.s, testManifest(t, "github", "v1.4.0", "private"))
	e := x.env(ep)
	const write, read = "github/create_repository", "github/get_repository"
	history := func(session string) *record.SessionHistory {
		t.Helper()
		h, err := x.s.SessionHistory(ctx, session)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	closeAs := func(session string, outcome record.Outcome) {
		t.Helper()
		l := x.admit(t, call{ep: ep, session: session, tool: write})
		if h := history(session); !slices.Equal(h.Admitted, []string{write}) || len(h.Completed) != 0 {
			t.Fatalf("%s: while admitted, history %+v", session, h)
		}
		_, err := x.tryAdmit(t, call{ep: ep, session: session, tool: read, exclusive: []string{write}})
		check(t, session+": exclusive with an open admission", err, isDependency(write, true))
		req := lease.CloseRequest{Lease: l.ID, Outcome: outcome, Keep: time.Hour}
		if outcome != record.OutcomeRejected {
			e.mustClaim(t, l, "cl_"+session)
			req.Claim = "cl_" + session
		}
		if _, err := x.s.CloseLease(ctx, req); err != nil {
			t.Fatalf("%s: close %s: %v", session, outcome, err)
		}
	}
	for _, tc := range []struct {
		outcome   record.Outcome
		completed []string
		requires  func(error) bool // a later admission that requires the tool
		exclusive func(error) bool // a later admission exclusive with it
	}{
		{record.OutcomeEffect, []string{write}, nil, isDependency(write, true)},
		{record.OutcomeFailed, []string{}, isDependency(write, false), isDependency(write, true)},
		{record.OutcomeRejected, []string{}, isDependency(write, false), nil},
	} {
		session := "ledger/completed/" + string(tc.outcome)
		closeAs(session, tc.outcome)
		if h := history(session); !slices.Equal(h.Completed, tc.completed) || len(h.Admitted) != 0 || h.Session != session {
			t.Fatalf("%s: history %+v, want completed %v", session, h, tc.completed)
		}
		l, err := x.tryAdmit(t, call{ep: ep, session: session, tool: read, requires: []string{write}})
		check(t, session+": requires", err, tc.requires)
		if err == nil {
			x.release(t, l)
		}
		l, err = x.tryAdmit(t, call{ep: ep, session: session, tool: read, exclusive: []string{write}})
		check(t, session+": exclusive", err, tc.exclusive)
		if err == nil {
			x.release(t, l)
		}
	}
	// The ledger is per session, and a session id is opaque: what
	// happened in "ledger/completed/effect" is not in "ledger".
	if h := history("ledger"); len(h.Completed) != 0 || len(h.Admitted) != 0 {
		t.Fatalf("session ledger has %+v", h)
	}
	_, err := x.tryAdmit(t, call{ep: ep, session: "ledger", tool: read, requires: []string{write}})
	check(t, "requires in another session", err, isDependency(write, false))
}

// generationReleasesOlder: a newer generation of a pool releases the
// pool's admitted, running and uncertain leases of older generations
// (their formations uncertain: nobody knows what ran) and nothing else;
// setting it again finishes an interrupted release; an older or
// non-positive generation is refused; concurrent setters release each
// lease once.
func generationReleasesOlder(t *testing.T, x *fixture) {
	ctx := testCtx(t)
	ep := register(t, x.s, testManifest(t, "github", "v1.4.0", "private"))
	elsewhere := register(t, x.s, testManifest(t, "gitlab", "v2", "private"))
	e := x.env(ep)
	generation := func(pool string) int64 {
		t.Helper()
		g, err := x.s.PoolGeneration(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	if g := generation(ep.Pool); g != 0 {
		t.Fatalf("a new pool is at generation %d", g)
	}
	admitted, running, uncertain := x.admit(t, call{ep: ep}), x.admit(t, call{ep: ep}), x.admit(t, call{ep: ep})
	e.mustClaim(t, running, "cl_r")
	e.mustClaim(t, uncertain, "cl_u")
	if _, err := x.s.CloseLease(ctx, lease.CloseRequest{Lease: uncertain.ID, Outcome: record.OutcomeUncertain, Claim: "cl_u"}); err != nil {
		t.Fatal(err)
	}
	other := x.admit(t, call{ep: elsewhere})

	ch, err := x.s.SetGeneration(ctx, ep.Pool, 1, time.Hour)
	released := ch.IDs()
	if err != nil || !sameSet(released, ids(admitted, running, uncertain)) {
		t.Fatalf("set generation 1 released %v (%v), want %v", released, err, ids(admitted, running, uncertain))
	}
	if g := generation(ep.Pool); g != 1 {
		t.Fatalf("pool at %d, want 1", g)
	}
	if g := generation(elsewhere.Pool); g != 0 {
		t.Fatalf("another pool moved to %d", g)
	}
	for _, l := range []*record.Lease{admitted, running, uncertain} {
		_, err := x.s.OpenLease(ctx, l.ID)
		check(t, "a released lease", err, is(record.ErrLeaseClosed))
		if st := e.status(t, l); st != record.StatusUncertain {
			t.Fatalf("released formation %s, want uncertain", st)
		}
		if h, err := x.s.SessionHistory(ctx, l.Session); err != nil || len(h.Completed) != 0 || len(h.Admitted) != 0 {
			t.Fatalf("a released lease's session: %+v, %v", h, err)
		}
	}
	_, err = x.s.CloseLease(ctx, lease.CloseRequest{Lease: running.ID, Outcome: record.OutcomeEffect, Claim: "cl_r"})
	check(t, "the report of a released lease", err, is(record.ErrLeaseClosed))
	if st, _, err := e.state(t, other.ID); err != nil || st != record.LeaseAdmitted {
		t.Fatalf("another pool's lease: %s %v", st, err)
	}

	current := x.admit(t, call{ep: ep, gen: 1})
	e.mustClaim(t, current, "cl_c")
	// An interrupted release: the generation was recorded, an older lease
	// was not released yet. Setting the generation again finishes it.
	gkey := x.rawValue(t, []byte("00000000000000000001"))
	if _, err := x.raw.Delete(ctx, string(gkey.Key)); err != nil {
		t.Fatal(err)
	}
	stray := x.admit(t, call{ep: ep, gen: 0})
	if _, err := x.raw.Put(ctx, string(gkey.Key), string(gkey.Value)); err != nil {
		t.Fatal(err)
	}
	if ch, err := x.s.SetGeneration(ctx, ep.Pool, 1, time.Hour); err != nil || !sameSet(ch.IDs(), ids(stray)) {
		t.Fatalf("set generation 1 again released %v (%v), want the stray %s", ch.IDs(), err, stray.ID)
	}
	if st, claim, err := e.state(t, current.ID); err != nil || st != record.LeaseRunning || claim != "cl_c" {
		t.Fatalf("a lease of the current generation: %s %q %v", st, claim, err)
	}
	for _, pool := range []string{ep.Pool, elsewhere.Pool} { // a pool at 1, one at none
		for _, g := range []int64{0, -1} {
			_, err := x.s.SetGeneration(ctx, pool, g, time.Hour)
			check(t, fmt.Sprint("generation ", g, " of ", pool), err, is(record.ErrStaleGeneration))
		}
	}
	// Nothing recorded: the pool without a generation still admits at none.
	x.release(t, x.admit(t, call{ep: elsewhere, gen: 0}))
	if ch, err := x.s.SetGeneration(ctx, ep.Pool, 2, time.Hour); err != nil || !sameSet(ch.IDs(), ids(current)) {
		t.Fatalf("set generation 2 released %v (%v)", ch.IDs(), err)
	}
	_, err = x.s.SetGeneration(ctx, ep.Pool, 1, time.Hour)
	check(t, "an older generation", err, is(record.ErrStaleGeneration))
	if g := generation(ep.Pool); g != 2 {
		t.Fatalf("after the refusal the pool is at %d, want 2", g)
	}

	// Two replicas set generation 3 at once: every lease is released once.
	var old []*record.Lease
	for range 6 {
		old = append(old, x.admit(t, call{ep: ep, gen: 2}))
	}
	var got [2][]string
	var errs [2]error
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ch, err := x.s.SetGeneration(ctx, ep.Pool, 3, time.Hour)
			got[i], errs[i] = ch.IDs(), err
		}()
	}
	close(start)
	wg.Wait()
	if errs[0] != nil || errs[1] != nil || !sameSet(append(got[0], got[1]...), ids(old...)) {
		t.Fatalf("concurrent setters released %v and %v (%v, %v), want each of %v once", got[0], got[1], errs[0], errs[1], ids(old...))
	}
	if shown, err := x.s.GetEpoch(ctx, ep.ID); err != nil || shown.ActiveLeases != 0 || shown.UncertainLeases != 0 {
		t.Fatalf("epoch after the releases: %+v, %v", shown, err)
	}
}

// unreportedSweep: admitted leases admitted before the cutoff, and
// running ones claimed before it, become uncertain (the claim kept);
// later ones, closed ones and uncertain ones are left; a second sweep and
// concurrent sweepers mark each lease once.
func unreportedSweep(t *testing.T, x *fixture) {
	ctx := testCtx(t)
	ep := register(t, x.s, testManifest(t, "github", "v1.4.0", "private"))
	e := x.env(ep)
	cutoff := x.t0.Add(time.Hour)
	early := x.admit(t, call{ep: ep})
	late := x.admit(t, call{ep: ep, at: 2 * time.Hour})
	atCutoff := x.admit(t, call{ep: ep, at: time.Hour})
	runEarly, runLate := x.admit(t, call{ep: ep}), x.admit(t, call{ep: ep})
	if _, err := x.s.ClaimLease(ctx, e.req(runEarly, "cl_e", 30*time.Minute), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := x.s.ClaimLease(ctx, e.req(runLate, "cl_l", 90*time.Minute), nil); err != nil {
		t.Fatal(err)
	}
	closed := x.admit(t, call{ep: ep})
	x.release(t, closed)
	already := x.admit(t, call{ep: ep})
	e.mustClaim(t, already, "cl_x")
	if _, err := x.s.CloseLease(ctx, lease.CloseRequest{Lease: already.ID, Outcome: record.OutcomeUncertain, Claim: "cl_x"}); err != nil {
		t.Fatal(err)
	}
	alreadyRev := x.rawKeyOfMarker(t, ep.ID, already.ID)

	marked, err := x.s.MarkUnreported(ctx, cutoff)
	if err != nil || !sameSet(ids(marked...), ids(early, runEarly)) {
		t.Fatalf("sweep marked %v (%v), want %v", ids(marked...), err, ids(early, runEarly))
	}
	for _, m := range marked {
		if m.Closed <= m.Revision || m.State != record.LeaseUncertain {
			t.Fatalf("%s admitted at revision %d, marked %s at %d", m.ID, m.Revision, m.State, m.Closed)
		}
	}
	for _, want := range []struct {
		l      *record.Lease
		state  record.LeaseState
		claim  string
		status record.Status
	}{
		{early, record.LeaseUncertain, "", record.StatusUncertain},
		{runEarly, record.LeaseUncertain, "cl_e", record.StatusUncertain},
		{late, record.LeaseAdmitted, "", record.StatusAdmitted},
		{atCutoff, record.LeaseAdmitted, "", record.StatusAdmitted},
		{runLate, record.LeaseRunning, "cl_l", record.StatusAdmitted},
		{already, record.LeaseUncertain, "cl_x", record.StatusUncertain},
	} {
		st, claim, err := e.state(t, want.l.ID)
		if err != nil || st != want.state || claim != want.claim || e.status(t, want.l) != want.status {
			t.Fatalf("%s after the sweep: %s %q %s (%v), want %s %q %s", want.l.ID, st, claim, e.status(t, want.l), err, want.state, want.claim, want.status)
		}
	}
	if rev := x.rawKeyOfMarker(t, ep.ID, already.ID); rev != alreadyRev {
		t.Fatalf("the sweep rewrote an uncertain lease (revision %d -> %d)", alreadyRev, rev)
	}
	_, err = x.s.OpenLease(ctx, closed.ID)
	check(t, "a closed lease after the sweep", err, is(record.ErrLeaseClosed))
	if e.status(t, closed) != record.StatusRejected {
		t.Fatalf("the sweep touched a closed formation: %s", e.status(t, closed))
	}
	_, err = x.s.CloseLease(ctx, lease.CloseRequest{Lease: runEarly.ID, Outcome: record.OutcomeEffect, Claim: "cl_e"})
	check(t, "a report after the sweep", err, is(record.ErrLeaseUncertain))
	if shown, err := x.s.GetEpoch(ctx, ep.ID); err != nil || shown.ActiveLeases != 3 || shown.UncertainLeases != 3 {
		t.Fatalf("epoch counts after the sweep: %+v, %v", shown, err)
	}
	if again, err := x.s.MarkUnreported(ctx, cutoff); err != nil || len(again) != 0 {
		t.Fatalf("a second sweep marked %v (%v)", again, err)
	}
	for _, tc := range []struct {
		l    *record.Lease
		note string
	}{{closed, "closed"}, {late, "admitted after the cutoff"}, {already, "uncertain"}} {
		if m, err := x.s.MarkLeaseUnreported(ctx, tc.l.ID, cutoff); m != nil || err != nil {
			t.Fatalf("marking a lease %s: %v, %v", tc.note, m, err)
		}
	}
	unknown, _ := lease.NewLeaseID()
	_, err = x.s.MarkLeaseUnreported(ctx, unknown, cutoff)
	check(t, "marking an unknown lease", err, is(record.ErrLeaseNotFound))

	// Replicas sweeping at once mark each lease once.
	var fresh []*record.Lease
	for range 5 {
		fresh = append(fresh, x.admit(t, call{ep: ep}))
	}
	const sweepers = 3
	var got [sweepers][]string
	var errs [sweepers]error
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range sweepers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			m, err := x.s.MarkUnreported(ctx, cutoff)
			got[i], errs[i] = ids(m...), err
		}()
	}
	close(start)
	wg.Wait()
	var all []string
	for i := range sweepers {
		if errs[i] != nil {
			t.Fatalf("sweeper %d: %v", i, errs[i])
		}
		all = append(all, got[i]...)
	}
	if !sameSet(all, ids(fresh...)) {
		t.Fatalf("concurrent sweepers marked %v, want each of %v once", got, ids(fresh...))
	}
}

// rawKeyOfMarker returns the modification revision of a lease's marker
// (the key under the prefix that ends in the epoch and the lease id).
func (x *fixture) rawKeyOfMarker(t *testing.T, epoch, id string) int64 {
	t.Helper()
	kvs := x.rawKeys(t, func(kv *mvccpb.KeyValue) bool { return strings.HasSuffix(string(kv.Key), "/"+epoch+"/"+id) })
	if len(kvs) != 1 {
		t.Fatalf("%d markers of %s", len(kvs), id)
	}
	return kvs[0].ModRevision
}

// admissionOf is what l's dispatch token states of its admission.
func admissionOf(l *record.Lease) *record.Admission {
	return &record.Admission{Epoch: l.Target.Epoch, Revision: l.Revision, Formation: l.Formation, Session: l.Session, Tool: l.Tool}
}
