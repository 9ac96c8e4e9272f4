package lease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// This file holds the store's maintenance operations, what `authzd store`
// runs instead of etcdctl: status, snapshot, compaction, defragmentation
// and alarms. They go through the store's own client, so they use fcd's
// credentials and reach the same members as the server does.

// MemberStatus is what one etcd member says about itself.
type MemberStatus struct {
	// Endpoint is the client URL asked.
	Endpoint string `json:"endpoint"`
	// Error is why the member did not answer; the other fields are then
	// zero.
	Error string `json:"error,omitempty"`
	// MemberID is the member's id, in hex as etcdctl prints it.
	MemberID string `json:"memberID,omitempty"`
	Version  string `json:"version,omitempty"`
	// StorageVersion is the version of the member's data format (etcd
	// 3.6 and later): what a snapshot of it needs to be restored with.
	StorageVersion string `json:"storageVersion,omitempty"`
	// DBSize is the database file's size, what counts against the quota;
	// DBSizeInUse is that less the pages compaction freed.
	DBSize      int64 `json:"dbSize"`
	DBSizeInUse int64 `json:"dbSizeInUse"`
	// Quota is the member's backend quota in bytes as it reports it (0:
	// a member too old to say).
	Quota     int64  `json:"quota,omitempty"`
	Leader    bool   `json:"leader"`
	IsLearner bool   `json:"isLearner,omitempty"`
	RaftTerm  uint64 `json:"raftTerm"`
	RaftIndex uint64 `json:"raftIndex"`
	// Revision is the member's current key-value revision.
	Revision int64 `json:"revision"`
	// Errors are the member's own error strings (its alarms, e.g.
	// "memberID:... alarm:NOSPACE").
	Errors []string `json:"errors,omitempty"`
}

// Alarm is an alarm active on one member.
type Alarm struct {
	// MemberID is the member's id in hex.
	MemberID string `json:"memberID"`
	// Alarm is AlarmNoSpace or AlarmCorrupt.
	Alarm string `json:"alarm"`
}

// Status is the cluster's state as `authzd store status` shows it.
type Status struct {
	Members []MemberStatus `json:"members"`
	// Alarms are the active alarms, by member; empty when none.
	Alarms []Alarm `json:"alarms"`
}

// Status asks every configured endpoint for its status and the cluster
// for its alarms, each within the operation timeout. A member that does
// not answer is listed with its error; Status fails only when none
// answers or the alarms cannot be read.
func (s *Store) Status(ctx context.Context) (Status, error) {
	octx, cancel := s.op(ctx)
	defer cancel()
	_, all := s.Endpoints()
	st := Status{Members: make([]MemberStatus, len(all)), Alarms: []Alarm{}}
	answered := 0
	for i, ep := range all {
		m := MemberStatus{Endpoint: ep}
		resp, err := s.cli.Status(octx, ep)
		if err != nil {
			m.Error = s.wrap(ctx, "status "+ep, err).Error()
		} else {
			answered++
			m.MemberID = memberID(resp.Header.GetMemberId())
			m.Version, m.StorageVersion = resp.Version, resp.StorageVersion
			m.DBSize, m.DBSizeInUse, m.Quota = resp.DbSize, resp.DbSizeInUse, resp.DbSizeQuota
			m.Leader = resp.Leader != 0 && resp.Leader == resp.Header.GetMemberId()
			m.IsLearner, m.RaftTerm, m.RaftIndex = resp.IsLearner, resp.RaftTerm, resp.RaftIndex
			m.Revision, m.Errors = resp.Header.GetRevision(), resp.Errors
		}
		st.Members[i] = m
	}
	if answered == 0 {
		return st, s.wrap(ctx, "status", fmt.Errorf("no endpoint of %v answered", all))
	}
	alarms, err := s.Alarms(ctx)
	if err != nil {
		return st, err
	}
	st.Alarms = alarms
	return st, nil
}

// Alarms lists the cluster's active alarms, by member.
func (s *Store) Alarms(ctx context.Context) ([]Alarm, error) {
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.AlarmList(octx)
	if err != nil {
		return nil, s.wrap(ctx, "alarm list", err)
	}
	return alarmsOf(resp.Alarms), nil
}

// DisarmAlarms disarms every active alarm and returns those it disarmed.
// Disarm NOSPACE only once space is free (Compact, then Defrag): etcd
// checks the database file's size against the quota on every write, and
// raises the alarm again at the first write while the file is still at
// the quota (docs/operations.md).
func (s *Store) DisarmAlarms(ctx context.Context) ([]Alarm, error) {
	octx, cancel := s.op(ctx)
	defer cancel()
	// A zero member and alarm disarms every active one (the client lists
	// them and disarms each).
	resp, err := s.cli.AlarmDisarm(octx, &clientv3.AlarmMember{})
	if err != nil {
		return nil, s.wrap(ctx, "alarm disarm", err)
	}
	disarmed := alarmsOf(resp.Alarms)
	if len(disarmed) > 0 {
		s.log.Warn("etcd alarms disarmed", "alarms", disarmed)
	}
	return disarmed, nil
}

func alarmsOf(list []*pb.AlarmMember) []Alarm {
	out := []Alarm{}
	for _, a := range list {
		if a.Alarm != pb.AlarmType_NONE {
			out = append(out, Alarm{MemberID: memberID(a.MemberID), Alarm: a.Alarm.String()})
		}
	}
	slices.SortFunc(out, func(a, b Alarm) int {
		return cmp.Or(cmp.Compare(a.Alarm, b.Alarm), cmp.Compare(a.MemberID, b.MemberID))
	})
	return out
}

