package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fcd-authz/fcd/record"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Errors of admission and the lease lifecycle.
var (
	// ErrFormationChanged: the formation changed between read and admission
	// (a concurrent admission or approval); read it again.
	ErrFormationChanged = errors.New("lease: formation changed concurrently")
	// ErrGenerationChanged: the pool's generation changed during admission.
	ErrGenerationChanged = errors.New("lease: pool generation changed concurrently")
	// ErrCertificateChanged: the certificate a successor admission relies
	// on changed (was revoked) during admission; read it again.
	ErrCertificateChanged = errors.New("lease: certificate changed concurrently")
)

// NewLeaseID returns a fresh random lease id ("ls_" and 26 base32
// characters).
func NewLeaseID() (string, error) { return randomID("ls_") }

// GetFormationRevision returns a formation and the etcd revision it was
// last written at, for a later compare-and-swap.
func (s *Store) GetFormationRevision(ctx context.Context, id string) (*record.Formation, int64, error) {
	return s.getFormation(ctx, id)
}

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

// AdmitRequest is one admission: the formation as read (and its
// revision), the lease to open, and the session-ledger conditions.
type AdmitRequest struct {
	Formation    *record.Formation
	FormationRev int64
	Lease        *record.Lease
	// Requires must all have completed in the session; Exclusive must be
	// neither admitted nor completed there ("server/tool" names).
	Requires  []string
	Exclusive []string
	// StaleSource and Certificate are set for an admission to the
	// formation's successor only: the source epoch must be STALE and the
	// certificate record unchanged since it was read (Revision), both in
	// the same transaction as everything else.
	StaleSource string
	Certificate *record.Certificate
}

// Admit opens a lease in one etcd transaction that checks, against
// everything written before it in etcd's order: the formation is as read
// (ready, not yet admitted), the target epoch is ACTIVE, every required
// tool has completed in the session, no exclusive tool is admitted or
// completed there, and the pool generation is the one in the lease. It
// writes the lease marker under the target epoch, the lease index, the
// session ledger entry and the formation (status admitted, lease id), so a
// drain either commits before it (and it fails) or after it (and the
// marker holds retirement back).
//
// On success the lease's Revision and Cluster are set. A compare that
// fails is reported as *StateError (epoch not ACTIVE), *DependencyError,
// ErrFormationChanged or ErrGenerationChanged. ErrUnavailable means the
// outcome is unknown: read the formation back before answering.
func (s *Store) Admit(ctx context.Context, req AdmitRequest) error {
	f, l := req.Formation, req.Lease
	l.State = record.LeaseAdmitted
	skey, ekey := s.k.formationState(f.ID), s.k.state(l.Target.Epoch)
	gkey := s.k.generation(l.Target.Pool)
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(skey), "=", req.FormationRev),
		clientv3.Compare(clientv3.CreateRevision(s.k.formationOutcome(f.ID)), "=", 0),
		clientv3.Compare(clientv3.Value(ekey), "=", string(record.StateActive)),
	}
	if l.Generation == 0 {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(gkey), "=", 0))
	} else {
		cmps = append(cmps, clientv3.Compare(clientv3.Value(gkey), "=", formatGeneration(l.Generation)))
	}
	for _, t := range req.Requires {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(s.k.completed(l.Session, t)), ">", 0))
	}
	for _, t := range req.Exclusive {
		cmps = append(cmps,
			clientv3.Compare(clientv3.CreateRevision(s.k.completed(l.Session, t)), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(s.k.failed(l.Session, t)), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(s.k.admittedTool(l.Session, t)), "=", 0).WithPrefix())
	}
	if req.StaleSource != "" {
		if req.Certificate == nil {
			return fmt.Errorf("lease: a successor admission needs its certificate")
		}
		cmps = append(cmps,
			clientv3.Compare(clientv3.Value(s.k.state(req.StaleSource)), "=", string(record.StateStale)),
			clientv3.Compare(clientv3.ModRevision(s.certificateKey(req.Certificate)), "=", req.Certificate.Revision))
	}
	lval, err := json.Marshal(&storedMarker{Lease: l, Requires: req.Requires, Exclusive: req.Exclusive})
	if err != nil {
		return fmt.Errorf("lease: encode lease: %w", err)
	}
	f.Status, f.Lease, f.UpdatedAt = record.StatusAdmitted, l.ID, l.AdmittedAt
	state, err := encodeState(f)
	if err != nil {
		return err
	}
	resp, err := s.txn(ctx, txn{cmps: cmps, then: []clientv3.Op{
		clientv3.OpPut(s.k.marker(l.Target.Epoch, l.ID), string(lval)),
		// No lease option: the marker, the lease index and the ledger
		// entry live until the lease closes.
		clientv3.OpPut(s.k.lease(l.ID), indexValue(l.Target.Epoch, f.ID)),
		clientv3.OpPut(s.k.admitted(l.Session, l.Tool, l.ID), l.Tool),
		// Only the small state changes; the call record stays as formed.
		// (A ready formation has no pending-approval entry: the approval
		// that made it ready removed it.)
		clientv3.OpPut(skey, string(state), clientv3.WithIgnoreLease()),
	}})
	if err != nil {
		return s.wrap(ctx, "admit", err)
	}
	if resp.Succeeded {
		l.Revision, l.Cluster = resp.Header.Revision, clusterID(resp.Header.ClusterId)
		return nil
	}
	return s.diagnoseAdmit(ctx, req)
}

