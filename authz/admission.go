package authz

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/fcd-authz/fcd/authz/policy"
	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/internal/public"
	"github.com/fcd-authz/fcd/internal/tracing"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/record"
	"go.opentelemetry.io/otel/attribute"
)

// Errors of admission and the lease lifecycle.
var (
	// ErrNotApproved: the formation lacks the approvals it needs.
	ErrNotApproved = public.New("authz", "formation is not approved")
	// ErrFormationDenied: the policy or an approver denied the formation.
	ErrFormationDenied = public.New("authz", "formation was denied")
	// ErrPolicyNowDenies: the policy set changed since formation and now
	// denies the call (or asks for more approvals than it has).
	ErrPolicyNowDenies = public.New("authz", "the policy in force now denies the call")
	// ErrSourceDraining: the source epoch is DRAINING; a draining source
	// never substitutes, retry later or form the call again.
	ErrSourceDraining = public.New("authz", "source epoch is draining")
	// ErrSourceStale: the source epoch is STALE and the call cannot run on
	// a successor: none was captured at formation, or the captured one is
	// no longer eligible (the error's text says why).
	ErrSourceStale = public.New("authz", "source epoch is stale and no successor is eligible")
	// ErrLeaseOutOfScope: the reporter's credential is limited to other
	// pools than the lease's.
	ErrLeaseOutOfScope = public.New("authz", "the reporter may not report outcomes for this lease's pool")
	// ErrAdmissionDisabled: this server has no signing key.
	ErrAdmissionDisabled = public.New("authz", "admission is not configured (no signing key)")
)

// Admissions is the use case of gateways: the etcd-ordered admission of a
// ready formation to its source epoch, or to its certified successor once
// the source retired, and the dispatch token that carries the decision to
// the backend.
type Admissions struct {
	trail      *Follower
	store      *lease.Store
	decider    Decider
	successors *successors
	inputs     *policy.InputCache
	// ready is shared with Formations: formations this replica saw
	// become ready; see readyCache.
	ready *readyCache
	// generations caches pool generations (pool → int64), shared with
	// Leases, which drops a pool's entry when it records a newer one; see
	// generation.
	generations *sync.Map
	issuer      *TokenIssuer
	grace       time.Duration
	metrics     *metrics
	now         func() time.Time
	log         *slog.Logger
	decisions   DecisionLogger
}

// Grant is a granted admission: the dispatch token and where it goes. Its
// JSON is the REST answer of an admission (the API's Grant schema).
// (An admission's facts as its token states them are record.Admission.)
type Grant struct {
	Token     string    `json:"token"`
	Lease     string    `json:"lease"`
	Target    Where     `json:"target"`
	ExpiresAt time.Time `json:"expiresAt"`
	// successor and reissued say how it was granted, for metrics.
	successor, reissued bool
}

// Where names an admitted target.
type Where struct {
	Epoch string `json:"epoch"`
	Pool  string `json:"pool"`
}

// Admit performs the etcd-ordered admission of a ready formation and
// returns a dispatch token. Admitting the same formation again while its
// lease is admitted and unclaimed (within the report grace) returns the
// same lease and a token with the same jti; once a backend claimed the
// lease no token is issued for it again (ErrLeaseClaimed). An ACTIVE source always takes the call; a
// DRAINING one answers ErrSourceDraining (never a substitution); a STALE
// one sends it to the successor captured at formation if that is still
// eligible (certificate unrevoked, unexpired and trusted, policy not
// refusing it, successor ACTIVE), else answers ErrSourceStale. If the
// policy set changed since formation it is evaluated again and may deny,
// never widen. An ambiguous etcd error is resolved by reading the
// formation back; the call is never admitted twice.
func (ad *Admissions) Admit(ctx context.Context, id string) (*Grant, error) {
	return ad.admitChecked(ctx, id, nil)
}

// admitChecked is Admit with a check of the formation as read, before
// anything else (a gateway's caller binding); its error is returned as is.
func (ad *Admissions) admitChecked(ctx context.Context, id string, check func(*record.Formation) error) (*Grant, error) {
	ctx, span := tracing.Start(ctx, tracerScope, "authz.admit", attribute.String("fcd.formation", id))
	a, err := ad.admit(ctx, id, check)
	result := admissionResult(a, err)
	ad.metrics.admissions.WithLabelValues(result).Inc()
	span.SetAttributes(attribute.String("fcd.result", result))
	if a != nil {
		span.SetAttributes(attribute.String("fcd.lease", a.Lease), attribute.String("fcd.epoch", a.Target.Epoch), attribute.String("fcd.pool", a.Target.Pool))
	}
	tracing.End(span, err)
	return a, err
}

