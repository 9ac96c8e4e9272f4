package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/audit"
	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/internal/fixtures"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/server"
	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The stack below is internal/e2e's startStack (stack_test.go), reduced to
// the github v1.4 release and rebuilt without testing.TB: authzd as it
// ships (server.New, on its embedded etcd member) over real HTTP with a
// credential per role, the embedded default policies and a published EdDSA
// signing key; the v1.4 manifest registered (signed by a trusted registrar
// key) over REST; the github v1.4 fixture served over real HTTP three
// times: behind the real fencecheck middleware in online mode (keys from
// authzd's JWKS, each lease claimed in authzd before the effect, outcomes
// reported under the claim, with a backend credential) for design A; behind
// the same middleware in offline mode (no claim, no report) for design A0;
// bare for design B. One fixture instance serves all three, so the backend
// is the same.

const (
	issuerName = "fcd-bench-gateway"
	poolV14    = "github-v1-4"
	// The timed call: a read, ready at once under the default policies.
	benchTool = "get_repository"
	benchArgs = `{"owner":"` + fixtures.GitHubAccount + `","repo":"hello-world"}`
)

type stack struct {
	url   string // authzd
	creds map[api.Role]api.Secret
	http  *http.Client
	rec   *fixtures.Recorder
	rep   *fencecheck.Reporter
	// urlTrail is a second authzd on the same store, recording every
	// change to an audit trail (trail); guardedTrail the fixture behind
	// fencecheck online against it, with its own reporter (repTrail).
	urlTrail, guardedTrail string
	repTrail               *fencecheck.Reporter
	trail                  *audit.Trail
	// guarded, offline and bare are the base URLs of the fixture behind
	// fencecheck online (claims), behind fencecheck offline, and without
	// it.
	guarded, offline, bare string
	snapshot               string
	closers                []func()
	// api calls authzd (by its base URL: url or urlTrail) as a role,
	// through the typed client.
	clients map[string]map[api.Role]*client.ClientWithResponses
	// args are benchArgs decoded, the arguments of every formation (read
	// only once set).
	args map[string]any
}

// close stops everything started, in reverse order.
func (s *stack) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
}

