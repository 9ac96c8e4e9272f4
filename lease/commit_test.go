package lease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/leaktest"
	"github.com/fcd-authz/fcd/internal/testutil"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/record"
)

// prepare stores a ready formation of tool in session and returns its
// admission to the env's epoch, not yet run.
func (e *claimEnv) prepare(t *testing.T, session, tool string) *pendingAdmission {
	t.Helper()
	return e.prepareOn(t, e.ep, session, tool, 0)
}

// concurrently runs every op while the store's commit slots are held, so
// that all of them queue, then releases the slots and returns each op's
// error, in order.
func concurrently(t *testing.T, s *lease.Store, ops ...func(context.Context) error) []error {
	t.Helper()
	ctx := testCtx(t)
	queued, release := lease.HoldCommitsForTest(s)
	errs := make([]error, len(ops))
	var wg sync.WaitGroup
	for i, op := range ops {
		wg.Go(func() { errs[i] = op(ctx) })
	}
	testutil.Eventually(t, 30*time.Second, "every write queued", func() bool { return queued() == len(ops) })
	release()
	wg.Wait()
	return errs
}

func admitOp(s *lease.Store, p *pendingAdmission) func(context.Context) error {
	return func(ctx context.Context) error { return s.Admit(ctx, p.req) }
}

// TestGroupCommitBatchesAdmissions: admissions queued together go to etcd
// as one transaction, each is applied as it would be alone (its marker,
// readable and claimable under its own revision), and one whose compares
// fail (its formation changed since read) fails alone with its own error.
func TestGroupCommitBatchesAdmissions(t *testing.T) {
	e := newClaimEnv(t)
	var ps []*pendingAdmission
	for i := range 8 {
		ps = append(ps, e.prepare(t, fmt.Sprint("batch-", i), "github/get_repository"))
	}
	stale := ps[3]
	stale.req.FormationRev-- // read before the record was written: its compare fails
	before := e.s.CommitStats()
	var ops []func(context.Context) error
	for _, p := range ps {
		ops = append(ops, admitOp(e.s, p))
	}
	errs := concurrently(t, e.s, ops...)
	after := e.s.CommitStats()

	if got := after.Transactions - before.Transactions; got != 1 {
		t.Errorf("8 queued admissions took %d transactions, want 1", got)
	}
	if got := after.Batched - before.Batched; got != 8 {
		t.Errorf("batched items = %d, want 8", got)
	}
	for i, p := range ps {
		if p == stale {
			if !errors.Is(errs[i], lease.ErrFormationChanged) {
				t.Errorf("admission with a stale formation revision: %v, want ErrFormationChanged", errs[i])
			}
			if _, err := e.s.OpenLease(testCtx(t), p.req.Lease.ID); !errors.Is(err, record.ErrLeaseNotFound) {
				t.Errorf("the failed admission's lease reads %v, want not found", err)
			}
			continue
		}
		if errs[i] != nil {
			t.Fatalf("admission %d: %v", i, errs[i])
		}
		l := p.req.Lease
		got, err := e.s.OpenLease(testCtx(t), l.ID)
		if err != nil || got.Revision != l.Revision || got.State != record.LeaseAdmitted {
			t.Fatalf("admitted lease %d reads %+v, %v (want revision %d)", i, got, err, l.Revision)
		}
		e.mustClaim(t, got, "cl_"+l.ID)
		if st := e.status(t, got); st != record.StatusAdmitted {
			t.Errorf("formation %d status %s, want admitted", i, st)
		}
	}
}