// diagnoseAdmit tells which condition of a failed admission did not hold.
func (s *Store) diagnoseAdmit(ctx context.Context, req AdmitRequest) error {
	l := req.Lease
	ops := []clientv3.Op{
		clientv3.OpGet(s.k.formationState(req.Formation.ID), clientv3.WithKeysOnly()),
		clientv3.OpGet(s.k.state(l.Target.Epoch)),
		clientv3.OpGet(s.k.generation(l.Target.Pool)),
	}
	for _, t := range req.Requires {
		ops = append(ops, clientv3.OpGet(s.k.completed(l.Session, t), clientv3.WithKeysOnly()))
	}
	for _, t := range req.Exclusive {
		ops = append(ops, clientv3.OpGet(s.k.completed(l.Session, t), clientv3.WithKeysOnly()),
			clientv3.OpGet(s.k.failed(l.Session, t), clientv3.WithKeysOnly()),
			clientv3.OpGet(s.k.admittedTool(l.Session, t), clientv3.WithPrefix(), clientv3.WithKeysOnly()))
	}
	if req.StaleSource != "" {
		ops = append(ops, clientv3.OpGet(s.k.state(req.StaleSource)),
			clientv3.OpGet(s.certificateKey(req.Certificate), clientv3.WithKeysOnly()))
	}
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Txn(octx).Then(ops...).Commit()
	if err != nil {
		return s.wrap(ctx, "diagnose admission", err)
	}
	r := func(i int) []*mvccpb.KeyValue { return resp.Responses[i].GetResponseRange().Kvs }
	if f := r(0); len(f) == 0 || f[0].ModRevision != req.FormationRev {
		return ErrFormationChanged
	}
	if st := r(1); len(st) == 0 {
		return fmt.Errorf("%w: %s", record.ErrEpochNotFound, l.Target.Epoch)
	} else if record.State(st[0].Value) != record.StateActive {
		return &record.StateError{Epoch: l.Target.Epoch, State: record.State(st[0].Value), Want: record.StateActive}
	}
	g := r(2)
	if (l.Generation == 0 && len(g) > 0) || (l.Generation != 0 && (len(g) == 0 || string(g[0].Value) != formatGeneration(l.Generation))) {
		return ErrGenerationChanged
	}
	i := 3
	for _, t := range req.Requires {
		if len(r(i)) == 0 {
			return &record.DependencyError{Tool: t}
		}
		i++
	}
	for _, t := range req.Exclusive {
		if len(r(i)) > 0 || len(r(i+1)) > 0 || len(r(i+2)) > 0 {
			return &record.DependencyError{Tool: t, Exclusive: true}
		}
		i += 3
	}
	if req.StaleSource != "" {
		if st := r(i); len(st) == 0 || record.State(st[0].Value) != record.StateStale {
			got := record.State("")
			if len(st) > 0 {
				got = record.State(st[0].Value)
			}
			return &record.StateError{Epoch: req.StaleSource, State: got, Want: record.StateStale}
		}
		if c := r(i + 1); len(c) == 0 || c[0].ModRevision != req.Certificate.Revision {
			return ErrCertificateChanged
		}
	}
	// Every condition holds now: something changed and changed back.
	return ErrFormationChanged
}

