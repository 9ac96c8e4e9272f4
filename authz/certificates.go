package authz

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/fcd-authz/fcd/internal/public"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
)

// Errors of certificates.
var (
	// ErrCertificateMismatch: a verified certificate does not fit the
	// registry: an epoch is not registered, the epochs belong to
	// different servers, or an epoch does not declare the tool.
	ErrCertificateMismatch = public.New("authz", "certificate does not fit the registered epochs")
	// ErrCertificateExpired: the certificate's validity ended before it was
	// registered; it could never give a call a successor.
	ErrCertificateExpired = public.New("authz", "certificate has expired")
	// ErrCertificatesDisabled: no compatibility issuer keys are configured.
	ErrCertificatesDisabled = public.New("authz", "no compatibility issuer keys are configured")
)

// Certificates is the use case of compatibility issuers and operators:
// register, revoke and read the signed certificates a formation's
// successor is captured through. It is part of the [Registry].
type Certificates struct {
	store *lease.Store
	// issuers verifies certificates; nil refuses them.
	issuers *manifest.Verifier
	now     func() time.Time
	log     *slog.Logger
}

// Register verifies a signed compatibility certificate against
// the issuer keys, checks it against the registry (both epochs registered,
// of one server, both declaring the tool) and stores it. Registering it
// again returns the stored record with created false.
func (cs *Certificates) Register(ctx context.Context, jws []byte) (*record.Certificate, bool, error) {
	if cs.issuers == nil {
		return nil, false, ErrCertificatesDisabled
	}
	sc, err := cs.issuers.VerifyCertificate(jws)
	if err != nil {
		return nil, false, fmt.Errorf("authz: certificate: %w", err)
	}
	c := sc.Certificate
	if now := cs.now().UTC(); !now.Before(c.ExpiresAt) {
		return nil, false, fmt.Errorf("%w: it expired at %s", ErrCertificateExpired, c.ExpiresAt.Format(time.RFC3339))
	}
	var server string
	for _, id := range []string{c.Source, c.Target} {
		ep, err := cs.store.EpochNow(ctx, id)
		if errors.Is(err, record.ErrEpochNotFound) {
			return nil, false, fmt.Errorf("%w: epoch %s is not registered", ErrCertificateMismatch, id)
		}
		if err != nil {
			return nil, false, fmt.Errorf("authz: certificate: %w", err)
		}
		if server != "" && ep.Server != server {
			return nil, false, fmt.Errorf("%w: the epochs belong to servers %s and %s", ErrCertificateMismatch, server, ep.Server)
		}
		server = ep.Server
		if ep.Manifest.Tool(c.Tool) == nil {
			return nil, false, fmt.Errorf("%w: epoch %s does not declare %s", ErrCertificateMismatch, id, c.Tool)
		}
	}
	rec, created, err := cs.store.RegisterCertificate(ctx, sc)
	if err != nil {
		return nil, false, fmt.Errorf("authz: certificate: %w", err)
	}
	if created {
		cs.log.Info("certificate registered", "certificate", rec.ID, "source", c.Source, "target", c.Target, "tool", c.Tool, "signer", sc.KeyID)
	}
	return rec, created, nil
}

// Revoke revokes a certificate. A formation that captured its
// successor through it loses that successor: admission checks it again.
// by names the operator, which the audit trail keeps.
func (cs *Certificates) Revoke(ctx context.Context, by, id string) (*record.Certificate, error) {
	rec, err := cs.store.RevokeCertificate(lease.WithActor(ctx, by), id)
	if err == nil {
		cs.log.Info("certificate revoked", "certificate", id, "by", by)
	}
	return rec, err
}

// Get returns a registered certificate, revoked or not.
func (cs *Certificates) Get(ctx context.Context, id string) (*record.Certificate, error) {
	return cs.store.GetCertificate(ctx, id)
}

// List lists registered certificates, revoked ones included,
// ordered by id: those for calls formed on source (every source when
// empty) of tool (every tool when empty; a tool needs a source).
func (cs *Certificates) List(ctx context.Context, source, tool string) ([]*record.Certificate, error) {
	if source == "" && tool != "" {
		return nil, fmt.Errorf("%w: tool needs source", ErrBadRequest)
	}
	for _, v := range []string{source, tool} {
		if len(v) > maxIDLength || strings.ContainsAny(v, "/\x00") {
			return nil, fmt.Errorf("%w: source and tool must be ids without '/'", ErrBadRequest)
		}
	}
	return cs.store.CertificatesFor(ctx, source, tool)
}
