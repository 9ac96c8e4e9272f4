package lease

import (
	"context"
	"fmt"

	"github.com/fcd-authz/fcd/record"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Exposure is what an etcd cluster lets a client do that does not hold
// fcd's credential: what anyone who can reach the cluster can change of
// what fcd trusts (docs/trust.md).
type Exposure struct {
	// Anonymous: a client without any credential — no client certificate,
	// no user — read fcd's prefix. Every process that reaches an endpoint
	// can then also write the formations, approvals and published keys.
	Anonymous bool `json:"anonymous"`
	// AuthDisabled: etcd's authentication is off, so every client the
	// cluster lets in (each certificate its CA ever signed) may read and
	// write every key, fcd's prefix included; with it on, a client is
	// limited to its user's roles.
	AuthDisabled bool `json:"authDisabled"`
}

// Open reports whether anything but fcd's own credential can write.
func (e Exposure) Open() bool { return e.Anonymous || e.AuthDisabled }

// Exposure asks the cluster how open it is: a read of fcd's prefix by a
// client of its own that keeps the store's TLS trust (the CA) but presents
// no certificate, and etcd's authentication status through the store's
// client. Each within the store's operation timeout. It fails only when
// the cluster does not answer the store itself: a probe client that is
// refused — by the TLS handshake, or by etcd for want of a user — is what
// a closed cluster does.
func (s *Store) Exposure(ctx context.Context) (Exposure, error) {
	var e Exposure
	octx, cancel := s.op(ctx)
	defer cancel()
	status, err := s.cli.AuthStatus(octx)
	if err != nil {
		// Not s.wrap: that logs every failure, and the caller, a
		// background check, says once that it fails.
		if cerr := ctx.Err(); cerr != nil {
			return e, fmt.Errorf("lease: exposure: %w", cerr)
		}
		return e, fmt.Errorf("%w: auth status: %v", record.ErrUnavailable, err)
	}
	e.AuthDisabled = !status.Enabled

	anon := s.tls
	if anon != nil {
		anon = anon.Clone()
		anon.Certificates, anon.GetClientCertificate = nil, nil
	}
	_, all := s.Endpoints()
	cli, err := clientv3.New(clientv3.Config{Endpoints: all, TLS: anon, DialTimeout: s.opTimeout, Logger: zap.NewNop(), Context: ctx})
	if err != nil {
		return e, fmt.Errorf("lease: anonymous probe client: %w", err)
	}
	defer cli.Close()
	pctx, pcancel := s.op(ctx)
	defer pcancel()
	_, err = cli.Get(pctx, s.k.ping(), clientv3.WithCountOnly())
	if cerr := ctx.Err(); cerr != nil {
		return e, fmt.Errorf("lease: exposure: %w", cerr)
	}
	e.Anonymous = err == nil
	return e, nil
}
