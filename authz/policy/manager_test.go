package policy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"go.uber.org/goleak"

	"github.com/fcd-authz/fcd/internal/testutil"
	"github.com/fcd-authz/fcd/policies"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// writeSet replaces the policy files of dir with fsys.
func writeSet(t testing.TB, dir string, fsys fstest.MapFS) {
	t.Helper()
	old, _ := filepath.Glob(filepath.Join(dir, "*"))
	for _, f := range old {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	for name, f := range fsys {
		if err := os.WriteFile(filepath.Join(dir, name), f.Data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func digestOf(t testing.TB, fsys fstest.MapFS) string {
	t.Helper()
	s, err := Load(context.Background(), fsys)
	if err != nil {
		t.Fatal(err)
	}
	return s.Digest()
}

func TestNewManager(t *testing.T) {
	ctx := context.Background()
	t.Run("embedded defaults", func(t *testing.T) {
		m, err := NewManager(ctx, Source{FS: policies.FS}, ManagerConfig{Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		st := m.Status()
		if st.Source != "embedded" || st.Digest != m.Current().Digest() || st.LoadedAt.IsZero() || st.LastError != "" {
			t.Errorf("status = %+v", st)
		}
		done := make(chan struct{})
		go func() { m.Watch(ctx, time.Millisecond); close(done) }()
		<-done // an FS source is not watched: Watch returns at once
		if err := m.Reload(ctx); err != nil {
			t.Errorf("reloading the embedded set: %v", err)
		}
	})
	t.Run("the initial load must succeed", func(t *testing.T) {
		dir := t.TempDir()
		writeSet(t, dir, with(tinySet("A", 1), "p.cedar", []byte("permit (")))
		if _, err := NewManager(ctx, Source{Dir: dir}, ManagerConfig{Logger: quietLogger()}); !errors.Is(err, ErrInvalidPolicy) {
			t.Fatalf("NewManager = %v, want ErrInvalidPolicy", err)
		}
		if _, err := NewManager(ctx, Source{Dir: filepath.Join(dir, "missing")}, ManagerConfig{Logger: quietLogger()}); err == nil {
			t.Fatal("NewManager on a missing directory succeeded")
		}
		if _, err := NewManager(ctx, Source{}, ManagerConfig{}); err == nil {
			t.Fatal("NewManager without a source succeeded")
		}
	})
}

// TestReloadKeepsWorkingSet breaks the policy directory in each way a
// reload can fail and checks that the old set stays in force, decisions go
// on, and the error is visible in Status until a good set loads.
func TestReloadKeepsWorkingSet(t *testing.T) {
	ctx := context.Background()
	mf := githubManifest(t)
	write := githubInput(t, mf, call{tool: "create_repository"})
	a, b := tinySet("A", 1), tinySet("B", 2)
	da, db := digestOf(t, a), digestOf(t, b)
	breakages := []struct {
		note string
		fsys fstest.MapFS
		want error
	}{
		{"Rego syntax error", with(b, "p.rego", []byte("package fcd.authz\nallow contains {\n")), ErrInvalidPolicy},
		{"Cedar syntax error", with(b, "p.cedar", []byte(`@id("x") permit (principal,`)), ErrInvalidPolicy},
		{"failing Rego test", tinyMix("B", 2, 3), ErrTestsFailed},
		{"failing Cedar case", with(b, "p.cedar", a["p.cedar"].Data), ErrTestsFailed},
		{"a language missing", with(b, "p.cedar", nil), ErrInvalidPolicy},
	}
	for _, tc := range breakages {
		t.Run(tc.note, func(t *testing.T) {
			dir := t.TempDir()
			writeSet(t, dir, a)
			now := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
			var tick atomic.Int64
			clock := func() time.Time { return now.Add(time.Duration(tick.Add(1)) * time.Second) }
			m, err := NewManager(ctx, Source{Dir: dir}, ManagerConfig{Logger: quietLogger(), Now: clock})
			if err != nil {
				t.Fatal(err)
			}
			loadedAt := m.Status().LoadedAt

			writeSet(t, dir, tc.fsys)
			if err := m.Reload(ctx); !errors.Is(err, tc.want) {
				t.Fatalf("Reload = %v, want %v", err, tc.want)
			}
			if got := m.Current().Digest(); got != da {
				t.Fatalf("the broken set replaced the working one: %s", got)
			}
			st := m.Status()
			if st.Digest != da || !st.LoadedAt.Equal(loadedAt) || st.LastError == "" || !st.LastErrorAt.After(loadedAt) {
				t.Errorf("status after a failed reload = %+v", st)
			}
			if d := m.Decide(ctx, write); d.PolicyDigest != da || d.Approvals != 1 || !d.Allowed() {
				t.Errorf("decision after a failed reload = %+v", d)
			}

			writeSet(t, dir, b)
			if err := m.Reload(ctx); err != nil {
				t.Fatalf("Reload of a good set: %v", err)
			}
			st = m.Status()
			if st.Digest != db || st.LastError != "" || !st.LastErrorAt.IsZero() || !st.LoadedAt.After(loadedAt) {
				t.Errorf("status after a good reload = %+v", st)
			}
			if d := m.Decide(ctx, write); d.PolicyDigest != db || d.Approvals != 2 {
				t.Errorf("decision after a good reload = %+v", d)
			}
		})
	}
}

// TestReloadRacesDecisions decides from many goroutines while another
// reloads, alternating between two valid sets. Under -race this checks the
// swap is data-race free; every decision must come wholly from one set.
func TestReloadRacesDecisions(t *testing.T) {
	ctx := context.Background()
	mf := githubManifest(t)
	a, b := tinySet("A", 1), tinySet("B", 2)
	variants := map[string]struct {
		name      string
		approvals int
	}{digestOf(t, a): {"A", 1}, digestOf(t, b): {"B", 2}}
	dir := t.TempDir()
	writeSet(t, dir, a)
	m, err := NewManager(ctx, Source{Dir: dir}, ManagerConfig{Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	in := githubInput(t, mf, call{tool: "create_repository"})

	// The reloader alternates the directory between the two sets and
	// reloads 20 times; deciders decide until it is done.
	const reloads = 20
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(stop)
		for i := range reloads {
			next := b
			if i%2 == 1 {
				next = a
			}
			writeSet(t, dir, next)
			if err := m.Reload(ctx); err != nil {
				t.Errorf("Reload: %v", err)
				return
			}
		}
	})
	var mu sync.Mutex
	seen := map[string]int{}
	for range 8 {
		wg.Go(func() {
			local := map[string]int{}
			defer func() {
				mu.Lock()
				for k, v := range local {
					seen[k] += v
				}
				mu.Unlock()
			}()
			for {
				select {
				case <-stop:
					return
				default:
				}
				d := m.Decide(ctx, in)
				v, ok := variants[d.PolicyDigest]
				switch {
				case !ok:
					t.Errorf("decision with unknown digest %q", d.PolicyDigest)
					return
				case !d.Allowed() || d.Approvals != v.approvals || len(d.Engines) != 2:
					t.Errorf("set %s decided %+v", v.name, d)
					return
				}
				for _, e := range d.Engines {
					if len(e.Reasons) == 0 || !strings.HasSuffix(e.Reasons[0], "variant "+v.name) {
						t.Errorf("set %s: %s reasons %q come from another set", v.name, e.Engine, e.Reasons)
						return
					}
				}
				local[v.name]++
			}
		})
	}
	wg.Wait()
	t.Logf("decisions by set during %d reloads: %v", reloads, seen)
	if seen["A"] == 0 || seen["B"] == 0 {
		t.Errorf("decisions did not span both sets: %v", seen)
	}
}

// TestWatch checks that Watch picks up a changed directory, reports a
// broken one without replacing the set, and stops with its context.
func TestWatch(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithCancel(context.Background())
	dir := t.TempDir()
	a, b := tinySet("A", 1), tinySet("B", 2)
	writeSet(t, dir, a)
	m, err := NewManager(ctx, Source{Dir: dir}, ManagerConfig{Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { m.Watch(ctx, 5*time.Millisecond); close(done) }()

	waitFor := func(what string, cond func() bool) {
		t.Helper()
		testutil.EventuallyState(t, 30*time.Second, what, cond, func() string { return fmt.Sprintf("status %+v", m.Status()) })
	}
	db := digestOf(t, b)
	writeSet(t, dir, b)
	waitFor("the changed set", func() bool { return m.Current().Digest() == db })

	writeSet(t, dir, with(b, "p.rego", []byte("package fcd.authz\nallow contains {\n")))
	waitFor("the reload error", func() bool { return m.Status().LastError != "" })
	if m.Current().Digest() != db {
		t.Errorf("a broken directory replaced the set")
	}

	writeSet(t, dir, a)
	da := digestOf(t, a)
	waitFor("the repaired set", func() bool { return m.Current().Digest() == da && m.Status().LastError == "" })

	cancel()
	<-done
	if d := m.Decide(context.Background(), githubInput(t, githubManifest(t), call{tool: "create_repository"})); d.PolicyDigest != da {
		t.Errorf("decision digest %s, want %s", d.PolicyDigest, da)
	}
}
