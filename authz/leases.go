package authz

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/fcd-authz/fcd/internal/tracing"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
	"go.opentelemetry.io/otel/attribute"
)

// Leases is the use case of backends and operators after admission: a
// backend claims a lease before the effect and reports its outcome; an
// operator resolves an uncertain one; a redeployed pool releases its old
// leases; a sweep marks the never-reported ones uncertain.
type Leases struct {
	trail       *Follower
	store       *lease.Store
	issuer      *TokenIssuer
	generations *sync.Map
	grace       time.Duration
	retention   time.Duration
	metrics     *metrics
	now         func() time.Time
	log         *slog.Logger
	// operators verifies signed resolutions; nil: resolutions are unsigned.
	operators *manifest.Verifier
}

// ClaimRequest is a backend's claim on a lease, immediately before the
// effect: the lease (the token's jti), the token's fcd_epoch and
// fcd_revision, and the claimant's id for this one call.
type ClaimRequest struct {
	Lease, Epoch string
	Revision     int64
	Claim        string
	// Pools, when not empty, limits the claimant to leases of these pools.
	Pools []string
}

// Claim moves an admitted lease to running in one etcd transaction, so
// that of all the calls presenting its token — on any instance of the
// pool, across restarts and re-admissions — exactly one runs. A second
// claim is refused with ErrLeaseClaimed (the fence answers replay); a
// retry of the same claim is answered as the first. A lease of another
// pool than the claimant's is refused with ErrLeaseOutOfScope.
func (ls *Leases) Claim(ctx context.Context, req ClaimRequest) (_ *record.Claim, err error) {
	ctx, span := tracing.Start(ctx, tracerScope, "authz.claim", attribute.String("fcd.lease", req.Lease))
	defer func() { tracing.End(span, err) }()
	if req.Lease == "" || len(req.Lease) > maxIDLength || req.Epoch == "" || len(req.Epoch) > maxIDLength ||
		req.Revision <= 0 || req.Claim == "" || len(req.Claim) > lease.MaxClaimIDLength {
		return nil, fmt.Errorf("%w: a claim needs epoch, revision (> 0) and claim (1-%d bytes)", ErrBadRequest, lease.MaxClaimIDLength)
	}
	var allow func(string) error
	if len(req.Pools) > 0 {
		allow = func(pool string) error {
			if !slices.Contains(req.Pools, pool) {
				return fmt.Errorf("%w: lease %s is of pool %s", ErrLeaseOutOfScope, req.Lease, pool)
			}
			return nil
		}
	}
	// No effect runs that the audit trail cannot record.
	if err := ls.trail.Ready(); err != nil {
		ls.metrics.claims.WithLabelValues(claimResult(err)).Inc()
		return nil, fmt.Errorf("authz: claim %s: %w", req.Lease, err)
	}
	c, err := ls.store.ClaimLease(ctx, lease.ClaimRequest{Lease: req.Lease, Epoch: req.Epoch, Revision: req.Revision, Claim: req.Claim,
		At: ls.now().UTC()}, allow)
	ls.metrics.claims.WithLabelValues(claimResult(err)).Inc()
	if err != nil {
		return nil, fmt.Errorf("authz: claim %s: %w", req.Lease, err)
	}
	ls.trail.Committed(c.Revision)
	return c, nil
}

func claimResult(err error) string {
	for _, c := range []struct {
		err   error
		label string
	}{
		{record.ErrLeaseClaimed, "claimed"}, {record.ErrLeaseClosed, "closed"}, {record.ErrLeaseUncertain, "uncertain"},
		{record.ErrLeaseNotFound, "not_found"}, {ErrLeaseOutOfScope, "out_of_scope"}, {record.ErrUnavailable, "unavailable"},
	} {
		if errors.Is(err, c.err) {
			return c.label
		}
	}
	if err != nil {
		return "error"
	}
	return "claimed_now"
}

// CompleteRequest is an outcome a backend reports for a lease.
type CompleteRequest struct {
	Lease   string
	Outcome record.Outcome
	Detail  string
	// Claim is the id the lease was claimed under; empty for a release of
	// an unclaimed lease (outcome rejected).
	Claim string
	// Admission, when set, are the facts of the lease's admission from the
	// reporter's dispatch token: with them a common report is one etcd
	// transaction and no read. The store proves them; wrong facts only
	// cost the read they would have saved.
	Admission *record.Admission
	// Failure is what the backend answered a failed or refused call (kept
	// for its recovery); only with outcome failed or rejected.
	Failure *record.Failure
	// Pools, when not empty, limits the reporter to leases of these pools:
	// a lease of another pool is refused with ErrLeaseOutOfScope and left
	// as it is, so a backend of one pool cannot release (or hold) the
	// leases of another — releasing a marker early would let an epoch
	// retire while its effect still runs.
	Pools []string
}

