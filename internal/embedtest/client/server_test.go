// Package client_test runs the typed REST client (the module
// github.com/fcd-authz/fcd/client) against a real authzd, and checks that
// client.gen.go is what api/openapi.yaml generates. These tests assemble
// the server from this module's packages, so they live here: the client
// module's go.mod must not require this module, or whatever embeds the
// client would take part in its whole version selection (etcd, OPA,
// Cedar, gRPC).
package client_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"testing"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/internal/leaktest"
	"github.com/fcd-authz/fcd/internal/manifesttest"
	"github.com/fcd-authz/fcd/internal/servertest"
	"github.com/fcd-authz/fcd/manifest"
	authzd "github.com/fcd-authz/fcd/server"
	"github.com/lestrrat-go/jwx/v2/jwa"
)

// TestMain fails the package if a test leaves goroutines behind: the
// servers, the stores' etcd clients and the embedded members are stopped
// by the tests that start them.
func TestMain(m *testing.M) {
	leaktest.VerifyTestMain(m)
}

// server is a real authzd for the client to talk to, as it ships
// (server.New): an embedded etcd member, the store, the registry, the use
// cases decided by the embedded default policies, a token issuer
// publishing its key, the audit trail, the router of api.New, and an HTTP
// server. Nothing is mocked.
type server struct {
	t         *testing.T
	url       string
	registrar *manifesttest.Signer
	secrets   map[string]api.Secret // by credential id
}

// serverConfig changes what startServer serves.
type serverConfig struct {
	// formationLimit limits POST /v1/formations per credential.
	formationLimit api.RateLimit
}

// startServer starts a server with one credential per role, named after
// it, and a second approver "approver-2". It waits until the token
// signing key is published, so that admissions can be signed.
func startServer(t *testing.T, cfg serverConfig) *server {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := &server{t: t, registrar: manifesttest.NewSigner(t), secrets: map[string]api.Secret{}}

	var creds []api.Credential
	add := func(id string, role api.Role) {
		secret, cred, err := api.NewCredential(id, role)
		if err != nil {
			t.Fatal(err)
		}
		s.secrets[id] = secret
		creds = append(creds, cred)
	}
	for _, role := range api.Roles() {
		add(string(role), role)
	}
	add("approver-2", api.RoleApprover)
	auth, err := api.NewAuthenticator(creds)
	if err != nil {
		t.Fatal(err)
	}

	key, err := manifest.GenerateKey(jwa.EdDSA)
	if err != nil {
		t.Fatal(err)
	}
	// authzd as it ships, on an embedded etcd member of its own. Without
	// a formationLimit the formation rate limit is off: a test forms calls
	// for one host faster than a host may (the test of the limit sets one).
	rate, burst := cfg.formationLimit.Rate, int64(cfg.formationLimit.Burst)
	if rate == 0 {
		rate = authzd.NoFormationLimit
	}
	srv := servertest.Start(t, authzd.Config{
		Registrars: s.registrar.Verifier, Issuers: manifesttest.NewSigner(t).Verifier, Auth: auth,
		Signer: key, Issuer: "fcd-clienttest", FormationRate: rate, FormationBurst: burst, Logger: log,
	})
	s.url = srv.URL()
	return s
}

// as returns a client of s sending the credential id's secret ("" for
// none).
func (s *server) as(id string) *client.ClientWithResponses {
	s.t.Helper()
	c, err := client.New(s.url, string(s.secrets[id]))
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// signedExample is examples/github/manifest-RELEASE.json signed by the
// server's trusted registrar.
func (s *server) signedExample(release string) []byte {
	s.t.Helper()
	doc, err := os.ReadFile("../../../examples/github/manifest-" + release + ".json")
	if err != nil {
		s.t.Fatal(err)
	}
	jws, err := manifest.Sign(doc, s.registrar.Key, manifest.TypManifest)
	if err != nil {
		s.t.Fatal(err)
	}
	return jws
}

// signedExamplePayload is examples/github/manifest-RELEASE.json, unsigned.
func (s *server) signedExamplePayload(release string) []byte {
	s.t.Helper()
	doc, err := os.ReadFile("../../../examples/github/manifest-" + release + ".json")
	if err != nil {
		s.t.Fatal(err)
	}
	return doc
}

// sign signs the manifest m with the server's trusted registrar.
func (s *server) sign(m map[string]any) []byte {
	s.t.Helper()
	doc, err := json.Marshal(m)
	if err != nil {
		s.t.Fatal(err)
	}
	jws, err := manifest.Sign(doc, s.registrar.Key, manifest.TypManifest)
	if err != nil {
		s.t.Fatal(err)
	}
	return jws
}
