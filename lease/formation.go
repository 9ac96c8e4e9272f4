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
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Txn(octx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(val), clientv3.WithLease(lid))).
		Commit()
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
		octx, cancel := s.op(ctx)
		resp, err := s.cli.Txn(octx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
			Then(clientv3.OpPut(key, string(val), clientv3.WithIgnoreLease())).
			Commit()
		cancel()
		if err != nil {
			return nil, 0, s.wrap(ctx, "update formation", err)
		}
		if resp.Succeeded {
			return f, resp.Header.Revision, nil
		}
	}
	return nil, 0, fmt.Errorf("%w: formation %s", record.ErrConflict, id)
}

// FormationPage asks [Store.ListFormations] for one page of formations.
// Pages are in id order (etcd key order): ids are random, so that order
// says nothing about age, but it is the order etcd reads in, which lets a
// page start anywhere without reading what comes before it.
type FormationPage struct {
	// After is the id the page starts after (exclusive); empty starts at
	// the first formation. It need not be a stored id.
	After string
	// Limit is the most formations the page holds; zero or less means 100.
	Limit int
	// Scan bounds how many stored records one call reads (and decodes),
	// matched or not, so that a selective keep cannot make one call read
	// every record; zero or less means 10×Limit, at least 1000.
	Scan int
}

// listChunk is how many records ListFormations asks etcd for at once, at
// most: the memory one chunk holds is bounded whatever Limit and Scan say.
const listChunk = 500

// ListFormations returns, in id order, up to p.Limit formations after
// p.After that keep accepts (all when keep is nil), and next: the id to
// pass as After for the rest, or "" when no formation follows. It reads in
// chunks with etcd range limits and stops after p.Scan records, so a page
// may hold fewer than p.Limit formations (none, even) while next is set;
// it never reads every record. keep may change the record it is given.
func (s *Store) ListFormations(ctx context.Context, p FormationPage, keep func(*record.Formation) bool) ([]*record.Formation, string, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = 100
	}
	budget := p.Scan
	if budget <= 0 {
		budget = max(10*limit, 1000)
	}
	prefix := s.k.formations()
	from, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
	if p.After != "" {
		from = s.k.formation(p.After) + "\x00" // the first key after it
	}
	var out []*record.Formation
	for scanned := 0; ; {
		n := min(listChunk, budget-scanned)
		if keep == nil {
			n = min(n, limit-len(out)) // etcd's More tells whether any follows
		}
		octx, cancel := s.op(ctx)
		resp, err := s.cli.Get(octx, from, clientv3.WithRange(end), clientv3.WithLimit(int64(n)))
		cancel()
		if err != nil {
			return nil, "", s.wrap(ctx, "list formations", err)
		}
		if len(resp.Kvs) == 0 {
			return out, "", nil
		}
		for i, kv := range resp.Kvs {
			scanned++
			var f record.Formation
			if err := json.Unmarshal(kv.Value, &f); err != nil {
				return nil, "", fmt.Errorf("%w: formation %s", record.ErrCorrupt, kv.Key)
			}
			if keep == nil || keep(&f) {
				out = append(out, &f)
			}
			switch {
			case i == len(resp.Kvs)-1 && !resp.More:
				return out, "", nil
			case len(out) == limit || scanned >= budget:
				return out, strings.TrimPrefix(string(kv.Key), prefix), nil
			}
			from = string(kv.Key) + "\x00"
		}
	}
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