// Complete applies a backend's outcome to a lease. effect (a result),
// failed (an isError result) and rejected (nothing ran) release it —
// effect also records the tool as completed in the session, the only
// thing that meets a requires — and uncertain keeps it, blocking
// retirement until resolved. A claimed lease takes outcomes only under its
// claim (ErrLeaseClaimed); an unclaimed one only rejected, without a claim
// (a release: ErrLeaseNotClaimed otherwise).
func (ls *Leases) Complete(ctx context.Context, req CompleteRequest) (_ *record.Lease, err error) {
	ctx, span := tracing.Start(ctx, tracerScope, "authz.complete", attribute.String("fcd.lease", req.Lease), attribute.String("fcd.outcome", string(req.Outcome)))
	defer func() { tracing.End(span, err) }()
	cr, err := ls.closeRequest(req)
	if err != nil {
		return nil, err
	}
	l, err := ls.store.CloseLease(ctx, cr)
	return ls.completed(ctx, req, l, err)
}

// MaxCompleteBatch bounds the reports of one CompleteAll.
const MaxCompleteBatch = 256

// MaxFailureText bounds a reported failure's error name and message (the
// fence cuts them to 256 bytes; this leaves room for other reporters).
const MaxFailureText = 1024

// CompleteAll applies many outcomes, each as Complete would, with its
// own answer (the lease or the error, by index). The common reports
// among them — with their token's admission facts — go to etcd as one
// transaction.
func (ls *Leases) CompleteAll(ctx context.Context, reqs []CompleteRequest) ([]*record.Lease, []error) {
	ctx, span := tracing.Start(ctx, tracerScope, "authz.complete", attribute.Int("fcd.reports", len(reqs)))
	defer span.End()
	leases, errs := make([]*record.Lease, len(reqs)), make([]error, len(reqs))
	if len(reqs) > MaxCompleteBatch {
		for i := range errs {
			errs[i] = fmt.Errorf("%w: more than %d reports in one request", ErrBadRequest, MaxCompleteBatch)
		}
		return leases, errs
	}
	var crs []lease.CloseRequest
	var at []int
	for i, req := range reqs {
		cr, err := ls.closeRequest(req)
		if err != nil {
			errs[i] = err
			continue
		}
		crs, at = append(crs, cr), append(at, i)
	}
	closed, cerrs := ls.store.CloseLeases(ctx, crs)
	for j, i := range at {
		leases[i], errs[i] = ls.completed(ctx, reqs[i], closed[j], cerrs[j])
	}
	return leases, errs
}

// closeRequest checks a report and makes it the store's request.
func (ls *Leases) closeRequest(req CompleteRequest) (lease.CloseRequest, error) {
	switch req.Outcome {
	case record.OutcomeEffect, record.OutcomeFailed, record.OutcomeRejected, record.OutcomeUncertain:
	default:
		return lease.CloseRequest{}, fmt.Errorf("%w: outcome must be effect, failed, rejected or uncertain", ErrBadRequest)
	}
	if len(req.Claim) > lease.MaxClaimIDLength {
		return lease.CloseRequest{}, fmt.Errorf("%w: claim longer than %d bytes", ErrBadRequest, lease.MaxClaimIDLength)
	}
	if f := req.Failure; f != nil {
		if req.Outcome != record.OutcomeFailed && req.Outcome != record.OutcomeRejected {
			return lease.CloseRequest{}, fmt.Errorf("%w: a failure goes with outcome failed or rejected", ErrBadRequest)
		}
		if len(f.Error) > MaxFailureText || len(f.Message) > MaxFailureText {
			return lease.CloseRequest{}, fmt.Errorf("%w: failure error and message are at most %d bytes", ErrBadRequest, MaxFailureText)
		}
	}
	var allow func(string) error
	if len(req.Pools) > 0 {
		allow = func(pool string) error {
			if !slices.Contains(req.Pools, pool) {
				return fmt.Errorf("%w: lease %s is of pool %s", ErrLeaseOutOfScope, req.Lease, pool)
			}
			return nil
		}
	}
	return lease.CloseRequest{
		Lease: req.Lease, Outcome: req.Outcome, Claim: req.Claim, Keep: ls.retention, AllowPool: allow,
		Admission: req.Admission, Failure: req.Failure,
	}, nil
}