// TestGroupCommitKeepsSessionOrder: writes that read what another writes
// are never in one batch, where etcd would evaluate both against the state
// before either: of two admissions of one exclusive tool in one session,
// exactly one opens a lease, as when they run one after the other; an
// admission that requires a tool whose effect is being reported sees the
// report or not, never half of it.
func TestGroupCommitKeepsSessionOrder(t *testing.T) {
	e := newClaimEnv(t)
	const tool = "github/create_repository"
	a, b := e.prepare(t, "excl", tool), e.prepare(t, "excl", tool)
	for _, p := range []*pendingAdmission{a, b} {
		p.req.Exclusive = []string{tool}
	}
	before := e.s.CommitStats()
	errs := concurrently(t, e.s, admitOp(e.s, a), admitOp(e.s, b))
	if got := e.s.CommitStats().Transactions - before.Transactions; got != 2 {
		t.Errorf("two conflicting admissions took %d transactions, want 2", got)
	}
	var dep *record.DependencyError
	switch {
	case errs[0] == nil && errors.As(errs[1], &dep) && dep.Exclusive:
	case errs[1] == nil && errors.As(errs[0], &dep) && dep.Exclusive:
	default:
		t.Fatalf("two exclusive admissions in one session: %v and %v, want one admitted and one refused as exclusive", errs[0], errs[1])
	}

	// A tool requiring get_repository, admitted while get_repository's
	// effect is reported: the admission fails (not yet completed) or
	// succeeds (completed), and the session ledger agrees with it.
	dep1 := e.prepare(t, "req", "github/get_repository")
	if err := e.s.Admit(testCtx(t), dep1.req); err != nil {
		t.Fatal(err)
	}
	l := dep1.req.Lease
	e.mustClaim(t, l, "cl_dep")
	next := e.prepare(t, "req", "github/create_repository")
	next.req.Requires = []string{"github/get_repository"}
	errs = concurrently(t, e.s,
		func(ctx context.Context) error {
			_, err := e.s.CloseLease(ctx, lease.CloseRequest{Lease: l.ID, Claim: "cl_dep", Outcome: record.OutcomeEffect, Keep: time.Hour})
			return err
		},
		admitOp(e.s, next))
	if errs[0] != nil {
		t.Fatalf("report: %v", errs[0])
	}
	// Refused as a dependency, or (when the report landed between the
	// admission and its diagnosis) as a formation that changed, which
	// authz answers by trying again.
	if errs[1] != nil && !errors.As(errs[1], &dep) && !errors.Is(errs[1], lease.ErrFormationChanged) {
		t.Fatalf("admission requiring a completed tool: %v", errs[1])
	}
	h, err := e.s.SessionHistory(testCtx(t), "req")
	if err != nil || len(h.Completed) != 1 {
		t.Fatalf("session history %+v, %v: want get_repository completed", h, err)
	}
}

// TestGroupCommitClaimsOnce: many claims of one lease queued together
// (each writes the claim key) go one transaction each, and exactly one
// claim id wins; claims of distinct leases share a transaction.
func TestGroupCommitClaimsOnce(t *testing.T) {
	e := newClaimEnv(t)
	one := e.admit(t, 0)
	var others []*record.Lease
	for range 4 {
		others = append(others, e.admit(t, 0))
	}
	var ops []func(context.Context) error
	won := make([]bool, 4)
	for i := range 4 {
		ops = append(ops, func(ctx context.Context) error {
			_, err := e.s.ClaimLease(ctx, e.req(one, fmt.Sprint("cl_", i), time.Minute), nil)
			won[i] = err == nil
			if err != nil && !errors.Is(err, record.ErrLeaseClaimed) {
				return err
			}
			return nil
		})
	}
	for _, l := range others {
		ops = append(ops, func(ctx context.Context) error {
			_, err := e.s.ClaimLease(ctx, e.req(l, "cl_x", time.Minute), nil)
			return err
		})
	}
	before := e.s.CommitStats()
	for i, err := range concurrently(t, e.s, ops...) {
		if err != nil {
			t.Errorf("claim %d: %v", i, err)
		}
	}
	winners := 0
	for _, w := range won {
		if w {
			winners++
		}
	}
	if winners != 1 {
		t.Errorf("%d claims of one lease won, want 1", winners)
	}
	// Four claims of one lease conflict pairwise: at least four
	// transactions; the other leases' claims ride along with them.
	if got := e.s.CommitStats().Transactions - before.Transactions; got != 4 {
		t.Errorf("8 claims (4 of one lease) took %d transactions, want 4", got)
	}
}

