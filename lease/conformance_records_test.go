package lease_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// epochLifecycle: registration is idempotent and keeps the first record;
// ACTIVE → DRAINING → STALE, where retirement is refused while a lease
// marker exists (with its counts) and succeeds once it is released; only
// ACTIVE epochs admit.
func epochLifecycle(t *testing.T, x *fixture) {
	ctx := testCtx(t)
	sm := testManifest(t, "github", "v1.4.0", "private")
	ep, created, err := x.s.RegisterEpoch(ctx, sm)
	if err != nil || !created || ep.ID != sm.Epoch || ep.State != record.StateActive || ep.Pool != "github-v1.4.0" || ep.Revision <= 0 {
		t.Fatalf("register: %+v created %v, %v", ep, created, err)
	}
	if len(ep.Tools) != 2 || ep.Tools[0].Name != "get_repository" || ep.Tools[0].Digest == "" {
		t.Fatalf("registered tools: %+v", ep.Tools)
	}
	again, created, err := x.s.RegisterEpoch(ctx, sm)
	if err != nil || created || again.ID != ep.ID || again.Revision != ep.Revision || !again.RegisteredAt.Equal(ep.RegisteredAt) {
		t.Fatalf("register again: %+v created %v, %v; want the first record", again, created, err)
	}
	other := register(t, x.s, testManifest(t, "gitlab", "v2", "private"))

	listed := func(f record.EpochFilter) []string {
		t.Helper()
		eps, err := x.s.ListEpochs(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range eps {
			out = append(out, e.ID)
		}
		return out
	}
	if got := listed(record.EpochFilter{}); !slices.Equal(got, []string{ep.ID, other.ID}) {
		t.Fatalf("list = %v, want both in registration order", got)
	}
	if got := listed(record.EpochFilter{Server: "gitlab"}); !slices.Equal(got, []string{other.ID}) {
		t.Fatalf("list of gitlab = %v", got)
	}

	l := x.admit(t, call{ep: ep})
	st, err := x.s.Drain(ctx, ep.ID)
	check(t, "drain", err, nil)
	if st != record.StateDraining {
		t.Fatalf("drain = %s", st)
	}
	shown, err := x.s.GetEpoch(ctx, ep.ID)
	if err != nil || shown.State != record.StateDraining || shown.ActiveLeases != 1 || shown.StateRevision <= ep.Revision {
		t.Fatalf("drained epoch reads %+v, %v", shown, err)
	}
	if now, err := x.s.EpochNow(ctx, ep.ID); err != nil || now.State != record.StateDraining || now.StateRevision != shown.StateRevision {
		t.Fatalf("EpochNow of the drained epoch: %+v, %v", now, err)
	}
	if got := listed(record.EpochFilter{State: record.StateDraining}); !slices.Equal(got, []string{ep.ID}) {
		t.Fatalf("list of DRAINING = %v", got)
	}
	_, err = x.tryAdmit(t, call{ep: ep})
	check(t, "admission to a DRAINING epoch", err, isState(record.StateDraining))
	_, err = x.s.Drain(ctx, ep.ID)
	check(t, "drain twice", err, isState(record.StateDraining))

	_, err = x.s.Retire(ctx, ep.ID, 0)
	var blocked *record.RetireBlockedError
	if !errors.As(err, &blocked) || blocked.Epoch != ep.ID || blocked.Active != 1 || blocked.Uncertain != 0 {
		t.Fatalf("retire with a marker: %v, want RetireBlockedError 1/0", err)
	}
	if now, err := x.s.EpochNow(ctx, ep.ID); err != nil || now.State != record.StateDraining {
		t.Fatalf("a refused retirement changed the state: %+v, %v", now, err)
	}
	x.release(t, l)
	st, err = x.s.Retire(ctx, ep.ID, 0)
	check(t, "retire once released", err, nil)
	if st != record.StateStale {
		t.Fatalf("retire = %s", st)
	}
	if shown, err := x.s.GetEpoch(ctx, ep.ID); err != nil || shown.State != record.StateStale || shown.ActiveLeases != 0 {
		t.Fatalf("retired epoch reads %+v, %v", shown, err)
	}
	_, err = x.s.Retire(ctx, ep.ID, 0)
	check(t, "retire twice", err, isState(record.StateStale))
	_, err = x.s.Drain(ctx, ep.ID)
	check(t, "drain STALE", err, isState(record.StateStale))
	_, err = x.tryAdmit(t, call{ep: ep})
	check(t, "admission to a STALE epoch", err, isState(record.StateStale))

	// Retire with a wait that no release ends reports the counts.
	held := []*record.Lease{x.admit(t, call{ep: other}), x.admit(t, call{ep: other})}
	if _, err := x.s.Drain(ctx, other.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := x.s.Retire(ctx, other.ID, 10*time.Millisecond); !errors.As(err, &blocked) || blocked.Active != 2 {
		t.Fatalf("retire with an expiring wait: %v, want RetireBlockedError 2/0", err)
	}
	// Retire with a wait returns STALE once the last marker is released,
	// whether the releases land before its first try or while it watches
	// (the order is not forced here; TestRetireWaitsForLeaseMarkers
	// releases while it watches).
	type result struct {
		st  record.State
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := x.s.Retire(ctx, other.ID, time.Minute)
		done <- result{st, err}
	}()
	for _, l := range held {
		x.release(t, l)
	}
	if r := <-done; r.err != nil || r.st != record.StateStale {
		t.Fatalf("retire with a wait across the releases: %s, %v", r.st, r.err)
	}

	for name, op := range map[string]func() error{
		"get":    func() error { _, err := x.s.GetEpoch(ctx, "sha256:unknown"); return err },
		"now":    func() error { _, err := x.s.EpochNow(ctx, "sha256:unknown"); return err },
		"leases": func() error { _, err := x.s.EpochLeases(ctx, "sha256:unknown"); return err },
		"drain":  func() error { _, err := x.s.Drain(ctx, "sha256:unknown"); return err },
		"retire": func() error { _, err := x.s.Retire(ctx, "sha256:unknown", 0); return err },
	} {
		check(t, name+" of an unknown epoch", op(), is(record.ErrEpochNotFound))
	}
}

// snapshotContentAddressed: a snapshot's id is the digest of its tool
// list, so the same catalog is the same snapshot however it is asked for
// and whichever store (cache) asks, and a changed catalog is another one;
// tools resolve through the snapshot with their epoch's current state.
func snapshotContentAddressed(t *testing.T, x *fixture) {
	ctx := testCtx(t)
	gh := register(t, x.s, testManifest(t, "github", "v1.4.0", "private"))
	gl := register(t, x.s, testManifest(t, "gitlab", "v2", "private"))

	all, created, err := x.s.CreateSnapshot(ctx, nil)
	if err != nil || !created || len(all.Tools) != 4 || all.Revision <= 0 {
		t.Fatalf("snapshot of all: %+v created %v (revision %d), %v", all, created, all.Revision, err)
	}
	if id, err := manifest.Digest(all.Tools); err != nil || id != all.ID {
		t.Fatalf("snapshot id %s is not the digest of its tools (%s, %v)", all.ID, id, err)
	}
	if !slices.IsSortedFunc(all.Tools, func(a, b record.SnapshotTool) int { return strings.Compare(a.Name, b.Name) }) {
		t.Fatalf("snapshot tools not ordered by name: %+v", all.Tools)
	}
	named, created, err := x.s.CreateSnapshot(ctx, []string{"gitlab", "github"})
	if err != nil || created || named.ID != all.ID || !reflect.DeepEqual(named.Tools, all.Tools) {
		t.Fatalf("the same catalog asked by name: %s created %v, %v; want %s again", named.ID, created, err, all.ID)
	}
	// Another store has nothing cached: it reads the stored snapshot, and
	// finds the same catalog already stored.
	fresh := x.open(t, x.prefix)
	stored, err := fresh.GetSnapshot(ctx, all.ID)
	if err != nil || stored.ID != all.ID || !reflect.DeepEqual(stored.Tools, all.Tools) {
		t.Fatalf("stored snapshot: %+v, %v", stored, err)
	}
	if again, created, err := fresh.CreateSnapshot(ctx, nil); err != nil || created || again.ID != all.ID {
		t.Fatalf("the same catalog from another store: %s created %v, %v", again.ID, created, err)
	}

	onlyGH, created, err := x.s.CreateSnapshot(ctx, []string{"github"})
	if err != nil || !created || onlyGH.ID == all.ID || len(onlyGH.Tools) != 2 {
		t.Fatalf("snapshot of github: %+v created %v, %v", onlyGH, created, err)
	}
	if _, err := x.s.Drain(ctx, gl.ID); err != nil {
		t.Fatal(err)
	}
	// Draining gitlab leaves github's catalog: the snapshot that exists.
	if after, created, err := x.s.CreateSnapshot(ctx, nil); err != nil || created || after.ID != onlyGH.ID {
		t.Fatalf("snapshot after the drain: %s created %v, %v; want %s", after.ID, created, err, onlyGH.ID)
	}

	tool, ep, err := fresh.ResolveTool(ctx, all.ID, "gitlab/create_repository")
	if err != nil || tool.Epoch != gl.ID || tool.Descriptor == nil || tool.Descriptor.Name != "create_repository" || !tool.RequiresApproval {
		t.Fatalf("resolve through the old snapshot: %+v, %v", tool, err)
	}
	if ep.ID != gl.ID || ep.State != record.StateDraining || ep.Manifest == nil {
		t.Fatalf("resolved epoch: %s %s (manifest %v), want %s DRAINING", ep.ID, ep.State, ep.Manifest != nil, gl.ID)
	}
	snap, full, err := fresh.GetSnapshotFull(ctx, all.ID)
	if err != nil || snap.ID != all.ID || len(full) != 4 {
		t.Fatalf("full snapshot: %d tools, %v", len(full), err)
	}
	for i, ft := range full {
		d, err := ft.Descriptor.Digest()
		if err != nil || d != all.Tools[i].DescriptorDigest || ft.Name != all.Tools[i].Name {
			t.Fatalf("full tool %d: %s digest %s, want %s %s", i, ft.Name, d, all.Tools[i].Name, all.Tools[i].DescriptorDigest)
		}
	}

	_, err = x.s.GetSnapshot(ctx, "sha256:nope")
	check(t, "unknown snapshot", err, is(record.ErrSnapshotNotFound))
	_, _, err = x.s.ResolveTool(ctx, all.ID, "github/nope")
	check(t, "unknown tool", err, is(record.ErrToolNotFound))
	_, _, err = x.s.CreateSnapshot(ctx, []string{"gitlab"})
	check(t, "snapshot of a drained server", err, is(record.ErrNoActiveEpochs))
	if _, err := x.s.Drain(ctx, gh.ID); err != nil {
		t.Fatal(err)
	}
	_, _, err = x.s.CreateSnapshot(ctx, nil)
	check(t, "snapshot with nothing ACTIVE", err, is(record.ErrNoActiveEpochs))
}

// formationCreateGetUpdate: a formation is created once under its id,
// read back as written with its revision, and updated by compare-and-swap
// — a refused change writes nothing, and concurrent updates all land.
func formationCreateGetUpdate(t *testing.T, x *fixture) {
	ctx := testCtx(t)
	f, rev := x.form(t, "s", "github/create_repository")
	got, grev, err := x.s.GetFormationRevision(ctx, f.ID)
	if err != nil || grev != rev || !sameJSON(t, got, f) {
		t.Fatalf("read back: rev %d (want %d), %v\n%+v\n%+v", grev, rev, err, got, f)
	}
	if plain, err := x.s.GetFormation(ctx, f.ID); err != nil || !sameJSON(t, plain, f) {
		t.Fatalf("GetFormation: %+v, %v", plain, err)
	}
	dup := *f
	dup.Status = record.StatusDenied
	if _, err := x.s.CreateFormation(ctx, &dup, time.Hour); err == nil {
		t.Fatal("a second formation under the same id was created")
	}
	if _, r, _ := x.s.GetFormationRevision(ctx, f.ID); r != rev {
		t.Fatalf("the refused creation wrote the record (revision %d, want %d)", r, rev)
	}

	upd, rev2, err := x.s.UpdateFormation(ctx, f.ID, func(f *record.Formation) error {
		f.Status = record.StatusPendingApproval
		return nil
	})
	if err != nil || rev2 <= rev || upd.Status != record.StatusPendingApproval {
		t.Fatalf("update: %+v rev %d, %v", upd, rev2, err)
	}
	if got, r, err := x.s.GetFormationRevision(ctx, f.ID); err != nil || r != rev2 || got.Status != record.StatusPendingApproval {
		t.Fatalf("after the update: %s rev %d, %v", got.Status, r, err)
	}
	errNo := errors.New("not now")
	_, r, err := x.s.UpdateFormation(ctx, f.ID, func(f *record.Formation) error {
		f.Status = record.StatusDenied
		return errNo
	})
	if !errors.Is(err, errNo) || r != 0 {
		t.Fatalf("a refused change: rev %d, %v; want 0 and the change's error", r, err)
	}
	if got, r, _ := x.s.GetFormationRevision(ctx, f.ID); r != rev2 || got.Status != record.StatusPendingApproval {
		t.Fatalf("a refused change wrote the record: %s rev %d", got.Status, r)
	}

	// Concurrent approvals: each lands once, at its own revision.
	const n = 8
	revs := make([]int64, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var err error
			_, revs[i], err = x.s.UpdateFormation(ctx, f.ID, func(f *record.Formation) error {
				f.Approvals = append(f.Approvals, record.Approval{Approver: fmt.Sprint("a", i), Decision: record.Approve, At: x.t0})
				return nil
			})
			if err != nil {
				t.Errorf("approval %d: %v", i, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	final, err := x.s.GetFormation(ctx, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	approvers := map[string]bool{}
	for _, a := range final.Approvals {
		approvers[a.Approver] = true
	}
	slices.Sort(revs)
	if len(final.Approvals) != n || len(approvers) != n || revs[0] <= rev2 || len(slices.Compact(slices.Clone(revs))) != n {
		t.Fatalf("after %d concurrent approvals: %d approvals by %d approvers, revisions %v", n, len(final.Approvals), len(approvers), revs)
	}

	for name, op := range map[string]func() error{
		"get": func() error { _, err := x.s.GetFormation(ctx, "fm_unknown"); return err },
		"update": func() error {
			_, _, err := x.s.UpdateFormation(ctx, "fm_unknown", func(*record.Formation) error { return nil })
			return err
		},
	} {
		check(t, name+" of an unknown formation", op(), is(record.ErrFormationNotFound))
	}

	// Listing: in id order (not by age: the older one's id sorts last),
	// filtered by keep.
	older := &record.Formation{Call: record.Call{ID: "fm_zzzzzz", Session: "s", CreatedAt: x.t0.Add(-time.Hour)}, Status: record.StatusDenied}
	if _, err := x.s.CreateFormation(ctx, older, time.Hour); err != nil {
		t.Fatal(err)
	}
	list, next, err := x.s.ListFormations(ctx, lease.FormationPage{}, nil)
	if err != nil || len(list) != 2 || list[0].ID != f.ID || list[1].ID != older.ID || next != "" {
		t.Fatalf("list: %d, next %q, %v", len(list), next, err)
	}
	denied, _, err := x.s.ListFormations(ctx, lease.FormationPage{}, func(f *record.Formation) bool { return f.Status == record.StatusDenied })
	if err != nil || len(denied) != 1 || denied[0].ID != older.ID {
		t.Fatalf("list of denied: %+v, %v", denied, err)
	}
}

// formationPages: listing pages through every formation exactly once, in
// id order, whatever the page size; a page starts after any id, stored or
// not; a filtered page stops after its scan budget and says where to go
// on, so a selective filter never reads every record in one call.
func formationPages(t *testing.T, x *fixture) {
	ctx := testCtx(t)
	const n = 23
	var ids []string
	for i := range n {
		status := record.StatusReady
		if i%5 == 0 {
			status = record.StatusPendingApproval
		}
		f := &record.Formation{Call: record.Call{ID: fmt.Sprintf("fm_%03d", 10*i+5), Session: "s", CreatedAt: x.t0}, Status: status}
		if _, err := x.s.CreateFormation(ctx, f, time.Hour); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, f.ID)
	}
	pending := func(f *record.Formation) bool { return f.Status == record.StatusPendingApproval }
	var pendingIDs []string
	for i, id := range ids {
		if i%5 == 0 {
			pendingIDs = append(pendingIDs, id)
		}
	}
	// walk lists every page from after and returns the ids in order, the
	// number of calls and the size of the largest page.
	walk := func(t *testing.T, p lease.FormationPage, keep func(*record.Formation) bool) (got []string, calls, largest int) {
		t.Helper()
		for {
			calls++
			page, next, err := x.s.ListFormations(ctx, p, keep)
			if err != nil {
				t.Fatal(err)
			}
			largest = max(largest, len(page))
			for _, f := range page {
				got = append(got, f.ID)
			}
			if next == "" {
				return got, calls, largest
			}
			if next <= p.After {
				t.Fatalf("next %q does not move past %q", next, p.After)
			}
			if calls > 2*n {
				t.Fatalf("paging does not end: next %q", next)
			}
			p.After = next
		}
	}
	cases := []struct {
		note    string
		page    lease.FormationPage
		keep    func(*record.Formation) bool
		want    []string
		calls   int // how many calls the walk takes; 0: not checked
		maxPage int
	}{
		{note: "one page holds all", page: lease.FormationPage{Limit: 100}, want: ids, calls: 1, maxPage: n},
		{note: "default limit", want: ids, calls: 1, maxPage: n},
		{note: "limit 1", page: lease.FormationPage{Limit: 1}, want: ids, calls: n, maxPage: 1},
		{note: "limit 5", page: lease.FormationPage{Limit: 5}, want: ids, calls: 5, maxPage: 5},
		{note: "limit divides n+1", page: lease.FormationPage{Limit: 23}, want: ids, calls: 1, maxPage: 23},
		{note: "limit 22: the last page has one", page: lease.FormationPage{Limit: 22}, want: ids, calls: 2, maxPage: 22},
		{note: "after an unknown id between two", page: lease.FormationPage{After: "fm_100", Limit: 4}, want: ids[10:], maxPage: 4},
		{note: "after a stored id", page: lease.FormationPage{After: ids[20], Limit: 4}, want: ids[21:], calls: 1, maxPage: 2},
		{note: "after the last", page: lease.FormationPage{After: ids[n-1]}, calls: 1},
		{note: "after every id", page: lease.FormationPage{After: "fm_~"}, calls: 1},
		{note: "before every id", page: lease.FormationPage{After: "fm_", Limit: 10}, want: ids, calls: 3, maxPage: 10},
		{note: "filtered", page: lease.FormationPage{Limit: 2}, keep: pending, want: pendingIDs, calls: 3, maxPage: 2},
		// Scan 4 reads four records a call: 23 records take 6 calls, some
		// of them holding no match but a next.
		{note: "filtered, scan budget", page: lease.FormationPage{Limit: 100, Scan: 4}, keep: pending, want: pendingIDs, calls: 6, maxPage: 1},
		{note: "unfiltered, scan budget below limit", page: lease.FormationPage{Limit: 10, Scan: 3}, want: ids, calls: 8, maxPage: 3},
	}
	for _, tc := range cases {
		t.Run(tc.note, func(t *testing.T) {
			got, calls, largest := walk(t, tc.page, tc.keep)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("walk listed %v, want %v", got, tc.want)
			}
			if tc.calls != 0 && calls != tc.calls {
				t.Errorf("walk took %d calls, want %d", calls, tc.calls)
			}
			if largest != tc.maxPage {
				t.Errorf("largest page %d, want %d", largest, tc.maxPage)
			}
		})
	}
	// The store's other keys (epochs, leases) are never listed.
	if got, _, _ := walk(t, lease.FormationPage{After: "fm_~"}, nil); len(got) != 0 {
		t.Fatalf("listed past the formations: %v", got)
	}
}

// formationRetention: a formation's record and state are bound to an
// etcd lease that outlives keep from its creation (expiry is etcd
// collecting them), and stay bound while admitted; the common report
// binds the outcome and the lease index alone; a lease that turns
// uncertain detaches the record, so it never expires while the lease
// stays open; a close that reads the record binds all of it again. Once
// the retention ends, everything is gone.
func formationRetention(t *testing.T, x *fixture) {
	ctx := testCtx(t)
	const keep = time.Hour
	ep := register(t, x.s, testManifest(t, "github", "v1.4.0", "private"))
	e := x.env(ep)
	retention := func(key string) int64 {
		t.Helper()
		return x.rawKey(t, key).Lease
	}
	within := func(key string) {
		t.Helper()
		lid := retention(key)
		if lid == 0 {
			t.Fatalf("record %s is kept forever, want at least %s", key, keep)
		}
		if ttl := x.grantedTTL(t, lid); ttl < keep || ttl > keep+2*time.Minute {
			t.Fatalf("record %s is kept for %s, want %s (and at most 2m more)", key, ttl, keep)
		}
	}
	formation := func(id string) []string {
		return []string{"formations/" + id, "formation-states/" + id}
	}
	idle, _ := x.form(t, "s-idle", "github/get_repository")
	for _, k := range formation(idle.ID) {
		within(k)
	}

	l := x.admit(t, call{ep: ep})
	for _, k := range formation(l.Formation) {
		within(k) // still the creation's
	}
	x.release(t, l) // reads the lease: binds everything anew
	for _, k := range append(formation(l.Formation), "formation-outcomes/"+l.Formation, "leases/"+l.ID) {
		within(k)
	}

	fast := x.admit(t, call{ep: ep})
	e.mustClaim(t, fast, "cl_a")
	if _, err := x.s.CloseLease(ctx, lease.CloseRequest{Lease: fast.ID, Claim: "cl_a", Outcome: record.OutcomeEffect,
		Keep: keep, Admission: admissionOf(fast)}); err != nil {
		t.Fatal(err)
	}
	for _, k := range append(formation(fast.Formation), "formation-outcomes/"+fast.Formation, "leases/"+fast.ID) {
		within(k)
	}

	unsure := x.admit(t, call{ep: ep})
	e.mustClaim(t, unsure, "cl_a")
	if _, err := x.s.CloseLease(ctx, lease.CloseRequest{Lease: unsure.ID, Claim: "cl_a", Outcome: record.OutcomeUncertain}); err != nil {
		t.Fatal(err)
	}
	for _, k := range append(formation(unsure.Formation), "formation-outcomes/"+unsure.Formation, "leases/"+unsure.ID) {
		if lid := retention(k); lid != 0 {
			t.Fatalf("%s of an uncertain lease is bound to retention lease %x", k, lid)
		}
	}
	signed := "signed-resolution-of-" + unsure.ID
	if _, err := x.s.CloseLease(ctx, lease.CloseRequest{Lease: unsure.ID, Outcome: record.OutcomeNoEffect, Resolve: true, Keep: keep,
		Resolution: signed}); err != nil {
		t.Fatal(err)
	}
	// The signed resolution is kept as long as the outcome.
	for _, k := range append(formation(unsure.Formation), "formation-outcomes/"+unsure.Formation, "leases/"+unsure.ID, "resolutions/"+unsure.ID) {
		within(k)
	}
	if got, err := x.s.Resolution(ctx, unsure.ID); err != nil || got != signed {
		t.Fatalf("resolution kept: %q, %v", got, err)
	}
	resolutionEnds := retention("resolutions/" + unsure.ID)

	// Records kept alike may share a retention lease: end them all.
	ends := map[int64]bool{}
	for _, k := range append(formation(idle.ID), append(formation(l.Formation), "leases/"+l.ID)...) {
		ends[retention(k)] = true
	}
	for lid := range ends {
		x.revoke(t, lid)
	}
	_, err := x.s.GetFormation(ctx, idle.ID)
	check(t, "an expired formation", err, is(record.ErrFormationNotFound))
	_, err = x.s.GetFormation(ctx, l.Formation)
	check(t, "an expired closed formation", err, is(record.ErrFormationNotFound))
	_, err = x.s.OpenLease(ctx, l.ID)
	check(t, "the lease of an expired formation", err, is(record.ErrLeaseNotFound))
	if kvs := x.rawKeys(t, func(kv *mvccpb.KeyValue) bool {
		for _, id := range []string{idle.ID, l.Formation, l.ID} {
			if strings.Contains(string(kv.Key), id) || strings.Contains(string(kv.Value), id) {
				return true
			}
		}
		return false
	}); len(kvs) != 0 {
		t.Fatalf("%d keys of the expired formations remain, the first %s", len(kvs), kvs[0].Key)
	}
	if !ends[resolutionEnds] { // kept alike, it may have ended with them
		x.revoke(t, resolutionEnds)
	}
	if got, err := x.s.Resolution(ctx, unsure.ID); err != nil || got != "" {
		t.Fatalf("resolution after its retention: %q, %v", got, err)
	}
}

// corruptRecords: a stored record that does not decode is reported as
// record.ErrCorrupt, never taken for absent or for a default; a marker
// that does not decode still holds its epoch back.
func corruptRecords(t *testing.T, x *fixture) {
	ctx := testCtx(t)
	ep := register(t, x.s, testManifest(t, "github", "v1.4.0", "private"))
	snap, _, err := x.s.CreateSnapshot(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	byFormation, byMarker := x.admit(t, call{ep: ep}), x.admit(t, call{ep: ep})
	if _, err := x.s.SetGeneration(ctx, "other-pool", 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	overwrite := func(kv *mvccpb.KeyValue, value string) {
		t.Helper()
		if _, err := x.raw.Put(ctx, string(kv.Key), value); err != nil {
			t.Fatal(err)
		}
	}

	overwrite(x.rawKey(t, "formations/"+byFormation.Formation), "not json")
	_, err = x.s.GetFormation(ctx, byFormation.Formation)
	check(t, "a corrupt formation", err, is(record.ErrCorrupt))
	_, _, err = x.s.ListFormations(ctx, lease.FormationPage{}, nil)
	check(t, "listing a corrupt formation", err, is(record.ErrCorrupt))
	_, err = x.s.CloseLease(ctx, lease.CloseRequest{Lease: byFormation.ID, Outcome: record.OutcomeRejected})
	check(t, "closing the lease of a corrupt formation", err, is(record.ErrCorrupt))

	marker := x.rawKeys(t, func(kv *mvccpb.KeyValue) bool {
		return strings.HasSuffix(string(kv.Key), "/"+ep.ID+"/"+byMarker.ID)
	})
	if len(marker) != 1 {
		t.Fatalf("%d markers of %s", len(marker), byMarker.ID)
	}
	overwrite(marker[0], "garbage")
	_, err = x.s.OpenLease(ctx, byMarker.ID)
	check(t, "a corrupt marker", err, is(record.ErrCorrupt))
	_, err = x.s.EpochLeases(ctx, ep.ID)
	check(t, "listing a corrupt marker", err, is(record.ErrCorrupt))
	if _, err := x.s.Drain(ctx, ep.ID); err != nil {
		t.Fatal(err)
	}
	var blocked *record.RetireBlockedError
	if _, err := x.s.Retire(ctx, ep.ID, 0); !errors.As(err, &blocked) || blocked.Active != 2 {
		t.Fatalf("retire over a corrupt marker: %v, want blocked by 2 active leases", err)
	}

	overwrite(x.rawValue(t, []byte("00000000000000000001")), "one")
	_, err = x.s.PoolGeneration(ctx, "other-pool")
	check(t, "a corrupt generation", err, is(record.ErrCorrupt))
	_, err = x.s.SetGeneration(ctx, "other-pool", 2, time.Hour)
	check(t, "a generation over a corrupt one", err, is(record.ErrCorrupt))

	// Epoch records and snapshots are cached once read: a store that has
	// not read them yet sees the corruption.
	fresh := x.open(t, x.prefix)
	other := *snap
	other.ID = "sha256:other"
	val, err := json.Marshal(&other)
	if err != nil {
		t.Fatal(err)
	}
	overwrite(x.rawKey(t, "snapshots/"+snap.ID), string(val))
	_, err = fresh.GetSnapshot(ctx, snap.ID)
	check(t, "a snapshot stored under another id", err, is(record.ErrCorrupt))
	rec := x.rawKeys(t, func(kv *mvccpb.KeyValue) bool {
		return strings.HasSuffix(string(kv.Key), "/epochs/"+ep.ID) && !strings.Contains(string(kv.Key), "/notes/") &&
			bytes.HasPrefix(kv.Value, []byte("{"))
	})
	if len(rec) != 1 {
		t.Fatalf("%d epoch records of %s", len(rec), ep.ID)
	}
	overwrite(rec[0], "{}")
	_, err = fresh.GetEpoch(ctx, ep.ID)
	check(t, "a corrupt epoch record", err, is(record.ErrCorrupt))
	_, err = fresh.ListEpochs(ctx, record.EpochFilter{})
	check(t, "listing a corrupt epoch record", err, is(record.ErrCorrupt))
	_, err = fresh.EpochNow(ctx, ep.ID)
	check(t, "deciding on a corrupt epoch record", err, is(record.ErrCorrupt))
}

// formationPendingIndex: the formations waiting for approval are listed
// from their index, which follows the status through every write: created
// waiting, approved (ready), denied, moved back to waiting, expired.
func formationPendingIndex(t *testing.T, x *fixture) {
	ctx := testCtx(t)
	create := func(st record.Status) *record.Formation {
		t.Helper()
		fid, err := lease.NewFormationID()
		if err != nil {
			t.Fatal(err)
		}
		f := &record.Formation{Call: record.Call{ID: fid, Session: "pending", Tool: "github/create_repository",
			CreatedAt: x.t0.Add(time.Duration(x.n) * time.Second), ExpiresAt: x.t0.Add(time.Hour)}, Status: st}
		x.n++
		if _, err := x.s.CreateFormation(ctx, f, time.Hour); err != nil {
			t.Fatal(err)
		}
		return f
	}
	set := func(f *record.Formation, st record.Status) {
		t.Helper()
		if _, _, err := x.s.UpdateFormation(ctx, f.ID, func(f *record.Formation) error { f.Status = st; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	// want walks the index in pages of one and of a hundred.
	want := func(fs ...*record.Formation) {
		t.Helper()
		var wantIDs []string
		for _, f := range fs {
			wantIDs = append(wantIDs, f.ID)
		}
		slices.Sort(wantIDs)
		for _, limit := range []int{1, 100} {
			var ids []string
			for p := (lease.FormationPage{Limit: limit}); ; {
				got, next, err := x.s.PendingApproval(ctx, p)
				if err != nil {
					t.Fatal(err)
				}
				if len(got) > limit {
					t.Fatalf("a page of %d holds %d", limit, len(got))
				}
				for _, f := range got {
					ids = append(ids, f.ID)
					if f.Status != record.StatusPendingApproval {
						t.Errorf("listed %s in status %s", f.ID, f.Status)
					}
				}
				if next == "" {
					break
				}
				p.After = next
			}
			if !slices.Equal(ids, wantIDs) {
				t.Fatalf("pending approval in pages of %d: %v, want %v (id order)", limit, ids, wantIDs)
			}
		}
	}
	waits, approved, denied, back := create(record.StatusPendingApproval), create(record.StatusPendingApproval),
		create(record.StatusPendingApproval), create(record.StatusReady)
	create(record.StatusReady)
	want(waits, approved, denied)
	set(approved, record.StatusReady)
	set(denied, record.StatusDenied)
	set(back, record.StatusPendingApproval)
	want(waits, back)
	// The index lives as long as the record: revoking its retention
	// lease collects both.
	x.revoke(t, x.rawKey(t, "formation-states/"+back.ID).Lease)
	want()
}
