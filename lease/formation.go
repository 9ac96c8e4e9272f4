package lease

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fcd-authz/fcd/record"
	"go.etcd.io/etcd/api/v3/mvccpb"
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

// A formation is stored under up to four keys, so that each write carries
// the bytes of what changed, not the whole record:
//
//   - formations/<id>: the immutable call (arguments, snapshot, decision,
//     digest, captured successor), written once at formation;
//   - formation-states/<id>: its small mutable state (status, approvals,
//     lease), written at formation, approval and admission;
//   - formation-outcomes/<id>: the status its lease's outcome gave it,
//     written when the lease closes (or turns uncertain) — without reading
//     or rewriting the other two;
//   - pending-approval/<id>: present while the formation waits for
//     approval, so that listing those is not a scan of every record.
//
// The record and its state share the retention lease of the formation:
// they live the formation's keep from its creation (authz sizes keep to
// cover the longest a lease can stay open without turning uncertain). A
// lease that turns uncertain detaches them from it; every close that
// reads them (everything but the common report) re-attaches them to a
// lease that keeps them the retention from the close.

// splitFormation encodes f's immutable part and its state.
func splitFormation(f *record.Formation) (call, state string, err error) {
	if call, err = encodeStored("formation", toStoredCall(f)); err != nil {
		return "", "", err
	}
	if state, err = encodeState(f); err != nil {
		return "", "", err
	}
	return call, state, nil
}

func encodeState(f *record.Formation) (string, error) {
	return encodeStored("formation state", &storedFormationState{ver: current, Status: f.Status,
		Approvals: toStoredApprovals(f.Approvals), Lease: f.Lease, UpdatedAt: f.UpdatedAt})
}

// storedFormation is a formation as read: its keys' values and revisions.
type storedFormation struct {
	call, state, outcome *mvccpb.KeyValue // outcome may be nil
}

// decode joins the parts into one record.
func (sf storedFormation) decode() (*record.Formation, error) {
	var c storedCall
	if err := decodeStored(sf.call.Key, sf.call.Value, &c); err != nil {
		return nil, err
	}
	var st storedFormationState
	if err := decodeStored(sf.state.Key, sf.state.Value, &st); err != nil {
		return nil, err
	}
	f := c.formation()
	f.Status, f.Approvals, f.Lease, f.UpdatedAt = st.Status, recordApprovals(st.Approvals), st.Lease, st.UpdatedAt
	if sf.outcome != nil {
		var o storedOutcome
		if err := decodeStored(sf.outcome.Key, sf.outcome.Value, &o); err != nil {
			return nil, err
		}
		f.Status, f.Outcome, f.Failure, f.UpdatedAt = o.Status, o.Outcome, o.Failure.record(), o.UpdatedAt
	}
	return f, nil
}

// outcomeRev is the revision of the outcome key (0: none yet).
func (sf storedFormation) outcomeRev() int64 {
	if sf.outcome == nil {
		return 0
	}
	return sf.outcome.ModRevision
}

// CreateFormation stores a new formation record and returns the etcd
// revision it was written at. The record is kept at least for keep (then
// etcd collects it); ids are random, so creation never overwrites.
func (s *Store) CreateFormation(ctx context.Context, f *record.Formation, keep time.Duration) (int64, error) {
	call, state, err := splitFormation(f)
	if err != nil {
		return 0, err
	}
	lid, err := s.retention.lease(ctx, s, keep)
	if err != nil {
		return 0, err
	}
	key := s.k.formation(f.ID)
	ops := []clientv3.Op{
		clientv3.OpPut(key, call, clientv3.WithLease(lid)),
		clientv3.OpPut(s.k.formationState(f.ID), state, clientv3.WithLease(lid)),
	}
	if f.Status == record.StatusPendingApproval {
		ops = append(ops, clientv3.OpPut(s.k.pendingApproval(f.ID), "", clientv3.WithLease(lid)))
	}
	t := txn{cmps: []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)}, then: ops}
	if r := f.Recovery; r != nil {
		// One live recovery of a formation: its key lives as long as the
		// recovery's record.
		rkey := s.k.recovery(r.Of)
		t.cmps = append(t.cmps, clientv3.Compare(clientv3.CreateRevision(rkey), "=", 0))
		t.then = append(t.then, clientv3.OpPut(rkey, f.ID, clientv3.WithLease(lid)))
		t.els = []clientv3.Op{clientv3.OpGet(rkey)}
	}
	resp, err := s.txn(ctx, t)
	if err != nil {
		s.retention.forgetOn(err)
		return 0, s.wrap(ctx, "create formation", err)
	}
	if !resp.Succeeded {
		if f.Recovery != nil {
			if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
				return 0, fmt.Errorf("%w: %s is recovered by %s", record.ErrRecoveryExists, f.Recovery.Of, kvs[0].Value)
			}
		}
		return 0, fmt.Errorf("lease: formation id %s already used", f.ID)
	}
	return resp.Header.Revision, nil
}

