package lease_test

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/lease"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestExposure: Store.Exposure tells an open cluster (plain http, any
// client) from one that authenticates clients by certificate but has
// etcd's authentication off (any certificate of its CA may write
// everything) and from one set up as docs/trust.md says (client
// certificates, authentication on, the fcd user limited to fcd's prefix);
// and under that setup the store works, while outside its prefix the
// same credential is denied.
func TestExposure(t *testing.T) {
	const prefix = "/exposure/"
	tests := []struct {
		name  string
		start func(t *testing.T) ([]string, *tls.Config)
		want  lease.Exposure
	}{
		{"open", func(t *testing.T) ([]string, *tls.Config) { return etcdtest.Start(t).Endpoints(), nil },
			lease.Exposure{Anonymous: true, AuthDisabled: true}},
		{"client certificates, authentication off", func(t *testing.T) ([]string, *tls.Config) {
			m, files := etcdtest.StartTLS(t)
			return m.Endpoints(), files.ClientConfig(t)
		}, lease.Exposure{AuthDisabled: true}},
		{"client certificates, fcd's role", func(t *testing.T) ([]string, *tls.Config) {
			m, files := etcdtest.StartTLSWithAuth(t, prefix)
			return m.Endpoints(), files.FCDConfig(t)
		}, lease.Exposure{}},
		{"embedded", func(t *testing.T) ([]string, *tls.Config) {
			m, err := lease.StartEmbedded(context.Background(), lease.EmbedConfig{Dir: filepath.Join(t.TempDir(), "etcd"),
				LogFile: filepath.Join(t.TempDir(), "etcd.log"), Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(m.Close)
			return m.Endpoints(), m.Access().TLS
		}, lease.Exposure{AuthDisabled: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eps, tlsCfg := tc.start(t)
			s, err := lease.Open(context.Background(), lease.Config{Endpoints: eps, TLS: tlsCfg, Prefix: prefix,
				OpTimeout: 2 * time.Second, DialTimeout: 2 * time.Second, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			got, err := s.Exposure(ctx)
			if err != nil || got != tc.want || got.Open() != (tc.want != lease.Exposure{}) {
				t.Fatalf("exposure %+v (%v), want %+v", got, err, tc.want)
			}
			if err := s.Ping(ctx); err != nil {
				t.Fatalf("ping: %v", err)
			}
			if _, err := s.Health(ctx); err != nil {
				t.Fatalf("health: %v", err)
			}
			if got.AuthDisabled {
				return
			}
			cli, err := clientv3.New(clientv3.Config{Endpoints: eps, TLS: tlsCfg, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			if _, err := cli.Put(ctx, prefix+"inside", "v"); err != nil {
				t.Fatalf("a write inside the prefix: %v", err)
			}
			if _, err := cli.Put(ctx, "/other/outside", "v"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
				t.Fatalf("a write outside the prefix: %v, want permission denied", err)
			}
		})
	}
}
