package lease

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// epochRecord is the immutable stored part of an epoch.
type epochRecord struct {
	ver
	ID           string             `json:"id"`
	SignerKeyID  string             `json:"signerKid"`
	RegisteredAt time.Time          `json:"registeredAt"`
	Manifest     *manifest.Manifest `json:"manifest"`
	JWS          string             `json:"jws"`

	// digests caches the descriptor digests by tool name (canonical JSON
	// is not free); computed once, the record never changes.
	digestsOnce sync.Once
	digests     map[string]string
	digestsErr  error
}

// toolDigest returns the digest of the named tool's descriptor.
func (r *epochRecord) toolDigest(name string) (string, error) {
	r.digestsOnce.Do(func() {
		r.digests = make(map[string]string, len(r.Manifest.Tools))
		for i := range r.Manifest.Tools {
			d, err := r.Manifest.Tools[i].Digest()
			if err != nil {
				r.digestsErr = err
				return
			}
			r.digests[r.Manifest.Tools[i].Name] = d
		}
	})
	if r.digestsErr != nil {
		return "", r.digestsErr
	}
	d, ok := r.digests[name]
	if !ok {
		return "", fmt.Errorf("%w: epoch %s has no tool %s", record.ErrCorrupt, r.ID, name)
	}
	return d, nil
}

func (r *epochRecord) epoch(rev int64, st record.State, withDoc bool) (*record.Epoch, error) {
	m := r.Manifest
	e := &record.Epoch{
		ID: r.ID, Server: m.Server.Name, Release: m.Server.Release, Pool: m.Pool,
		Artifact: m.Artifact, ConfigDigest: m.Config.Digest, SignerKeyID: r.SignerKeyID,
		RegisteredAt: r.RegisteredAt, State: st, Revision: rev,
	}
	for i := range m.Tools {
		d, err := r.toolDigest(m.Tools[i].Name)
		if err != nil {
			return nil, fmt.Errorf("%w: epoch %s tool %s: %v", record.ErrCorrupt, r.ID, m.Tools[i].Name, err)
		}
		e.Tools = append(e.Tools, record.EpochTool{Name: m.Tools[i].Name, Digest: d, SideEffects: m.Tools[i].SideEffects})
	}
	if withDoc {
		e.Manifest, e.JWS = m, r.JWS
	}
	return e, nil
}

func decodeRecord(kv *mvccpb.KeyValue) (*epochRecord, error) {
	var r epochRecord
	if err := decodeStored(kv.Key, kv.Value, &r); err != nil {
		return nil, err
	}
	if r.Manifest == nil {
		return nil, fmt.Errorf("%w: epoch record %s: no manifest", record.ErrCorrupt, kv.Key)
	}
	return &r, nil
}

// RegisterEpoch stores a verified manifest as an ACTIVE epoch. It is
// idempotent: the epoch id is the manifest's digest, so registering the
// same manifest again, even concurrently, returns the one existing epoch
// with created false.
func (s *Store) RegisterEpoch(ctx context.Context, sm *manifest.Signed) (ep *record.Epoch, created bool, err error) {
	rec := epochRecord{ver: current, ID: sm.Epoch, SignerKeyID: sm.KeyID, RegisteredAt: s.now().UTC(), Manifest: sm.Manifest, JWS: sm.JWS}
	val, err := json.Marshal(&rec)
	if err != nil {
		return nil, false, fmt.Errorf("lease: encode epoch: %w", err)
	}
	key, skey := s.k.epoch(sm.Epoch), s.k.state(sm.Epoch)
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Txn(octx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(val)), clientv3.OpPut(skey, string(record.StateActive))).
		Else(clientv3.OpGet(key), clientv3.OpGet(skey)).
		Commit()
	if err != nil {
		return nil, false, s.wrap(ctx, "register epoch", err)
	}
	if resp.Succeeded {
		ep, err := rec.epoch(resp.Header.Revision, record.StateActive, true)
		return ep, true, err
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	st := resp.Responses[1].GetResponseRange().Kvs
	if len(kvs) == 0 || len(st) == 0 {
		return nil, false, fmt.Errorf("%w: epoch %s half written", record.ErrCorrupt, sm.Epoch)
	}
	old, err := decodeRecord(kvs[0])
	if err != nil {
		return nil, false, err
	}
	ep, err = old.epoch(kvs[0].CreateRevision, record.State(st[0].Value), true)
	if err != nil {
		return nil, false, err
	}
	if err := s.countMarkers(ctx, ep); err != nil {
		return nil, false, err
	}
	return ep, false, nil
}

