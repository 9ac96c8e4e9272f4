package lease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/record"
)

// TestReportFactsAreProven: the facts a report carries from its token are
// the attacker's to spell. Each forged fact (another formation, session,
// tool, revision or epoch) makes the report take the read path, which
// closes the lease the report names under the facts stored for it: no
// other formation's status, no other session's ledger changes. A claim
// that is not the lease's is refused with the facts as without them.
func TestReportFactsAreProven(t *testing.T) {
	e := newClaimEnv(t)
	other := register(t, e.s, testManifest(t, "github", "v1.5.0", "private"))
	for _, tc := range []struct {
		name   string
		forge  func(a *record.Admission, bystander *record.Lease)
		effect bool // the report applies (to the right records)
	}{
		{"true facts", func(*record.Admission, *record.Lease) {}, true},
		{"another formation", func(a *record.Admission, b *record.Lease) { a.Formation = b.Formation }, true},
		{"another session", func(a *record.Admission, b *record.Lease) { a.Session = b.Session }, true},
		{"a session with nothing", func(a *record.Admission, _ *record.Lease) { a.Session = "victim" }, true},
		{"another tool", func(a *record.Admission, _ *record.Lease) { a.Tool = "github/create_repository" }, true},
		{"another admission's revision", func(a *record.Admission, b *record.Lease) { a.Revision = b.Revision }, true},
		{"another epoch", func(a *record.Admission, _ *record.Lease) { a.Epoch = other.ID }, true},
		{"an unknown epoch", func(a *record.Admission, _ *record.Lease) { a.Epoch = "sha256:00" }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			l, bystander := e.admit(t, 0), e.admit(t, 0)
			e.mustClaim(t, l, "cl_l")
			e.mustClaim(t, bystander, "cl_b")
			facts := admissionOf(l)
			tc.forge(facts, bystander)
			closed, err := e.s.CloseLease(ctx, lease.CloseRequest{Lease: l.ID, Claim: "cl_l", Outcome: record.OutcomeEffect,
				Keep: time.Hour, Admission: facts})
			if err != nil || closed.ID != l.ID || closed.Formation != l.Formation {
				t.Fatalf("report: %+v, %v", closed, err)
			}
			if st := e.status(t, l); st != record.StatusCompleted {
				t.Errorf("the reported formation is %s, want completed", st)
			}
			if st, claim, err := e.state(t, bystander.ID); err != nil || st != record.LeaseRunning || claim != "cl_b" {
				t.Errorf("the bystander lease is %s %q %v, want running under cl_b", st, claim, err)
			}
			if st := e.status(t, bystander); st != record.StatusAdmitted {
				t.Errorf("the bystander formation is %s, want admitted", st)
			}
			for session, want := range map[string]int{l.Session: 1, bystander.Session: 0, "victim": 0} {
				h, err := e.s.SessionHistory(ctx, session)
				if err != nil || len(h.Completed) != want {
					t.Errorf("session %s completed %v (%v), want %d tools", session, h.Completed, err, want)
				}
			}
		})
	}

	t.Run("a claim not the lease's", func(t *testing.T) {
		l := e.admit(t, 0)
		e.mustClaim(t, l, "cl_l")
		for _, claim := range []string{"cl_other", ""} {
			_, err := e.s.CloseLease(testCtx(t), lease.CloseRequest{Lease: l.ID, Claim: claim, Outcome: record.OutcomeRejected,
				Keep: time.Hour, Admission: admissionOf(l)})
			if !errors.Is(err, record.ErrLeaseClaimed) {
				t.Errorf("report under claim %q: %v, want ErrLeaseClaimed", claim, err)
			}
		}
		if st, claim, err := e.state(t, l.ID); err != nil || st != record.LeaseRunning || claim != "cl_l" {
			t.Errorf("the lease is %s %q %v, want running under cl_l", st, claim, err)
		}
	})
}

// TestCommonReportReadsNothing: with true facts the report is applied
// without reading the formation — here its record is unreadable, which
// the read path refuses (record.ErrCorrupt) — and without them it is not.
func TestCommonReportReadsNothing(t *testing.T) {
	e := newClaimEnv(t)
	for _, withFacts := range []bool{true, false} {
		l := e.admit(t, 0)
		e.mustClaim(t, l, "cl_l")
		e.m.PutRaw(t, "/claims/formations/"+l.Formation, "not json")
		req := lease.CloseRequest{Lease: l.ID, Claim: "cl_l", Outcome: record.OutcomeEffect, Keep: time.Hour}
		if withFacts {
			req.Admission = admissionOf(l)
		}
		_, err := e.s.CloseLease(testCtx(t), req)
		switch {
		case withFacts && err != nil:
			t.Errorf("report with facts over an unreadable record: %v, want applied unread", err)
		case !withFacts && !errors.Is(err, record.ErrCorrupt):
			t.Errorf("report without facts over an unreadable record: %v, want ErrCorrupt from reading it", err)
		}
	}
}