// OpenLease returns an open lease (its marker, and its claim if any) with
// the revision that created it and the cluster id, or ErrLeaseNotFound /
// ErrLeaseClosed.
func (s *Store) OpenLease(ctx context.Context, id string) (*record.Lease, error) {
	l, _, err := s.openLease(ctx, id)
	return l, err
}

// openRevs are the revisions a lease was read at, for a compare-and-swap:
// its marker's and its claim's (0: no claim).
type openRevs struct {
	marker, claim int64
	claimKey      string
}

// claimCmp holds when the lease's claim is still as read: the same claim
// key unchanged, or still none.
func (s *Store) claimCmp(id string, revs openRevs) clientv3.Cmp {
	if revs.claimKey == "" {
		return clientv3.Compare(clientv3.CreateRevision(s.k.claims(id)), "=", 0).WithPrefix()
	}
	return clientv3.Compare(clientv3.ModRevision(revs.claimKey), "=", revs.claim)
}

func (s *Store) openLease(ctx context.Context, id string) (*record.Lease, openRevs, error) {
	octx, cancel := s.op(ctx)
	defer cancel()
	idx, err := s.cli.Get(octx, s.k.lease(id))
	if err != nil {
		return nil, openRevs{}, s.wrap(ctx, "get lease", err)
	}
	if len(idx.Kvs) == 0 {
		return nil, openRevs{}, fmt.Errorf("%w: %s", record.ErrLeaseNotFound, id)
	}
	epoch := indexEpoch(idx.Kvs[0].Value)
	resp, err := s.cli.Txn(octx).Then(
		clientv3.OpGet(s.k.marker(epoch, id)),
		clientv3.OpGet(s.k.claims(id), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, openRevs{}, s.wrap(ctx, "get lease", err)
	}
	m := resp.Responses[0].GetResponseRange().Kvs
	if len(m) == 0 {
		return nil, openRevs{}, fmt.Errorf("%w: %s", record.ErrLeaseClosed, id)
	}
	var l record.Lease
	if err := json.Unmarshal(m[0].Value, &l); err != nil {
		return nil, openRevs{}, fmt.Errorf("%w: lease %s", record.ErrCorrupt, id)
	}
	l.Claim = nil
	revs := openRevs{marker: m[0].ModRevision}
	if c := resp.Responses[1].GetResponseRange().Kvs; len(c) > 0 {
		l.Claim = &record.Claim{}
		if err := json.Unmarshal(c[0].Value, l.Claim); err != nil {
			return nil, openRevs{}, fmt.Errorf("%w: claim of lease %s", record.ErrCorrupt, id)
		}
		revs.claim, revs.claimKey = c[0].ModRevision, string(c[0].Key)
		if l.State == record.LeaseAdmitted {
			l.State = record.LeaseRunning
		}
	}
	l.Revision, l.Cluster = m[0].CreateRevision, clusterID(resp.Header.ClusterId)
	return &l, revs, nil
}

// CloseRequest is an outcome for an open lease.
type CloseRequest struct {
	Lease   string
	Outcome record.Outcome
	// Claim is the reporter's claim id. A claimed (running) lease takes
	// outcomes only under its claim; an unclaimed one only rejected, with
	// no claim (a release: nothing ran, and no claim can succeed after).
	Claim string
	// Admission, when set, are the facts of the lease's admission as its
	// dispatch token states them. They let the common report (effect,
	// failed or rejected, not a resolution) be one transaction with no
	// read before it; its compares prove each fact against the stored
	// admission, and a report whose facts do not hold is handled as one
	// without them. Never trusted beyond what the compares prove.
	Admission *record.Admission
	// Failure is what the backend answered a failed or refused call, kept
	// with the formation's outcome for its recovery.
	Failure *record.Failure
	// Resolve marks an operator's resolution: the only way to close an
	// uncertain lease (besides a newer generation), and only such a lease.
	Resolve bool
	// Resolution, with Resolve, is the operator's signed resolution (a
	// verified JWS): kept with the close, in its transaction and as long
	// as the outcome, and read back with Store.Resolution.
	Resolution string
	// Operator and Reason, with Resolve, are the resolving operator's
	// credential id and the reason given: kept in the outcome's value, so
	// the audit trail, which follows the store, records who resolved.
	Operator, Reason string
	// Keep is how long the closed formation record is kept.
	Keep time.Duration
	// AllowPool, when not nil, is asked first with the pool of the lease's
	// epoch and may refuse (a reporter limited to some pools, say); its
	// error is returned as is and nothing changes.
	AllowPool func(pool string) error
}

// CloseLease applies an outcome to an open lease: effect, failed and
// rejected release the marker (effect also records the tool as completed
// in the session, failed as failed), uncertain keeps it. The formation's
// status follows. Every write is one transaction, compare-and-swap on the
// marker, the claim and the formation.
//
// Who may close what: an uncertain lease only by a resolution; a running
// lease only under its claim (ErrLeaseClaimed otherwise); an admitted,
// unclaimed lease only as rejected and without a claim (ErrLeaseNotClaimed
// otherwise) — no effect can have run under it, and the claim that would
// let one run is refused once the marker is gone.
//
// The lease returned has at least its id and formation set.
func (s *Store) CloseLease(ctx context.Context, req CloseRequest) (*record.Lease, error) {
	if l, ok, err := s.closeFast(ctx, req); ok || err != nil {
		return l, err
	}
	return s.closeRead(ctx, req)
}

// closeRead is CloseLease by reading the lease first.
func (s *Store) closeRead(ctx context.Context, req CloseRequest) (*record.Lease, error) {
	id := req.Lease
	kept, err := s.resolutionPut(req)
	if err != nil {
		return nil, err
	}
	by := closure{By: byBackend}
	if req.Resolve {
		by = closure{By: byOperator, Operator: req.Operator, Reason: req.Reason}
	}
	return s.closeLease(ctx, id, req.Outcome, req.Failure, by, req.Keep, func(l *record.Lease) error {
		if req.AllowPool != nil {
			if err := req.AllowPool(l.Target.Pool); err != nil {
				return err
			}
		}
		switch {
		case req.Resolve && l.State != record.LeaseUncertain:
			return fmt.Errorf("%w: %s", record.ErrLeaseNotUncertain, id)
		case req.Resolve:
			return nil
		case l.State == record.LeaseUncertain:
			return fmt.Errorf("%w: %s", record.ErrLeaseUncertain, id)
		case l.Claim != nil && req.Claim != l.Claim.ID:
			return fmt.Errorf("%w: %s is claimed by another call", record.ErrLeaseClaimed, id)
		case l.Claim == nil && req.Claim != "":
			return fmt.Errorf("%w: %s has no claim %q", record.ErrLeaseNotClaimed, id, req.Claim)
		case l.Claim == nil && req.Outcome != record.OutcomeRejected:
			return fmt.Errorf("%w: %s: only rejected (a release) applies to an unclaimed lease", record.ErrLeaseNotClaimed, id)
		}
		return nil
	}, kept...)
}

// CloseLeases applies many outcomes, each as CloseLease would, with its
// own answer. The common reports among them (see closeFast) go to etcd
// together, as one transaction of nested ones where they do not conflict;
// the others, and those whose facts did not hold, close one by one.
func (s *Store) CloseLeases(ctx context.Context, reqs []CloseRequest) ([]*record.Lease, []error) {
	leases, errs := make([]*record.Lease, len(reqs)), make([]error, len(reqs))
	fast := make([]*fastClose, len(reqs))
	var ts []txn
	var at []int
	for i, req := range reqs {
		f, err := s.prepareFast(ctx, req)
		switch {
		case err != nil:
			errs[i] = err
		case f != nil:
			fast[i] = f
			ts, at = append(ts, f.t), append(at, i)
		}
	}
	resps, terrs := s.commits.commitAll(ctx, ts)
	for j, i := range at {
		leases[i], errs[i] = s.finishFast(ctx, reqs[i], fast[i], resps[j], terrs[j])
	}
	for i, req := range reqs {
		if leases[i] == nil && errs[i] == nil {
			leases[i], errs[i] = s.closeRead(ctx, req)
		}
	}
	return leases, errs
}

// fastClose is a prepared common report.
type fastClose struct {
	t txn
	l *record.Lease
}

// closeFast applies a common report in one transaction, without reading:
// its compares prove that the lease is open and neither uncertain nor
// claimed by another (its marker unchanged since the admission at the
// token's revision; the claim under the reporter's id, or none for a
// release), and that the token's formation, session and tool are the
// lease's (the lease index and the ledger entry its admission wrote). ok
// is false when the request is not such a report or a compare failed:
// the caller then reads and closes as usual, and gets the precise answer.
func (s *Store) closeFast(ctx context.Context, req CloseRequest) (_ *record.Lease, ok bool, _ error) {
	f, err := s.prepareFast(ctx, req)
	if f == nil || err != nil {
		return nil, false, err
	}
	resp, err := s.txn(ctx, f.t)
	l, err := s.finishFast(ctx, req, f, resp, err)
	return l, l != nil, err
}

// prepareFast builds the transaction of a common report; nil when req is
// not one.
func (s *Store) prepareFast(ctx context.Context, req CloseRequest) (*fastClose, error) {
	a := req.Admission
	if a == nil || req.Resolve || a.Epoch == "" || a.Revision <= 0 || a.Formation == "" || a.Session == "" || a.Tool == "" {
		return nil, nil
	}
	switch req.Outcome {
	case record.OutcomeEffect, record.OutcomeFailed, record.OutcomeRejected:
	default:
		return nil, nil
	}
	if req.Claim == "" && req.Outcome != record.OutcomeRejected {
		return nil, nil
	}
	recs, err := s.records(ctx, []string{a.Epoch})
	if err != nil {
		return nil, err
	}
	rec := recs[a.Epoch]
	if rec == nil {
		return nil, nil
	}
	if req.AllowPool != nil {
		if err := req.AllowPool(rec.Manifest.Pool); err != nil {
			return nil, err
		}
	}
	id := req.Lease
	mkey, ikey := s.k.marker(a.Epoch, id), s.k.lease(id)
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(mkey), "=", a.Revision),
		clientv3.Compare(clientv3.Value(ikey), "=", indexValue(a.Epoch, a.Formation)),
		clientv3.Compare(clientv3.CreateRevision(s.k.admitted(a.Session, a.Tool, id)), "=", a.Revision),
		clientv3.Compare(clientv3.CreateRevision(s.k.formationOutcome(a.Formation)), "=", 0),
	}
	if req.Claim == "" {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(s.k.claims(id)), "=", 0).WithPrefix())
	} else {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(s.k.claim(id, req.Claim)), ">", 0))
	}
	by := closure{Lease: id, Claim: req.Claim, By: byBackend}
	if req.Claim == "" {
		by.By = byRelease
	}
	oval, err := s.outcomeValue(req.Outcome, req.Failure, by)
	if err != nil {
		return nil, err
	}
	lid, err := s.retention.lease(ctx, s, req.Keep)
	if err != nil {
		return nil, err
	}
	ops := append(s.releaseOps(a.Epoch, id, a.Session, a.Tool, req.Outcome),
		clientv3.OpPut(s.k.formationOutcome(a.Formation), oval, clientv3.WithLease(lid)),
		clientv3.OpPut(ikey, indexValue(a.Epoch, a.Formation), clientv3.WithLease(lid)))
	return &fastClose{t: txn{cmps: cmps, then: ops}, l: &record.Lease{
		ID: id, Formation: a.Formation, Session: a.Session, Tool: a.Tool, Revision: a.Revision,
		Target: record.Target{Epoch: a.Epoch, Pool: rec.Manifest.Pool},
	}}, nil
}

