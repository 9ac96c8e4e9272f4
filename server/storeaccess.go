package server

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/fcd-authz/fcd/lease"
	"go.etcd.io/etcd/client/pkg/v3/transport"
)

// StoreAccess is how every client of fcd's store reaches it — the server
// and each `authzd store` command that talks to etcd: the external cluster
// EtcdEndpoints names, with the TLS files EtcdCA, EtcdCert and EtcdKey, or
// else the embedded member of DataDir, with the client credential it
// generated (lease.EmbeddedAccess; the member must have started there
// once). One function, so that all of them present the same credential.
func (c Config) StoreAccess() (lease.ClientAccess, error) {
	if len(c.EtcdEndpoints) == 0 {
		return lease.EmbeddedAccess(c.EtcdDir())
	}
	acc := lease.ClientAccess{Endpoints: c.EtcdEndpoints, CAFile: c.EtcdCA, CertFile: c.EtcdCert, KeyFile: c.EtcdKey}
	if c.EtcdCA != "" || c.EtcdCert != "" {
		info := transport.TLSInfo{TrustedCAFile: c.EtcdCA, CertFile: c.EtcdCert, KeyFile: c.EtcdKey}
		var err error
		if acc.TLS, err = info.ClientConfig(); err != nil {
			return lease.ClientAccess{}, fmt.Errorf("etcd TLS: %w", err)
		}
	}
	return acc, nil
}

// accessCheckInterval is how often an external cluster is asked whether it
// lets in clients without fcd's credential.
const accessCheckInterval = time.Minute

// accessWatch keeps what /readyz warns about an external cluster's access
// control: that it accepts clients without any credential, or that its
// authentication is off (every certificate of its CA may write fcd's
// keys). A warning does not make the replica unready: the cluster answers
// and fcd works as it did; what is at risk is that something else can
// change what fcd trusts, which an operator must fix in etcd
// (docs/trust.md). Each change of the finding is logged once.
type accessWatch struct {
	store     *lease.Store
	endpoints []string
	log       *slog.Logger

	mu       sync.Mutex
	warnings []string
	checked  bool
	failing  bool // the last check failed
}

// Warnings returns the warnings of the last check, and whether there was
// one.
func (w *accessWatch) Warnings() ([]string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.warnings), w.checked
}

// run checks now and every interval until ctx ends.
func (w *accessWatch) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		w.check(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// check asks the cluster once. A check that fails keeps the last finding
// (a cluster that does not answer: /readyz already says the store is
// unavailable); the first failure of a run of them is logged.
func (w *accessWatch) check(ctx context.Context) {
	e, err := w.store.Exposure(ctx)
	w.mu.Lock()
	first := err != nil && !w.failing
	w.failing = err != nil
	w.mu.Unlock()
	if first && ctx.Err() == nil {
		w.log.Warn("etcd access check failed", "endpoints", w.endpoints, "err", err)
	}
	if err != nil {
		return
	}
	var warnings []string
	if e.Anonymous {
		warnings = append(warnings, fmt.Sprintf("etcd %v accepts clients without credentials: any process that reaches it can change formations, approvals and the published signing keys (docs/trust.md)", w.endpoints))
	}
	if e.AuthDisabled {
		warnings = append(warnings, "etcd authentication is off: every client the cluster lets in may write fcd's keys; give fcd a user limited to its prefix and enable authentication (docs/trust.md)")
	}
	w.mu.Lock()
	changed := !w.checked || !slices.Equal(warnings, w.warnings)
	w.warnings, w.checked = warnings, true
	w.mu.Unlock()
	switch {
	case !changed:
	case len(warnings) > 0:
		w.log.Warn("etcd is open to clients without fcd's credential", "endpoints", w.endpoints, "anonymous", e.Anonymous,
			"authDisabled", e.AuthDisabled, "warnings", warnings)
	default:
		w.log.Info("etcd access: client certificates and authentication on", "endpoints", w.endpoints)
	}
}
