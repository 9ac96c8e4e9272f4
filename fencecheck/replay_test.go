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