func (ad *Admissions) admit(ctx context.Context, id string, check func(*record.Formation) error) (*Grant, error) {
	if ad.issuer == nil {
		return nil, ErrAdmissionDisabled
	}
	for attempt := 0; ; attempt++ {
		a, err := ad.admitOnce(ctx, id, attempt == 0, check)
		if errors.Is(err, lease.ErrGenerationChanged) {
			ad.generations.Clear() // the pool is not known here; refill on demand
		}
		if errors.Is(err, lease.ErrFormationChanged) || errors.Is(err, lease.ErrGenerationChanged) ||
			errors.Is(err, lease.ErrCertificateChanged) {
			ad.ready.drop(id)
			if attempt < 8 {
				continue
			}
			return nil, fmt.Errorf("authz: admit %s: %w", id, record.ErrConflict)
		}
		if err != nil {
			return nil, fmt.Errorf("authz: admit %s: %w", id, err)
		}
		return a, nil
	}
}

func (ad *Admissions) admitOnce(ctx context.Context, id string, cached bool, check func(*record.Formation) error) (*Grant, error) {
	rec, rev, ok := ad.ready.take(id)
	if !cached || !ok {
		var err error
		if rec, rev, err = ad.store.GetFormationRevision(ctx, id); err != nil {
			return nil, err
		}
	}
	if check != nil {
		if err := check(rec); err != nil {
			if ok {
				ad.ready.put(rec, rev) // untouched: keep it for its caller
			}
			return nil, err
		}
	}
	now := ad.now().UTC()
	switch rec.Status {
	case record.StatusAdmitted:
		return ad.reissue(ctx, rec, now)
	case record.StatusReady:
	case record.StatusPendingApproval:
		if !now.Before(rec.ExpiresAt) {
			return nil, ErrExpired
		}
		return nil, fmt.Errorf("%w: %d of %d approvals", ErrNotApproved, approvedBy(rec), rec.ApprovalsRequired)
	case record.StatusDenied:
		return nil, ErrFormationDenied
	case record.StatusExpired:
		return nil, ErrExpired
	case record.StatusUncertain:
		return nil, record.ErrLeaseUncertain
	default: // completed, rejected
		return nil, fmt.Errorf("%w: formation is %s", record.ErrLeaseClosed, rec.Status)
	}
	if !now.Before(rec.ExpiresAt) {
		return nil, ErrExpired
	}
	// The MCP+ invariant, again at the last gate: a write or delete never
	// goes without its approvals, whatever got it to "ready".
	if !ready(rec) {
		return nil, fmt.Errorf("%w: %d of %d approvals", ErrNotApproved, approvedBy(rec), requiredApprovals(rec))
	}
	successorAllowed, err := ad.recheck(ctx, rec)
	if err != nil {
		return nil, err
	}
	// Do not open a lease that could not be given a token, nor one the
	// audit trail could not record.
	if !ad.issuer.Published() {
		return nil, ErrSigningKeyUnpublished
	}
	if err := ad.trail.Ready(); err != nil {
		return nil, err
	}
	// The source always wins while it is ACTIVE.
	a, err := ad.admitTo(ctx, rec, rev, rec.Source, nil, now)
	var se *record.StateError
	if !errors.As(err, &se) {
		return a, err
	}
	switch {
	case se.State == record.StateDraining:
		// A draining source never substitutes: its open leases may still
		// run there.
		return nil, ErrSourceDraining
	case se.State != record.StateStale:
		return nil, fmt.Errorf("%w: source epoch %s is %s", ErrSourceStale, se.Epoch, se.State)
	case rec.Successor == nil:
		return nil, ErrSourceStale
	case !successorAllowed:
		return nil, fmt.Errorf("%w: the policy in force refuses the successor", ErrSourceStale)
	}
	cert, err := ad.successors.admission(ctx, rec, now)
	if err != nil {
		return nil, err
	}
	a, err = ad.admitTo(ctx, rec, rev, rec.Successor.Target, cert, now)
	if errors.As(err, &se) {
		return nil, fmt.Errorf("%w: successor epoch %s is %s", ErrSourceStale, rec.Successor.Epoch, se.State)
	}
	return a, err
}

