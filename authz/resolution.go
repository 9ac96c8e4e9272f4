package authz

import (
	"context"
	"fmt"

	"github.com/fcd-authz/fcd/internal/public"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
)

// Errors of resolutions.
var (
	// ErrResolutionUnsigned: operator keys are configured, so an uncertain
	// lease is resolved only with an operator's signed resolution, and the
	// request carried none.
	ErrResolutionUnsigned = public.New("authz", "a signed resolution is required")
	// ErrResolutionInvalid: the signed resolution does not resolve this
	// lease: it does not verify against the operator keys (or none are
	// configured), it is malformed, of another typ, issued outside the
	// accepted window, or names another lease. Errors of manifest's
	// verification are wrapped beside it.
	ErrResolutionInvalid = public.New("authz", "the signed resolution is not valid for this lease")
	// ErrResolutionNotFound: no signed resolution is kept for the lease.
	ErrResolutionNotFound = public.New("authz", "no signed resolution is kept for this lease")
)

// ResolveSigned is an operator's signed resolution of an uncertain lease:
// jws is a resolution document ([manifest.Resolution], typ
// fcd-resolution+jws) signed with an operator key, which says the
// outcome, the reason and the person who decided. It must verify against
// the operator keys (Config.Operators), have been issued within the
// accepted window and name leaseID; otherwise it is refused with
// ErrResolutionInvalid and nothing changes. The verified document is kept
// with the close, in the same etcd transaction (Resolution reads it
// back), and the trail's resolution event names its signer, its operator
// and its digest. by is the caller's credential id.
func (ls *Leases) ResolveSigned(ctx context.Context, by, leaseID string, jws []byte) (*record.Lease, *manifest.SignedResolution, error) {
	if ls.operators == nil {
		return nil, nil, fmt.Errorf("%w: this server has no operator keys to verify it (authzd serve --operator-keys)", ErrResolutionInvalid)
	}
	sr, err := ls.operators.VerifyResolution(jws, ls.now())
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrResolutionInvalid, err)
	}
	if sr.Resolution.Lease != leaseID {
		return nil, nil, fmt.Errorf("%w: it resolves lease %s, not %s", ErrResolutionInvalid, sr.Resolution.Lease, leaseID)
	}
	outcome := record.OutcomeNoEffect
	if sr.Resolution.Outcome == manifest.ResolutionEffect {
		outcome = record.OutcomeEffect
	}
	l, err := ls.resolve(ctx, by, leaseID, outcome, sr.Resolution.Reason, sr)
	return l, sr, err
}

// Resolution returns the signed resolution kept with a lease it closed;
// ErrResolutionNotFound when none is (the lease is open, closed
// otherwise, resolved unsigned, past its retention, or unknown). The
// document was verified when it was kept; it is not verified again, so it
// reads the same after the operator keys change.
func (ls *Leases) Resolution(ctx context.Context, leaseID string) (*manifest.SignedResolution, error) {
	if leaseID == "" || len(leaseID) > maxIDLength {
		return nil, fmt.Errorf("%w: lease", ErrBadRequest)
	}
	jws, err := ls.store.Resolution(ctx, leaseID)
	if err != nil {
		return nil, err
	}
	if jws == "" {
		return nil, fmt.Errorf("%w: %s", ErrResolutionNotFound, leaseID)
	}
	sr, err := manifest.ReadVerifiedResolution([]byte(jws))
	if err != nil {
		return nil, fmt.Errorf("%w: the resolution kept for %s: %v", record.ErrCorrupt, leaseID, err)
	}
	return sr, nil
}

// resolve closes an uncertain lease by an operator's resolution, signed
// (sr) or not, and records it.
func (ls *Leases) resolve(ctx context.Context, by, leaseID string, outcome record.Outcome, reason string, sr *manifest.SignedResolution) (*record.Lease, error) {
	req := lease.CloseRequest{Lease: leaseID, Outcome: outcome, Resolve: true, Keep: ls.retention, Operator: by, Reason: reason}
	if sr != nil {
		req.Resolution = sr.JWS
	}
	l, err := ls.store.CloseLease(ctx, req)
	if err != nil {
		return l, fmt.Errorf("authz: resolve %s: %w", leaseID, err)
	}
	ls.metrics.outcomes.WithLabelValues(string(outcome), "operator").Inc()
	if sr != nil {
		ls.log.Info("lease resolved", "lease", leaseID, "outcome", outcome, "reason", reason, "by", by,
			"signer", sr.KeyID, "operator", sr.Resolution.Operator, "digest", sr.Digest)
	} else {
		ls.log.Info("lease resolved", "lease", leaseID, "outcome", outcome, "reason", reason, "by", by)
	}
	return l, nil
}
