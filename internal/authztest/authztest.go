// Package authztest builds authz's use cases for tests, failing the test
// instead of returning an error, so that test setups stay one line.
package authztest

import (
	"context"

	"github.com/fcd-authz/fcd/audit"
	"testing"

	"github.com/fcd-authz/fcd/authz"
)

// New returns the use cases of cfg, failing t on error.
func New(t testing.TB, cfg authz.Config) *authz.UseCases {
	t.Helper()
	uc, err := authz.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return uc
}

// Registry returns the registry of cfg, failing t on error.
func Registry(t testing.TB, cfg authz.RegistryConfig) *authz.Registry {
	t.Helper()
	r, err := authz.NewRegistry(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TrailWriter is an *audit.Trail as an authz.Follower writes it.
type TrailWriter struct{ *audit.Trail }

// Append appends evs to the trail.
func (w TrailWriter) Append(ctx context.Context, evs []authz.TrailEvent) error {
	entries := make([]audit.Entry, len(evs))
	for i, e := range evs {
		entries[i] = audit.Entry{Kind: e.Kind, Schema: e.Schema, Revision: e.Revision, Time: e.Time, Data: e.Data}
	}
	return w.Trail.Append(ctx, entries)
}
