package lease

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// CreateSnapshot freezes the ACTIVE catalog. For each server (all servers,
// or those named), the ACTIVE epoch registered last is taken: registering
// a release rolls it out, draining it rolls back to the previous ACTIVE
// one. It returns created false when an equal snapshot already existed.
func (s *Store) CreateSnapshot(ctx context.Context, servers []string) (*record.Snapshot, bool, error) {
	epochs, _, err := s.readEpochs(ctx, false)
	if err != nil {
		return nil, false, err
	}
	latest := map[string]*record.Epoch{}
	for _, e := range epochs { // registration order: later wins
		if e.State != record.StateActive || (len(servers) > 0 && !slices.Contains(servers, e.Server)) {
			continue
		}
		latest[e.Server] = e
	}
	for _, name := range servers {
		if latest[name] == nil {
			return nil, false, fmt.Errorf("%w: server %q", record.ErrNoActiveEpochs, name)
		}
	}
	if len(latest) == 0 {
		return nil, false, record.ErrNoActiveEpochs
	}
	ids := make([]string, 0, len(latest))
	for _, e := range latest {
		ids = append(ids, e.ID)
	}
	recs, err := s.records(ctx, ids)
	if err != nil {
		return nil, false, err
	}
	var snap record.Snapshot
	for server, e := range latest {
		for i := range recs[e.ID].Manifest.Tools {
			t := &recs[e.ID].Manifest.Tools[i]
			d, err := t.Digest()
			if err != nil {
				return nil, false, fmt.Errorf("%w: %v", record.ErrCorrupt, err)
			}
			snap.Tools = append(snap.Tools, record.SnapshotTool{
				Name: server + "/" + t.Name, Epoch: e.ID, DescriptorDigest: d,
				Title: t.Title, Summary: t.Summary, SideEffects: t.SideEffects, RequiresApproval: t.RequiresApproval,
			})
		}
	}
	sort.Slice(snap.Tools, func(i, j int) bool { return snap.Tools[i].Name < snap.Tools[j].Name })
	if snap.ID, err = manifest.Digest(snap.Tools); err != nil {
		return nil, false, err
	}
	val, err := encodeStored("snapshot", toStoredSnapshot(&snap))
	if err != nil {
		return nil, false, err
	}
	key := s.k.snapshot(snap.ID)
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Txn(octx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, val)).
		Commit()
	if err != nil {
		return nil, false, s.wrap(ctx, "create snapshot", err)
	}
	if resp.Succeeded {
		snap.Revision = resp.Header.Revision
	}
	return &snap, resp.Succeeded, nil
}

