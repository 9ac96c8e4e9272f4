package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Errors of claims.
var (
	// ErrLeaseClaimed: another call claimed the lease first (a replay on
	// another instance, after a restart or a re-admission), or an outcome
	// was reported under another claim than the lease's.
	ErrLeaseClaimed = errors.New("lease: lease already claimed by another call")
	// ErrLeaseNotClaimed: an outcome other than rejected was reported for
	// a lease no backend claimed, or under a claim the lease does not
	// have: no effect can have run under it.
	ErrLeaseNotClaimed = errors.New("lease: lease was not claimed")
)

// LeaseRunning is the state of a lease a backend claimed before its effect.
// Like an admitted lease it holds its epoch back; unlike one it is never
// claimed again, and re-admission issues no token for it.
const LeaseRunning LeaseState = "running"

// Claim is a backend's claim on a lease, taken in one etcd transaction
// immediately before the effect: of all the calls presenting a lease's
// token — on any instance, across restarts and re-admissions — exactly
// one claims it.
type Claim struct {
	// ID is the claimant's id for this one call (random, chosen by the
	// fence); the claimant reports the outcome under it, and a retry of a
	// claim with the same id is answered as the first was.
	ID string `json:"id"`
	// At is when the claim was taken.
	At time.Time `json:"at"`
}

// ClaimRequest claims a lease. Epoch and Revision come from the verified
// dispatch token (fcd_epoch, fcd_revision): they name the lease marker and
// the admission that created it, so the claim is one transaction with no
// read before it.
type ClaimRequest struct {
	Lease    string
	Epoch    string
	Revision int64
	Claim    string
	// At is when the claim is taken, on the caller's clock — the clock of
	// its admissions' AdmittedAt and of the unreported sweep's cutoff,
	// which a running lease's claim time is compared with. Zero means the
	// store's clock.
	At time.Time
}

// MaxClaimIDLength bounds a claim id.
const MaxClaimIDLength = 128

// ClaimLease moves an admitted lease to running in one etcd transaction:
// it succeeds only if the lease's marker is exactly as its admission wrote
// it (not closed, not marked uncertain) and no claim exists. A retry with
// the same claim id returns the existing claim (the first answer may have
// been lost); any other claim is refused with ErrLeaseClaimed. A closed
// lease answers ErrLeaseClosed, an uncertain one ErrLeaseUncertain, an
// unknown one ErrLeaseNotFound.
//
// allow, when not nil, is asked first with the pool of the lease's epoch
// (from the immutable epoch record) and may refuse; nothing changes then.
func (s *Store) ClaimLease(ctx context.Context, req ClaimRequest, allow func(pool string) error) (*Claim, error) {
	if req.Lease == "" || req.Epoch == "" || req.Revision <= 0 || req.Claim == "" || len(req.Claim) > MaxClaimIDLength {
		return nil, fmt.Errorf("%w: a claim needs the lease, its epoch and admission revision, and a claim id of 1-%d bytes",
			ErrLeaseNotFound, MaxClaimIDLength)
	}
	if allow != nil {
		recs, err := s.records(ctx, []string{req.Epoch})
		if err != nil {
			return nil, err
		}
		rec := recs[req.Epoch]
		if rec == nil {
			return nil, fmt.Errorf("%w: %s (epoch %s unknown)", ErrLeaseNotFound, req.Lease, req.Epoch)
		}
		if err := allow(rec.Manifest.Pool); err != nil {
			return nil, err
		}
	}
	at := req.At
	if at.IsZero() {
		at = s.now()
	}
	c := &Claim{ID: req.Claim, At: at.UTC()}
	val, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("lease: encode claim: %w", err)
	}
	mkey, ckey := s.k.marker(req.Epoch, req.Lease), s.k.claim(req.Lease)
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := s.cli.Txn(octx).If(
		clientv3.Compare(clientv3.ModRevision(mkey), "=", req.Revision),
		clientv3.Compare(clientv3.CreateRevision(ckey), "=", 0),
	).Then(
		clientv3.OpPut(ckey, string(val)),
	).Else(
		clientv3.OpGet(ckey),
		clientv3.OpGet(mkey),
		clientv3.OpGet(s.k.lease(req.Lease), clientv3.WithKeysOnly()),
	).Commit()
	if err != nil {
		return nil, s.wrap(ctx, "claim lease", err)
	}
	if resp.Succeeded {
		s.log.Debug("lease claimed", "lease", req.Lease, "claim", req.Claim)
		return c, nil
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		var cur Claim
		if err := json.Unmarshal(kvs[0].Value, &cur); err != nil {
			return nil, fmt.Errorf("%w: claim of lease %s", ErrCorrupt, req.Lease)
		}
		if cur.ID == req.Claim {
			// Our own claim, whose answer was lost; still open?
			if m := resp.Responses[1].GetResponseRange().Kvs; len(m) > 0 && m[0].CreateRevision == req.Revision {
				return &cur, nil
			}
		} else {
			return nil, fmt.Errorf("%w: %s", ErrLeaseClaimed, req.Lease)
		}
	}
	m := resp.Responses[1].GetResponseRange().Kvs
	switch {
	case len(m) == 0 && len(resp.Responses[2].GetResponseRange().Kvs) == 0:
		return nil, fmt.Errorf("%w: %s", ErrLeaseNotFound, req.Lease)
	case len(m) == 0:
		return nil, fmt.Errorf("%w: %s", ErrLeaseClosed, req.Lease)
	case m[0].CreateRevision != req.Revision:
		return nil, fmt.Errorf("%w: %s (not admitted at revision %d)", ErrLeaseNotFound, req.Lease, req.Revision)
	}
	var l Lease
	if json.Unmarshal(m[0].Value, &l) == nil && l.State == LeaseUncertain {
		return nil, fmt.Errorf("%w: %s", ErrLeaseUncertain, req.Lease)
	}
	return nil, fmt.Errorf("%w: lease %s", ErrConflict, req.Lease)
}

// claim is the key of a lease's claim, written once by ClaimLease and
// deleted when the lease closes.
func (k keys) claim(lease string) string { return k.p + "claims/" + lease }
