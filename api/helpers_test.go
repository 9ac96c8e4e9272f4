package api_test

import (
	"context"
	"encoding/base64"
	"log/slog"

	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/authz/policy"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/policies"
)

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// formations returns the formation use case decided by the embedded
// default policies.
func (f *fixture) formations(store *lease.Store, log *slog.Logger) *authz.Formations {
	f.t.Helper()
	pm, err := policy.NewManager(context.Background(), policy.Source{FS: policies.FS}, policy.ManagerOptions{Logger: log})
	if err != nil {
		f.t.Fatalf("default policies: %v", err)
	}
	f.policies = pm
	return authz.NewFormations(store, pm, authz.FormationConfig{Logger: log})
}