// GetFormation returns a formation record.
func (s *Store) GetFormation(ctx context.Context, id string) (*record.Formation, error) {
	f, _, err := s.getFormation(ctx, id)
	return f, err
}

// getFormation returns a formation and the revision of its state, which a
// compare-and-swap of the state checks.
func (s *Store) getFormation(ctx context.Context, id string) (*record.Formation, int64, error) {
	sf, f, err := s.readDecoded(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	return f, sf.state.ModRevision, nil
}

// readDecoded reads a formation's keys and decodes them.
func (s *Store) readDecoded(ctx context.Context, id string) (storedFormation, *record.Formation, error) {
	sf, err := s.readFormation(ctx, id)
	if err != nil {
		return storedFormation{}, nil, err
	}
	f, err := sf.decode()
	return sf, f, err
}

func (s *Store) readFormation(ctx context.Context, id string) (storedFormation, error) {
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Txn(octx).Then(
		clientv3.OpGet(s.k.formation(id)),
		clientv3.OpGet(s.k.formationState(id)),
		clientv3.OpGet(s.k.formationOutcome(id)),
	).Commit()
	if err != nil {
		return storedFormation{}, s.wrap(ctx, "get formation", err)
	}
	kv := func(i int) *mvccpb.KeyValue {
		if kvs := resp.Responses[i].GetResponseRange().Kvs; len(kvs) > 0 {
			return kvs[0]
		}
		return nil
	}
	sf := storedFormation{call: kv(0), state: kv(1), outcome: kv(2)}
	if sf.call == nil || sf.state == nil {
		return storedFormation{}, fmt.Errorf("%w: %s", record.ErrFormationNotFound, id)
	}
	return sf, nil
}

// UpdateFormation applies change to the stored record with compare-and-
// swap on the revision of its state, retrying from a fresh read when a
// concurrent writer got there first; etcd orders concurrent updates and
// none is lost. change may modify the mutable part only (status,
// approvals, lease); the immutable call is written once, at formation.
// If change returns an error the record is left as it was and that error
// is returned (wrapped in nothing). change may run more than once. The
// revision the state was written at is returned with the record.
func (s *Store) UpdateFormation(ctx context.Context, id string, change func(f *record.Formation) error) (*record.Formation, int64, error) {
	const attempts = 32
	skey := s.k.formationState(id)
	for range attempts {
		sf, f, err := s.readDecoded(ctx, id)
		if err != nil {
			return nil, 0, err
		}
		was := f.Status
		if err := change(f); err != nil {
			return f, 0, err
		}
		state, err := encodeState(f)
		if err != nil {
			return nil, 0, err
		}
		ops := []clientv3.Op{clientv3.OpPut(skey, state, clientv3.WithIgnoreLease())}
		switch pending := f.Status == record.StatusPendingApproval; {
		case was == record.StatusPendingApproval && !pending:
			ops = append(ops, clientv3.OpDelete(s.k.pendingApproval(id)))
		case was != record.StatusPendingApproval && pending:
			// Indexed as long as the state is kept.
			ops = append(ops, clientv3.OpPut(s.k.pendingApproval(id), "", clientv3.WithLease(clientv3.LeaseID(sf.state.Lease))))
		}
		resp, err := s.txn(ctx, txn{
			cmps: []clientv3.Cmp{
				clientv3.Compare(clientv3.ModRevision(skey), "=", sf.state.ModRevision),
				clientv3.Compare(clientv3.ModRevision(s.k.formationOutcome(id)), "=", sf.outcomeRev()),
			},
			then: ops,
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
		ids := make([]string, len(resp.Kvs))
		for i, kv := range resp.Kvs {
			ids[i] = strings.TrimPrefix(string(kv.Key), prefix)
		}
		states, outcomes, err := s.formationParts(ctx, ids[0], ids[len(ids)-1])
		if err != nil {
			return nil, "", err
		}
		for i, kv := range resp.Kvs {
			scanned++
			if st := states[ids[i]]; st != nil { // else collected between the reads
				f, err := storedFormation{call: kv, state: st, outcome: outcomes[ids[i]]}.decode()
				if err != nil {
					return nil, "", err
				}
				if keep == nil || keep(f) {
					out = append(out, f)
				}
			}
			switch {
			case i == len(resp.Kvs)-1 && !resp.More:
				return out, "", nil
			case len(out) == limit || scanned >= budget:
				return out, ids[i], nil
			}
			from = string(kv.Key) + "\x00"
		}
	}
}

// formationParts reads the states and outcomes of the formations with ids
// from first to last (inclusive), by id, in one read.
func (s *Store) formationParts(ctx context.Context, first, last string) (states, outcomes map[string]*mvccpb.KeyValue, err error) {
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Txn(octx).Then(
		clientv3.OpGet(s.k.formationState(first), clientv3.WithRange(s.k.formationState(last)+"\x00")),
		clientv3.OpGet(s.k.formationOutcome(first), clientv3.WithRange(s.k.formationOutcome(last)+"\x00")),
	).Commit()
	if err != nil {
		return nil, nil, s.wrap(ctx, "list formations", err)
	}
	byID := func(i int, prefix string) map[string]*mvccpb.KeyValue {
		m := map[string]*mvccpb.KeyValue{}
		for _, kv := range resp.Responses[i].GetResponseRange().Kvs {
			m[strings.TrimPrefix(string(kv.Key), prefix)] = kv
		}
		return m
	}
	return byID(0, s.k.formationStates()), byID(1, s.k.formationOutcomes()), nil
}

// PendingApproval returns a page of the formations that wait for
// approval, in id order, found by their index: no other record is read.
// next is as ListFormations'.
func (s *Store) PendingApproval(ctx context.Context, p FormationPage) ([]*record.Formation, string, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = 100
	}
	prefix := s.k.pendingApprovals()
	from := prefix
	if p.After != "" {
		from = s.k.pendingApproval(p.After) + "\x00"
	}
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Get(octx, from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(prefix)),
		clientv3.WithLimit(int64(limit)), clientv3.WithKeysOnly())
	if err != nil {
		return nil, "", s.wrap(ctx, "list pending approvals", err)
	}
	out := make([]*record.Formation, 0, len(resp.Kvs))
	// Three reads a formation, in transactions within etcd's 128
	// operations.
	const chunk = 40
	for i := 0; i < len(resp.Kvs); i += chunk {
		var ops []clientv3.Op
		ids := resp.Kvs[i:min(i+chunk, len(resp.Kvs))]
		for _, kv := range ids {
			id := strings.TrimPrefix(string(kv.Key), prefix)
			ops = append(ops, clientv3.OpGet(s.k.formation(id)), clientv3.OpGet(s.k.formationState(id)),
				clientv3.OpGet(s.k.formationOutcome(id)))
		}
		got, err := s.cli.Txn(octx).Then(ops...).Commit()
		if err != nil {
			return nil, "", s.wrap(ctx, "list pending approvals", err)
		}
		first := func(j int) *mvccpb.KeyValue {
			if kvs := got.Responses[j].GetResponseRange().Kvs; len(kvs) > 0 {
				return kvs[0]
			}
			return nil
		}
		for j := range ids {
			sf := storedFormation{call: first(3 * j), state: first(3*j + 1), outcome: first(3*j + 2)}
			if sf.call == nil || sf.state == nil {
				continue // collected meanwhile
			}
			f, err := sf.decode()
			if err != nil {
				return nil, "", err
			}
			out = append(out, f)
		}
	}
	next := ""
	if resp.More && len(resp.Kvs) > 0 {
		next = strings.TrimPrefix(string(resp.Kvs[len(resp.Kvs)-1].Key), prefix)
	}
	return out, next, nil
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
		octx, cancel := s.writeOp(context.WithoutCancel(ctx))
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
