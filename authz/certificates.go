package authz

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
)

// Errors of certificates.
var (
	// ErrCertificateMismatch: a verified certificate does not fit the
	// registry: an epoch is not registered, the epochs belong to
	// different servers, or an epoch does not declare the tool.
	ErrCertificateMismatch = errors.New("authz: certificate does not fit the registered epochs")
	// ErrCertificateExpired: the certificate's validity ended before it was
	// registered; it could never give a call a successor.
	ErrCertificateExpired = errors.New("authz: certificate has expired")
	// ErrCertificatesDisabled: no compatibility issuer keys are configured.
	ErrCertificatesDisabled = errors.New("authz: no compatibility issuer keys are configured")
)

// WithCertificateIssuers makes the registry accept compatibility
// certificates signed by the keys of issuers (a trust set separate from the
// registrars'). Call it once, before serving.
func (r *Registry) WithCertificateIssuers(issuers *manifest.Verifier) *Registry {
	r.issuers = issuers
	return r
}

// WithClock makes the registry read time from now (tests); nil means
// time.Now. Call it once, before serving.
func (r *Registry) WithClock(now func() time.Time) *Registry {
	r.clock = now
	return r
}

func (r *Registry) now() time.Time {
	if r.clock == nil {
		return time.Now()
	}
	return r.clock()
}

// RegisterCertificate verifies a signed compatibility certificate against
// the issuer keys, checks it against the registry (both epochs registered,
// of one server, both declaring the tool) and stores it. Registering it
// again returns the stored record with created false.
func (r *Registry) RegisterCertificate(ctx context.Context, jws []byte) (*record.Certificate, bool, error) {
	if r.issuers == nil {
		return nil, false, ErrCertificatesDisabled
	}
	sc, err := r.issuers.VerifyCertificate(jws)
	if err != nil {
		return nil, false, fmt.Errorf("authz: certificate: %w", err)
	}
	c := sc.Certificate
	if now := r.now().UTC(); !now.Before(c.ExpiresAt) {
		return nil, false, fmt.Errorf("%w: it expired at %s", ErrCertificateExpired, c.ExpiresAt.Format(time.RFC3339))
	}
	var server string
	for _, id := range []string{c.Source, c.Target} {
		ep, err := r.store.GetEpoch(ctx, id)
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
	rec, created, err := r.store.RegisterCertificate(ctx, sc)
	if err != nil {
		return nil, false, fmt.Errorf("authz: certificate: %w", err)
	}
	if created {
		r.log.Info("certificate registered", "certificate", rec.ID, "source", c.Source, "target", c.Target, "tool", c.Tool, "signer", sc.KeyID)
	}
	return rec, created, nil
}

// RevokeCertificate revokes a certificate. A formation that captured its
// successor through it loses that successor: admission checks it again.
func (r *Registry) RevokeCertificate(ctx context.Context, id string) (*record.Certificate, error) {
	return r.store.RevokeCertificate(ctx, id)
}

// Certificate returns a registered certificate, revoked or not.
func (r *Registry) Certificate(ctx context.Context, id string) (*record.Certificate, error) {
	return r.store.GetCertificate(ctx, id)
}

// Certificates lists registered certificates, revoked ones included,
// ordered by id: those for calls formed on source (every source when
// empty) of tool (every tool when empty; a tool needs a source).
func (r *Registry) Certificates(ctx context.Context, source, tool string) ([]*record.Certificate, error) {
	if source == "" && tool != "" {
		return nil, fmt.Errorf("%w: tool needs source", ErrBadRequest)
	}
	for _, v := range []string{source, tool} {
		if len(v) > maxIDLength || strings.ContainsAny(v, "/\x00") {
			return nil, fmt.Errorf("%w: source and tool must be ids without '/'", ErrBadRequest)
		}
	}
	return r.store.CertificatesFor(ctx, source, tool)
}
