package lease

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fcd-authz/fcd/record"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/singleflight"
)

// NewFormationID returns a fresh random formation id ("fm_" and 26
// base32 characters, 128 bits).
func NewFormationID() (string, error) { return randomID("fm_") }

// randomID returns prefix and 128 random bits in lowercase base32.
func randomID(prefix string) (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("lease: random id: %w", err)
	}
	return prefix + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:])), nil
}

// CreateFormation stores a new formation record and returns the etcd
// revision it was written at. The record is kept at least for keep (then
// etcd collects it); ids are random, so creation never overwrites.
func (s *Store) CreateFormation(ctx context.Context, f *record.Formation, keep time.Duration) (int64, error) {
	val, err := json.Marshal(f)
	if err != nil {
		return 0, fmt.Errorf("lease: encode formation: %w", err)
	}
	lid, err := s.retention.lease(ctx, s, keep)
	if err != nil {
		return 0, err
	}
	key := s.k.formation(f.ID)
	resp, err := s.txn(ctx, txn{
		cmps: []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)},
		then: []clientv3.Op{clientv3.OpPut(key, string(val), clientv3.WithLease(lid))},
	})
	if err != nil {
		s.retention.forgetOn(err)
		return 0, s.wrap(ctx, "create formation", err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("lease: formation id %s already used", f.ID)
	}
	return resp.Header.Revision, nil
}

// GetFormation returns a formation record.
func (s *Store) GetFormation(ctx context.Context, id string) (*record.Formation, error) {
	f, _, err := s.getFormation(ctx, id)
	return f, err
}