// finishFast reads the answer of a common report's transaction: the lease
// when it applied, nil and no error when a compare failed.
func (s *Store) finishFast(ctx context.Context, req CloseRequest, f *fastClose, resp *clientv3.TxnResponse, err error) (*record.Lease, error) {
	if err != nil {
		s.retention.forgetOn(err)
		return nil, s.wrap(ctx, "close lease", err)
	}
	if !resp.Succeeded {
		return nil, nil
	}
	f.l.Closed = resp.Header.Revision
	s.log.Info("lease closed", "lease", req.Lease, "outcome", req.Outcome, "formation", f.l.Formation)
	return f.l, nil
}

// storedMarker is a lease marker's value as its admission writes it: the
// lease, and the session dependencies the admission's compares checked
// (which the audit trail records with the admission). Readers decode it as
// a record.Lease.
type storedMarker struct {
	*record.Lease
	Requires  []string `json:"requires,omitempty"`
	Exclusive []string `json:"exclusiveWith,omitempty"`
}

// closeLease closes an open lease if check accepts it, reading it first.
// kept are more keys written with a release, kept as long as its outcome.
func (s *Store) closeLease(ctx context.Context, id string, outcome record.Outcome, failure *record.Failure, by closure, keep time.Duration, check func(*record.Lease) error, kept ...keptPut) (*record.Lease, error) {
	for range 16 {
		l, revs, err := s.openLease(ctx, id)
		if err != nil {
			return nil, err
		}
		if err := check(l); err != nil {
			return l, err
		}
		// The formation may be gone (collected after its keep, which
		// authz sizes to outlast the lease): the lease closes all the same.
		sf, err := s.readFormation(ctx, l.Formation)
		gone := errors.Is(err, record.ErrFormationNotFound)
		if err != nil && !gone {
			return nil, err
		}
		if !gone {
			if _, err := sf.decode(); err != nil {
				return nil, err // rewritten as read below: refuse what does not decode
			}
		}
		mkey, fid := s.k.marker(l.Target.Epoch, id), l.Formation
		cmps := []clientv3.Cmp{
			clientv3.Compare(clientv3.ModRevision(mkey), "=", revs.marker),
			s.claimCmp(id, revs),
		}
		if !gone {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(s.k.formationOutcome(fid)), "=", sf.outcomeRev()))
		}
		by.Lease = id
		if by.By == byBackend && l.Claim == nil {
			by.By = byRelease
		}
		if l.Claim != nil {
			by.Claim = l.Claim.ID
		}
		oval, err := s.outcomeValue(outcome, failure, by)
		if err != nil {
			return nil, err
		}
		var ops []clientv3.Op
		if outcome == record.OutcomeUncertain {
			l.State = record.LeaseUncertain
			marker := *l
			marker.Claim = nil // the claim has its own key
			lval, _ := json.Marshal(&marker)
			ops = append(ops, clientv3.OpPut(mkey, string(lval)))
		} else {
			ops = s.releaseOps(l.Target.Epoch, id, l.Session, l.Tool, outcome)
		}
		// The record's keys as read, rewritten to live as long as the
		// outcome: detached while the lease stays uncertain (it may stay
		// longer than any retention), else kept keep from now.
		var opt []clientv3.OpOption
		if outcome != record.OutcomeUncertain {
			lid, err := s.retention.lease(ctx, s, keep)
			if err != nil {
				return nil, err
			}
			opt = append(opt, clientv3.WithLease(lid))
			ops = append(ops, clientv3.OpPut(s.k.lease(id), indexValue(l.Target.Epoch, fid), opt...))
			for _, p := range kept {
				ops = append(ops, clientv3.OpPut(p.key, p.value, opt...))
			}
		}
		if !gone {
			ops = append(ops,
				clientv3.OpPut(s.k.formationOutcome(fid), oval, opt...),
				clientv3.OpPut(string(sf.call.Key), string(sf.call.Value), opt...),
				clientv3.OpPut(string(sf.state.Key), string(sf.state.Value), opt...))
			cmps = append(cmps,
				clientv3.Compare(clientv3.ModRevision(string(sf.call.Key)), "=", sf.call.ModRevision),
				clientv3.Compare(clientv3.ModRevision(string(sf.state.Key)), "=", sf.state.ModRevision))
		} else {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(s.k.formation(fid)), "=", 0))
		}
		resp, err := s.txn(ctx, txn{cmps: cmps, then: ops})
		if err != nil {
			s.retention.forgetOn(err)
			return nil, s.wrap(ctx, "close lease", err)
		}
		if resp.Succeeded {
			l.Closed = resp.Header.Revision
			s.log.Info("lease closed", "lease", id, "outcome", outcome, "formation", fid)
			return l, nil
		}
	}
	return nil, fmt.Errorf("%w: lease %s", record.ErrConflict, id)
}

