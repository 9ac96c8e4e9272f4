package lease_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/record"
)

// TestOpenOverTLS: against a member that serves TLS and requires client
// certificates, a store with the CA and a client certificate works; one
// that trusts the CA but has no client certificate, one without TLS, and
// one that does not trust the CA all fail closed (ErrUnavailable).
func TestOpenOverTLS(t *testing.T) {
	m, files := etcdtest.StartTLS(t)
	ctx := context.Background()
	caOnly := func() *tls.Config {
		pem, err := os.ReadFile(files.CA)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		return &tls.Config{RootCAs: pool}
	}()
	tests := []struct {
		name string
		tls  *tls.Config
		ok   bool
	}{
		{"CA and client certificate", files.ClientConfig(t), true},
		{"CA, no client certificate", caOnly, false},
		{"no TLS", nil, false},
		{"CA not trusted", &tls.Config{Certificates: files.ClientConfig(t).Certificates}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := lease.Open(ctx, lease.Config{Endpoints: m.Endpoints(), TLS: tc.tls, Prefix: "/tls/",
				OpTimeout: 2 * time.Second, DialTimeout: 2 * time.Second, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			err = s.Ping(ctx)
			switch {
			case tc.ok && err != nil:
				t.Fatalf("ping: %v", err)
			case !tc.ok && !errors.Is(err, record.ErrUnavailable):
				t.Fatalf("ping: %v, want ErrUnavailable", err)
			}
		})
	}
}
