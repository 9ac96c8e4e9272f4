package host_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/internal/fixtures"
	"github.com/fcd-authz/fcd/internal/gatewaytest"
	"github.com/fcd-authz/fcd/internal/manifesttest"
	"github.com/fcd-authz/fcd/internal/servertest"
	"github.com/fcd-authz/fcd/internal/testutil"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/server"
	"github.com/lestrrat-go/jwx/v2/jwa"
)

const (
	issuerName = "fcd-host-test"
	pool       = "github-v1-4"
	user       = "alice"
	password   = "alice-password"
)

// stack is everything a host meets, all real: authzd (server.New, serving
// real HTTP on a real embedded etcd member, the embedded default policies, a
// published EdDSA signing key) with the github v1.4 manifest registered;
// the github v1.4 fixture (an official MCP Go SDK server) behind the real
// fencecheck middleware, claiming and reporting with a backend credential;
// and real nginx in front of it, running the example configuration,
// authenticating alice and asking authzd to admit each call.
type stack struct {
	t     testing.TB
	URL   string // authzd
	creds map[api.Role]api.Secret
	Rec   *fixtures.Recorder
	// MCP is the gateway's URL of the fixture's MCP endpoint.
	MCP string
	// serve serves another github v1.4 fixture of cfg (its sink and logger
	// set) behind the fence and a gateway of its own, and returns the
	// gateway's URL of its MCP endpoint.
	serve func(t *testing.T, cfg fixtures.Config) string
	// member is authzd's etcd member.
	member *etcdtest.Member
}

func startStack(t *testing.T) *stack {
	t.Helper()
	member := etcdtest.Start(t)
	s := &stack{t: t, creds: map[api.Role]api.Secret{}, Rec: fixtures.NewRecorder(), member: member}
	var stored []api.Credential
	for _, role := range api.Roles() {
		secret, cred, err := api.NewCredential(string(role), role)
		if err != nil {
			t.Fatal(err)
		}
		s.creds[role] = secret
		stored = append(stored, cred)
	}
	auth, err := api.NewAuthenticator(stored)
	if err != nil {
		t.Fatal(err)
	}
	registrar := manifesttest.NewSigner(t)
	log := slog.New(slog.DiscardHandler)
	sigKey, err := manifest.GenerateKey(jwa.EdDSA)
	if err != nil {
		t.Fatal(err)
	}
	// authzd as it ships, on member (which a test stops and restarts). The
	// formation rate limit is off: a test forms calls for one host faster
	// than a host may (the limit has its own tests in api and client).
	srv := servertest.Start(t, server.Config{
		EtcdEndpoints: member.Endpoints(), EtcdPrefix: "/host/", EtcdQuota: member.Quota(),
		FormationRate: server.NoFormationLimit,
		Registrars:    registrar.Verifier, Auth: auth, Signer: sigKey, Issuer: issuerName, Logger: log,
	})
	s.URL = srv.URL()

	rel, err := fixtures.Lookup("github", "v1.4")
	if err != nil {
		t.Fatal(err)
	}
	jws, err := manifest.Sign(rel.ManifestJSON(), registrar.Key, manifest.TypManifest)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.as(api.RoleRegistrar).RegisterManifestWithBodyWithResponse(context.Background(), "application/jose", bytes.NewReader(jws)); err != nil {
		t.Fatalf("register the github manifest: %v", err)
	}

	backend := string(s.creds[api.RoleBackend])
	rep, err := fencecheck.NewReporter(fencecheck.ReporterConfig{AuthzdURL: s.URL, Credential: backend, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = rep.Close(ctx)
	})
	claimer, err := fencecheck.NewLeaseClient(fencecheck.LeaseClientConfig{AuthzdURL: s.URL, Credential: backend})
	if err != nil {
		t.Fatal(err)
	}
	v := rel.Verifier(0)
	v.Issuer, v.JWKSURL, v.Claimer = issuerName, s.URL+"/.well-known/jwks.json", claimer
	if err := v.Validate(); err != nil {
		t.Fatal(err)
	}
	s.serve = func(t *testing.T, cfg fixtures.Config) string {
		cfg.Sink, cfg.Logger = s.Rec, log
		mux := http.NewServeMux()
		mux.Handle("/mcp", v.Middleware(fixtures.MustNew("github", "v1.4", cfg),
			fencecheck.MiddlewareConfig{Server: "github", Reporter: rep, Timeout: 10 * time.Second, Logger: log}))
		fsrv := httptest.NewServer(mux)
		t.Cleanup(fsrv.Close)
		gw := gatewaytest.Start(t, gatewaytest.Nginx, gatewaytest.Config{
			Authzd: s.URL, Credential: string(s.creds[api.RoleGateway]), Pools: map[string]string{pool: fsrv.URL},
			Default: pool, Users: map[string]string{user: password},
		})
		return gw.URL + "/mcp"
	}
	s.MCP = s.serve(t, fixtures.Config{})
	return s
}

