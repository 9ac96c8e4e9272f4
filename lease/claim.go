package lease

import (
	"context"
	"fmt"
	"time"

	"github.com/fcd-authz/fcd/record"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/attribute"
)

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
func (s *Store) ClaimLease(ctx context.Context, req ClaimRequest, allow func(pool string) error) (c *record.Claim, err error) {
	ctx, span := startTxnSpan(ctx, "lease.claim", attribute.String("fcd.lease", req.Lease))
	defer func() {
		var rev int64
		if c != nil {
			rev = c.Revision
		}
		endTxnSpan(span, rev, err)
	}()
	if req.Lease == "" || req.Epoch == "" || req.Revision <= 0 || req.Claim == "" || len(req.Claim) > MaxClaimIDLength {
		return nil, fmt.Errorf("%w: a claim needs the lease, its epoch and admission revision, and a claim id of 1-%d bytes",
			record.ErrLeaseNotFound, MaxClaimIDLength)
	}
	if allow != nil {
		recs, err := s.records(ctx, []string{req.Epoch})
		if err != nil {
			return nil, err
		}
		rec := recs[req.Epoch]
		if rec == nil {
			return nil, fmt.Errorf("%w: %s (epoch %s unknown)", record.ErrLeaseNotFound, req.Lease, req.Epoch)
		}
		if err := allow(rec.Manifest.Pool); err != nil {
			return nil, err
		}
	}
	at := req.At
	if at.IsZero() {
		at = s.now()
	}
	c = &record.Claim{ID: req.Claim, At: at.UTC()}
	val, err := encodeStored("claim", &storedClaim{ver: current, ID: c.ID, At: c.At, Epoch: req.Epoch, Admission: req.Revision})
	if err != nil {
		return nil, err
	}
	mkey, ckey := s.k.marker(req.Epoch, req.Lease), s.k.claim(req.Lease, req.Claim)
	resp, err := s.txn(ctx, txn{
		cmps: []clientv3.Cmp{
			clientv3.Compare(clientv3.ModRevision(mkey), "=", req.Revision),
			clientv3.Compare(clientv3.CreateRevision(s.k.claims(req.Lease)), "=", 0).WithPrefix(),
		},
		then: []clientv3.Op{clientv3.OpPut(ckey, val)},
		els: []clientv3.Op{
			clientv3.OpGet(s.k.claims(req.Lease), clientv3.WithPrefix()),
			clientv3.OpGet(mkey),
			clientv3.OpGet(s.k.lease(req.Lease), clientv3.WithKeysOnly()),
		},
	})
	if err != nil {
		return nil, s.wrap(ctx, "claim lease", err)
	}
	if resp.Succeeded {
		s.log.Debug("lease claimed", "lease", req.Lease, "claim", req.Claim)
		c.Revision = resp.Header.Revision
		return c, nil
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		stored, err := decodeClaim(kvs[0].Key, kvs[0].Value)
		if err != nil {
			return nil, err
		}
		if cur := stored.claim(); cur.ID == req.Claim {
			// Our own claim, whose answer was lost; still open?
			if m := resp.Responses[1].GetResponseRange().Kvs; len(m) > 0 && m[0].CreateRevision == req.Revision {
				cur.Revision = kvs[0].ModRevision
				return cur, nil
			}
		} else {
			return nil, fmt.Errorf("%w: %s", record.ErrLeaseClaimed, req.Lease)
		}
	}
	m := resp.Responses[1].GetResponseRange().Kvs
	switch {
	case len(m) == 0 && len(resp.Responses[2].GetResponseRange().Kvs) == 0:
		return nil, fmt.Errorf("%w: %s", record.ErrLeaseNotFound, req.Lease)
	case len(m) == 0:
		return nil, fmt.Errorf("%w: %s", record.ErrLeaseClosed, req.Lease)
	case m[0].CreateRevision != req.Revision:
		return nil, fmt.Errorf("%w: %s (not admitted at revision %d)", record.ErrLeaseNotFound, req.Lease, req.Revision)
	}
	if l, err := decodeMarker(m[0].Key, m[0].Value); err != nil {
		return nil, err
	} else if l.State == record.LeaseUncertain {
		return nil, fmt.Errorf("%w: %s", record.ErrLeaseUncertain, req.Lease)
	}
	return nil, fmt.Errorf("%w: lease %s", record.ErrConflict, req.Lease)
}
