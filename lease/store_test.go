package lease_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/internal/testutil"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// testManifest builds a small valid manifest; release and defaultVisibility
// are covered fields, so each distinct pair is a distinct epoch.
func testManifest(t *testing.T, server, release, visibility string) *manifest.Signed {
	t.Helper()
	cfg := map[string]any{"repository.defaultVisibility": visibility}
	cd, err := manifest.Digest(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := &manifest.Manifest{
		Server:     manifest.Server{Name: server, Release: release},
		Pool:       server + "-" + release,
		Artifact:   manifest.Artifact{Image: "example/" + server + ":" + release},
		Deployment: manifest.Deployment{Name: server + "-" + release},
		Config:     manifest.Config{Digest: cd, Values: cfg},
		Tools: []manifest.Tool{
			{Name: "get_repository", Summary: "Read a repository.", SideEffects: manifest.SideEffectRead,
				InputSchema: json.RawMessage(`{"type":"object","properties":{"name":{"type":"string"}}}`)},
			{Name: "create_repository", Summary: "Create a repository.", SideEffects: manifest.SideEffectWrite, RequiresApproval: true,
				InputSchema: json.RawMessage(`{"type":"object","properties":{"name":{"type":"string"},"private":{"type":"boolean"}}}`)},
		},
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	id, err := m.EpochID()
	if err != nil {
		t.Fatal(err)
	}
	return &manifest.Signed{Manifest: m, Epoch: id, KeyID: "test-key", JWS: "test-jws-" + release}
}

func register(t *testing.T, s *lease.Store, sm *manifest.Signed) *record.Epoch {
	t.Helper()
	ep, _, err := s.RegisterEpoch(context.Background(), sm)
	if err != nil {
		t.Fatalf("register %s: %v", sm.Manifest.Server.Release, err)
	}
	return ep
}

func TestRegisterIsIdempotentUnderConcurrency(t *testing.T) {
	m := etcdtest.Start(t)
	s := m.Store(t, "/reg/")
	sm := testManifest(t, "github", "v1.4.0", "private")

	const n = 16
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		created int
		ids     = map[string]bool{}
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ep, c, err := s.RegisterEpoch(context.Background(), sm)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			ids[ep.ID] = true
			if c {
				created++
			}
		}()
	}
	wg.Wait()
	if created != 1 {
		t.Errorf("%d registrations reported created, want exactly 1", created)
	}
	if len(ids) != 1 || !ids[sm.Epoch] {
		t.Errorf("epoch ids %v, want only %s", ids, sm.Epoch)
	}
	eps, err := s.ListEpochs(context.Background(), record.EpochFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 1 || eps[0].State != record.StateActive {
		t.Fatalf("list = %+v, want one ACTIVE epoch", eps)
	}
	// A different covered field is a different epoch.
	other := register(t, s, testManifest(t, "github", "v1.4.0", "public"))
	if other.ID == sm.Epoch {
		t.Fatal("changing the configuration did not change the epoch id")
	}
}

func TestLifecycleStateMachine(t *testing.T) {
	m := etcdtest.Start(t)
	s := m.Store(t, "/life/")
	ctx := context.Background()
	ep := register(t, s, testManifest(t, "github", "v1.4.0", "private"))

	steps := []struct {
		note    string
		do      func() (record.State, error)
		want    record.State
		wantErr func(error) bool
	}{
		{"retire while ACTIVE is refused", func() (record.State, error) { return s.Retire(ctx, ep.ID, 0) }, "", isState(record.StateActive)},
		{"drain ACTIVE", func() (record.State, error) { return s.Drain(ctx, ep.ID) }, record.StateDraining, nil},
		{"drain twice is refused", func() (record.State, error) { return s.Drain(ctx, ep.ID) }, "", isState(record.StateDraining)},
		{"retire DRAINING without markers", func() (record.State, error) { return s.Retire(ctx, ep.ID, 0) }, record.StateStale, nil},
		{"retire twice is refused", func() (record.State, error) { return s.Retire(ctx, ep.ID, 0) }, "", isState(record.StateStale)},
		{"drain STALE is refused", func() (record.State, error) { return s.Drain(ctx, ep.ID) }, "", isState(record.StateStale)},
		{"drain unknown", func() (record.State, error) { return s.Drain(ctx, "sha256:unknown") }, "", is(record.ErrEpochNotFound)},
		{"retire unknown", func() (record.State, error) { return s.Retire(ctx, "sha256:unknown", 0) }, "", is(record.ErrEpochNotFound)},
	}
	for _, st := range steps {
		got, err := st.do()
		switch {
		case st.wantErr == nil && err != nil:
			t.Fatalf("%s: unexpected error %v", st.note, err)
		case st.wantErr != nil && !st.wantErr(err):
			t.Fatalf("%s: error %v is not the expected one", st.note, err)
		case got != st.want:
			t.Fatalf("%s: state %q, want %q", st.note, got, st.want)
		}
	}
	shown, err := s.GetEpoch(ctx, ep.ID)
	if err != nil {
		t.Fatal(err)
	}
	if shown.State != record.StateStale || shown.Manifest == nil || shown.JWS == "" {
		t.Fatalf("show = state %s, manifest %v, jws %q", shown.State, shown.Manifest != nil, shown.JWS)
	}
}

func isState(st record.State) func(error) bool {
	return func(err error) bool {
		var se *record.StateError
		return errors.As(err, &se) && se.State == st
	}
}

func is(target error) func(error) bool { return func(err error) bool { return errors.Is(err, target) } }

func TestRetireWaitsForLeaseMarkers(t *testing.T) {
	m := etcdtest.Start(t)
	s := m.Store(t, "/wait/")
	ctx := context.Background()
	ep := register(t, s, testManifest(t, "github", "v1.4.0", "private"))
	if _, err := s.Drain(ctx, ep.ID); err != nil {
		t.Fatal(err)
	}
	// Markers as admission writes them, one key per lease under the epoch.
	lease.PutMarkerForTest(t, s, ep.ID, "lease-a", false)
	lease.PutMarkerForTest(t, s, ep.ID, "lease-b", true)

	shown, err := s.GetEpoch(ctx, ep.ID)
	if err != nil {
		t.Fatal(err)
	}
	if shown.ActiveLeases != 1 || shown.UncertainLeases != 1 {
		t.Fatalf("lease counts = %d/%d, want 1/1", shown.ActiveLeases, shown.UncertainLeases)
	}

	_, err = s.Retire(ctx, ep.ID, 0)
	var blocked *record.RetireBlockedError
	if !errors.As(err, &blocked) || blocked.Active != 1 || blocked.Uncertain != 1 {
		t.Fatalf("retire with markers: %v, want RetireBlockedError 1/1", err)
	}
	// A short wait that no marker release ends also reports the counts,
	// and leaves no watch behind.
	idle := etcdWatchers(t)
	if _, err := s.Retire(ctx, ep.ID, 200*time.Millisecond); !errors.As(err, &blocked) {
		t.Fatalf("retire with expiring wait: %v", err)
	}
	testutil.Eventually(t, 30*time.Second, "the watch of the expired wait to end", func() bool { return etcdWatchers(t) == idle })

	// Release the markers one by one while Retire waits; it must return
	// STALE once the last one is gone. A Retire that missed the releases
	// would answer RetireBlockedError at the end of its wait, not STALE.
	type result struct {
		st  record.State
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := s.Retire(ctx, ep.ID, time.Minute)
		done <- result{st, err}
	}()
	// Retire is waiting once it watches the markers: it read them (both
	// there) at some revision, and its watch reports every release after
	// that revision.
	testutil.Eventually(t, 30*time.Second, "retire to watch the markers", func() bool {
		select {
		case r := <-done:
			t.Fatalf("retire returned %q, %v before any marker was released", r.st, r.err)
		default:
		}
		return etcdWatchers(t) != idle
	})
	cli := rawClient(t, m)
	markerKey := func(l string) string { return "/wait/markers/" + ep.ID + "/" + l }
	deleted := func(l string) int64 {
		resp, err := cli.Delete(ctx, markerKey(l))
		if err != nil || resp.Deleted != 1 {
			t.Fatalf("delete marker %s: %v (%d deleted)", l, err, resp.Deleted)
		}
		return resp.Header.Revision
	}
	deleted("lease-a")
	last := deleted("lease-b")
	r := <-done
	if r.err != nil || r.st != record.StateStale {
		t.Fatalf("retire with wait = %q, %v", r.st, r.err)
	}
	shown, err = s.GetEpoch(ctx, ep.ID)
	if err != nil {
		t.Fatal(err)
	}
	if shown.StateRevision <= last {
		t.Fatalf("STALE written at revision %d, before the last marker went at %d", shown.StateRevision, last)
	}
}

// etcdWatchers is the number of watches the etcd members of this process
// serve (etcd's gauge etcd_debugging_mvcc_watcher_total): the one a
// waiting Retire holds, as nothing else in fcd watches etcd.
func etcdWatchers(t *testing.T) float64 {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "etcd_debugging_mvcc_watcher_total" && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("etcd's watcher gauge is not registered")
	return 0
}

// rawClient is an etcd client of the member, bypassing the store; closed
// at test end.
func rawClient(t *testing.T, m *etcdtest.Member) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: m.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func TestSnapshotsAreImmutable(t *testing.T) {
	m := etcdtest.Start(t)
	s := m.Store(t, "/snap/")
	ctx := context.Background()
	v13 := register(t, s, testManifest(t, "github", "v1.3.0", "public"))
	register(t, s, testManifest(t, "other", "v1", "private"))

	s1, created, err := s.CreateSnapshot(ctx, []string{"github"})
	if err != nil || !created {
		t.Fatalf("snapshot: %v created=%v", err, created)
	}
	if len(s1.Tools) != 2 || s1.Tools[0].Name != "github/create_repository" || s1.Tools[0].Epoch != v13.ID {
		t.Fatalf("snapshot tools = %+v", s1.Tools)
	}
	before, _, err := s.GetSnapshotFull(ctx, s1.ID)
	if err != nil {
		t.Fatal(err)
	}

	// A later registration rolls the server out: new snapshots see it, the
	// old snapshot does not change.
	v14 := register(t, s, testManifest(t, "github", "v1.4.0", "private"))
	s2, _, err := s.CreateSnapshot(ctx, []string{"github"})
	if err != nil {
		t.Fatal(err)
	}
	if s2.ID == s1.ID || s2.Tools[0].Epoch != v14.ID {
		t.Fatalf("snapshot after rollout = %s on %s, want new id on v1.4", s2.ID, s2.Tools[0].Epoch)
	}
	if _, err := s.Drain(ctx, v14.ID); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{s1.ID, s2.ID} {
		if _, err := s.GetSnapshot(ctx, id); err != nil {
			t.Fatalf("snapshot %s after drain: %v", id, err)
		}
	}
	after, full, err := s.GetSnapshotFull(ctx, s1.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("snapshot changed:\n%+v\n%+v", before, after)
	}
	if len(full) != 2 || full[0].Descriptor == nil || full[0].Descriptor.Name != "create_repository" {
		t.Fatalf("full view = %+v", full)
	}
	// Rolling back (draining v1.4) yields the v1.3 catalog again: same
	// content, same id, not a rewrite.
	s3, created, err := s.CreateSnapshot(ctx, []string{"github"})
	if err != nil || created || s3.ID != s1.ID {
		t.Fatalf("snapshot after rollback = %s created=%v err=%v, want existing %s", s3.ID, created, err, s1.ID)
	}
	all, _, err := s.CreateSnapshot(ctx, nil)
	if err != nil || len(all.Tools) != 4 {
		t.Fatalf("snapshot of all servers: %v %+v", err, all)
	}

	tool, err := s.SnapshotTool(ctx, s2.ID, "github/create_repository")
	if err != nil || tool.Epoch != v14.ID {
		t.Fatalf("tool of s2 = %+v, %v", tool, err)
	}
	for _, tc := range []struct {
		snap, tool string
		want       error
	}{
		{s2.ID, "github/nope", record.ErrToolNotFound},
		{"sha256:nope", "github/create_repository", record.ErrSnapshotNotFound},
	} {
		if _, err := s.SnapshotTool(ctx, tc.snap, tc.tool); !errors.Is(err, tc.want) {
			t.Errorf("SnapshotTool(%s, %s) = %v, want %v", tc.snap, tc.tool, err, tc.want)
		}
	}
	if _, _, err := s.CreateSnapshot(ctx, []string{"nosuch"}); !errors.Is(err, record.ErrNoActiveEpochs) {
		t.Errorf("snapshot of unknown server: %v", err)
	}
}

func TestFailsClosedWhileEtcdIsDown(t *testing.T) {
	m := etcdtest.Start(t)
	s := m.Store(t, "/down/")
	ctx := context.Background()
	ep := register(t, s, testManifest(t, "github", "v1.4.0", "private"))

	m.Stop()
	if err := s.Ping(ctx); !errors.Is(err, record.ErrUnavailable) {
		t.Fatalf("ping with etcd down: %v", err)
	}
	ops := map[string]func() error{
		"register": func() error {
			_, _, err := s.RegisterEpoch(ctx, testManifest(t, "github", "v1.5.0", "private"))
			return err
		},
		"drain":    func() error { _, err := s.Drain(ctx, ep.ID); return err },
		"retire":   func() error { _, err := s.Retire(ctx, ep.ID, 0); return err },
		"list":     func() error { _, err := s.ListEpochs(ctx, record.EpochFilter{}); return err },
		"snapshot": func() error { _, _, err := s.CreateSnapshot(ctx, nil); return err },
	}
	for name, op := range ops {
		if err := op(); !errors.Is(err, record.ErrUnavailable) {
			t.Errorf("%s with etcd down: %v, want ErrUnavailable", name, err)
		}
	}

	m.Restart()
	// The client reconnects with backoff.
	testutil.Eventually(t, 30*time.Second, "the store to reach etcd again", func() bool { return s.Ping(ctx) == nil })
	got, err := s.GetEpoch(ctx, ep.ID)
	if err != nil || got.State != record.StateActive {
		t.Fatalf("epoch after restart: %+v %v", got, err)
	}
	if _, err := s.Drain(ctx, ep.ID); err != nil {
		t.Fatalf("drain after restart: %v", err)
	}
}