func memberID(id uint64) string { return strconv.FormatUint(id, 16) }

// SnapshotInfo describes a snapshot SnapshotSave wrote.
type SnapshotInfo struct {
	// Bytes is the snapshot's size, its trailing SHA-256 included.
	Bytes int64 `json:"bytes"`
	// Version is the storage version of the member that made it (etcd
	// 3.6 and later).
	Version string `json:"version,omitempty"`
}

// SnapshotSave streams a point-in-time snapshot of one member's database
// to w: a bbolt file followed by its SHA-256, which a restore checks.
// With several endpoints the member is the one the client's connection
// is on; every member holds the whole committed state. Only ctx bounds
// the transfer (a large database takes a while); the first answer must
// come within the store's operation timeout, like any read's.
func (s *Store) SnapshotSave(ctx context.Context, w io.Writer) (SnapshotInfo, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resp, err := s.cli.SnapshotWithVersion(clientv3.WithRequireLeader(sctx))
	if err != nil {
		return SnapshotInfo{}, s.wrap(ctx, "snapshot", err)
	}
	defer resp.Snapshot.Close()
	n, err := io.Copy(w, resp.Snapshot)
	if err != nil {
		return SnapshotInfo{}, s.wrap(ctx, "snapshot", err)
	}
	if n == 0 {
		return SnapshotInfo{}, errors.New("lease: snapshot: etcd sent an empty snapshot")
	}
	return SnapshotInfo{Bytes: n, Version: resp.Version}, nil
}

// Compact discards the key-value history before revision rev (rev <= 0:
// the current revision), and waits until the members have removed it
// from their databases (a physical compaction), so that a Defrag that
// follows frees the space. Compacting at or below the revision already
// compacted does nothing and is not an error. It returns the revision
// compacted at.
//
// Compact is the one way fcd compacts etcd: `authzd store compact` calls
// it, and nothing else in fcd may call the client's Compact. The audit
// trail follows etcd's revision history, so a compaction must never
// remove revisions a trail has not consumed yet; the guard that holds rev
// back to the oldest revision a trail still needs belongs here, in this
// single method, so that no path around it exists: Compact never compacts
// past the oldest fresh trail cursor (TrailFloor, compact.go), and returns
// the revision it compacted at, which may be lower than rev. The embedded
// member's own auto-compaction is off; RunCompactor compacts through here.
func (s *Store) Compact(ctx context.Context, rev int64) (int64, error) {
	return s.compactGuarded(ctx, rev, 0)
}

func (s *Store) compactGuarded(ctx context.Context, rev int64, ttl time.Duration) (int64, error) {
	if rev <= 0 {
		var err error
		if rev, err = s.Revision(ctx); err != nil {
			return 0, err
		}
	}
	asked := rev
	rev, held, err := s.holdBack(ctx, rev, ttl)
	if err != nil {
		return 0, err
	}
	if held {
		s.log.Info("compaction held back to the oldest revision an audit trail has not recorded", "asked", asked, "revision", rev)
	}
	// A physical compaction of a large history takes longer than a read:
	// ctx alone bounds it.
	_, err = s.cli.Compact(clientv3.WithRequireLeader(ctx), rev, clientv3.WithCompactPhysical())
	switch {
	case errors.Is(err, rpctypes.ErrCompacted) || errors.Is(err, rpctypes.ErrGRPCCompacted):
		s.log.Info("etcd already compacted at or past the revision", "revision", rev)
		return rev, nil
	case errors.Is(err, rpctypes.ErrFutureRev) || errors.Is(err, rpctypes.ErrGRPCFutureRev):
		return 0, fmt.Errorf("lease: compact: revision %d is past etcd's current revision", rev)
	case err != nil:
		return 0, s.wrap(ctx, "compact", err)
	}
	s.log.Warn("etcd compacted", "revision", rev)
	return rev, nil
}

// DefragResult is the outcome of defragmenting one member.
type DefragResult struct {
	Endpoint string `json:"endpoint"`
	// Before and After are the member's database file sizes around the
	// defragmentation (0 when its status could not be read).
	Before int64  `json:"dbSizeBefore"`
	After  int64  `json:"dbSizeAfter"`
	Error  string `json:"error,omitempty"`
}

// Defrag defragments every configured member, one after the other (a
// member does not serve while it rewrites its database, so doing them
// all at once would stop the cluster): the file is rewritten without the
// pages compaction freed, and shrinks. Only ctx bounds each member's
// defragmentation. It fails if any member failed, after trying them all.
func (s *Store) Defrag(ctx context.Context) ([]DefragResult, error) {
	_, all := s.Endpoints()
	var errs []error
	out := make([]DefragResult, 0, len(all))
	size := func(ep string) int64 {
		octx, cancel := s.op(ctx)
		defer cancel()
		if st, err := s.cli.Status(octx, ep); err == nil {
			return st.DbSize
		}
		return 0
	}
	for _, ep := range all {
		r := DefragResult{Endpoint: ep, Before: size(ep)}
		if _, err := s.cli.Defragment(ctx, ep); err != nil {
			werr := s.wrap(ctx, "defragment "+ep, err)
			r.Error = werr.Error()
			errs = append(errs, werr)
		} else {
			r.After = size(ep)
			s.log.Warn("etcd member defragmented", "endpoint", ep, "dbSizeBefore", r.Before, "dbSizeAfter", r.After)
		}
		out = append(out, r)
	}
	return out, errors.Join(errs...)
}