// completed is the answer to a report the store answered with l, err.
func (ls *Leases) completed(ctx context.Context, req CompleteRequest, l *record.Lease, err error) (*record.Lease, error) {
	if err != nil {
		if errors.Is(err, ErrLeaseOutOfScope) {
			l = nil // tell the caller nothing about another pool's lease
		}
		return l, fmt.Errorf("authz: complete %s: %w", req.Lease, err)
	}
	by := "backend"
	if req.Claim == "" {
		by = "release"
	}
	ls.metrics.outcomes.WithLabelValues(string(req.Outcome), by).Inc()
	ls.log.Info("lease outcome", "lease", req.Lease, "outcome", req.Outcome, "detail", req.Detail)
	return l, nil
}

// SweepUnreported marks uncertain the admitted leases whose outcome was
// never reported although their last possible token expired a report
// grace ago (admitted more than 2×ReportGrace + the token lifetime ago):
// a backend that crashed, or a report that was lost. Until then such a
// lease held its epoch back with nothing to show for it; marked uncertain
// it is counted in the epoch's uncertainLeases and an operator can
// resolve it. Safe to run on every replica at once.
func (ls *Leases) SweepUnreported(ctx context.Context) ([]string, error) {
	wait := 2 * ls.grace
	if ls.issuer != nil {
		wait += ls.issuer.Lifetime()
	}
	marked, err := ls.store.MarkUnreported(ctx, ls.now().UTC().Add(-wait))
	ls.metrics.outcomes.WithLabelValues(string(record.OutcomeUncertain), "sweeper").Add(float64(len(marked)))
	ids := make([]string, len(marked))
	for i, l := range marked {
		ids[i] = l.ID
	}
	if err != nil {
		return ids, fmt.Errorf("authz: sweep unreported leases: %w", err)
	}
	return ids, nil
}

// RunSweeper calls SweepUnreported every interval until ctx ends.
func (ls *Leases) RunSweeper(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if marked, err := ls.SweepUnreported(ctx); err != nil {
				ls.log.Warn("sweep of unreported leases", "err", err)
			} else if len(marked) > 0 {
				ls.log.Warn("leases never reported, marked uncertain", "leases", marked)
			}
		}
	}
}

// Resolve is an operator's resolution of an uncertain lease: effect or
// no_effect; either releases the marker. by names the operator (the
// caller's credential id), which the audit trail keeps with it. With
// operator keys configured (Config.Operators) a resolution must be signed
// (ResolveSigned) and Resolve answers ErrResolutionUnsigned: the bearer
// credential alone resolves only where no keys are configured (tests, a
// server not yet given keys).
func (ls *Leases) Resolve(ctx context.Context, by, leaseID string, outcome record.Outcome, reason string) (*record.Lease, error) {
	if ls.operators != nil {
		return nil, fmt.Errorf("%w: this server verifies operator keys; send the resolution signed (authzd lease resolve)", ErrResolutionUnsigned)
	}
	if outcome != record.OutcomeEffect && outcome != record.OutcomeNoEffect {
		return nil, fmt.Errorf("%w: outcome must be effect or no_effect", ErrBadRequest)
	}
	return ls.resolve(ctx, by, leaseID, outcome, reason, nil)
}

// SetGeneration records a newer backend generation of pool and releases
// the pool's open leases (admitted or uncertain) of older generations: the
// old backends are gone, no effect or report can come from them. Repeating
// the current generation finishes an interrupted release. by names the
// operator, which the audit trail keeps.
func (ls *Leases) SetGeneration(ctx context.Context, by, pool string, gen int64) ([]string, error) {
	if pool == "" || len(pool) > maxIDLength {
		return nil, fmt.Errorf("%w: pool", ErrBadRequest)
	}
	if gen <= 0 {
		return nil, fmt.Errorf("%w: generation must be a positive integer", ErrBadRequest)
	}
	ch, err := ls.store.SetGeneration(lease.WithActor(ctx, by), pool, gen, ls.retention)
	ls.generations.Delete(pool)
	released := ch.IDs()
	ls.metrics.outcomes.WithLabelValues(string(record.OutcomeReleased), "generation").Add(float64(len(released)))
	if err != nil {
		if ch.Revision > 0 { // the generation is set; some releases are not
			err = &GenerationIncompleteError{Released: released, Pending: ch.Pending, Err: err}
		}
		return released, fmt.Errorf("authz: generation of %s: %w", pool, err)
	}
	return released, nil
}

// GenerationIncompleteError: a generation change was recorded but stopped
// (the store failed) before it released every older lease. Setting the
// same generation again releases the rest; each release is its own
// compare-and-swap, so none happens twice.
type GenerationIncompleteError struct {
	// Released are the leases released before it stopped; Pending counts
	// the older leases left.
	Released []string
	Pending  int
	Err      error
}

func (e *GenerationIncompleteError) Error() string {
	return fmt.Sprintf("released %d leases, %d left: %v", len(e.Released), e.Pending, e.Err)
}

func (e *GenerationIncompleteError) Unwrap() error { return e.Err }
