package authz

import (
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/fcd-authz/fcd/authz/policy"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
)

// Defaults of the zero Config's durations (and of authzd's flags).
const (
	// DefaultTTL is how long a formation may wait for approval and
	// admission.
	DefaultTTL = 15 * time.Minute
	// DefaultRetention is how long a record is kept after it expires.
	DefaultRetention = 24 * time.Hour
	// DefaultReportGrace is how long after an admission its token may be
	// issued again and its outcome report is awaited.
	DefaultReportGrace = 5 * time.Minute
)

// Config configures the use cases of [New]. Store and Decider are
// required; zero values of the other fields mean their defaults.
type Config struct {
	// Store is the ordered store. Required.
	Store *lease.Store
	// Decider decides formations by policy. Required.
	Decider Decider
	// TTL is how long a formation may wait for approval and admission;
	// zero means DefaultTTL.
	TTL time.Duration
	// Retention is how long a record is kept after it expires, for audit;
	// zero means DefaultRetention.
	Retention time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// Issuer signs dispatch tokens; nil disables admission.
	Issuer *TokenIssuer
	// ReportGrace is how long after an admission its dispatch token may be
	// issued again (a retried admission) and an outcome report is awaited
	// beyond the last token's expiry; an admitted lease still unreported
	// after 2×ReportGrace + the token lifetime is marked uncertain by
	// Leases.SweepUnreported. Zero means DefaultReportGrace.
	ReportGrace time.Duration
	// Manifests verifies registration manifests (the registrar keys) for
	// the Registry New builds; nil refuses every registration
	// (ErrRegistrationDisabled).
	Manifests *manifest.Verifier
	// Certificates verifies compatibility certificates (the issuer keys):
	// the Registry stores only certificates that verify against it, a
	// formation captures a successor only through a certificate that
	// verifies against it at formation, and is admitted to it only if it
	// still does; nil refuses certificates and no call ever has a
	// successor.
	Certificates *manifest.Verifier
	// Operators verifies operators' signed resolutions of uncertain leases
	// (the operator keys). With it a resolution must be signed by one of
	// them (Leases.ResolveSigned); nil means an operator's bearer
	// credential alone resolves (Leases.Resolve), as for --dev and tests.
	Operators *manifest.Verifier
	// GatewayCaller says whether a gateway admission is bound to the
	// caller the gateway authenticated; zero means CallerPrincipal.
	GatewayCaller CallerBinding
	// Trail is this replica's audit trail, a Follower of the store:
	// admissions and claims are refused (ErrTrailBehind) while it is not
	// Ready, so that no effect runs that the trail cannot record. Nil
	// keeps no trail and refuses nothing.
	Trail *Follower
	// DecisionLog receives every policy decision (OPA's decision log:
	// authz/decisionlog); nil logs none.
	DecisionLog DecisionLogger
	// Notifier sends the approval webhooks; only its metrics are the use
	// cases' (Collectors). Nil sends none.
	Notifier *Notifier
}

// UseCases are fcd's use cases over one store, split by who calls them:
// hosts and approvers form and approve calls (Formations), gateways admit
// them (Admissions, and Gate for a request of an MCP session), backends
// and operators close their leases (Leases). They share one replica's
// caches — a formation this replica saw become ready, pool generations,
// verified certificates, compiled schemas — and one set of metrics.
type UseCases struct {
	// Registry registers manifests and certificates, lists snapshots and
	// drains and retires epochs, on the same store, trust sets and trail.
	Registry   *Registry
	Formations *Formations
	Admissions *Admissions
	Leases     *Leases
	Gate       *Gate
	metrics    *metrics
	decisions  DecisionLogger
	decider    Decider
	notifier   *Notifier
}

// New returns the use cases configured by cfg.
func New(cfg Config) (*UseCases, error) {
	if cfg.Store == nil || cfg.Decider == nil {
		return nil, errors.New("authz: Config.Store and Config.Decider are required")
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.ReportGrace <= 0 {
		cfg.ReportGrace = DefaultReportGrace
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.GatewayCaller == "" {
		cfg.GatewayCaller = CallerPrincipal
	}
	m := newMetrics()
	ready := &readyCache{}
	ready.entries.Max = maxReadyCache
	schemas := &schemaCache{}
	inputs := &policy.InputCache{}
	generations := &sync.Map{}
	succ := &successors{store: cfg.Store, issuers: cfg.Certificates, schemas: schemas, inputs: inputs, log: cfg.Logger}
	succ.verified.entries.Max = maxVerifiedCache
	u := &UseCases{metrics: m, decisions: cfg.DecisionLog, decider: cfg.Decider, notifier: cfg.Notifier}
	var err error
	u.Registry, err = NewRegistry(RegistryConfig{Store: cfg.Store, Manifests: cfg.Manifests, Certificates: cfg.Certificates,
		Now: cfg.Now, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	u.Formations = &Formations{
		store: cfg.Store, decider: cfg.Decider, successors: succ, schemas: schemas, inputs: inputs, ready: ready, metrics: m,
		ttl: cfg.TTL, keep: formationKeep(cfg), now: cfg.Now, log: cfg.Logger, decisions: cfg.DecisionLog,
	}
	u.Admissions = &Admissions{
		store: cfg.Store, decider: cfg.Decider, successors: succ, inputs: inputs, ready: ready, generations: generations,
		issuer: cfg.Issuer, grace: cfg.ReportGrace, metrics: m, now: cfg.Now, log: cfg.Logger, trail: cfg.Trail, decisions: cfg.DecisionLog,
	}
	u.Leases = &Leases{
		store: cfg.Store, issuer: cfg.Issuer, generations: generations, grace: cfg.ReportGrace,
		retention: cfg.Retention, metrics: m, now: cfg.Now, log: cfg.Logger, trail: cfg.Trail,
		operators: cfg.Operators,
	}
	u.Gate = &Gate{formations: u.Formations, admissions: u.Admissions, caller: cfg.GatewayCaller}
	return u, nil
}

// sweepSlack covers the sweeper's period (authzd sweeps every minute)
// and clock skew between replicas.
const sweepSlack = 2 * time.Minute

// formationKeep is how long a formation's record and state are stored
// from its creation. The common outcome report does not rewrite them (it
// writes the outcome alone, kept the retention from the report), so they
// must outlast the longest a lease can stay open without turning
// uncertain: admitted within the TTL, claimed before the sweep would mark
// it (2×ReportGrace + the token lifetime after admission), reported
// before the sweep marks the claim (as long again). Marking a lease
// uncertain detaches its record, and closing it then keeps it the
// retention from the close. After that, retention.
func formationKeep(cfg Config) time.Duration {
	window := 2 * cfg.ReportGrace
	if cfg.Issuer != nil {
		window += cfg.Issuer.Lifetime()
	}
	return cfg.TTL + 2*(window+sweepSlack) + cfg.Retention
}
