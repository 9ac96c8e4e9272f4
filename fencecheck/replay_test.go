package fencecheck_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/fencecheck"
)

func TestMemoryReplay(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	m := fencecheck.NewMemoryReplay(3)
	m.Now = clk.Now
	t0 := clk.Now()

	seen := func(jti string, exp time.Time) (bool, error) { return m.Seen(ctx, jti, exp) }
	for i, exp := range []time.Duration{10 * time.Second, 20 * time.Second, 30 * time.Second} {
		if s, err := seen(fmt.Sprint("a", i), t0.Add(exp)); s || err != nil {
			t.Fatalf("a%d: seen=%v err=%v", i, s, err)
		}
	}
	if s, err := seen("a1", t0.Add(time.Hour)); !s || err != nil {
		t.Fatalf("a1 again: seen=%v err=%v, want seen", s, err)
	}

	// Full of live entries: refuse the new id, forget none.
	if _, err := seen("b", t0.Add(time.Minute)); !errors.Is(err, fencecheck.ErrReplayFull) {
		t.Fatalf("err = %v, want ErrReplayFull", err)
	}
	for i := range 3 {
		if s, _ := seen(fmt.Sprint("a", i), t0.Add(time.Minute)); !s {
			t.Fatalf("a%d forgotten while live", i)
		}
	}

	// a0 and a1 expire: they are evicted, soonest first, and room is made.
	clk.Advance(20 * time.Second)
	if s, err := seen("b", t0.Add(time.Minute)); s || err != nil {
		t.Fatalf("b: seen=%v err=%v", s, err)
	}
	if n := m.Len(); n != 2 {
		t.Fatalf("Len = %d, want 2 (a2 and b)", n)
	}
	if s, _ := seen("a2", t0.Add(time.Minute)); !s {
		t.Fatal("a2 (live) forgotten")
	}
	// An expired id is not remembered any more.
	if s, err := seen("a0", t0.Add(time.Minute)); s || err != nil {
		t.Fatalf("a0 after expiry: seen=%v err=%v", s, err)
	}
}

func TestMemoryReplayZeroValue(t *testing.T) {
	var m fencecheck.MemoryReplay
	exp := time.Now().Add(time.Minute)
	if s, err := m.Seen(context.Background(), "x", exp); s || err != nil {
		t.Fatalf("seen=%v err=%v", s, err)
	}
	if s, _ := m.Seen(context.Background(), "x", exp); !s {
		t.Fatal("not seen")
	}
}

// TestMemoryReplayConcurrent: of many concurrent first uses of one id,
// exactly one is new.
func TestMemoryReplayConcurrent(t *testing.T) {
	m := fencecheck.NewMemoryReplay(1000)
	exp := time.Now().Add(time.Minute)
	var fresh atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := m.Seen(context.Background(), "same", exp)
			if err != nil {
				t.Error(err)
			}
			if !s {
				fresh.Add(1)
			}
		}()
	}
	wg.Wait()
	if fresh.Load() != 1 {
		t.Fatalf("%d callers saw the id as new, want 1", fresh.Load())
	}
}

// TestMemoryReplayForget: a forgotten id is new again, and the eviction
// of its first record does not drop the second one early.
func TestMemoryReplayForget(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	m := fencecheck.NewMemoryReplay(10)
	m.Now = clk.Now
	t0 := clk.Now()

	if s, err := m.Seen(ctx, "a", t0.Add(10*time.Second)); s || err != nil {
		t.Fatalf("first: seen=%v err=%v", s, err)
	}
	m.Forget(ctx, "a")
	if n := m.Len(); n != 0 {
		t.Fatalf("Len after Forget = %d, want 0", n)
	}
	m.Forget(ctx, "never-seen") // a no-op
	if s, err := m.Seen(ctx, "a", t0.Add(time.Minute)); s || err != nil {
		t.Fatalf("after Forget: seen=%v err=%v, want new", s, err)
	}
	// The first record's expiry passes: the second record stays.
	clk.Advance(20 * time.Second)
	if s, _ := m.Seen(ctx, "b", t0.Add(time.Minute)); s {
		t.Fatal("b seen")
	}
	if s, _ := m.Seen(ctx, "a", t0.Add(time.Minute)); !s {
		t.Fatal("a, recorded again after Forget, was dropped at its first record's expiry")
	}
	// And it goes at its own expiry.
	clk.Advance(time.Minute)
	if s, err := m.Seen(ctx, "a", t0.Add(2*time.Minute)); s || err != nil {
		t.Fatalf("after its expiry: seen=%v err=%v", s, err)
	}

	// A forgotten id frees its room in a full store.
	full := fencecheck.NewMemoryReplay(1)
	full.Now = clk.Now
	exp := clk.Now().Add(time.Minute)
	if _, err := full.Seen(ctx, "x", exp); err != nil {
		t.Fatal(err)
	}
	if _, err := full.Seen(ctx, "y", exp); !errors.Is(err, fencecheck.ErrReplayFull) {
		t.Fatalf("err = %v, want ErrReplayFull", err)
	}
	full.Forget(ctx, "x")
	if s, err := full.Seen(ctx, "y", exp); s || err != nil {
		t.Fatalf("after Forget: seen=%v err=%v", s, err)
	}
}
