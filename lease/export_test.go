package lease

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/fcd-authz/fcd/record"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// PutMarkerForTest writes a bare lease marker (a lease record with only
// its id and state), so that retirement is tested apart from admission.
func PutMarkerForTest(t testing.TB, s *Store, epoch, lease string, uncertain bool) {
	t.Helper()
	rec := record.Lease{ID: lease, State: record.LeaseAdmitted}
	if uncertain {
		rec.State = record.LeaseUncertain
	}
	val, _ := json.Marshal(rec)
	if _, err := s.cli.Put(context.Background(), s.k.marker(epoch, lease), string(val)); err != nil {
		t.Fatalf("put marker: %v", err)
	}
}

// DeleteMarkerForTest releases a marker written by PutMarkerForTest.
func DeleteMarkerForTest(t testing.TB, s *Store, epoch, lease string) {
	t.Helper()
	if _, err := s.cli.Delete(context.Background(), s.k.marker(epoch, lease)); err != nil {
		t.Errorf("delete marker: %v", err)
	}
}

// ClaimKeyForTest returns the stored claim of a lease (its key's value)
// and whether the key exists.
func ClaimKeyForTest(t testing.TB, s *Store, lease string) (string, bool) {
	t.Helper()
	resp, err := s.cli.Get(context.Background(), s.k.claims(lease), clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("get claim: %v", err)
	}
	if len(resp.Kvs) == 0 {
		return "", false
	}
	return string(resp.Kvs[0].Value), true
}

// HoldCommitsForTest takes every commit slot of s, so that writes queue
// instead of going to etcd. queued tells how many wait; release frees the
// slots, and the queued writes go as batches (none once s is closed).
func HoldCommitsForTest(s *Store) (queued func() int, release func()) {
	c := s.commits
	c.mu.Lock()
	held := c.maxSlots
	c.running += held
	c.mu.Unlock()
	queued = func() int {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.queue)
	}
	release = func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.running -= held
		for c.running < c.maxSlots && !c.closed {
			c.running++
			c.flushing.Add(1)
			go c.flush(false)
		}
	}
	return queued, release
}

// RevokeRetentionForTest revokes every etcd lease of the store's cluster
// behind the store's back, as a restore from a backup would lose them.
func RevokeRetentionForTest(t testing.TB, s *Store) {
	t.Helper()
	ctx := context.Background()
	resp, err := s.cli.Leases(ctx)
	if err != nil {
		t.Fatalf("list leases: %v", err)
	}
	if len(resp.Leases) == 0 {
		t.Fatal("no retention lease to revoke")
	}
	for _, l := range resp.Leases {
		if _, err := s.cli.Revoke(ctx, l.ID); err != nil {
			t.Fatalf("revoke lease: %v", err)
		}
	}
}

// StopServerForTest stops the member's etcd server as a fatal error of
// its own would, without Close: what Failed reports.
func StopServerForTest(e *Embedded) { e.etcd.Server.HardStop() }