// TestLoneWritesAreNotBatched: writes that never overlap each go to etcd
// at once, alone: nothing waits for a batch to fill.
func TestLoneWritesAreNotBatched(t *testing.T) {
	e := newClaimEnv(t)
	before := e.s.CommitStats()
	for range 5 {
		l := e.admit(t, 0) // a formation and an admission
		e.mustClaim(t, l, "cl_lone")
	}
	d := e.s.CommitStats()
	if tx, items, batched := d.Transactions-before.Transactions, d.Items-before.Items, d.Batched-before.Batched; tx != 15 || items != 15 || batched != 0 {
		t.Errorf("15 sequential writes: %d transactions, %d items, %d batched; want 15, 15, 0", tx, items, batched)
	}
}

// TestGroupCommitRefusedBatchSplits: a batch etcd refuses as a whole
// (here: a retention lease it no longer knows, attached by one item) is
// sent again item by item, so the other items' answers do not depend on
// it.
func TestGroupCommitRefusedBatchSplits(t *testing.T) {
	e := newClaimEnv(t)
	var ls []*record.Lease
	for range 3 {
		ls = append(ls, e.admit(t, 0))
	}
	// Every retention lease the store holds is revoked behind its back.
	lease.RevokeRetentionForTest(t, e.s)
	var ops []func(context.Context) error
	for _, l := range ls {
		ops = append(ops, func(ctx context.Context) error {
			_, err := e.s.ClaimLease(ctx, e.req(l, "cl_split", time.Minute), nil)
			return err
		})
	}
	fid, err := lease.NewFormationID()
	if err != nil {
		t.Fatal(err)
	}
	f := &record.Formation{Call: record.Call{ID: fid, Session: "split", Tool: "github/get_repository",
		CreatedAt: e.t0, ExpiresAt: e.t0.Add(time.Hour)}, Status: record.StatusReady}
	ops = append(ops, func(ctx context.Context) error {
		_, err := e.s.CreateFormation(ctx, f, time.Hour)
		return err
	})
	before := e.s.CommitStats()
	errs := concurrently(t, e.s, ops...)
	for i := range ls {
		if errs[i] != nil {
			t.Errorf("claim %d in a refused batch: %v", i, errs[i])
		}
	}
	if !errors.Is(errs[3], record.ErrUnavailable) {
		t.Errorf("formation on a revoked retention lease: %v, want ErrUnavailable", errs[3])
	}
	if got := e.s.CommitStats().Split - before.Split; got != 1 {
		t.Errorf("split batches = %d, want 1", got)
	}
	// The store forgot the lease it was refused: the next write works.
	if _, err := e.s.CreateFormation(testCtx(t), f, time.Hour); err != nil {
		t.Errorf("formation after the refusal: %v", err)
	}
}

// TestGroupCommitFailsClosedWhileEtcdIsDown: with etcd down, the writes
// the committer carries — an admission, a claim, a common report, a
// batch of reports — fail with ErrUnavailable, and none of them took
// effect once etcd is back.
func TestGroupCommitFailsClosedWhileEtcdIsDown(t *testing.T) {
	e := newClaimEnv(t)
	ctx := testCtx(t)
	running := e.admit(t, 0)
	e.mustClaim(t, running, "cl_run")
	admitted := e.admit(t, 0)
	pending := e.prepare(t, "down", "github/get_repository")

	e.m.Stop()
	report := lease.CloseRequest{Lease: running.ID, Claim: "cl_run", Outcome: record.OutcomeEffect, Keep: time.Hour, Admission: admissionOf(running)}
	for name, op := range map[string]func() error{
		"admit": func() error { return e.s.Admit(ctx, pending.req) },
		"claim": func() error {
			_, err := e.s.ClaimLease(ctx, e.req(admitted, "cl_down", time.Minute), nil)
			return err
		},
		"report": func() error { _, err := e.s.CloseLease(ctx, report); return err },
		"reports": func() error {
			_, errs := e.s.CloseLeases(ctx, []lease.CloseRequest{report})
			return errs[0]
		},
	} {
		if err := op(); !errors.Is(err, record.ErrUnavailable) {
			t.Errorf("%s with etcd down: %v, want ErrUnavailable", name, err)
		}
	}

	e.m.Restart()
	testutil.Eventually(t, 30*time.Second, "the store to reach etcd again", func() bool { return e.s.Ping(ctx) == nil })
	if st, claim, err := e.state(t, running.ID); err != nil || st != record.LeaseRunning || claim != "cl_run" {
		t.Errorf("the reported lease is %s %q %v, want still running", st, claim, err)
	}
	if st, claim, err := e.state(t, admitted.ID); err != nil || st != record.LeaseAdmitted || claim != "" {
		t.Errorf("the claimed lease is %s %q %v, want still admitted", st, claim, err)
	}
	if _, err := e.s.OpenLease(ctx, pending.req.Lease.ID); !errors.Is(err, record.ErrLeaseNotFound) {
		t.Errorf("the admission made while etcd was down: %v, want none", err)
	}
}

