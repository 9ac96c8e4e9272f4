package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fcd-authz/fcd/record"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/attribute"
)

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
	epoch, err := indexEpoch(idx.Kvs[0].Key, idx.Kvs[0].Value)
	if err != nil {
		return nil, openRevs{}, err
	}
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
	marker, err := decodeMarker(m[0].Key, m[0].Value)
	if err != nil {
		return nil, openRevs{}, err
	}
	l := marker.lease()
	revs := openRevs{marker: m[0].ModRevision}
	if c := resp.Responses[1].GetResponseRange().Kvs; len(c) > 0 {
		claim, err := decodeClaim(c[0].Key, c[0].Value)
		if err != nil {
			return nil, openRevs{}, err
		}
		l.Claim = claim.claim()
		revs.claim, revs.claimKey = c[0].ModRevision, string(c[0].Key)
		if l.State == record.LeaseAdmitted {
			l.State = record.LeaseRunning
		}
	}
	l.Revision, l.Cluster = m[0].CreateRevision, clusterID(resp.Header.ClusterId)
	return l, revs, nil
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
func (s *Store) CloseLease(ctx context.Context, req CloseRequest) (l *record.Lease, err error) {
	ctx, span := startTxnSpan(ctx, "lease.close", attribute.String("fcd.lease", req.Lease))
	defer func() {
		var rev int64
		if l != nil {
			rev = l.Closed
		}
		endTxnSpan(span, rev, err)
	}()
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
	ctx, span := startTxnSpan(ctx, "lease.close", attribute.Int("fcd.leases", len(reqs)))
	defer span.End()
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
			// The lease alone: the claim has its own key.
			lval, err := encodeStored("lease", toStoredMarker(l, nil, nil))
			if err != nil {
				return nil, err
			}
			ops = append(ops, clientv3.OpPut(mkey, lval))
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
	return encodeStored("outcome", &storedOutcome{ver: current, Status: status, Outcome: outcome, Failure: toStoredFailure(failure),
		UpdatedAt: s.now().UTC(), Closure: &by})
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