// outcomeValue is the formation's outcome key's value for a lease's
// outcome: the status it gives the formation, and when.
func (s *Store) outcomeValue(outcome record.Outcome, failure *record.Failure, by closure) (string, error) {
	var status record.Status
	switch outcome {
	case record.OutcomeEffect:
		status = record.StatusCompleted
	case record.OutcomeFailed:
		status = record.StatusFailed
	case record.OutcomeRejected, record.OutcomeNoEffect:
		status = record.StatusRejected
	case record.OutcomeUncertain, record.OutcomeReleased:
		status = record.StatusUncertain
	default:
		return "", fmt.Errorf("lease: unknown outcome %q", outcome)
	}
	b, err := json.Marshal(&formationOutcome{Status: status, Outcome: outcome, Failure: failure, UpdatedAt: s.now().UTC(), Closure: &by})
	if err != nil {
		return "", fmt.Errorf("lease: encode outcome: %w", err)
	}
	return string(b), nil
}

// releaseOps release a lease with an outcome other than uncertain: its
// marker, claim and ledger entry go; an effect is recorded as completed in
// the session, a failure as failed.
func (s *Store) releaseOps(epoch, lease, session, tool string, outcome record.Outcome) []clientv3.Op {
	ops := []clientv3.Op{
		clientv3.OpDelete(s.k.marker(epoch, lease)), clientv3.OpDelete(s.k.claims(lease), clientv3.WithPrefix()),
		clientv3.OpDelete(s.k.admitted(session, tool, lease)), clientv3.OpDelete(s.k.reissue(lease)),
	}
	switch outcome {
	case record.OutcomeEffect:
		ops = append(ops, clientv3.OpPut(s.k.completed(session, tool), tool))
	case record.OutcomeFailed:
		ops = append(ops, clientv3.OpPut(s.k.failed(session, tool), tool))
	}
	return ops
}

