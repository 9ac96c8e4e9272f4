package lease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// Alarms etcd raises, as [Health.Alarms] names them.
const (
	// AlarmNoSpace: a member's database reached its backend quota. etcd
	// then refuses every write (reads and deletes still work) until the
	// space is freed (compaction, defragmentation) and the alarm disarmed.
	AlarmNoSpace = "NOSPACE"
	// AlarmCorrupt: a member's data differs from the others'.
	AlarmCorrupt = "CORRUPT"
)

// Health is what etcd says about its size and alarms: what an operator
// watches to see the store fill up before etcd refuses writes.
type Health struct {
	// DBSize is the largest database file of the members that answered, in
	// bytes: what counts against the quota. It shrinks only when a member
	// is defragmented.
	DBSize int64 `json:"dbSize"`
	// DBSizeInUse is the largest logically used size of those members:
	// DBSize less the pages compaction freed, which etcd writes into
	// before the file grows.
	DBSizeInUse int64 `json:"dbSizeInUse"`
	// Quota is the backend quota the members run with, in bytes, as
	// configured ([Config.Quota]); 0 when unknown (etcd does not tell
	// clients).
	Quota int64 `json:"quota,omitempty"`
	// Alarms are the active alarms of the cluster (AlarmNoSpace,
	// AlarmCorrupt), each once, sorted; empty when none.
	Alarms []string `json:"alarms"`
}

// HasAlarm reports whether alarm is active.
func (h Health) HasAlarm(alarm string) bool { return slices.Contains(h.Alarms, alarm) }

// Health asks etcd for each endpoint's status (database size and size in
// use) and the cluster's active alarms: one Status call per endpoint, in
// parallel, and one AlarmList, each within the store's operation timeout
// or ctx's deadline. It fails only if the alarms or no member's status
// could be read: a member that does not answer is left out of the sizes.
func (s *Store) Health(ctx context.Context) (Health, error) {
	if s.cli == nil {
		return Health{}, errors.New("lease: health of a store that was never opened")
	}
	h := Health{Quota: s.quota, Alarms: []string{}}
	octx, cancel := s.op(ctx)
	defer cancel()
	eps := s.cli.Endpoints()
	sizes := make([]*pb.StatusResponse, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Go(func() {
			if st, err := s.cli.Status(octx, ep); err == nil {
				sizes[i] = (*pb.StatusResponse)(st)
			}
		})
	}
	alarms, aerr := s.cli.AlarmList(octx)
	wg.Wait()
	if aerr != nil {
		return Health{}, s.wrap(ctx, "alarm list", aerr)
	}
	answered := 0
	for _, st := range sizes {
		if st == nil {
			continue
		}
		answered++
		h.DBSize = max(h.DBSize, st.DbSize)
		h.DBSizeInUse = max(h.DBSizeInUse, st.DbSizeInUse)
	}
	if answered == 0 {
		return Health{}, s.wrap(ctx, "status", fmt.Errorf("no endpoint of %v answered", eps))
	}
	for _, a := range alarms.Alarms {
		if a.Alarm != pb.AlarmType_NONE {
			h.Alarms = append(h.Alarms, a.Alarm.String())
		}
	}
	slices.Sort(h.Alarms)
	h.Alarms = slices.Compact(h.Alarms)
	return h, nil
}
