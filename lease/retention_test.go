package lease_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/record"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestRetentionLeasesShareBuckets: records whose retention ends in the
// same minute share one etcd lease, whatever their keep and however many
// callers ask at once; each lease keeps its records at least for keep and
// at most a bucket longer; a later minute gets a lease of its own.
func TestRetentionLeasesShareBuckets(t *testing.T) {
	m := etcdtest.Start(t)
	cli := rawClient(t, m)
	// The clock stands in the middle of a minute, so that every keep below
	// ends in one bucket per keep.
	var now atomic.Int64
	now.Store(time.Now().Truncate(time.Minute).Add(30 * time.Second).UnixNano())
	s, err := lease.Open(context.Background(), lease.Config{
		Endpoints: m.Endpoints(), Prefix: "/retention/", Logger: slog.New(slog.DiscardHandler),
		Now: func() time.Time { return time.Unix(0, now.Load()) },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	leases := func() int {
		t.Helper()
		resp, err := cli.Leases(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(resp.Leases)
	}
	// A formation's record is kept for its TTL plus retention, a closed
	// one for the retention: the two keeps alternate in a busy store.
	keeps := []time.Duration{15*time.Minute + 24*time.Hour, 24 * time.Hour}
	form := func(prefix string, n int) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				f := &record.Formation{Call: record.Call{ID: fmt.Sprintf("%s-%d", prefix, i)}}
				_, errs[i] = s.CreateFormation(ctx, f, keeps[i%len(keeps)])
			})
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}

	before := leases()
	form("fm_a", 20)
	if got := leases() - before; got != len(keeps) {
		t.Fatalf("20 concurrent records with %d keeps granted %d etcd leases, want %d (one per bucket)", len(keeps), got, len(keeps))
	}
	for i, keep := range keeps {
		resp, err := cli.Get(ctx, "/retention/formations/"+fmt.Sprintf("fm_a-%d", i))
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("record fm_a-%d: %v", i, err)
		}
		ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
		if err != nil {
			t.Fatal(err)
		}
		if low, high := int64(keep/time.Second), int64((keep+time.Minute)/time.Second)+1; ttl.TTL < low || ttl.TTL > high {
			t.Errorf("keep %s: the record's lease lives %ds, want within [%d, %d]", keep, ttl.TTL, low, high)
		}
	}

	// The same minute again: no new lease. A minute later: one per keep.
	form("fm_b", 6)
	if got := leases() - before; got != len(keeps) {
		t.Fatalf("records in the same buckets granted new leases: %d in all, want %d", got, len(keeps))
	}
	now.Add(int64(time.Minute))
	form("fm_c", 6)
	if got := leases() - before; got != 2*len(keeps) {
		t.Fatalf("a minute later: %d leases in all, want %d", got, 2*len(keeps))
	}
}

// TestRetentionLeaseLostInEtcd: when etcd no longer knows the cached
// retention lease (revoked, a restored cluster), one write fails and the
// next is given a lease granted anew, not refused until the bucket ends.
func TestRetentionLeaseLostInEtcd(t *testing.T) {
	m := etcdtest.Start(t)
	cli := rawClient(t, m)
	s := m.Store(t, "/lost/")
	ctx := context.Background()
	form := func(id string) error {
		_, err := s.CreateFormation(ctx, &record.Formation{Call: record.Call{ID: id}}, time.Hour)
		return err
	}
	if err := form("fm_1"); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Leases(ctx)
	if err != nil || len(resp.Leases) != 1 {
		t.Fatalf("leases %v, %v", resp, err)
	}
	if _, err := cli.Revoke(ctx, resp.Leases[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := form("fm_2"); err == nil {
		t.Fatal("a write on a lease etcd does not know succeeded")
	}
	if err := form("fm_3"); err != nil {
		t.Fatalf("the next write after the lost lease: %v", err)
	}
	got, err := cli.Get(ctx, "/lost/formations/fm_3")
	if err != nil || len(got.Kvs) != 1 || got.Kvs[0].Lease == int64(resp.Leases[0].ID) {
		t.Fatalf("fm_3 stored %v (%v), want it on a new lease", got.Kvs, err)
	}
}