// GetEpoch returns one epoch with its manifest, state and lease counts,
// read at one revision.
func (s *Store) GetEpoch(ctx context.Context, id string) (*record.Epoch, error) {
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Txn(octx).Then(
		clientv3.OpGet(s.k.epoch(id)),
		clientv3.OpGet(s.k.state(id)),
		clientv3.OpGet(s.k.markers(id), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, s.wrap(ctx, "get epoch", err)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	st := resp.Responses[1].GetResponseRange().Kvs
	if len(kvs) == 0 || len(st) == 0 {
		return nil, fmt.Errorf("%w: %s", record.ErrEpochNotFound, id)
	}
	rec, err := decodeRecord(kvs[0])
	if err != nil {
		return nil, err
	}
	ep, err := rec.epoch(kvs[0].CreateRevision, record.State(st[0].Value), true)
	if err != nil {
		return nil, err
	}
	ep.ActiveLeases, ep.UncertainLeases = tallyMarkers(resp.Responses[2].GetResponseRange().Kvs)
	ep.StateRevision = st[0].ModRevision
	return ep, nil
}

// EpochLeases returns the open leases of an epoch — the lease markers that
// hold its retirement back, admitted, running (claimed) or uncertain —
// oldest first, read at one store revision. An operator finds here the
// uncertain leases to resolve.
func (s *Store) EpochLeases(ctx context.Context, id string) ([]*record.Lease, error) {
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Txn(octx).Then(
		clientv3.OpGet(s.k.state(id), clientv3.WithKeysOnly()),
		clientv3.OpGet(s.k.markers(id), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)),
		// Claims exist only for calls running now: few.
		clientv3.OpGet(s.k.allClaims(), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, s.wrap(ctx, "epoch leases", err)
	}
	claims := map[string]*record.Claim{}
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		c, err := decodeClaim(kv.Key, kv.Value)
		if err != nil {
			return nil, err
		}
		lease, _, _ := strings.Cut(strings.TrimPrefix(string(kv.Key), s.k.allClaims()), "/")
		claims[lease] = c.claim()
	}
	if len(resp.Responses[0].GetResponseRange().Kvs) == 0 {
		return nil, fmt.Errorf("%w: %s", record.ErrEpochNotFound, id)
	}
	kvs := resp.Responses[1].GetResponseRange().Kvs
	out := make([]*record.Lease, 0, len(kvs))
	for _, kv := range kvs {
		m, err := decodeMarker(kv.Key, kv.Value)
		if err != nil {
			return nil, err
		}
		l := m.lease()
		l.Revision, l.Cluster = kv.CreateRevision, clusterID(resp.Header.ClusterId)
		if l.Claim = claims[l.ID]; l.Claim != nil && l.State == record.LeaseAdmitted {
			l.State = record.LeaseRunning
		}
		out = append(out, l)
	}
	return out, nil
}

// ResolveTool resolves a tool through a snapshot only (never "latest") and
// returns it with its source epoch as EpochNow reads it: what a formation
// needs, in as few reads as the caches allow (the snapshot and epoch
// record are immutable and cached; the state is read every time).
func (s *Store) ResolveTool(ctx context.Context, snapshot, name string) (*record.FullTool, *record.Epoch, error) {
	tool, err := s.SnapshotTool(ctx, snapshot, name)
	if err != nil {
		return nil, nil, err
	}
	ep, err := s.EpochNow(ctx, tool.Epoch)
	if err != nil {
		return nil, nil, err
	}
	return tool, ep, nil
}

// EpochNow returns an epoch's record (with its manifest) and its current
// state, without lease counts: one read of the state key, the immutable
// record coming from the cache. GetEpoch, which also tallies the lease
// markers, is for showing an epoch; this is for deciding on one.
func (s *Store) EpochNow(ctx context.Context, id string) (*record.Epoch, error) {
	recs, err := s.records(ctx, []string{id})
	if err != nil {
		return nil, err
	}
	octx, cancel := s.op(ctx)
	defer cancel()
	st, err := s.cli.Get(octx, s.k.state(id))
	if err != nil {
		return nil, s.wrap(ctx, "epoch state", err)
	}
	if len(st.Kvs) == 0 || recs[id] == nil {
		return nil, fmt.Errorf("%w: %s", record.ErrEpochNotFound, id)
	}
	ep, err := recs[id].epoch(0, record.State(st.Kvs[0].Value), true)
	if err != nil {
		return nil, err
	}
	ep.StateRevision = st.Kvs[0].ModRevision
	return ep, nil
}

// ListEpochs returns the epochs matching f, oldest registration first,
// with states and lease counts read at one revision.
func (s *Store) ListEpochs(ctx context.Context, f record.EpochFilter) ([]*record.Epoch, error) {
	all, _, err := s.readEpochs(ctx, true)
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, e := range all {
		if (f.Server == "" || e.Server == f.Server) && (f.State == "" || e.State == f.State) {
			out = append(out, e)
		}
	}
	return out, nil
}

// readEpochs reads every epoch and state — and with counts every lease
// marker, to count them — in one transaction and returns the epochs
// ordered by registration, and the revision read. Without counts the
// markers are not read at all: a snapshot needs only the states, and
// there is a marker per open call in the cluster.
func (s *Store) readEpochs(ctx context.Context, counts bool) ([]*record.Epoch, int64, error) {
	octx, cancel := s.op(ctx)
	defer cancel()
	ops := []clientv3.Op{
		clientv3.OpGet(s.k.epochs(), clientv3.WithPrefix()),
		clientv3.OpGet(s.k.states(), clientv3.WithPrefix()),
	}
	if counts {
		ops = append(ops, clientv3.OpGet(s.k.allMarkers(), clientv3.WithPrefix()))
	}
	resp, err := s.cli.Txn(octx).Then(ops...).Commit()
	if err != nil {
		return nil, 0, s.wrap(ctx, "list epochs", err)
	}
	states := map[string]record.State{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		states[string(kv.Key[len(s.k.states()):])] = record.State(kv.Value)
	}
	byEpoch := map[string][]*mvccpb.KeyValue{}
	if counts {
		for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
			id := s.k.epochOfMarker(string(kv.Key))
			byEpoch[id] = append(byEpoch[id], kv)
		}
	}
	var out []*record.Epoch
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		// An epoch record never changes: decode each once per replica
		// (the manifest is most of the work) and share it with records.
		id := string(kv.Key[len(s.k.epochs()):])
		rec := s.cache.record(id)
		if rec == nil {
			if rec, err = decodeRecord(kv); err != nil {
				return nil, 0, err
			}
			rec = s.cache.putRecord(id, rec)
		}
		ep, err := rec.epoch(kv.CreateRevision, states[rec.ID], false)
		if err != nil {
			return nil, 0, err
		}
		ep.ActiveLeases, ep.UncertainLeases = tallyMarkers(byEpoch[rec.ID])
		out = append(out, ep)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Revision < out[j].Revision })
	return out, resp.Header.Revision, nil
}

