package lease_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/lease"
)

// TestCompactionWaitsForTrails: Compact never compacts past the oldest
// fresh trail cursor — the history a trail has not recorded stays
// readable by Follow — and a cursor older than its TTL (a replica gone
// for good) no longer holds it back.
func TestCompactionWaitsForTrails(t *testing.T) {
	m := etcdtest.Start(t)
	now := time.Now()
	clock := func() time.Time { return now }
	s, err := lease.Open(context.Background(), lease.Config{Endpoints: m.Endpoints(), Prefix: "/compact/",
		Logger: slog.New(slog.DiscardHandler), Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	write := func(i int) {
		if err := s.RecordPolicy(ctx, "writer", "policy", map[string]any{"digest": fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		write(i)
	}
	held, err := s.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetTrailCursor(ctx, "slow", held); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		write(10 + i)
	}
	got, err := s.Compact(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got != held+1 {
		t.Fatalf("compacted at %d; the slow trail recorded up to %d, so at most %d", got, held, held+1)
	}
	// What the slow trail has not recorded is still there to follow.
	followed := 0
	fctx, stop := context.WithCancel(ctx)
	err = s.Follow(fctx, held+1, func(c lease.Commit) error {
		followed++
		for _, ch := range c.Changes {
			if p, ok := ch.(lease.PolicyRecorded); ok && string(p.Data) == `{"digest":"14"}` {
				stop()
			}
		}
		return nil
	}, nil)
	if !errors.Is(err, context.Canceled) || followed == 0 {
		t.Fatalf("follow from the first change after the slow trail's cursor: %v after %d commits", err, followed)
	}
	var hc *lease.HistoryCompactedError
	if err := s.Follow(ctx, held-2, func(lease.Commit) error { return nil }, nil); !errors.As(err, &hc) || hc.Compacted != got {
		t.Fatalf("follow from before the compaction: %v, want a HistoryCompactedError at %d", err, got)
	}

	// A day later the slow replica's cursor is stale: it holds nothing.
	now = now.Add(lease.DefaultCursorTTL + time.Minute)
	if _, ok, err := s.TrailFloor(ctx, 0); err != nil || ok {
		t.Fatalf("floor of a stale cursor: ok=%v err=%v", ok, err)
	}
	head, err := s.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Compact(ctx, 0); err != nil || got != head {
		t.Fatalf("compact with only a stale cursor: %d, %v; want the head %d", got, err, head)
	}
}
