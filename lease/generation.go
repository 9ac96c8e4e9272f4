package lease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fcd-authz/fcd/record"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// PoolGeneration returns the recorded backend generation of a pool (0 when
// none was recorded).
func (s *Store) PoolGeneration(ctx context.Context, pool string) (int64, error) {
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Get(octx, s.k.generation(pool))
	if err != nil {
		return 0, s.wrap(ctx, "pool generation", err)
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	return parseGeneration(resp.Kvs[0].Value)
}

// Generations are stored zero-padded so that etcd's byte-wise value
// comparison orders them numerically.
func formatGeneration(g int64) string { return fmt.Sprintf("%020d", g) }

func parseGeneration(b []byte) (int64, error) {
	g, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: generation %q", record.ErrCorrupt, b)
	}
	return g, nil
}

// SetGeneration records a newer backend generation of a pool and releases
// the pool's open leases admitted under an older generation, admitted or
// uncertain: the old backends are gone, so no effect and no report can
// come from them any more. Setting the current generation again repeats
// the release (finishing one that was interrupted); an older one is
// refused. It returns the revision that set the generation and the leases
// it released, each with the revision that closed it — those released
// before an error, with the error.
func (s *Store) SetGeneration(ctx context.Context, pool string, gen int64, keep time.Duration) (GenerationChange, error) {
	var ch GenerationChange
	if gen <= 0 {
		return ch, fmt.Errorf("%w: generation must be positive", record.ErrStaleGeneration)
	}
	gkey := s.k.generation(pool)
	octx, cancel := s.op(ctx)
	resp, err := s.cli.Txn(octx).
		If(clientv3.Compare(clientv3.CreateRevision(gkey), "=", 0)).
		Then(clientv3.OpPut(gkey, formatGeneration(gen)), s.noteOp(ctx, noteGenerations, pool, storedNote{Generation: gen})).
		Else(clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.Value(gkey), "<", formatGeneration(gen))},
			[]clientv3.Op{clientv3.OpPut(gkey, formatGeneration(gen)), s.noteOp(ctx, noteGenerations, pool, storedNote{Generation: gen})},
			[]clientv3.Op{clientv3.OpGet(gkey)},
		)).
		Commit()
	cancel()
	if err != nil {
		return ch, s.wrap(ctx, "set generation", err)
	}
	ch.Revision = resp.Header.Revision
	if !resp.Succeeded {
		inner := resp.Responses[0].GetResponseTxn()
		if !inner.Succeeded {
			cur, err := parseGeneration(inner.Responses[0].GetResponseRange().Kvs[0].Value)
			if err != nil {
				return ch, err
			}
			if cur > gen {
				return ch, fmt.Errorf("%w: pool %s is at %d", record.ErrStaleGeneration, pool, cur)
			}
		}
	}
	s.log.Info("pool generation", "pool", pool, "generation", gen)

	octx, cancel = s.op(ctx)
	all, err := s.cli.Get(octx, s.k.allMarkers(), clientv3.WithPrefix())
	cancel()
	if err != nil {
		return ch, s.wrap(ctx, "scan markers", err)
	}
	var stale []string
	for _, kv := range all.Kvs {
		// A marker that does not decode is not released: it keeps its
		// epoch from retiring until someone looks (the safe side).
		l, err := decodeMarker(kv.Key, kv.Value)
		if err != nil {
			s.log.Error("generation change: a lease marker does not decode; left as it is", "err", err)
			continue
		}
		if l.Target.Pool == pool && l.Generation < gen {
			stale = append(stale, l.ID)
		}
	}
	ch.Released, ch.Pending = []*record.Lease{}, len(stale)
	// The releases run releaseWorkers at a time: their reads overlap and
	// the committer sends their writes to etcd together, a batch of up to
	// MaxBatch releases a transaction, each its own compare-and-swap (so
	// a fault leaves every lease either released or not, and setting the
	// generation again finishes the rest).
	ctx, cancel = context.WithCancel(ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
		ids   = make(chan string)
	)
	for range min(releaseWorkers, len(stale)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range ids {
				closed, err := s.closeLease(ctx, id, record.OutcomeReleased, nil, closure{By: byGeneration, Generation: gen}, keep, func(*record.Lease) error { return nil })
				mu.Lock()
				switch {
				case err == nil:
					ch.Released = append(ch.Released, closed)
					ch.Pending--
				case errors.Is(err, record.ErrLeaseClosed):
					ch.Pending-- // closed meanwhile by its report
				case first == nil:
					first = err
					cancel()
				}
				mu.Unlock()
			}
		}()
	}
feed:
	for _, id := range stale {
		select {
		case ids <- id:
		case <-ctx.Done():
			break feed
		}
	}
	close(ids)
	wg.Wait()
	slices.SortFunc(ch.Released, func(a, b *record.Lease) int { return strings.Compare(a.ID, b.ID) })
	if first != nil {
		return ch, first
	}
	return ch, nil
}

// releaseWorkers is how many releases of a generation change run at once.
const releaseWorkers = 32

// GenerationChange is what SetGeneration did.
type GenerationChange struct {
	// Revision is the etcd revision of the transaction that set the
	// generation (or found it set).
	Revision int64
	// Released are the leases released, each with its Closed revision,
	// in id order.
	Released []*record.Lease
	// Pending counts the older leases not released when an error ended
	// the change: setting the generation again releases them.
	Pending int
}

// IDs are the ids of the released leases.
func (g GenerationChange) IDs() []string {
	ids := make([]string, len(g.Released))
	for i, l := range g.Released {
		ids[i] = l.ID
	}
	return ids
}