// TestCloseAnswersGroupCommits: Close waits for the batches under way,
// which keep etcd's answer, fails the writes still queued with ErrClosed
// (an ErrUnavailable) instead of leaving them waiting, refuses writes
// after it, and leaves no flush goroutine behind.
func TestCloseAnswersGroupCommits(t *testing.T) {
	e := newClaimEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Writes queued while every slot is held: nothing sends them.
	s := e.m.Store(t, "/claims/")
	queued, release := lease.HoldCommitsForTest(s)
	waiting := []*pendingAdmission{e.prepare(t, "close-q1", "github/get_repository"), e.prepare(t, "close-q2", "github/get_repository")}
	errs := make([]error, len(waiting))
	var wg sync.WaitGroup
	for i, p := range waiting {
		wg.Go(func() { errs[i] = s.Admit(ctx, p.req) })
	}
	testutil.Eventually(t, 30*time.Second, "both writes queued", func() bool { return queued() == len(waiting) })
	if err := s.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, lease.ErrClosed) || !errors.Is(err, record.ErrUnavailable) {
			t.Errorf("write %d queued at Close: %v, want ErrClosed (an ErrUnavailable)", i, err)
		}
	}
	release() // starts no flush: the store is closed
	if err := s.Admit(ctx, e.prepare(t, "close-after", "github/get_repository").req); !errors.Is(err, lease.ErrClosed) {
		t.Errorf("write after Close: %v, want ErrClosed", err)
	}
	assertNoFlush(t)

	// Writes handed to flush goroutines when Close comes: each is either
	// committed (etcd's answer) or refused with ErrClosed, never lost to
	// the closed connection.
	s = e.m.Store(t, "/claims/")
	queued, release = lease.HoldCommitsForTest(s)
	var inFlight []*pendingAdmission
	for i := range 8 {
		inFlight = append(inFlight, e.prepare(t, fmt.Sprint("close-f", i), "github/get_repository"))
	}
	errs = make([]error, len(inFlight))
	for i, p := range inFlight {
		wg.Go(func() { errs[i] = s.Admit(ctx, p.req) })
	}
	testutil.Eventually(t, 30*time.Second, "every write queued", func() bool { return queued() == len(inFlight) })
	release()
	if err := s.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	assertNoFlush(t) // at once: Close joined them
	wg.Wait()
	for i, err := range errs {
		if err != nil && !errors.Is(err, lease.ErrClosed) {
			t.Errorf("write %d under way at Close: %v, want its commit or ErrClosed", i, err)
		}
	}
}

// assertNoFlush fails t if a goroutine of the group committer is running.
func assertNoFlush(t *testing.T) {
	t.Helper()
	for _, g := range leaktest.Goroutines() {
		if strings.Contains(g, "lease.(*committer).flush") {
			t.Errorf("a flush goroutine is left after Close:\n%s", g)
		}
	}
}
