package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The audit trail is made from etcd's revision history (follow.go), so a
// compaction must not remove revisions a replica's trail has not recorded
// yet. Each replica's follower keeps a cursor in the store — the last
// revision its trail holds every event of — and Compact never compacts
// past the oldest cursor that is still kept fresh. The embedded member's
// own periodic auto-compaction is off: fcd compacts (RunCompactor), through
// Compact, so there is no path around the guard.

// DefaultCursorTTL is how long a trail's cursor holds compaction back
// after its replica last wrote it: a replica stopped for longer no longer
// does (its trail records a gap when it comes back; audit verify names
// it), so that a replica removed for good does not pin the history.
const DefaultCursorTTL = 24 * time.Hour

// SetTrailCursor records that replica's trail holds every event up to rev:
// compaction is held back to it (Compact). It returns the revision of the
// write itself.
func (s *Store) SetTrailCursor(ctx context.Context, replica string, rev int64) (int64, error) {
	b, _ := json.Marshal(&storedCursor{ver: current, Revision: rev, At: s.now().UTC()})
	octx, cancel := s.writeOp(ctx)
	defer cancel()
	resp, err := s.cli.Put(octx, s.k.trailCursor(replica), string(b))
	if err != nil {
		return 0, s.wrap(ctx, "set trail cursor", err)
	}
	return resp.Header.Revision, nil
}

// TrailCursor returns the cursor replica's trail wrote last, and false
// when it wrote none.
func (s *Store) TrailCursor(ctx context.Context, replica string) (int64, bool, error) {
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Get(octx, s.k.trailCursor(replica))
	if err != nil {
		return 0, false, s.wrap(ctx, "trail cursor", err)
	}
	if len(resp.Kvs) == 0 {
		return 0, false, nil
	}
	var c storedCursor
	if err := decodeStored(resp.Kvs[0].Key, resp.Kvs[0].Value, &c); err != nil {
		return 0, false, err
	}
	return c.Revision, true, nil
}

// TrailFloor returns the oldest revision a trail still needs: the lowest
// cursor written within ttl (zero: DefaultCursorTTL) plus one, and false
// when no fresh cursor exists (no trail holds compaction back).
func (s *Store) TrailFloor(ctx context.Context, ttl time.Duration) (int64, bool, error) {
	if ttl <= 0 {
		ttl = DefaultCursorTTL
	}
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Get(octx, s.k.trailCursors(), clientv3.WithPrefix())
	if err != nil {
		return 0, false, s.wrap(ctx, "trail cursors", err)
	}
	var floor int64
	found := false
	cutoff := s.now().Add(-ttl)
	for _, kv := range resp.Kvs {
		// A cursor that does not decode fails the floor: compacting past
		// a trail that may still need the history is not safe.
		var c storedCursor
		if err := decodeStored(kv.Key, kv.Value, &c); err != nil {
			return 0, false, err
		}
		if c.At.Before(cutoff) {
			continue
		}
		if !found || c.Revision+1 < floor {
			floor, found = c.Revision+1, true
		}
	}
	return floor, found, nil
}

// CompactorConfig configures RunCompactor.
type CompactorConfig struct {
	// Retention is how much history is kept at least; zero means one hour.
	Retention time.Duration
	// Interval is how often the compactor runs; zero means five minutes.
	Interval time.Duration
	// CursorTTL is TrailFloor's ttl; zero means DefaultCursorTTL.
	CursorTTL time.Duration
}

// RunCompactor compacts the store's history older than cfg.Retention every
// cfg.Interval, as etcd's periodic auto-compaction does, but through
// Compact, so never past a trail's cursor. It runs until ctx ends; every
// replica may run one (compacting twice to one revision is a no-op).
func (s *Store) RunCompactor(ctx context.Context, cfg CompactorConfig) {
	retention, interval := cfg.Retention, cfg.Interval
	if retention <= 0 {
		retention = time.Hour
	}
	if interval <= 0 {
		interval = 5 * time.Minute
	}
	type sample struct {
		at  time.Time
		rev int64
	}
	var samples []sample
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		if rev, err := s.Revision(ctx); err == nil {
			samples = append(samples, sample{s.now(), rev})
		}
		// The newest sample older than the retention is where to compact.
		var target int64
		cutoff := s.now().Add(-retention)
		for len(samples) > 0 && !samples[0].at.After(cutoff) {
			target = samples[0].rev
			samples = samples[1:]
		}
		if target > 0 {
			if _, err := s.compactGuarded(ctx, target, cfg.CursorTTL); err != nil && ctx.Err() == nil {
				s.log.Warn("periodic compaction failed", "revision", target, "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// holdBack returns rev held back to the first revision a trail still
// needs, and whether it was: the trails' floor (TrailFloor). On a full
// store (NOSPACE), whose cursors cannot be written since it filled, it is
// the first revision from the floor on that changed something a trail
// records: the revisions before it changed nothing a trail records
// (writes outside fcd's prefix, cursors, published keys), so compacting
// them loses no event, and whatever filled the store since the last
// cursor can be freed. (A replica that restarts after such a compaction,
// its trail at that cursor, records those revisions as a gap.)
func (s *Store) holdBack(ctx context.Context, rev int64, ttl time.Duration) (int64, bool, error) {
	floor, ok, err := s.TrailFloor(ctx, ttl)
	if err != nil {
		return 0, false, fmt.Errorf("lease: compact: %w", err)
	}
	if !ok || rev <= floor {
		return rev, false, nil
	}
	if full, err := s.full(ctx); err != nil || !full {
		return floor, true, err
	}
	// A full store: its cursors could not be written since it filled.
	first, err := s.firstChange(ctx, floor, rev)
	if err != nil {
		return 0, false, fmt.Errorf("lease: compact: %w", err)
	}
	if first < rev {
		return first, true, nil
	}
	return rev, false, nil
}

// firstChange returns the first revision from from on, below until, that
// changed something the audit trail records (Follow's changes), or until
// if none did.
func (s *Store) firstChange(ctx context.Context, from, until int64) (int64, error) {
	wctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), 30*time.Second)
	defer cancel()
	wch := s.cli.Watch(wctx, s.k.p, clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithProgressNotify())
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-wctx.Done():
			return 0, wctx.Err()
		case <-tick.C:
			_ = s.cli.RequestProgress(wctx)
		case resp, ok := <-wch:
			switch {
			case !ok:
				return 0, errors.New("watch closed")
			case resp.CompactRevision != 0:
				return resp.CompactRevision, nil // already gone
			case resp.Err() != nil:
				return 0, resp.Err()
			}
			for evs := range byRevision(resp.Events) {
				rev := evs[0].Kv.ModRevision
				if rev >= until {
					return until, nil
				}
				if len(s.changes(rev, evs)) > 0 {
					return rev, nil
				}
			}
			if resp.IsProgressNotify() && resp.Header.Revision+1 >= until {
				return until, nil
			}
		}
	}
}

// full reports whether the store has the NOSPACE alarm raised.
func (s *Store) full(ctx context.Context) (bool, error) {
	alarms, err := s.Alarms(ctx)
	if err != nil {
		return false, err
	}
	for _, a := range alarms {
		if a.Alarm == AlarmNoSpace {
			return true, nil
		}
	}
	return false, nil
}
