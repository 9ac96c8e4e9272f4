package lease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/record"
)

// TestSignedResolutionKept: a resolution's signed document is written in
// the close's transaction, so it is kept exactly when the resolution
// closed the lease: a refused resolution, a close that is not a
// resolution and an unsigned resolution keep none, and none replaces the
// one kept.
func TestSignedResolutionKept(t *testing.T) {
	x := newFixture(t, etcdtest.Start(t).Endpoints(), "/resolution/")
	ctx := testCtx(t)
	ep := register(t, x.s, testManifest(t, "github", "v1.4.0", "private"))
	e := x.env(ep)
	uncertain := func() *record.Lease {
		t.Helper()
		l := x.admit(t, call{ep: ep})
		e.mustClaim(t, l, "cl_a")
		if _, err := x.s.CloseLease(ctx, lease.CloseRequest{Lease: l.ID, Outcome: record.OutcomeUncertain, Claim: "cl_a"}); err != nil {
			t.Fatal(err)
		}
		return l
	}
	kept := func(what string, l *record.Lease, want string) {
		t.Helper()
		if got, err := x.s.Resolution(ctx, l.ID); err != nil || got != want {
			t.Fatalf("%s: resolution %q (%v), want %q", what, got, err, want)
		}
	}
	const keep = time.Hour

	// Refused: the lease is running, not uncertain.
	running := x.admit(t, call{ep: ep})
	e.mustClaim(t, running, "cl_a")
	_, err := x.s.CloseLease(ctx, lease.CloseRequest{Lease: running.ID, Outcome: record.OutcomeEffect, Resolve: true, Keep: keep, Resolution: "doc-running"})
	check(t, "resolving a running lease", err, is(record.ErrLeaseNotUncertain))
	kept("a refused resolution", running, "")

	// A document only goes with a resolution.
	l := uncertain()
	for _, req := range []lease.CloseRequest{
		{Lease: l.ID, Outcome: record.OutcomeEffect, Claim: "cl_a", Keep: keep, Resolution: "doc-report"},
		{Lease: l.ID, Outcome: record.OutcomeUncertain, Resolve: true, Resolution: "doc-uncertain"},
	} {
		if _, err := x.s.CloseLease(ctx, req); err == nil || errors.Is(err, record.ErrLeaseUncertain) {
			t.Fatalf("%+v: %v, want a refusal of the document", req, err)
		}
	}
	if st, _, err := e.state(t, l.ID); err != nil || st != record.LeaseUncertain {
		t.Fatalf("after the refusals the lease is %s (%v)", st, err)
	}
	kept("no resolution yet", l, "")

	// Resolved with its document: kept, and a second resolution (closed)
	// changes nothing.
	if _, err := x.s.CloseLease(ctx, lease.CloseRequest{Lease: l.ID, Outcome: record.OutcomeNoEffect, Resolve: true, Keep: keep, Resolution: "doc-1"}); err != nil {
		t.Fatal(err)
	}
	kept("resolved", l, "doc-1")
	_, err = x.s.CloseLease(ctx, lease.CloseRequest{Lease: l.ID, Outcome: record.OutcomeEffect, Resolve: true, Keep: keep, Resolution: "doc-2"})
	check(t, "resolving again", err, is(record.ErrLeaseClosed))
	kept("resolved twice", l, "doc-1")

	// Resolved without a document: none kept.
	bare := uncertain()
	if _, err := x.s.CloseLease(ctx, lease.CloseRequest{Lease: bare.ID, Outcome: record.OutcomeEffect, Resolve: true, Keep: keep}); err != nil {
		t.Fatal(err)
	}
	kept("resolved unsigned", bare, "")
	kept("an unknown lease", &record.Lease{ID: "ls_unknown"}, "")
}