// as is a typed client of authzd with the role's credential.
func (s *stack) as(role api.Role) *client.ClientWithResponses {
	s.t.Helper()
	c, err := client.New(s.URL, string(s.creds[role]))
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// approve approves a formation of the digest as the approver, over REST.
// It may run on any goroutine: it reports with t.Error.
func (s *stack) approve(id, digest string) {
	reason := "host test"
	resp, err := s.as(api.RoleApprover).ApproveFormationWithResponse(context.Background(), id,
		client.ApprovalRequest{Decision: client.ApprovalRequestDecisionApprove, Digest: digest, Reason: &reason})
	if err != nil || resp.JSON200 == nil {
		s.t.Errorf("approve %s: %v", id, err)
	}
}

// formation reads a formation as the host.
func (s *stack) formation(id string) *client.Formation {
	s.t.Helper()
	resp, err := s.as(api.RoleHost).GetFormationWithResponse(context.Background(), id)
	if err != nil || resp.JSON200 == nil {
		s.t.Fatalf("read formation %s: %v", id, err)
	}
	return resp.JSON200
}

// waitStatus waits until a formation has the status (fencecheck reports
// outcomes asynchronously).
func (s *stack) waitStatus(id, want string) {
	s.t.Helper()
	var got string
	testutil.EventuallyState(s.t, 15*time.Second, "formation "+id+" to be "+want, func() bool { got = string(s.formation(id).Status); return got == want },
		func() string { return got })
}

// sent is one request as it left the host transport for the gateway.
type sent struct {
	HTTPMethod, RPCMethod, Formation, McpMethod, Session string
}

// tap records every request the host transport sends, then sends it on
// with alice's basic credentials, as a host authenticating to the
// gateway does. It is the real path to the gateway, observed.
type tap struct {
	mu   sync.Mutex
	reqs []sent
	// inspect, if set, is given each body sent.
	inspect func(body []byte)
}

func (tp *tap) RoundTrip(req *http.Request) (*http.Response, error) {
	s := sent{HTTPMethod: req.Method, Formation: req.Header.Get("Fcd-Formation"), McpMethod: req.Header.Get("Mcp-Method"),
		Session: req.Header.Get("Mcp-Session-Id")}
	if req.Body != nil && req.GetBody != nil {
		if b, err := req.GetBody(); err == nil {
			var m struct{ Method string }
			raw, _ := io.ReadAll(b)
			_ = json.Unmarshal(raw, &m)
			if tp.inspect != nil {
				tp.inspect(raw)
			}
			s.RPCMethod = m.Method
		}
	}
	tp.mu.Lock()
	tp.reqs = append(tp.reqs, s)
	tp.mu.Unlock()
	return gatewaytest.BasicAuth(nil, user, password).RoundTrip(req)
}

func (tp *tap) sent() []sent {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return append([]sent(nil), tp.reqs...)
}