// admitTo runs the admission transaction of rec to target: its source, or
// (with the certificate it relies on) its successor once the source is
// STALE. A *record.StateError is returned as is for the caller to map.
func (ad *Admissions) admitTo(ctx context.Context, rec *record.Formation, rev int64, target record.Target, cert *record.Certificate, now time.Time) (*Grant, error) {
	gen, err := ad.generation(ctx, target.Pool)
	if err != nil {
		return nil, err
	}
	lid, err := lease.NewLeaseID()
	if err != nil {
		return nil, err
	}
	l := &record.Lease{
		ID: lid, Formation: rec.ID, Session: rec.Session, Tool: rec.Tool, ArgumentDigest: rec.ArgumentDigest,
		Target: target, Generation: gen, AdmittedAt: now,
	}
	if rec.Recovery != nil {
		l.RecoveryOf = rec.Recovery.Root
	}
	req := lease.AdmitRequest{Formation: rec, FormationRev: rev, Lease: l}
	if cert != nil {
		l.Certificate = cert.ID
		req.StaleSource, req.Certificate = rec.Source.Epoch, cert
	}
	// The dependencies come from the record: the descriptor the call was
	// formed and decided against. The transaction checks them, and the
	// epoch's state, against the ledger as etcd orders it.
	if d := rec.Metadata.Dependencies; d != nil {
		req.Requires = qualify(rec.Source.Server, d.Requires)
		req.Exclusive = qualify(rec.Source.Server, d.ExclusiveWith)
	}
	err = ad.store.Admit(ctx, req)
	switch {
	case errors.Is(err, record.ErrUnavailable):
		// The commit may or may not have happened: read back.
		return ad.readBack(ctx, rec.ID, lid, now, err)
	case err != nil:
		return nil, err
	}
	ad.ready.drop(rec.ID)
	ad.trail.Committed(l.Revision)
	ad.log.InfoContext(ctx, "admitted", "formation", rec.ID, "lease", lid, "epoch", l.Target.Epoch, "pool", l.Target.Pool,
		"revision", l.Revision, "certificate", l.Certificate)
	return ad.token(ctx, l, now)
}

// generation returns the pool's backend generation from a cache: the
// admission transaction compares it, so a stale value costs one retry
// (the cache entry is dropped on ErrGenerationChanged), never a wrong
// token.
func (ad *Admissions) generation(ctx context.Context, pool string) (int64, error) {
	if g, ok := ad.generations.Load(pool); ok {
		return g.(int64), nil
	}
	g, err := ad.store.PoolGeneration(ctx, pool)
	if err != nil {
		return 0, err
	}
	ad.generations.Store(pool, g)
	return g, nil
}

func qualify(server string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = server + "/" + n
	}
	return out
}

// recheck evaluates the policy again when the set in force differs from
// the one that decided the formation. It can only narrow: a deny, or an
// obligation of more approvals than were given, refuses the admission; a
// refusal of the successor takes the successor away (successorAllowed
// false) and leaves the source.
func (ad *Admissions) recheck(ctx context.Context, rec *record.Formation) (successorAllowed bool, err error) {
	if d := ad.decider.Digest(); d != "" && d == rec.Decision.PolicyDigest {
		return true, nil
	}
	tool, epoch, err := ad.store.ResolveTool(ctx, rec.Snapshot, rec.Tool)
	if err != nil {
		return false, err
	}
	history, err := ad.store.SessionHistory(ctx, rec.Session)
	if err != nil {
		return false, err
	}
	in := &policy.Input{
		Phase:     policy.PhaseAdmission,
		Formation: ad.inputs.Formation(rec.Call, rec.Digest),
		Tool:      ad.inputs.Tool(tool.DescriptorDigest, epoch.Server, tool.Descriptor),
		Epoch:     ad.inputs.Epoch(epoch),
		Session:   *history,
	}
	if rec.Successor != nil {
		switch in.Successor, err = ad.successors.policyInput(ctx, rec.Successor); {
		case errors.Is(err, record.ErrCertificateNotFound) || errors.Is(err, record.ErrEpochNotFound):
			// The admission of the successor refuses it anyway; decide
			// the call as if it had none.
			in.Formation.Successor = nil
		case err != nil:
			return false, err
		}
	}
	d := ad.decider.Decide(ctx, in)
	logDecision(ctx, ad.decisions, in, d, rec)
	if d.PolicyDigest == rec.Decision.PolicyDigest {
		return true, nil
	}
	if !d.Allowed() {
		return false, fmt.Errorf("%w: %s", ErrPolicyNowDenies, reasons(d))
	}
	if d.Approvals > approvedBy(rec) {
		return false, fmt.Errorf("%w: it now needs %d approvals, the formation has %d", ErrPolicyNowDenies, d.Approvals, approvedBy(rec))
	}
	return in.Successor != nil && d.Successor != nil && d.Successor.Verdict == record.VerdictAllow, nil
}

func reasons(d record.Decision) string {
	var out []string
	for _, e := range d.Engines {
		if e.Verdict != record.VerdictAllow {
			out = append(out, fmt.Sprintf("%s: %v %v %s", e.Engine, e.Rules, e.Reasons, e.Error))
		}
	}
	return fmt.Sprint(out)
}

