package lease

import (
	"context"
	"errors"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// MaxGaugeMarkers bounds the lease markers one Gauges read decodes; past
// it the per-epoch counts are of the first markers only (Gauges.Partial),
// the total stays exact.
const MaxGaugeMarkers = 10000

// Gauges are what operators watch of the store: the formations waiting
// for approval and the open leases per epoch, read in one revision.
type Gauges struct {
	// PendingApproval counts formations waiting for an approval.
	PendingApproval int64
	// Open counts the open leases (lease markers: admitted, running or
	// uncertain) in all; Epochs breaks them down by epoch.
	Open   int64
	Epochs map[string]EpochLeases
	// Partial: there were more than MaxGaugeMarkers markers, and Epochs
	// counts the first of them only.
	Partial bool
	// Revision is the store revision read.
	Revision int64
}

// EpochLeases are one epoch's open leases: Open in all, Uncertain of them
// waiting for a resolution.
type EpochLeases struct{ Open, Uncertain int }

// Gauges reads the gauges in one read-only transaction: a count-only
// range over the pending-approval index (keys only, no values) and a
// range over the lease markers, one per open call, bounded by
// MaxGaugeMarkers. What it costs grows with the calls in flight, never
// with the formations kept.
func (s *Store) Gauges(ctx context.Context) (Gauges, error) {
	if s.cli == nil {
		return Gauges{}, errors.New("lease: gauges of a store that was never opened")
	}
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Txn(octx).Then(
		clientv3.OpGet(s.k.pendingApprovals(), clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(s.k.allMarkers(), clientv3.WithPrefix(), clientv3.WithLimit(MaxGaugeMarkers)),
	).Commit()
	if err != nil {
		return Gauges{}, s.wrap(ctx, "read gauges", err)
	}
	pending, markers := resp.Responses[0].GetResponseRange(), resp.Responses[1].GetResponseRange()
	g := Gauges{PendingApproval: pending.Count, Open: markers.Count, Epochs: map[string]EpochLeases{},
		Partial: markers.More, Revision: resp.Header.Revision}
	for _, kv := range markers.Kvs {
		id := s.k.epochOfMarker(string(kv.Key))
		e := g.Epochs[id]
		e.Open++
		if _, u := tallyMarkers([]*mvccpb.KeyValue{kv}); u > 0 {
			e.Uncertain++
		}
		g.Epochs[id] = e
	}
	return g, nil
}
