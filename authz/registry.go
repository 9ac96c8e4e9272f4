package authz

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/fcd-authz/fcd/internal/public"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
)

// MaxRetireWait bounds how long one retire call may wait for lease markers
// to clear.
const MaxRetireWait = 5 * time.Minute

// ErrRegistrationDisabled: the registry has no registrar keys
// (RegistryConfig.Manifests), so no signer is trusted.
var ErrRegistrationDisabled = fmt.Errorf("%w: no registrar keys are configured", manifest.ErrUntrustedSigner)

// Registry is the use case of registrars, operators and hosts: epochs from
// signed manifests, their lifecycle, and catalog snapshots.
type Registry struct {
	// Certificates registers and revokes compatibility certificates
	// between the registry's epochs.
	Certificates *Certificates
	store        *lease.Store
	verifier     *manifest.Verifier
	log          *slog.Logger
}

// RegistryConfig configures a [Registry]. Store is required; zero values
// of the other fields mean their defaults.
type RegistryConfig struct {
	// Store is the ordered store. Required.
	Store *lease.Store
	// Manifests verifies registration manifests (the registrar keys); nil
	// refuses every registration (ErrRegistrationDisabled).
	Manifests *manifest.Verifier
	// Certificates verifies compatibility certificates (the issuer keys,
	// a trust set separate from the registrars'); nil refuses them
	// (ErrCertificatesDisabled).
	Certificates *manifest.Verifier
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// NewRegistry returns the registry configured by cfg.
func NewRegistry(cfg RegistryConfig) (*Registry, error) {
	if cfg.Store == nil {
		return nil, errors.New("authz: RegistryConfig.Store is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Registry{
		Certificates: &Certificates{store: cfg.Store, issuers: cfg.Certificates, now: cfg.Now, log: cfg.Logger},
		store:        cfg.Store, verifier: cfg.Manifests, log: cfg.Logger,
	}, nil
}

// Registration is the outcome of registering a manifest.
type Registration struct {
	Epoch *record.Epoch
	// Created is false when the same manifest was registered before.
	Created bool
	// Findings are the lint warnings of an accepted manifest.
	Findings []manifest.Finding
}

// Register verifies a signed manifest (JWS) against the trusted registrar
// keys, decodes it strictly, lints it, and stores it as an ACTIVE epoch.
// A manifest with lint errors is refused with a *LintError. Registering
// the same manifest again returns the existing epoch.
func (r *Registry) Register(ctx context.Context, jws []byte) (*Registration, error) {
	if r.verifier == nil {
		return nil, ErrRegistrationDisabled
	}
	sm, err := r.verifier.VerifyManifest(jws)
	if err != nil {
		return nil, fmt.Errorf("authz: register: %w", err)
	}
	findings := manifest.Lint(sm.Manifest)
	if manifest.HasErrors(findings) {
		return nil, fmt.Errorf("authz: register %s: %w", sm.Manifest.Server.Name, &manifest.LintError{Findings: findings})
	}
	ep, created, err := r.store.RegisterEpoch(ctx, sm)
	if err != nil {
		return nil, fmt.Errorf("authz: register: %w", err)
	}
	if created {
		r.log.Info("epoch registered", "epoch", ep.ID, "server", ep.Server, "release", ep.Release, "signer", sm.KeyID)
	}
	return &Registration{Epoch: ep, Created: created, Findings: findings}, nil
}

// Epochs lists epochs.
func (r *Registry) Epochs(ctx context.Context, f record.EpochFilter) ([]*record.Epoch, error) {
	return r.store.ListEpochs(ctx, f)
}

// Epoch shows one epoch with its manifest.
func (r *Registry) Epoch(ctx context.Context, id string) (*record.Epoch, error) {
	return r.store.GetEpoch(ctx, id)
}

// Leases returns the open leases of an epoch (admitted or uncertain):
// what holds its retirement back.
func (r *Registry) Leases(ctx context.Context, epoch string) ([]*record.Lease, error) {
	return r.store.EpochLeases(ctx, epoch)
}

// Drain moves an ACTIVE epoch to DRAINING. by names the operator (the
// caller's credential id), which the audit trail keeps.
func (r *Registry) Drain(ctx context.Context, by, id string) (record.State, error) {
	st, _, err := r.store.DrainAt(lease.WithActor(ctx, by), id)
	return st, err
}

// ErrWaitTooLong is returned for a retire wait beyond MaxRetireWait.
var ErrWaitTooLong = public.New("authz", "retire wait too long")

// Retire moves a DRAINING epoch to STALE once no lease marker remains,
// waiting up to wait for markers to clear. by names the operator.
func (r *Registry) Retire(ctx context.Context, by, id string, wait time.Duration) (record.State, error) {
	if wait < 0 || wait > MaxRetireWait {
		return "", fmt.Errorf("%w: %s (at most %s)", ErrWaitTooLong, wait, MaxRetireWait)
	}
	st, _, err := r.store.RetireAt(lease.WithActor(ctx, by), id, wait)
	return st, err
}

// CreateSnapshot freezes the ACTIVE catalog, optionally of some servers.
func (r *Registry) CreateSnapshot(ctx context.Context, servers []string) (*record.Snapshot, error) {
	s, _, err := r.store.CreateSnapshot(ctx, servers)
	return s, err
}

// Snapshot returns a snapshot's summary view.
func (r *Registry) Snapshot(ctx context.Context, id string) (*record.Snapshot, error) {
	return r.store.GetSnapshot(ctx, id)
}

// SnapshotFull returns a snapshot with every full descriptor.
func (r *Registry) SnapshotFull(ctx context.Context, id string) ([]record.FullTool, error) {
	_, full, err := r.store.GetSnapshotFull(ctx, id)
	return full, err
}

// SnapshotTool returns one tool of a snapshot, named "server/tool".
func (r *Registry) SnapshotTool(ctx context.Context, id, name string) (*record.FullTool, error) {
	return r.store.SnapshotTool(ctx, id, name)
}

// Ready reports whether the store answers; a server that is not ready
// must not dispatch.
func (r *Registry) Ready(ctx context.Context) error { return r.store.Ping(ctx) }

// StoreEndpoints are the etcd endpoints requests go to now (those that
// answer) and all those configured.
func (r *Registry) StoreEndpoints() (answering, all []string) { return r.store.Endpoints() }

// StoreHealth is the store's size, quota and active alarms.
type StoreHealth = lease.Health

// Alarms of StoreHealth.Alarms.
const (
	AlarmNoSpace = lease.AlarmNoSpace
	AlarmCorrupt = lease.AlarmCorrupt
)

// StoreHealth reads the store's size, quota and alarms from etcd (a few
// maintenance calls, no key ranges): what /readyz and the metrics show
// so that an operator sees the store fill before etcd refuses writes.
func (r *Registry) StoreHealth(ctx context.Context) (StoreHealth, error) {
	return r.store.Health(ctx)
}

// StoreGauges are the formations waiting for approval and the open
// leases per epoch (uncertain ones among them), read in one revision.
type StoreGauges = lease.Gauges

// StoreGauges reads the gauges operators watch from the store: a
// count-only range and a bounded range over the lease markers (one per
// open call), for the metrics scrape, which caches it.
func (r *Registry) StoreGauges(ctx context.Context) (StoreGauges, error) {
	return r.store.Gauges(ctx)
}
