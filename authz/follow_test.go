package authz_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/audit"
	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/internal/authztest"
	"github.com/fcd-authz/fcd/internal/testutil"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
	"github.com/lestrrat-go/jwx/v2/jwa"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// verifyRoot verifies the trails under root against key's public half and
// fails t with the report unless every check holds.
func verifyRoot(t *testing.T, root string, ae *admitEnv) *audit.Report {
	t.Helper()
	keys, err := manifest.PublicSet(ae.key)
	if err != nil {
		t.Fatal(err)
	}
	r, err := audit.Verify(root, keys)
	if err != nil || !r.OK {
		t.Fatalf("verify: %v\n%s", err, r.Summary())
	}
	return r
}

// eventsOf returns the kinds of the events about lease (or formation).
func eventsOf(events []audit.Event, id string) []string {
	var kinds []string
	for _, ev := range events {
		if strings.Contains(string(ev.Data), `"`+id+`"`) {
			kinds = append(kinds, ev.Kind)
		}
	}
	return kinds
}

// TestFollowerRecordsCommitsNoRequestAnswered: a replica that commits an
// admission, a claim and an outcome and dies before it answers (or whose
// answers are lost) records nothing on the request path — here the
// store's own calls, with no use case after them. The trail follows the
// store, so every one of those commits is in it, once, in revision order,
// and the trail verifies clean.
func TestFollowerRecordsCommitsNoRequestAnswered(t *testing.T) {
	ae, tr, root := newTrailEnv(t)
	ctx := testCtx(t)
	f := ae.ready(t, "lost", "github/get_repository", `{"owner":"o","repo":"lost"}`, nil)
	rec, rev, err := ae.store.GetFormationRevision(ctx, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	lid, err := lease.NewLeaseID()
	if err != nil {
		t.Fatal(err)
	}
	l := &record.Lease{ID: lid, Formation: rec.ID, Session: rec.Session, Tool: rec.Tool, ArgumentDigest: rec.ArgumentDigest,
		Target: rec.Source, AdmittedAt: time.Now().UTC()}
	if err := ae.store.Admit(ctx, lease.AdmitRequest{Formation: rec, FormationRev: rev, Lease: l}); err != nil {
		t.Fatal(err)
	}
	if _, err := ae.store.ClaimLease(ctx, lease.ClaimRequest{Lease: lid, Epoch: l.Target.Epoch, Revision: l.Revision, Claim: "cl_lost"}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ae.store.CloseLease(ctx, lease.CloseRequest{Lease: lid, Outcome: record.OutcomeEffect, Claim: "cl_lost", Keep: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	events := readEvents(t, filepath.Join(root, "test"))
	got := eventsOf(events, lid)
	want := []string{authz.EventAdmission, authz.EventClaim, authz.EventOutcome}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events of lease %s: %v, want %v", lid, got, want)
	}
	var last int64
	for _, ev := range events {
		if ev.Revision < last {
			t.Errorf("event %d (%s) at revision %d after revision %d", ev.Seq, ev.Kind, ev.Revision, last)
		}
		last = ev.Revision
	}
	for _, ev := range events {
		if ev.Kind == authz.EventAdmission && strings.Contains(string(ev.Data), lid) && ev.Revision != l.Revision {
			t.Errorf("admission recorded at revision %d, committed at %d", ev.Revision, l.Revision)
		}
	}
	verifyRoot(t, root, ae)
}

// failingDisk fails every write while full is set: with ENOSPC, after
// writing half of what it was given when short is set too.
type failingDisk struct {
	full, short atomic.Bool
	failed      atomic.Int64
}

func (d *failingDisk) wrap(f *os.File) io.Writer { return diskWriter{d, f} }

type diskWriter struct {
	d *failingDisk
	f *os.File
}

func (w diskWriter) Write(b []byte) (int, error) {
	if !w.d.full.Load() {
		return w.f.Write(b)
	}
	w.d.failed.Add(1)
	if w.d.short.Load() && len(b) > 1 {
		n, _ := w.f.Write(b[:len(b)/2])
		return n, syscall.ENOSPC
	}
	return 0, syscall.ENOSPC
}

// TestFollowerFailsClosedOnAFullDisk: while the trail cannot be written
// (ENOSPC, with and without a short write), the replica is not ready for
// the trail, and admissions and claims are refused with ErrTrailBehind —
// no effect runs unrecorded. Formations still commit meanwhile; once the
// disk has space, the trail catches up from the store's history with
// nothing missing, no half-written line, and verifies clean.
func TestFollowerFailsClosedOnAFullDisk(t *testing.T) {
	for _, short := range []bool{false, true} {
		t.Run(fmt.Sprintf("short=%v", short), func(t *testing.T) {
			e := newEnv(t, nil, nil)
			key, iss := newIssuer(t, e.store, jwa.EdDSA)
			root := t.TempDir()
			disk := &failingDisk{}
			disk.short.Store(short)
			tr, err := audit.Open(audit.Config{Root: root, Replica: "test", Key: key, Writer: disk.wrap, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			ft := followTrail(t, e.store, tr, authz.TrailArgumentsNone)
			e.forms = authztest.New(t, authz.Config{Store: e.store, Decider: defaultSet(t), Now: e.clock.Now, Issuer: iss, Logger: quiet, Trail: ft.f})
			ae := &admitEnv{env: e, key: key, iss: iss}
			ctx := testCtx(t)

			// A call admitted while the disk has space, claimed after it filled.
			_, before := ae.admitRead(t, "before")
			claim := ae.claimRequest(t, before, "cl_before")
			disk.full.Store(true)
			during := ae.ready(t, "during", "github/get_repository", `{"owner":"o","repo":"during"}`, nil)
			testutil.Eventually(t, time.Minute, "the trail to be behind", func() bool { return errors.Is(e.forms.TrailReady(), authz.ErrTrailBehind) })
			if _, err := e.forms.Admissions.Admit(ctx, during.ID); !errors.Is(err, authz.ErrTrailBehind) {
				t.Fatalf("admission while the trail cannot write: %v, want ErrTrailBehind", err)
			}
			if _, err := e.forms.Leases.Claim(ctx, claim); !errors.Is(err, authz.ErrTrailBehind) {
				t.Fatalf("claim while the trail cannot write: %v, want ErrTrailBehind", err)
			}
			if st, _, err := ae.leaseState(t, before.Lease); err != nil || st != record.LeaseAdmitted {
				t.Fatalf("the refused claim changed the lease: %s %v", st, err)
			}
			if disk.failed.Load() == 0 {
				t.Fatal("the trail never tried to write")
			}

			disk.full.Store(false)
			testutil.Eventually(t, time.Minute, "the trail to catch up", func() bool { return e.forms.TrailReady() == nil })
			a, err := e.forms.Admissions.Admit(ctx, during.ID)
			if err != nil {
				t.Fatalf("admission once the trail writes again: %v", err)
			}
			if _, err := e.forms.Leases.Claim(ctx, claim); err != nil {
				t.Fatalf("claim once the trail writes again: %v", err)
			}
			if err := ft.Close(); err != nil {
				t.Fatal(err)
			}
			events := readEvents(t, filepath.Join(root, "test"))
			if got := eventsOf(events, during.ID); len(got) == 0 || got[0] != authz.EventFormation {
				t.Errorf("the formation made while the disk was full: events %v", got)
			}
			if got := eventsOf(events, a.Lease); fmt.Sprint(got) != fmt.Sprint([]string{authz.EventAdmission}) {
				t.Errorf("the admission after: events %v", got)
			}
			if got := eventsOf(events, "cl_before"); fmt.Sprint(got) != fmt.Sprint([]string{authz.EventClaim}) {
				t.Errorf("the claim after: events %v", got)
			}
			verifyRoot(t, root, ae)
		})
	}
}

// TestFollowerResumesWhereItsTrailEnds: a trail reopened after its
// follower stopped continues from its last revision, recording what the
// store committed meanwhile once, and none of what it holds again.
func TestFollowerResumesWhereItsTrailEnds(t *testing.T) {
	ae, tr, root := newTrailEnv(t)
	ae.admitRead(t, "first")
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	f2, a2 := ae.admitRead(t, "second") // no follower runs
	tr2, err := audit.Open(audit.Config{Root: root, Replica: "test", Key: ae.key, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := followTrail(t, ae.store, tr2, authz.TrailArgumentsNone).Close(); err != nil {
		t.Fatal(err)
	}
	events := readEvents(t, filepath.Join(root, "test"))
	seen := map[string]int{}
	for _, ev := range events {
		seen[fmt.Sprint(ev.Revision, ev.Kind, string(ev.Data))]++
	}
	for k, n := range seen {
		if n > 1 {
			t.Errorf("recorded %d times: %s", n, k)
		}
	}
	if got := eventsOf(events, f2.ID); len(got) < 2 || got[0] != authz.EventFormation {
		t.Errorf("the call formed while no follower ran: %v", got)
	}
	if got := eventsOf(events, a2.Lease); fmt.Sprint(got) != fmt.Sprint([]string{authz.EventAdmission}) {
		t.Errorf("its admission: %v", got)
	}
	verifyRoot(t, root, ae)
	var d map[string]any
	for _, ev := range events {
		if ev.Kind == authz.EventAdmission && json.Unmarshal(ev.Data, &d) == nil && d["lease"] == a2.Lease && d["admittedAt"] == nil {
			t.Errorf("admission event without its time: %s", ev.Data)
		}
	}
}

// TestFollowerRecordsReadmissions: a retried admission of an admitted
// formation issues the same lease's token again only after the store
// recorded it, so the trail holds it; the lease closed, no token is issued
// again.
func TestFollowerRecordsReadmissions(t *testing.T) {
	ae, tr, root := newTrailEnv(t)
	ctx := testCtx(t)
	f, a := ae.admitRead(t, "again")
	b, err := ae.forms.Admissions.Admit(ctx, f.ID)
	if err != nil || b.Lease != a.Lease {
		t.Fatalf("re-admission: %+v, %v; want lease %s", b, err, a.Lease)
	}
	if _, err := ae.forms.Leases.Complete(ctx, authz.CompleteRequest{Lease: a.Lease, Outcome: record.OutcomeRejected}); err != nil {
		t.Fatal(err)
	}
	if _, err := ae.forms.Admissions.Admit(ctx, f.ID); err == nil {
		t.Fatal("a closed lease's token issued again")
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	events := readEvents(t, filepath.Join(root, "test"))
	want := []string{authz.EventAdmission, authz.EventReadmission, authz.EventOutcome}
	if got := eventsOf(events, a.Lease); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events of lease %s: %v, want %v", a.Lease, got, want)
	}
	verifyRoot(t, root, ae)
}

// TestFollowerHoldsCompactionBack: a follower keeps its trail's cursor in
// the store, so a compaction while its replica is down stops at what the
// trail recorded, and the trail resumes without a gap; once the cursor is
// forgotten (here: a compaction past it, as an external cluster's own
// auto-compaction would do), the trail records the gap and verify names it.
func TestFollowerHoldsCompactionBack(t *testing.T) {
	ae := newAdmitEnv(t, nil)
	ctx := testCtx(t)
	root := t.TempDir()
	run := func() error {
		tr, err := audit.Open(audit.Config{Root: root, Replica: "r1", Key: ae.key, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		f := authz.NewFollower(authz.FollowerConfig{Store: ae.store, Trail: authztest.TrailWriter{Trail: tr}, Replica: "r1",
			CursorInterval: 10 * time.Millisecond, Logger: quiet})
		fctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- f.Run(fctx) }()
		rev, err := ae.store.Revision(ctx)
		if err == nil {
			err = f.WaitRecorded(ctx, rev)
		}
		// The cursor is written once the trail holds rev.
		testutil.Eventually(t, time.Minute, "the trail's floor in the store to pass the revision", func() bool {
			floor, ok, err := ae.store.TrailFloor(ctx, 0)
			return err == nil && ok && floor > rev
		})
		cancel()
		return errors.Join(err, <-done, tr.Close())
	}
	if err := run(); err != nil {
		t.Fatal(err)
	}
	f, a := ae.admitRead(t, "while-down")
	if _, err := ae.store.Compact(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := run(); err != nil {
		t.Fatal(err)
	}
	events := readEvents(t, filepath.Join(root, "r1"))
	if got := eventsOf(events, a.Lease); fmt.Sprint(got) != fmt.Sprint([]string{authz.EventAdmission}) {
		t.Fatalf("the admission made while the replica was down: %v", got)
	}
	if got := eventsOf(events, f.ID); len(got) == 0 || got[0] != authz.EventFormation {
		t.Fatalf("the formation made while the replica was down: %v", got)
	}
	verifyRoot(t, root, ae)

	// Compacted past the trail by someone else: the gap is recorded.
	ae.admitRead(t, "lost")
	head, err := ae.store.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := etcdCompact(ctx, ae, head); err != nil {
		t.Fatal(err)
	}
	if err := run(); err != nil {
		t.Fatal(err)
	}
	keys, err := manifest.PublicSet(ae.key)
	if err != nil {
		t.Fatal(err)
	}
	r, err := audit.Verify(root, keys)
	if err != nil {
		t.Fatal(err)
	}
	named := false
	for _, p := range r.Problems {
		named = named || p.ID == audit.PropHistory
	}
	if r.OK || !named {
		t.Fatalf("a trail with a gap verifies without naming it:\n%s", r.Summary())
	}
}

// etcdCompact compacts the member's history at rev with etcd's own client,
// around fcd's guard: what an external cluster's auto-compaction does.
func etcdCompact(ctx context.Context, ae *admitEnv, rev int64) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: ae.member.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	_, err = cli.Compact(ctx, rev, clientv3.WithCompactPhysical())
	return err
}

// TestFollowerOnAFullFileSystem is TestFollowerFailsClosedOnAFullDisk on
// a real full file system: the trail on a small tmpfs (mounting one needs
// root; the test is skipped where it cannot). Formations go on committing
// while the trail cannot write; the replica refuses admissions meanwhile;
// once space is freed, the trail holds every formation the store
// committed, and verifies clean.
func TestFollowerOnAFullFileSystem(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a small tmpfs here (needs root): %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", dir).Run() })
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, make([]byte, 200<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, nil, nil)
	key, iss := newIssuer(t, e.store, jwa.EdDSA)
	root := filepath.Join(dir, "audit")
	tr, err := audit.Open(audit.Config{Root: root, Replica: "test", Key: key, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ft := followTrail(t, e.store, tr, authz.TrailArgumentsNone)
	e.forms = authztest.New(t, authz.Config{Store: e.store, Decider: defaultSet(t), Now: e.clock.Now, Issuer: iss, Logger: quiet, Trail: ft.f})
	ae := &admitEnv{env: e, key: key, iss: iss}
	ctx := testCtx(t)

	var formed []string
	for i := 0; i < 400 && e.forms.TrailReady() == nil; i++ {
		f := ae.ready(t, fmt.Sprint("full-", i), "github/get_repository", fmt.Sprintf(`{"owner":"o","repo":"r%d"}`, i), nil)
		formed = append(formed, f.ID)
	}
	testutil.Eventually(t, time.Minute, "the trail to be behind", func() bool { return errors.Is(e.forms.TrailReady(), authz.ErrTrailBehind) })
	more := ae.ready(t, "full-more", "github/get_repository", `{"owner":"o","repo":"more"}`, nil)
	formed = append(formed, more.ID)
	if _, err := e.forms.Admissions.Admit(ctx, more.ID); !errors.Is(err, authz.ErrTrailBehind) {
		t.Fatalf("admission with the trail's file system full: %v, want ErrTrailBehind", err)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "the trail to catch up", func() bool { return e.forms.TrailReady() == nil })
	if _, err := e.forms.Admissions.Admit(ctx, more.ID); err != nil {
		t.Fatalf("admission once space is back: %v", err)
	}
	if err := ft.Close(); err != nil {
		t.Fatal(err)
	}
	events := readEvents(t, filepath.Join(root, "test"))
	for _, id := range formed {
		if got := eventsOf(events, id); len(got) == 0 || got[0] != authz.EventFormation {
			t.Fatalf("formation %s: events %v", id, got)
		}
	}
	t.Logf("%d formations committed while the trail filled its file system; all of them in the trail", len(formed))
	verifyRoot(t, root, ae)
}

// TestFollowerRecordsEachApprovalOnce: a delete that needs two approvals
// is recorded with each approval once, the one its write added, and the
// admission's rewrite of the state adds none.
func TestFollowerRecordsEachApprovalOnce(t *testing.T) {
	ae, tr, root := newTrailEnv(t)
	ctx := testCtx(t)
	_, a := ae.admitRead(t, "two")
	ae.report(t, a, record.OutcomeEffect)
	del := ae.ready(t, "two", "github/delete_repository", `{"owner":"o","repo":"two"}`, admins, "bob", "carol")
	if _, err := ae.forms.Admissions.Admit(ctx, del.ID); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	var approvers []string
	for _, ev := range readEvents(t, filepath.Join(root, "test")) {
		var d struct{ Formation, Approver string }
		if ev.Kind == authz.EventApproval && json.Unmarshal(ev.Data, &d) == nil && d.Formation == del.ID {
			approvers = append(approvers, d.Approver)
		}
	}
	if fmt.Sprint(approvers) != "[bob carol]" {
		t.Fatalf("approvals of %s in the trail: %v, want bob's and carol's once each", del.ID, approvers)
	}
	verifyRoot(t, root, ae)
}

// hangingTrail is a trail whose writes hang while stuck is set (a disk or
// a network file system that stops answering without failing).
type hangingTrail struct {
	authztest.TrailWriter
	stuck atomic.Bool
}

func (h *hangingTrail) Append(ctx context.Context, evs []authz.TrailEvent) error {
	for h.stuck.Load() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return h.TrailWriter.Append(ctx, evs)
}

// TestFollowerFailsClosedOnAHangingTrail: a write that neither fails nor
// returns leaves the commits it carries unrecorded; once they have waited
// longer than MaxLag, admissions are refused, and they are admitted again
// once the write went through.
func TestFollowerFailsClosedOnAHangingTrail(t *testing.T) {
	e := newEnv(t, nil, nil)
	key, iss := newIssuer(t, e.store, jwa.EdDSA)
	tr, err := audit.Open(audit.Config{Root: t.TempDir(), Replica: "test", Key: key, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	hang := &hangingTrail{TrailWriter: authztest.TrailWriter{Trail: tr}}
	f := authz.NewFollower(authz.FollowerConfig{Store: e.store, Trail: hang, MaxLag: 200 * time.Millisecond, Logger: quiet})
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; tr.Close() })
	e.forms = authztest.New(t, authz.Config{Store: e.store, Decider: defaultSet(t), Now: e.clock.Now, Issuer: iss, Logger: quiet, Trail: f})
	ae := &admitEnv{env: e, key: key, iss: iss}

	hang.stuck.Store(true)
	stuck := ae.ready(t, "hang", "github/get_repository", `{"owner":"o","repo":"hang"}`, nil)
	testutil.Eventually(t, time.Minute, "the trail to be behind", func() bool { return errors.Is(e.forms.TrailReady(), authz.ErrTrailBehind) })
	if _, err := e.forms.Admissions.Admit(testCtx(t), stuck.ID); !errors.Is(err, authz.ErrTrailBehind) {
		t.Fatalf("admission while the trail's write hangs: %v, want ErrTrailBehind", err)
	}
	hang.stuck.Store(false)
	testutil.Eventually(t, time.Minute, "the trail to catch up", func() bool { return e.forms.TrailReady() == nil })
	if _, err := e.forms.Admissions.Admit(testCtx(t), stuck.ID); err != nil {
		t.Fatalf("admission once the write went through: %v", err)
	}
}

// TestFollowerNotStartedRefuses: use cases whose follower never ran admit
// nothing (the trail would not record it).
func TestFollowerNotStartedRefuses(t *testing.T) {
	e := newEnv(t, nil, nil)
	key, iss := newIssuer(t, e.store, jwa.EdDSA)
	f := authz.NewFollower(authz.FollowerConfig{Store: e.store, Logger: quiet})
	e.forms = authztest.New(t, authz.Config{Store: e.store, Decider: defaultSet(t), Now: e.clock.Now, Issuer: iss, Logger: quiet, Trail: f})
	ae := &admitEnv{env: e, key: key, iss: iss}
	g := ae.ready(t, "idle", "github/get_repository", `{"owner":"o","repo":"idle"}`, nil)
	if _, err := e.forms.Admissions.Admit(testCtx(t), g.ID); !errors.Is(err, authz.ErrTrailBehind) {
		t.Fatalf("admission with a follower that never ran: %v, want ErrTrailBehind", err)
	}
}
