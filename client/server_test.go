package client_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/authz/policy"
	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/internal/authztest"
	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/internal/leaktest"
	"github.com/fcd-authz/fcd/internal/manifesttest"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/policies"
	"github.com/lestrrat-go/jwx/v2/jwa"
)

// TestMain fails the package if a test leaves goroutines behind: the
// servers, the stores' etcd clients and the embedded members are stopped
// by the tests that start them.
func TestMain(m *testing.M) {
	leaktest.VerifyTestMain(m)
}

// server is a real authzd HTTP stack for the client to talk to: an
// embedded etcd member, the store, the registry, the use cases decided by
// the embedded default policies, a token issuer publishing its key, the
// router of api.New, and an HTTP server. Nothing is mocked.
type server struct {
	t         *testing.T
	url       string
	registrar *manifesttest.Signer
	issuer    *authz.TokenIssuer
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
	store := etcdtest.Start(t).Store(t, "/clienttest/")
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

	pm, err := policy.NewManager(context.Background(), policy.Source{FS: policies.FS}, policy.ManagerConfig{Logger: log})
	if err != nil {
		t.Fatalf("default policies: %v", err)
	}
	key, err := manifest.GenerateKey(jwa.EdDSA)
	if err != nil {
		t.Fatal(err)
	}
	s.issuer, err = authz.NewTokenIssuer(authz.TokenIssuerConfig{Key: key, Issuer: "fcd-clienttest", Lifetime: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { s.issuer.Publish(ctx, store); close(stopped) }()
	// Cleanups run last in, first out: the publisher stops before the
	// store it publishes in is closed.
	t.Cleanup(func() { cancel(); <-stopped })

	certificates := manifesttest.NewSigner(t)
	h, err := api.New(api.Config{
		Registry: authztest.Registry(t, authz.RegistryConfig{Store: store, Manifests: s.registrar.Verifier, Logger: log, Certificates: certificates.Verifier}),
		UseCases: authztest.New(t, authz.Config{Store: store, Decider: pm, Logger: log, Issuer: s.issuer, Certificates: certificates.Verifier}),
		Auth:     auth, Logger: log, FormationLimit: cfg.formationLimit,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s.url = srv.URL

	deadline := time.Now().Add(30 * time.Second)
	for !s.issuer.Published() {
		if time.Now().After(deadline) {
			t.Fatal("signing key not published")
		}
		time.Sleep(10 * time.Millisecond)
	}
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
	doc, err := os.ReadFile("../examples/github/manifest-" + release + ".json")
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
	doc, err := os.ReadFile("../examples/github/manifest-" + release + ".json")
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
