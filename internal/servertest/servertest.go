// Package servertest starts fcd's server (server.New, the one that
// ships) for tests, failing the test instead of returning an error, and
// stops and closes it when the test ends.
package servertest

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/testutil"
	"github.com/fcd-authz/fcd/server"
)

// Start builds the server of cfg and runs it until the test ends, then
// shuts it down (failing the test if Run fails) and closes it. Where cfg
// leaves them zero, the server listens on a free loopback port, keeps its
// data (the embedded etcd member, the trail) in a temporary directory,
// names its trail replica "test" and logs nothing. With a signing key,
// Start returns once the key is published in the store, so that a token
// it issues verifies at once.
func Start(t testing.TB, cfg server.Config) *server.Server {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	if cfg.Replica == "" {
		cfg.Replica = "test"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s, err := server.New(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatalf("servertest: %v", err)
	}
	ran := make(chan error, 1)
	go func() { ran <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("servertest: run: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("servertest: close: %v", err)
		}
	})
	if iss := s.Issuer(); iss != nil {
		testutil.Eventually(t, time.Minute, "servertest: the signing key to be published", iss.Published)
	}
	return s
}