func startStack(ctx context.Context, dir string, reportWorkers int) (_ *stack, err error) {
	s := &stack{creds: map[api.Role]api.Secret{}, rec: fixtures.NewRecorder(),
		http: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	quiet := slog.New(slog.DiscardHandler)
	// No lease of this run can be older than its store: the offline fence
	// counts as started before it, so that no admission of the run falls
	// within its skew after the start (admitted_before_start).
	offlineStarted := time.Now().Add(-time.Minute)

	regKey, err := manifest.GenerateKey(jwa.EdDSA)
	if err != nil {
		return nil, err
	}
	set, err := manifest.PublicSet(regKey)
	if err != nil {
		return nil, err
	}
	mverifier, err := manifest.NewVerifier(set)
	if err != nil {
		return nil, err
	}
	var stored []api.Credential
	for _, role := range api.Roles() {
		secret, cred, err := api.NewCredential("bench-"+string(role), role)
		if err != nil {
			return nil, err
		}
		s.creds[role] = secret
		stored = append(stored, cred)
	}
	auth, err := api.NewAuthenticator(stored)
	if err != nil {
		return nil, err
	}
	sigKey, err := manifest.GenerateKey(jwa.EdDSA)
	if err != nil {
		return nil, err
	}
	// authzd as it ships (server.New), its logs formatted at the default
	// level and dropped, but for what the designs compare:
	//   - the formation rate limit is off: one host credential forms every
	//     call of the run, standing for many hosts (the limit is per
	//     credential, docs/capacity.md);
	//   - formations wait an hour, not 15 minutes: a long run forms its
	//     calls before it admits them;
	//   - design A keeps no audit trail: it is the baseline the trail's cost
	//     (design AT, the second replica below) is measured against.
	logs := slog.New(slog.NewTextHandler(io.Discard, nil))
	base := server.Config{
		Listen: "127.0.0.1:0", DataDir: dir, EtcdPrefix: "/bench/",
		Registrars: mverifier, Auth: auth, Signer: sigKey, Issuer: issuerName,
		FormationRate: server.NoFormationLimit, FormationTTL: time.Hour, Logger: logs,
	}
	cfgA := base
	cfgA.AuditDir = server.AuditOff
	srvA, err := runServer(ctx, s, cfgA)
	if err != nil {
		return nil, err
	}
	s.url = srvA.URL()
	// The same authzd again, keeping an audit trail (design AT), on the
	// same etcd member under a prefix of its own: a trail follows its
	// store's whole history, so on A's prefix it would record A's calls
	// too and carry their cost into A's figures. Apart, A runs no trail at
	// all and AT's trail records AT's calls alone.
	scAT, err := cfgA.StoreConfig(nil)
	if err != nil {
		return nil, err
	}
	scAT.Prefix, scAT.Logger = "/bench-trail/", quiet
	storeAT, err := lease.Open(context.WithoutCancel(ctx), scAT)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, func() { storeAT.Close() })
	cfgAT := base
	cfgAT.Store, cfgAT.AuditDir, cfgAT.Replica = storeAT, filepath.Join(dir, "audit"), "bench"
	srvAT, err := runServer(ctx, s, cfgAT)
	if err != nil {
		return nil, err
	}
	s.urlTrail, s.trail = srvAT.URL(), srvAT.Trail()
	if err := json.Unmarshal([]byte(benchArgs), &s.args); err != nil {
		return nil, err
	}
	s.clients = map[string]map[api.Role]*client.ClientWithResponses{}
	for _, base := range []string{s.url, s.urlTrail} {
		s.clients[base] = map[api.Role]*client.ClientWithResponses{}
		for _, role := range append(api.Roles(), "") {
			if s.clients[base][role], err = client.New(base, string(s.creds[role]), client.WithHTTPClient(s.http)); err != nil {
				return nil, err
			}
		}
	}
	for _, srv := range []*server.Server{srvA, srvAT} {
		for deadline := time.Now().Add(30 * time.Second); !srv.Issuer().Published(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				return nil, errors.New("authzd's signing key was not published within 30s")
			}
		}
	}

	rel, err := fixtures.Lookup("github", "v1.4")
	if err != nil {
		return nil, err
	}
	jws, err := manifest.Sign(rel.ManifestJSON(), regKey, manifest.TypManifest)
	if err != nil {
		return nil, err
	}
	// Registered and snapshotted in both stores: the epoch and the snapshot
	// are content-addressed, so their ids are the same in each.
	for _, u := range []string{s.url, s.urlTrail} {
		reg, err := s.clients[u][api.RoleRegistrar].RegisterManifestWithBodyWithResponse(ctx, "application/jose", bytes.NewReader(jws))
		if err != nil {
			return nil, fmt.Errorf("register the manifest: %w", err)
		}
		if reg.JSON201 == nil {
			return nil, fmt.Errorf("register the manifest: authzd answered %d, want 201", reg.StatusCode())
		}
		snap, err := s.clients[u][api.RoleHost].CreateSnapshotWithResponse(ctx, client.SnapshotRequest{Servers: &[]string{"github"}})
		if err != nil {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
		if snap.JSON201 == nil {
			return nil, fmt.Errorf("snapshot: authzd answered %d, want 201", snap.StatusCode())
		}
		if s.snapshot != "" && snap.JSON201.Id != s.snapshot {
			return nil, fmt.Errorf("snapshot %s on AT's store, %s on A's", snap.JSON201.Id, s.snapshot)
		}
		s.snapshot = snap.JSON201.Id
	}

	s.rep, err = fencecheck.NewReporter(fencecheck.ReporterConfig{AuthzdURL: s.url, Credential: string(s.creds[api.RoleBackend]), Logger: quiet, Workers: reportWorkers})
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.rep.Close(cctx)
	})
	s.repTrail, err = fencecheck.NewReporter(fencecheck.ReporterConfig{AuthzdURL: s.urlTrail, Credential: string(s.creds[api.RoleBackend]), Logger: quiet, Workers: reportWorkers})
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.repTrail.Close(cctx)
	})
	claimer, err := fencecheck.NewLeaseClient(fencecheck.LeaseClientConfig{AuthzdURL: s.url, Credential: string(s.creds[api.RoleBackend])})
	if err != nil {
		return nil, err
	}
	claimerT, err := fencecheck.NewLeaseClient(fencecheck.LeaseClientConfig{AuthzdURL: s.urlTrail, Credential: string(s.creds[api.RoleBackend])})
	if err != nil {
		return nil, err
	}
	online, offline, onlineT := rel.Verifier(0), rel.Verifier(0), rel.Verifier(0)
	online.Claimer, onlineT.Claimer = claimer, claimerT
	offline.Started = offlineStarted
	fx := fixtures.MustNew("github", "v1.4", fixtures.Config{Sink: s.rec, Logger: quiet})
	var guardedA, guardedA0, guardedAT http.Handler
	for _, g := range []struct {
		v   *fencecheck.Verifier
		rep fencecheck.OutcomeReporter
		h   *http.Handler
	}{{online, s.rep, &guardedA}, {offline, nil, &guardedA0}, {onlineT, s.repTrail, &guardedAT}} {
		g.v.Issuer, g.v.JWKSURL = issuerName, s.url+"/.well-known/jwks.json"
		if err := g.v.Validate(); err != nil {
			return nil, err
		}
		*g.h = g.v.Middleware(fx, fencecheck.MiddlewareConfig{Server: "github", Reporter: g.rep, Timeout: 10 * time.Second, Logger: quiet})
	}
	for _, m := range []struct {
		h   http.Handler
		url *string
	}{{guardedA, &s.guarded}, {guardedA0, &s.offline}, {guardedAT, &s.guardedTrail}, {fx, &s.bare}} {
		mux := http.NewServeMux()
		mux.Handle("/mcp", m.h)
		if *m.url, err = serve(s, mux); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// runServer builds the server of cfg and runs it until the stack closes.
func runServer(ctx context.Context, s *stack, cfg server.Config) (*server.Server, error) {
	srv, err := server.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ran := make(chan error, 1)
	go func() { ran <- srv.Run(rctx) }()
	s.closers = append(s.closers, func() {
		cancel()
		<-ran
		_ = srv.Close()
	})
	return srv, nil
}

// serve serves h on a loopback port until the stack closes.
func serve(s *stack, h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	s.closers = append(s.closers, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			_ = srv.Close()
		}
		wg.Wait()
	})
	return "http://" + ln.Addr().String(), nil
}

