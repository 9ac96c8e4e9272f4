package lease

import (
	"context"
	"encoding/json"
	"testing"
)

// PutMarkerForTest writes a lease marker as admission does, so that
// retirement can be tested without a lease's life.
func PutMarkerForTest(t testing.TB, s *Store, epoch, lease string, uncertain bool) {
	t.Helper()
	rec := markerRecord{State: markerAdmitted}
	if uncertain {
		rec.State = markerUncertain
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
	resp, err := s.cli.Get(context.Background(), s.k.claim(lease))
	if err != nil {
		t.Fatalf("get claim: %v", err)
	}
	if len(resp.Kvs) == 0 {
		return "", false
	}
	return string(resp.Kvs[0].Value), true
}