// indexValue is the value of a lease's index key: its epoch and formation,
// in one fixed encoding, so that a compare of the value proves both.
func indexValue(epoch, formation string) string {
	b, _ := json.Marshal(struct {
		Epoch     string `json:"epoch"`
		Formation string `json:"formation"`
	}{epoch, formation})
	return string(b)
}

// indexEpoch reads a lease index value's epoch: indexValue's encoding,
// or the bare epoch id older versions wrote.
func indexEpoch(v []byte) string {
	var ix struct {
		Epoch string `json:"epoch"`
	}
	if len(v) > 0 && v[0] == '{' && json.Unmarshal(v, &ix) == nil {
		return ix.Epoch
	}
	return string(v)
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
		Then(clientv3.OpPut(gkey, formatGeneration(gen)), s.noteOp(ctx, "generations", pool, note{Generation: gen})).
		Else(clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.Value(gkey), "<", formatGeneration(gen))},
			[]clientv3.Op{clientv3.OpPut(gkey, formatGeneration(gen)), s.noteOp(ctx, "generations", pool, note{Generation: gen})},
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
		var l record.Lease
		if json.Unmarshal(kv.Value, &l) == nil && l.Target.Pool == pool && l.Generation < gen {
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

// MarkUnreported marks uncertain every admitted lease admitted before
// cutoff: its backend never reported an outcome (it crashed, or the report
// was lost), so whether the effect happened is unknown. The marker stays
// (the epoch does not retire, the call is not replayed or substituted)
// until an operator resolves the lease or a newer pool generation releases
// it, as for a reported "uncertain". Each change is the compare-and-swap
// of CloseLease: a report that lands first wins, and replicas sweeping at
// once mark a lease once. It returns the leases it marked, each with the
// revision that marked it (Closed).
func (s *Store) MarkUnreported(ctx context.Context, cutoff time.Time) ([]*record.Lease, error) {
	octx, cancel := s.op(ctx)
	all, err := s.cli.Get(octx, s.k.allMarkers(), clientv3.WithPrefix())
	cancel()
	if err != nil {
		return nil, s.wrap(ctx, "scan markers", err)
	}
	marked := []*record.Lease{}
	for _, kv := range all.Kvs {
		var l record.Lease
		if json.Unmarshal(kv.Value, &l) != nil || !unreported(&l, cutoff) {
			continue
		}
		m, err := s.MarkLeaseUnreported(ctx, l.ID, cutoff)
		if err != nil {
			return marked, err
		}
		if m != nil {
			marked = append(marked, m)
		}
	}
	return marked, nil
}

// MarkLeaseUnreported marks one lease uncertain if it is still an
// admission made before cutoff with no outcome reported, and returns it
// (with the revision that marked it, Closed) if it did, nil if not. A
// lease closed or marked meanwhile is left as it is.
func (s *Store) MarkLeaseUnreported(ctx context.Context, id string, cutoff time.Time) (*record.Lease, error) {
	l, err := s.closeLease(ctx, id, record.OutcomeUncertain, nil, closure{By: bySweep}, 0, func(cur *record.Lease) error {
		if !unreported(cur, cutoff) {
			return errReported
		}
		return nil
	})
	switch {
	case errors.Is(err, record.ErrLeaseClosed), errors.Is(err, errReported):
		return nil, nil
	case err != nil:
		return nil, err
	}
	s.log.Warn("lease outcome never reported; marked uncertain", "lease", id)
	return l, nil
}

// unreported: an admitted lease admitted before cutoff, or a running one
// claimed before it, with no outcome reported.
func unreported(l *record.Lease, cutoff time.Time) bool {
	switch l.State {
	case record.LeaseAdmitted:
		return l.AdmittedAt.Before(cutoff)
	case record.LeaseRunning:
		return l.Claim != nil && l.Claim.At.Before(cutoff)
	}
	return false
}

var errReported = errors.New("lease: lease is no longer an unreported admission")

func clusterID(id uint64) string { return strconv.FormatUint(id, 16) }

func (k keys) lease(id string) string { return k.p + "leases/" + id }
func (k keys) generation(pool string) string {
	return k.p + "pools/" + pool + "/generation"
}

// completed is the session-ledger key recording that tool's effect
// completed in session; failed, that it ran and answered an error.
func (k keys) completed(session, tool string) string { return k.sessionCompleted(session) + tool }
func (k keys) failed(session, tool string) string    { return k.session(session) + "failed/" + tool }

// admittedTool is the prefix of the admissions of tool in session;
// admitted is one of them.
func (k keys) admittedTool(session, tool string) string {
	return k.sessionAdmitted(session) + tool + "/"
}
func (k keys) admitted(session, tool, lease string) string {
	return k.admittedTool(session, tool) + lease
}