// CanSign reports whether this replica can issue dispatch tokens now: nil,
// ErrAdmissionDisabled (no signing key) or ErrSigningKeyUnpublished (its
// public key is not in etcd yet, or was lost with etcd): /readyz is not
// ready without it, since every admission would be refused.
func (ad *Admissions) CanSign() error {
	switch {
	case ad.issuer == nil:
		return ErrAdmissionDisabled
	case !ad.issuer.Published():
		return ErrSigningKeyUnpublished
	}
	return nil
}

// reissue answers a repeated admission of an admitted formation: the same
// lease and jti while the lease is open, within the report grace after
// the admission. Past it the lease is taken for unreported: marked
// uncertain (see SweepUnreported), and no token is issued.
func (ad *Admissions) reissue(ctx context.Context, rec *record.Formation, now time.Time) (*Grant, error) {
	l, err := ad.store.OpenLease(ctx, rec.Lease)
	if err != nil {
		return nil, err
	}
	if cutoff := now.Add(-ad.grace); l.State == record.LeaseAdmitted && l.AdmittedAt.Before(cutoff) {
		if _, err := ad.store.MarkLeaseUnreported(ctx, l.ID, cutoff); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w: admitted %s ago and never reported", record.ErrLeaseUncertain, now.Sub(l.AdmittedAt).Round(time.Second))
	}
	switch l.State {
	case record.LeaseUncertain:
		return nil, record.ErrLeaseUncertain
	case record.LeaseRunning:
		// The call is running (or ran) under this lease: its outcome will
		// be reported; a second token could only be refused at the fence.
		return nil, fmt.Errorf("%w: the call is running; its outcome will be reported", record.ErrLeaseClaimed)
	}
	a, err := ad.token(ctx, l, now)
	if err != nil {
		return nil, err
	}
	// Authority handed out again is a change the store records (and the
	// trail with it) before the token goes: none the record lacks.
	if err := ad.trail.Ready(); err != nil {
		return nil, err
	}
	if err := ad.store.RecordReissue(ctx, l, a.ExpiresAt); err != nil {
		return nil, err
	}
	a.reissued = true
	return a, nil
}

// readBack resolves an ambiguous admission: admitted with our lease id
// means it committed; anything else means it did not, and the caller may
// retry. If the store cannot answer, nothing is dispatched.
func (ad *Admissions) readBack(ctx context.Context, id, lid string, now time.Time, cause error) (*Grant, error) {
	// A short look: the store just failed to answer a write, most likely
	// for want of a quorum, and failing closed fast matters more than
	// saving the host a retry (a retried admission of a formation the
	// commit did admit answers the same lease).
	ctx, cancel := context.WithTimeout(ctx, readBackTimeout)
	defer cancel()
	rec, err := ad.store.GetFormation(ctx, id)
	if err != nil {
		return nil, cause
	}
	if rec.Status == record.StatusAdmitted && rec.Lease == lid {
		l, err := ad.store.OpenLease(ctx, lid)
		if err != nil {
			return nil, cause
		}
		return ad.token(ctx, l, now)
	}
	return nil, cause
}

// readBackTimeout bounds the read-back of an admission whose commit's
// outcome is unknown.
const readBackTimeout = 250 * time.Millisecond

// token signs the dispatch token of an open lease.
func (ad *Admissions) token(ctx context.Context, l *record.Lease, now time.Time) (*Grant, error) {
	_, span := tracing.Start(ctx, tracerScope, "authz.sign_token", attribute.String("fcd.lease", l.ID))
	tok, exp, err := ad.issuer.sign(fencecheck.Claims{
		Audience: l.Target.Pool, Subject: l.Session, ID: l.ID,
		Formation: l.Formation, Tool: l.Tool, ArgumentDigest: l.ArgumentDigest,
		Epoch: l.Target.Epoch, Artifact: l.Target.Artifact.ID(), Config: l.Target.ConfigDigest,
		Generation: l.Generation, Revision: l.Revision, Cluster: l.Cluster,
		Admitted: l.AdmittedAt.UnixMilli(), RecoveryOf: l.RecoveryOf,
	}, now)
	tracing.End(span, err)
	if err != nil {
		return nil, err
	}
	return &Grant{Token: tok, Lease: l.ID, Target: Where{Epoch: l.Target.Epoch, Pool: l.Target.Pool}, ExpiresAt: exp,
		successor: l.Certificate != ""}, nil
}

// JWKS returns the JSON Web Key Set of every published signing key.
func (ad *Admissions) JWKS(ctx context.Context) ([]byte, error) {
	keys, err := ad.store.PublishedKeys(ctx)
	if err != nil {
		return nil, err
	}
	raw := make([]json.RawMessage, len(keys))
	for i, k := range keys {
		raw[i] = k
	}
	return json.Marshal(map[string]any{"keys": raw})
}
