package main

import (
	"fmt"
	"path/filepath"

	"github.com/fcd-authz/fcd/lease"
	"go.etcd.io/etcd/client/pkg/v3/transport"
)

// embeddedEtcdDir is the embedded etcd member's data directory inside
// DataDir.
func (c *Config) embeddedEtcdDir() string { return filepath.Join(c.DataDir, "etcd") }

// storeAccess is how every client of fcd's store reaches it — serve and
// each command that talks to etcd: the external cluster EtcdEndpoints
// names, with the TLS files EtcdCA, EtcdCert and EtcdKey, or else the
// embedded member of DataDir, with the client credential it generated
// (lease.EmbeddedAccess; the member must have started there once). One
// function, so that all of them present the same credential.
func (c *Config) storeAccess() (lease.ClientAccess, error) {
	if len(c.EtcdEndpoints) == 0 {
		return lease.EmbeddedAccess(c.embeddedEtcdDir())
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
