package lease

import (
	"context"
	"errors"
	"time"

	"github.com/fcd-authz/fcd/record"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// MarkUnreported marks uncertain every admitted lease admitted before
// cutoff: its backend never reported an outcome (it crashed, or the report
// was lost), so whether the effect happened is unknown. The marker stays
// (the epoch does not retire, the call is not replayed or substituted)
// until an operator resolves the lease or a newer pool generation releases
// it, as for a reported "uncertain". Each change is the compare-and-swap
// of CloseLease: a report that lands first wins, and replicas sweeping at
// once mark a lease once. It returns the leases it marked, each with the
// revision that marked it (Closed).
func (s *Store) MarkUnreported(ctx context.Context, cutoff time.Time) ([]*record.Lease, error) {
	octx, cancel := s.op(ctx)
	all, err := s.cli.Get(octx, s.k.allMarkers(), clientv3.WithPrefix())
	cancel()
	if err != nil {
		return nil, s.wrap(ctx, "scan markers", err)
	}
	marked := []*record.Lease{}
	for _, kv := range all.Kvs {
		// A marker that does not decode is not marked: it keeps its epoch
		// from retiring as an uncertain one would (the safe side).
		stored, err := decodeMarker(kv.Key, kv.Value)
		if err != nil {
			s.log.Error("sweep: a lease marker does not decode; left as it is", "err", err)
			continue
		}
		l := stored.lease()
		if !unreported(l, cutoff) {
			continue
		}
		m, err := s.MarkLeaseUnreported(ctx, l.ID, cutoff)
		if err != nil {
			return marked, err
		}
		if m != nil {
			marked = append(marked, m)
		}
	}
	return marked, nil
}

// MarkLeaseUnreported marks one lease uncertain if it is still an
// admission made before cutoff with no outcome reported, and returns it
// (with the revision that marked it, Closed) if it did, nil if not. A
// lease closed or marked meanwhile is left as it is.
func (s *Store) MarkLeaseUnreported(ctx context.Context, id string, cutoff time.Time) (*record.Lease, error) {
	l, err := s.closeLease(ctx, id, record.OutcomeUncertain, nil, closure{By: bySweep}, 0, func(cur *record.Lease) error {
		if !unreported(cur, cutoff) {
			return errReported
		}
		return nil
	})
	switch {
	case errors.Is(err, record.ErrLeaseClosed), errors.Is(err, errReported):
		return nil, nil
	case err != nil:
		return nil, err
	}
	s.log.Warn("lease outcome never reported; marked uncertain", "lease", id)
	return l, nil
}

// unreported: an admitted lease admitted before cutoff, or a running one
// claimed before it, with no outcome reported.
func unreported(l *record.Lease, cutoff time.Time) bool {
	switch l.State {
	case record.LeaseAdmitted:
		return l.AdmittedAt.Before(cutoff)
	case record.LeaseRunning:
		return l.Claim != nil && l.Claim.At.Before(cutoff)
	}
	return false
}

var errReported = errors.New("lease: lease is no longer an unreported admission")