// GetSnapshot returns a stored snapshot. Callers must not modify it.
func (s *Store) GetSnapshot(ctx context.Context, id string) (*record.Snapshot, error) {
	if snap := s.cache.snapshot(id); snap != nil {
		return snap, nil
	}
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Get(octx, s.k.snapshot(id))
	if err != nil {
		return nil, s.wrap(ctx, "get snapshot", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("%w: %s", record.ErrSnapshotNotFound, id)
	}
	var stored storedSnapshot
	if err := decodeStored(resp.Kvs[0].Key, resp.Kvs[0].Value, &stored); err != nil {
		return nil, err
	}
	if stored.ID != id {
		return nil, fmt.Errorf("%w: snapshot %s holds %s", record.ErrCorrupt, id, stored.ID)
	}
	snap := stored.snapshot()
	s.cache.putSnapshot(snap)
	return snap, nil
}

// GetSnapshotFull returns a snapshot with every tool's full descriptor,
// each checked against the digest the snapshot recorded.
func (s *Store) GetSnapshotFull(ctx context.Context, id string) (*record.Snapshot, []record.FullTool, error) {
	snap, err := s.GetSnapshot(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	ids := map[string]bool{}
	for _, t := range snap.Tools {
		ids[t.Epoch] = true
	}
	recs, err := s.records(ctx, slices.Sorted(maps.Keys(ids)))
	if err != nil {
		return nil, nil, err
	}
	full := make([]record.FullTool, 0, len(snap.Tools))
	for _, t := range snap.Tools {
		d, err := descriptor(recs[t.Epoch], t)
		if err != nil {
			return nil, nil, err
		}
		full = append(full, record.FullTool{SnapshotTool: t, Descriptor: d})
	}
	return snap, full, nil
}

// SnapshotTool returns one tool of a snapshot with its full descriptor.
// The tool is resolved through the snapshot only, never through "latest".
func (s *Store) SnapshotTool(ctx context.Context, id, name string) (*record.FullTool, error) {
	snap, err := s.GetSnapshot(ctx, id)
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(snap.Tools, func(t record.SnapshotTool) bool { return t.Name == name })
	if i < 0 {
		return nil, fmt.Errorf("%w: %s in %s", record.ErrToolNotFound, name, id)
	}
	t := snap.Tools[i]
	recs, err := s.records(ctx, []string{t.Epoch})
	if err != nil {
		return nil, err
	}
	d, err := descriptor(recs[t.Epoch], t)
	if err != nil {
		return nil, err
	}
	return &record.FullTool{SnapshotTool: t, Descriptor: d}, nil
}

// descriptor finds t's descriptor in its epoch record and checks its digest.
func descriptor(rec *epochRecord, t record.SnapshotTool) (*manifest.Tool, error) {
	if rec == nil {
		return nil, fmt.Errorf("%w: epoch %s of %s missing", record.ErrCorrupt, t.Epoch, t.Name)
	}
	_, local, _ := strings.Cut(t.Name, "/")
	d := rec.Manifest.Tool(local)
	if d == nil {
		return nil, fmt.Errorf("%w: epoch %s lacks %s", record.ErrCorrupt, t.Epoch, t.Name)
	}
	if got, err := rec.toolDigest(local); err != nil || got != t.DescriptorDigest {
		return nil, fmt.Errorf("%w: descriptor of %s does not match its digest", record.ErrCorrupt, t.Name)
	}
	return d, nil
}

// records reads the immutable records of the given epochs in one
// transaction.
//
// Records are immutable once written, so they are cached in memory; only
// missing ones are read. Callers must not modify what they get.
func (s *Store) records(ctx context.Context, ids []string) (map[string]*epochRecord, error) {
	out := make(map[string]*epochRecord, len(ids))
	var missing []string
	for _, id := range ids {
		if rec := s.cache.record(id); rec != nil {
			out[id] = rec
		} else {
			missing = append(missing, id)
		}
	}
	if len(missing) == 0 {
		return out, nil
	}
	ids = missing
	ops := make([]clientv3.Op, len(ids))
	for i, id := range ids {
		ops[i] = clientv3.OpGet(s.k.epoch(id))
	}
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Txn(octx).Then(ops...).Commit()
	if err != nil {
		return nil, s.wrap(ctx, "read epochs", err)
	}
	for i, r := range resp.Responses {
		kvs := r.GetResponseRange().Kvs
		if len(kvs) == 0 {
			continue
		}
		rec, err := decodeRecord(kvs[0])
		if err != nil {
			return nil, err
		}
		out[ids[i]] = s.cache.putRecord(ids[i], rec)
	}
	return out, nil
}

// immutableCache holds records that never change once written: epoch
// records (by epoch id) and snapshots (content-addressed). It needs no
// invalidation; snapshots are bounded by dropping the lot when full.
type immutableCache struct {
	mu        sync.RWMutex
	recs      map[string]*epochRecord
	snapshots map[string]*record.Snapshot
}

const maxCachedSnapshots = 4096

func (c *immutableCache) record(id string) *epochRecord {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.recs[id]
}

func (c *immutableCache) putRecord(id string, rec *epochRecord) *epochRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.recs[id]; old != nil {
		return old
	}
	if c.recs == nil {
		c.recs = map[string]*epochRecord{}
	}
	c.recs[id] = rec
	return rec
}

func (c *immutableCache) snapshot(id string) *record.Snapshot {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.snapshots[id]
}

func (c *immutableCache) putSnapshot(snap *record.Snapshot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.snapshots == nil || len(c.snapshots) >= maxCachedSnapshots {
		c.snapshots = map[string]*record.Snapshot{}
	}
	c.snapshots[snap.ID] = snap
}