func (s *Store) countMarkers(ctx context.Context, ep *record.Epoch) error {
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Get(octx, s.k.markers(ep.ID), clientv3.WithPrefix())
	if err != nil {
		return s.wrap(ctx, "count markers", err)
	}
	ep.ActiveLeases, ep.UncertainLeases = tallyMarkers(resp.Kvs)
	return nil
}

// Drain moves an ACTIVE epoch to DRAINING in one transaction. From its
// commit on, no admission to the epoch can commit.
func (s *Store) Drain(ctx context.Context, id string) (record.State, error) {
	st, _, err := s.DrainAt(ctx, id)
	return st, err
}

// DrainAt is Drain that also returns the etcd revision of the drain.
func (s *Store) DrainAt(ctx context.Context, id string) (record.State, int64, error) {
	resp, err := s.transition(ctx, "drain", id, record.StateActive, record.StateDraining, nil)
	if err != nil {
		return "", 0, err
	}
	s.log.Info("epoch draining", "epoch", id)
	return record.StateDraining, resp.Header.Revision, nil
}

// Retire moves a DRAINING epoch to STALE in one transaction that also
// proves no lease marker exists under it. If markers remain and wait is
// positive, Retire watches the markers and tries again as they go, until
// it succeeds or wait has passed; then it returns a *RetireBlockedError
// with the counts.
func (s *Store) Retire(ctx context.Context, id string, wait time.Duration) (record.State, error) {
	st, _, err := s.RetireAt(ctx, id, wait)
	return st, err
}