func (s *Store) getFormation(ctx context.Context, id string) (*record.Formation, int64, error) {
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Get(octx, s.k.formation(id))
	if err != nil {
		return nil, 0, s.wrap(ctx, "get formation", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, fmt.Errorf("%w: %s", record.ErrFormationNotFound, id)
	}
	var f record.Formation
	if err := json.Unmarshal(resp.Kvs[0].Value, &f); err != nil {
		return nil, 0, fmt.Errorf("%w: formation %s", record.ErrCorrupt, id)
	}
	return &f, resp.Kvs[0].ModRevision, nil
}

// UpdateFormation applies change to the stored record with compare-and-
// swap on its revision, retrying from a fresh read when a concurrent
// writer got there first; etcd orders concurrent updates and none is lost.
// If change returns an error the record is left as it was and that error
// is returned (wrapped in nothing). change may run more than once. The
// revision the record was written at is returned with it.
func (s *Store) UpdateFormation(ctx context.Context, id string, change func(f *record.Formation) error) (*record.Formation, int64, error) {
	const attempts = 32
	key := s.k.formation(id)
	for range attempts {
		f, rev, err := s.getFormation(ctx, id)
		if err != nil {
			return nil, 0, err
		}
		if err := change(f); err != nil {
			return f, 0, err
		}
		val, err := json.Marshal(f)
		if err != nil {
			return nil, 0, fmt.Errorf("lease: encode formation: %w", err)
		}
		resp, err := s.txn(ctx, txn{
			cmps: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", rev)},
			then: []clientv3.Op{clientv3.OpPut(key, string(val), clientv3.WithIgnoreLease())},
		})
		if err != nil {
			return nil, 0, s.wrap(ctx, "update formation", err)
		}
		if resp.Succeeded {
			return f, resp.Header.Revision, nil
		}
	}
	return nil, 0, fmt.Errorf("%w: formation %s", record.ErrConflict, id)
}

// ListFormations returns the formations keep accepts (all when keep is
// nil), oldest first. It reads every stored
// formation: records are collected after their retention, which bounds
// the range.
func (s *Store) ListFormations(ctx context.Context, keep func(*record.Formation) bool) ([]*record.Formation, error) {
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Get(octx, s.k.formations(), clientv3.WithPrefix())
	if err != nil {
		return nil, s.wrap(ctx, "list formations", err)
	}
	var out []*record.Formation
	for _, kv := range resp.Kvs {
		var f record.Formation
		if err := json.Unmarshal(kv.Value, &f); err != nil {
			return nil, fmt.Errorf("%w: formation %s", record.ErrCorrupt, kv.Key)
		}
		if keep == nil || keep(&f) {
			out = append(out, &f)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

// SessionHistory returns the tools completed and admitted in a session,
// as recorded by admission and completion.
func (s *Store) SessionHistory(ctx context.Context, session string) (*record.SessionHistory, error) {
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Txn(octx).Then(
		clientv3.OpGet(s.k.sessionCompleted(session), clientv3.WithPrefix()),
		clientv3.OpGet(s.k.sessionAdmitted(session), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, s.wrap(ctx, "session history", err)
	}
	h := &record.SessionHistory{Session: session, Completed: []string{}, Admitted: []string{}}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		h.Completed = append(h.Completed, string(kv.Value))
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		h.Admitted = append(h.Admitted, string(kv.Value))
	}
	h.Completed, h.Admitted = uniqueSorted(h.Completed), uniqueSorted(h.Admitted)
	return h, nil
}

func uniqueSorted(in []string) []string {
	sort.Strings(in)
	out := in[:0]
	for i, s := range in {
		if i == 0 || s != in[i-1] {
			out = append(out, s)
		}
	}
	return out
}

// retention hands out the etcd leases that keep records for a while.
// Records are collected by expiry bucket: a record to be kept for keep is
// attached to the lease of the bucket its end falls in, which expires at
// the bucket's end, between keep and keep + retentionBucket from now.
// Every record ending in one bucket shares one lease, whatever its keep
// (a formation's TTL plus retention, a closed record's retention), so the
// store grants one etcd lease per bucket, not one per call. A grant runs
// outside the lock, once per bucket for concurrent callers
// (singleflight).
type retention struct {
	mu     sync.Mutex
	leases map[int64]clientv3.LeaseID // by bucket
	grants singleflight.Group
}

const retentionBucket = time.Minute

func (r *retention) lease(ctx context.Context, s *Store, keep time.Duration) (clientv3.LeaseID, error) {
	now := s.now()
	bucket := now.Add(keep).Unix() / int64(retentionBucket/time.Second)
	end := bucketEnd(bucket)
	if id, ok := r.cached(bucket); ok {
		return id, nil
	}
	v, err, _ := r.grants.Do(strconv.FormatInt(bucket, 10), func() (any, error) {
		if id, ok := r.cached(bucket); ok {
			return id, nil
		}
		// One grant serves every waiting caller: it does not end with the
		// first caller's context.
		octx, cancel := s.op(context.WithoutCancel(ctx))
		defer cancel()
		resp, err := s.cli.Grant(octx, int64(end.Sub(now).Seconds())+1)
		if err != nil {
			return clientv3.LeaseID(0), s.wrap(context.WithoutCancel(ctx), "grant retention lease", err)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.leases == nil {
			r.leases = map[int64]clientv3.LeaseID{}
		}
		for b := range r.leases { // forget the buckets that ended
			if bucketEnd(b).Before(now) {
				delete(r.leases, b)
			}
		}
		r.leases[bucket] = resp.ID
		return resp.ID, nil
	})
	if err != nil {
		return 0, err
	}
	return v.(clientv3.LeaseID), nil
}

// forgetOn forgets every cached lease when err says etcd does not know a
// lease it was given (revoked, or the cluster restored from a backup): the
// next record is given a lease granted anew instead of failing until its
// bucket ends.
func (r *retention) forgetOn(err error) {
	if !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.leases)
}

// cached returns the lease of bucket if one was granted.
func (r *retention) cached(bucket int64) (clientv3.LeaseID, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id, ok := r.leases[bucket]
	return id, ok
}

// bucketEnd is when the lease of bucket expires.
func bucketEnd(bucket int64) time.Time {
	return time.Unix((bucket+1)*int64(retentionBucket/time.Second), 0)
}

func (k keys) formations() string                { return k.p + "formations/" }
func (k keys) formation(id string) string        { return k.formations() + id }
func (k keys) session(id string) string          { return k.p + "sessions/" + url.PathEscape(id) + "/" }
func (k keys) sessionCompleted(id string) string { return k.session(id) + "completed/" }
func (k keys) sessionAdmitted(id string) string  { return k.session(id) + "admitted/" }