// TestCloseLeasesTogether: many reports at once each get the answer
// CloseLease would give; the common ones share one etcd transaction, the
// others (no facts, forged facts, a claim not the lease's) are answered
// by reading, as alone.
func TestCloseLeasesTogether(t *testing.T) {
	e := newClaimEnv(t)
	var ls []*record.Lease
	for range 7 {
		l := e.admit(t, 0)
		e.mustClaim(t, l, "cl_"+l.ID)
		ls = append(ls, l)
	}
	var reqs []lease.CloseRequest
	for _, l := range ls[:4] {
		reqs = append(reqs, lease.CloseRequest{Lease: l.ID, Claim: "cl_" + l.ID, Outcome: record.OutcomeEffect, Keep: time.Hour, Admission: admissionOf(l)})
	}
	forged := admissionOf(ls[4])
	forged.Formation = ls[0].Formation
	reqs = append(reqs,
		lease.CloseRequest{Lease: ls[4].ID, Claim: "cl_" + ls[4].ID, Outcome: record.OutcomeFailed, Keep: time.Hour, Admission: forged},
		lease.CloseRequest{Lease: ls[5].ID, Claim: "cl_nope", Outcome: record.OutcomeEffect, Keep: time.Hour, Admission: admissionOf(ls[5])},
		lease.CloseRequest{Lease: ls[6].ID, Claim: "cl_" + ls[6].ID, Outcome: record.OutcomeRejected, Keep: time.Hour})
	before := e.s.CommitStats()
	closed, errs := e.s.CloseLeases(testCtx(t), reqs)
	d := e.s.CommitStats()
	want := []record.Status{record.StatusCompleted, record.StatusCompleted, record.StatusCompleted, record.StatusCompleted,
		record.StatusFailed, record.StatusAdmitted, record.StatusRejected}
	for i, l := range ls {
		switch {
		case i == 5:
			if !errors.Is(errs[i], record.ErrLeaseClaimed) {
				t.Errorf("report %d under another claim: %v, want ErrLeaseClaimed", i, errs[i])
			}
		case errs[i] != nil || closed[i] == nil || closed[i].ID != l.ID || closed[i].Formation != l.Formation:
			t.Errorf("report %d: %+v, %v", i, closed[i], errs[i])
		}
		if st := e.status(t, l); st != want[i] {
			t.Errorf("formation %d is %s, want %s", i, st, want[i])
		}
	}
	// Five went together (four applied, the one under another claim
	// refused by its compares, then on reading); the forged one names the
	// first one's formation, whose outcome key they both write, so it went
	// alone, failed its compares and was read and written; the release
	// without facts was read and written.
	if tx, batched := d.Transactions-before.Transactions, d.Batched-before.Batched; tx != 4 || batched != 5 {
		t.Errorf("%d transactions with %d items batched, want 4 and 5", tx, batched)
	}
}

// TestLeaseIndexOfAnOlderVersion: a lease index written by a version that
// stored the bare epoch id is still read; the common report's compare of
// the index then fails and the report takes the read path.
func TestLeaseIndexOfAnOlderVersion(t *testing.T) {
	e := newClaimEnv(t)
	l := e.admit(t, 0)
	e.mustClaim(t, l, "cl_old")
	e.m.PutRaw(t, "/claims/leases/"+l.ID, l.Target.Epoch)
	if st, claim, err := e.state(t, l.ID); err != nil || st != record.LeaseRunning || claim != "cl_old" {
		t.Fatalf("lease under an old index: %s %q %v", st, claim, err)
	}
	if _, err := e.s.CloseLease(testCtx(t), lease.CloseRequest{Lease: l.ID, Claim: "cl_old", Outcome: record.OutcomeEffect,
		Keep: time.Hour, Admission: admissionOf(l)}); err != nil {
		t.Fatal(err)
	}
	if st := e.status(t, l); st != record.StatusCompleted {
		t.Fatalf("formation %s, want completed", st)
	}
}