// RetireAt is Retire that also returns the etcd revision of the
// retirement.
func (s *Store) RetireAt(ctx context.Context, id string, wait time.Duration) (record.State, int64, error) {
	deadline := s.now().Add(wait)
	mprefix := s.k.markers(id)
	noMarkers := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(mprefix), "=", 0).WithPrefix()}
	for {
		resp, err := s.transition(ctx, "retire", id, record.StateDraining, record.StateStale, noMarkers, clientv3.OpGet(mprefix, clientv3.WithPrefix()))
		if err != nil {
			return "", 0, err
		}
		if resp.Succeeded {
			s.log.Info("epoch retired", "epoch", id)
			return record.StateStale, resp.Header.Revision, nil
		}
		active, uncertain := tallyMarkers(resp.Responses[1].GetResponseRange().Kvs)
		blocked := &record.RetireBlockedError{Epoch: id, Active: active, Uncertain: uncertain}
		left := deadline.Sub(s.now())
		if left <= 0 {
			return "", 0, blocked
		}
		if err := s.waitForChange(ctx, mprefix, resp.Header.Revision, left); err != nil {
			if ctx.Err() != nil {
				return "", 0, fmt.Errorf("lease: retire: %w", ctx.Err())
			}
			if err == context.DeadlineExceeded {
				return "", 0, blocked
			}
			return "", 0, s.wrap(ctx, "retire watch", err)
		}
	}
}

// transition moves epoch id from state from to state to in one
// transaction, if the epoch is in from and conds hold too. If it did not
// move, the transaction read the state, then reads: an epoch that does not
// exist, or is not in from, is an error (*record.StateError); otherwise
// one of conds failed and the answer holds what reads read from
// Responses[1] on. Without conds, a nil error means the epoch moved.
func (s *Store) transition(ctx context.Context, op, id string, from, to record.State, conds []clientv3.Cmp, reads ...clientv3.Op) (*clientv3.TxnResponse, error) {
	skey := s.k.state(id)
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Txn(octx).
		If(append([]clientv3.Cmp{clientv3.Compare(clientv3.Value(skey), "=", string(from))}, conds...)...).
		Then(clientv3.OpPut(skey, string(to)), s.noteOp(ctx, noteEpochs, id, storedNote{State: string(to)})).
		Else(append([]clientv3.Op{clientv3.OpGet(skey)}, reads...)...).
		Commit()
	if err != nil {
		return nil, s.wrap(ctx, op, err)
	}
	if resp.Succeeded {
		return resp, nil
	}
	st := resp.Responses[0].GetResponseRange().Kvs
	if len(st) == 0 {
		return nil, fmt.Errorf("%w: %s", record.ErrEpochNotFound, id)
	}
	if got := record.State(st[0].Value); got != from {
		return nil, &record.StateError{Epoch: id, State: got, Want: from}
	}
	return resp, nil
}

// waitForChange blocks until a marker under prefix is deleted after rev,
// or d passes (context.DeadlineExceeded).
func (s *Store) waitForChange(ctx context.Context, prefix string, rev int64, d time.Duration) error {
	wctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), d)
	defer cancel()
	wch := s.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithFilterPut())
	for {
		select {
		case <-wctx.Done():
			return context.DeadlineExceeded
		case wr, ok := <-wch:
			if !ok {
				return context.DeadlineExceeded
			}
			if err := wr.Err(); err != nil {
				return err
			}
			if len(wr.Events) > 0 {
				return nil
			}
		}
	}
}

// tallyMarkers counts markers by state. A marker that does not decode, or
// of a format version this build does not read, counts as active: it
// still blocks retirement, which is the safe side.
func tallyMarkers(kvs []*mvccpb.KeyValue) (active, uncertain int) {
	for _, kv := range kvs {
		// Only the state is read: this runs over every marker of an
		// epoch (or of the cluster, for a listing).
		var l struct {
			ver
			State record.LeaseState `json:"state"`
		}
		if json.Unmarshal(kv.Value, &l) == nil && l.V <= storedVersion && l.State == record.LeaseUncertain {
			uncertain++
		} else {
			active++
		}
	}
	return active, uncertain
}