// form forms one ready get_repository call over REST as the host, in a
// session of its own, for principal alice (group dev), as internal/e2e does.
func (s *stack) form(ctx context.Context, session string) (string, error) {
	return s.formAt(ctx, s.url, session)
}

// formAt is form through the authzd at base.
func (s *stack) formAt(ctx context.Context, base, session string) (string, error) {
	args := s.args
	r, err := s.clients[base][api.RoleHost].CreateFormationWithResponse(ctx, client.FormationRequest{
		Snapshot: s.snapshot, Session: session, Tool: "github/" + benchTool, Arguments: &args,
		Principal: &client.FormationRequest_Principal{Id: ptr("alice"), Attributes: &map[string]any{"groups": []string{"dev"}}},
	})
	if err != nil {
		return "", fmt.Errorf("form: %w", err)
	}
	if r.JSON201 == nil || r.JSON201.Status != client.FormationStatusReady {
		return "", fmt.Errorf("formation answered %d, want 201 and ready: %s", r.StatusCode(), r.Body)
	}
	return r.JSON201.Id, nil
}

func ptr[T any](v T) *T { return &v }

// formMany forms n ready formations with 16 parallel requests.
func (s *stack) formMany(ctx context.Context, base, prefix string, n int) ([]string, error) {
	ids := make([]string, n)
	errs := make([]error, 16)
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < n; i += 16 {
				id, err := s.formAt(ctx, base, fmt.Sprintf("%s-%d", prefix, i))
				if err != nil {
					errs[w] = err
					return
				}
				ids[i] = id
			}
		})
	}
	wg.Wait()
	return ids, errors.Join(errs...)
}

// reported is how many outcome reports the fencecheck reporter has
// finished, and an error if any was dropped or given up.
func (s *stack) reported() (uint64, error) {
	var sent uint64
	for _, r := range []*fencecheck.Reporter{s.rep, s.repTrail} {
		st := r.Stats()
		if st.Dropped > 0 || st.Failed > 0 {
			return st.Sent, fmt.Errorf("fencecheck reporter: %d outcome reports dropped, %d failed (%d sent)", st.Dropped, st.Failed, st.Sent)
		}
		sent += st.Sent
	}
	return sent, nil
}

// waitReported waits until n outcome reports were sent to authzd.
func (s *stack) waitReported(ctx context.Context, n uint64) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := s.reported()
		if err != nil {
			return err
		}
		if got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("fencecheck reporter: %d of %d outcome reports sent after 30s", got, n)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// claims is how many leases authzd says a backend claimed
// (fcd_lease_claims_total{result="claimed_now"} on its /metrics), and an
// error if any claim was refused.
func (s *stack) claims(ctx context.Context) (uint64, error) {
	var total uint64
	for _, u := range []string{s.url, s.urlTrail} {
		n, err := s.claimsAt(ctx, u)
		if err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}

// claimsAt is claims of the authzd at u.
func (s *stack) claimsAt(ctx context.Context, u string) (uint64, error) {
	resp, err := s.clients[u][""].GetMetrics(ctx)
	if err != nil {
		return 0, fmt.Errorf("authzd /metrics: %w", err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("authzd /metrics: %w", err)
	}
	var claimed uint64
	var refused []string
	for _, m := range families["fcd_lease_claims_total"].GetMetric() {
		result, n := "", m.GetCounter().GetValue()
		for _, l := range m.GetLabel() {
			if l.GetName() == "result" {
				result = l.GetValue()
			}
		}
		if result == "claimed_now" {
			claimed = uint64(n)
		} else if n > 0 {
			refused = append(refused, fmt.Sprintf("%s: %.0f", result, n))
		}
	}
	if len(refused) > 0 {
		return claimed, fmt.Errorf("authzd refused lease claims: %s", strings.Join(refused, ", "))
	}
	return claimed, nil
}
