package server

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/audit"
	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/authz/decisionlog"
	"github.com/fcd-authz/fcd/authz/policy"
	"github.com/fcd-authz/fcd/internal/telemetry"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/lestrrat-go/jwx/v2/jwk"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

const (
	// shutdownTimeout bounds the graceful shutdown of the servers; past it
	// in-flight requests and checks are cut.
	shutdownTimeout = 15 * time.Second
	// sweepInterval is how often leases never reported are looked for.
	sweepInterval = time.Minute
)

// Server is fcd's authorization server: what [New] builds from a Config,
// [Server.Run] serves and [Server.Close] releases.
type Server struct {
	cfg Config
	log *slog.Logger

	member   *lease.Embedded // nil with an external cluster
	store    *lease.Store
	ownStore bool // the server opened the store, and closes it
	// access watches an external cluster's access control for /readyz;
	// nil with the embedded member, which accepts its own credential only,
	// and with a store Config gave.
	access   *accessWatch
	policies *policy.Manager
	issuer   *authz.TokenIssuer // nil without a signing key: no admission
	trail    *audit.Trail       // nil without a signing key or with AuditDir off
	follower *authz.Follower    // keeps trail; nil without it
	useCases *authz.UseCases
	// notifier sends the approval webhooks; nil without NotifyURL.
	notifier *authz.Notifier
	// decisions exports decision logs; nil without DecisionLogURL.
	decisions *decisionlog.Exporter
	// traces is the provider the server made from OTLPEndpoint (shut down
	// by Close); tracer the one in use, nil when nothing is traced.
	traces *telemetry.Provider
	tracer trace.TracerProvider

	http     *http.Server
	httpLn   net.Listener
	url      string
	grpc     *grpc.Server // nil without GRPCListen
	grpcLn   net.Listener
	serveTLS bool
}

// New validates cfg and constructs everything Run serves: the store (on
// the embedded etcd member unless the cluster is external), the audit
// trail, the policies, the token issuer, the use cases, the HTTP handler
// and the servers, listening. It starts no goroutine of its own but, with
// DecisionLogURL, the decision-log exporter's uploader, which Close
// stops. If it fails, it closes what it built.
func New(ctx context.Context, cfg Config) (_ *Server, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Server{cfg: cfg, log: cfg.Logger}

	verifier := cfg.Registrars
	if verifier == nil {
		if verifier, err = manifest.LoadVerifier(cfg.RegistrarKeys); err != nil {
			return nil, fmt.Errorf("registrar keys: %w", err)
		}
	}
	auth := cfg.Auth
	if auth == nil {
		if auth, err = api.LoadCredentials(cfg.Credentials); err != nil {
			return nil, err
		}
	}

	defer func() {
		if err == nil {
			return
		}
		if cerr := s.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	if err := s.openTracing(ctx); err != nil {
		return nil, err
	}
	if err := s.openStore(ctx); err != nil {
		return nil, err
	}
	if err := s.buildUseCases(ctx, verifier); err != nil {
		return nil, err
	}
	// The gRPC service shares the HTTP handler's use cases (and their
	// caches): a call formed through one is admitted through the other.
	apiCfg := api.Config{
		Registry:       s.useCases.Registry,
		UseCases:       s.useCases,
		PolicyStatus:   s.policies.Status,
		Auth:           auth,
		BodyLimit:      cfg.BodyLimit,
		Logger:         s.log,
		FormationLimit: api.RateLimit{Rate: max(cfg.FormationRate, 0), Burst: int(cfg.FormationBurst)},
		TracerProvider: s.tracer,
	}
	if s.trail != nil { // a nil *audit.Trail is not a nil AuditTrail
		apiCfg.Trail = s.trail
	}
	if s.access != nil {
		apiCfg.StoreWarnings = s.access.Warnings
	}
	if err := s.listen(apiCfg); err != nil {
		return nil, err
	}
	return s, nil
}

// buildUseCases builds the token issuer (with a signing key), the audit
// trail, the policies and the use cases (the registry among them) on the
// store.
func (s *Server) buildUseCases(ctx context.Context, verifier *manifest.Verifier) error {
	cfg := &s.cfg
	var err error
	certificates := cfg.Issuers
	if certificates == nil && cfg.IssuerKeys != "" {
		if certificates, err = manifest.LoadVerifier(cfg.IssuerKeys); err != nil {
			return fmt.Errorf("issuer keys: %w", err)
		}
	}
	operators := cfg.Operators
	if operators == nil && cfg.OperatorKeys != "" {
		if operators, err = manifest.LoadVerifier(cfg.OperatorKeys); err != nil {
			return fmt.Errorf("operator keys: %w", err)
		}
	}
	if operators != nil {
		s.log.Info("resolutions of uncertain leases must be signed with an operator key", "operatorKeys", cfg.OperatorKeys)
	} else {
		s.log.Warn("no --operator-keys: an operator's bearer credential alone resolves uncertain leases (for tests)")
	}
	key := cfg.Signer
	if key == nil && cfg.SigningKey != "" {
		if key, err = manifest.LoadPrivateKey(cfg.SigningKey); err != nil {
			return fmt.Errorf("signing key: %w", err)
		}
	}
	if key != nil {
		if s.issuer, err = authz.NewTokenIssuer(authz.TokenIssuerConfig{Key: key, Issuer: cfg.Issuer, Lifetime: cfg.TokenLifetime}); err != nil {
			return fmt.Errorf("token issuer: %w", err)
		}
		s.log.Info("dispatch tokens", "kid", s.issuer.KeyID(), "issuer", cfg.Issuer, "lifetime", s.issuer.Lifetime())
		if s.trail, err = openTrail(cfg, key, s.log); err != nil {
			return err
		}
	} else {
		s.log.Warn("no --signing-key: admission is disabled, and no audit trail is kept")
	}
	if cfg.NotifyURL != "" {
		secret, err := os.ReadFile(cfg.NotifySecretFile)
		if err != nil {
			return fmt.Errorf("notification secret: %w", err)
		}
		if secret = bytes.TrimSpace(secret); len(secret) == 0 {
			return fmt.Errorf("notification secret: %s is empty", cfg.NotifySecretFile)
		}
		if s.notifier, err = authz.NewNotifier(authz.NotifierConfig{URL: cfg.NotifyURL, Secret: secret, Format: cfg.NotifyFormat,
			PageURL: cfg.NotifyPageURL, Store: s.store, Queue: int(cfg.NotifyQueue), Logger: s.log}); err != nil {
			return err
		}
	}
	var rec policy.Recorder
	if s.trail != nil {
		fc := authz.FollowerConfig{Store: s.store, Trail: trailWriter{s.trail}, Replica: s.trail.Replica(),
			Arguments: authz.TrailArguments(cfg.AuditArguments), MaxLag: cfg.AuditMaxLag, Logger: s.log}
		if s.notifier != nil {
			// Notifications follow what the trail recorded: every commit,
			// also one whose request got no answer, or made before a crash.
			fc.Observe = s.notifier.Observe
		}
		s.follower = authz.NewFollower(fc)
		rec = authz.StorePolicyRecorder(s.store, s.trail.Replica())
	}
	// The policies load once the trail is open: the set put in force is
	// written to the store, where the trail records it, and the audit
	// checks each decision against it.
	src, err := cfg.policySource()
	if err != nil {
		return err
	}
	if s.policies, err = policy.NewManager(ctx, src, policy.ManagerConfig{Logger: s.log, Trail: rec}); err != nil {
		return err
	}
	st := s.policies.Status()
	s.log.Info("policies loaded", "source", src.String(), "digest", st.Digest, "revision", st.Revision)
	if src.Bundle != nil && src.Bundle.Verification == nil {
		s.log.Warn("no --policy-bundle-keys: only an unsigned policy bundle is accepted", "bundle", src.String())
	}
	ucCfg := authz.Config{
		Store: s.store, Decider: s.policies, TTL: cfg.FormationTTL, Retention: cfg.FormationRetention, Logger: s.log,
		Issuer: s.issuer, Manifests: verifier,
		Certificates: certificates, ReportGrace: cfg.ReportGrace, GatewayCaller: authz.CallerBinding(cfg.GatewayCaller),
		Trail: s.follower, Operators: operators, Notifier: s.notifier,
	}
	if cfg.DecisionLogURL != "" {
		if s.decisions, err = s.decisionLog(); err != nil {
			return err
		}
		ucCfg.DecisionLog = s.decisions
	}
	s.useCases, err = authz.New(ucCfg)
	return err
}

// openTracing sets up the tracer: Config's TracerProvider, or an OTLP
// exporter when an endpoint is configured, or none (api then starts no
// span, and nothing below it does either).
func (s *Server) openTracing(ctx context.Context) error {
	if s.cfg.TracerProvider != nil {
		s.tracer = s.cfg.TracerProvider
		return nil
	}
	tc := s.cfg.telemetry()
	if !tc.Enabled() {
		return nil
	}
	p, err := telemetry.New(ctx, tc)
	if err != nil {
		return err
	}
	s.traces, s.tracer = p, p
	s.log.Info("traces exported over OTLP", "endpoint", cmp.Or(tc.Endpoint, "(from the environment)"), "protocol", cmp.Or(tc.Protocol, "(default or from the environment)"))
	return nil
}

// decisionLog starts the decision-log exporter DecisionLogURL names: its
// one uploading goroutine runs until Close.
func (s *Server) decisionLog() (*decisionlog.Exporter, error) {
	cfg := &s.cfg
	credential := os.Getenv("FCD_DECISION_LOG_CREDENTIAL")
	if cfg.DecisionLogCredentialFile != "" {
		data, err := os.ReadFile(cfg.DecisionLogCredentialFile)
		if err != nil {
			return nil, fmt.Errorf("decision log credential: %w", err)
		}
		credential = strings.TrimSpace(string(data))
	}
	labels, err := cfg.decisionLogLabels()
	if err != nil {
		return nil, err
	}
	dl := decisionlog.Config{
		URL: cfg.DecisionLogURL, Resource: cfg.DecisionLogResource, Credential: decisionlog.Credential(credential),
		BufferSize: int(cfg.DecisionLogBuffer), UploadSizeLimit: int(cfg.DecisionLogUploadLimit),
		MinDelay: cfg.DecisionLogMinDelay, MaxDelay: cfg.DecisionLogMaxDelay,
		Mask: cfg.DecisionLogMask, Labels: labels, Logger: s.log,
	}
	x, err := decisionlog.New(dl)
	if err != nil {
		return nil, err
	}
	dl.ID = x.ID()
	s.log.Info("decision logs exported", "config", dl)
	return x, nil
}

// openStore starts the embedded etcd member unless the configuration
// names an external cluster (or gives an open store), and opens the
// store on it.
func (s *Server) openStore(ctx context.Context) error {
	cfg := &s.cfg
	if cfg.Store != nil {
		s.store = cfg.Store
		return nil
	}
	if len(cfg.EtcdEndpoints) == 0 {
		ec := cfg.EmbedConfig()
		ec.Logger = s.log
		member, err := lease.StartEmbedded(ctx, ec)
		if err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				return fmt.Errorf("%w: another etcd or authzd listens there; give --embedded-etcd-client-url and --embedded-etcd-peer-url free loopback ports, or leave them unset to pick free ones", err)
			}
			return err
		}
		s.member = member
		s.log.Info("embedded etcd started", "dir", ec.Dir, "endpoints", member.Endpoints(), "log", ec.LogFile,
			"quota", member.Quota(), "compaction", "authzd's, keeping "+lease.DefaultCompactionRetention+" and what a trail has not recorded",
			"credential", member.Access().CertFile)
	}
	// The embedded member's credential is read back from its directory,
	// as every other client of the member reads it (StoreConfig).
	sc, err := cfg.StoreConfig(s.member)
	if err != nil {
		return err
	}
	// The store lives until Close, not until ctx ends (etcd's client
	// cancels with it whatever has no context of its own): requests still
	// in flight during the graceful shutdown use it.
	store, err := lease.Open(context.WithoutCancel(ctx), sc)
	if err != nil {
		return err
	}
	if r, ok := s.member.Restored(); ok {
		// Before the trail follows the store: it must know the revisions
		// the restore's bump skipped never existed.
		if err := store.RecordRestore(ctx, r); err != nil {
			store.Close()
			return fmt.Errorf("record the restore of the embedded member: %w", err)
		}
		if err := s.member.ClearRestored(); err != nil {
			s.log.Warn("restore recorded; its file stays", "err", err)
		}
		s.log.Info("the embedded member was restored from a snapshot; recorded for the audit trails", "snapshotRevision", r.Revision, "revisionBump", r.Bump)
	}
	if s.member == nil {
		// Opening does not wait for etcd; say where it is looked for, so
		// that the failures logged while it does not answer can be read.
		s.log.Info("external etcd", "endpoints", sc.Endpoints, "tls", sc.TLS != nil, "prefix", cmp.Or(cfg.EtcdPrefix, DefaultEtcdPrefix))
		s.access = &accessWatch{store: store, endpoints: sc.Endpoints, log: s.log}
	}
	s.store, s.ownStore = store, true
	return nil
}

// listen builds the HTTP server and, with GRPCListen, the Envoy
// ext_authz gRPC server, and opens their listeners.
func (s *Server) listen(apiCfg api.Config) error {
	cfg := &s.cfg
	handler, err := api.New(apiCfg)
	if err != nil {
		return fmt.Errorf("HTTP handler: %w", err)
	}
	var tlsCfg *tls.Config
	if cfg.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return fmt.Errorf("tls: %w", err)
		}
		tlsCfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	if cfg.GRPCListen != "" {
		var opts []grpc.ServerOption
		if tlsCfg != nil {
			opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
		}
		if s.grpc, err = api.NewCheckServer(apiCfg, opts...); err != nil {
			return fmt.Errorf("gRPC service: %w", err)
		}
		if s.grpcLn, err = net.Listen("tcp", cfg.GRPCListen); err != nil {
			return fmt.Errorf("grpc listen: %w", err)
		}
	}
	if s.httpLn, err = net.Listen("tcp", cfg.Listen); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	s.http = &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      authz.MaxRetireWait + 30*time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	s.url = "http://" + s.httpLn.Addr().String()
	if tlsCfg != nil {
		s.http.TLSConfig = tlsCfg.Clone()
		s.serveTLS = true
		s.url = "https://" + s.httpLn.Addr().String()
	}
	return nil
}

// Run serves until ctx ends or a server fails, then shuts down
// gracefully: in-flight requests finish, and Run returns once every
// goroutine it started has returned. Call Close afterwards. Run may be
// called once.
func (s *Server) Run(ctx context.Context) error { return s.run(ctx) }

// run serves until ctx ends or a server fails, then shuts down in order:
// the servers stop accepting and finish what is in flight, the background
// loops (policy watcher, reloader, token key publisher, trail checkpoints,
// lease sweeper) are cancelled, and run returns once every goroutine it
// started has returned. The store is untouched: Close closes it
// afterwards.
func (s *Server) run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	// The loops outlive the servers' graceful shutdown (a request in flight
	// may still need the published key), so they have a context of their
	// own, cancelled once the servers have stopped.
	loops, stopLoops := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLoops()

	if s.cfg.PolicyDir != "" || s.cfg.PolicyBundle != "" {
		g.Go(func() error {
			s.policies.Watch(loops, s.cfg.PolicyPoll)
			return nil
		})
	}
	if s.cfg.Reload != nil {
		g.Go(func() error {
			s.reloadOnHUP(loops)
			return nil
		})
	}
	if s.issuer != nil {
		g.Go(func() error {
			s.issuer.Publish(loops, s.store)
			return nil
		})
	}
	if s.trail != nil {
		g.Go(func() error {
			s.trail.Run(loops) // signs the head of what came since the last checkpoint
			return nil
		})
		g.Go(func() error {
			// The trail follows the store's history (docs/audit.md).
			return s.follower.Run(loops)
		})
	}
	if s.notifier != nil {
		g.Go(func() error {
			s.notifier.Run(loops)
			return nil
		})
		if s.trail == nil {
			// No trail to follow the store: the notifier follows it itself,
			// from the revision it starts at.
			g.Go(func() error { return s.notifier.Follow(loops) })
		}
	}
	if s.member != nil {
		// A member that fails takes every request with it: say why, here
		// and not only in etcd's own log, and exit non-zero.
		g.Go(func() error {
			select {
			case <-gctx.Done():
				return nil
			case err := <-s.member.Failed():
				s.log.Error("embedded etcd failed; authzd stops", "err", err, "dir", s.cfg.EtcdDir(), "etcdLog", s.cfg.EmbedConfig().LogFile)
				return err
			}
		})
	}
	if s.member != nil {
		// The embedded member's history older than an hour goes, never
		// what an audit trail has not recorded yet (lease/compact.go).
		g.Go(func() error {
			s.store.RunCompactor(loops, lease.CompactorConfig{})
			return nil
		})
	}
	if s.access != nil {
		g.Go(func() error {
			s.access.run(loops, accessCheckInterval)
			return nil
		})
	}
	// Leases whose backend never reported become uncertain, visible to
	// operators, instead of holding their epoch back silently.
	g.Go(func() error {
		s.useCases.Leases.RunSweeper(loops, sweepInterval)
		return nil
	})

	if s.grpc != nil {
		g.Go(func() error {
			// nil once stopped; ErrServerStopped if stopped before it began.
			if err := s.grpc.Serve(s.grpcLn); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				return fmt.Errorf("serve gRPC: %w", err)
			}
			return nil
		})
	}
	g.Go(func() error {
		var err error
		if s.serveTLS {
			err = s.http.ServeTLS(s.httpLn, "", "") // HTTP/2 and HTTP/1.1 over TLS
		} else {
			err = s.http.Serve(s.httpLn)
		}
		if !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve: %w", err)
		}
		return nil
	})

	if s.cfg.Serving != nil {
		s.cfg.Serving()
	}

	g.Go(func() error {
		<-gctx.Done() // ctx ended, or a server failed
		s.log.Info("shutting down")
		err := s.shutdown()
		stopLoops()
		return err
	})
	return g.Wait()
}

// shutdown stops both servers at once: they stop accepting, and what is
// in flight finishes within shutdownTimeout or is cut.
func (s *Server) shutdown() error {
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	var g errgroup.Group
	if s.grpc != nil {
		g.Go(func() error {
			stopped := make(chan struct{})
			go func() { s.grpc.GracefulStop(); close(stopped) }()
			select {
			case <-stopped:
			case <-sctx.Done():
				s.grpc.Stop() // closes what is left; GracefulStop returns
				<-stopped
			}
			return nil
		})
	}
	g.Go(func() error {
		if err := s.http.Shutdown(sctx); err != nil {
			_ = s.http.Close() // cut what did not finish
			return fmt.Errorf("shutdown: %w", err)
		}
		return nil
	})
	return g.Wait()
}

// reloadOnHUP reloads the policies on every value of Config.Reload (authzd
// serve's SIGHUP) until ctx ends.
func (s *Server) reloadOnHUP(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.cfg.Reload:
			// A failed reload keeps the working set; Reload logs why.
			_ = s.policies.Reload(ctx)
		}
	}
}

// Close releases what New made, last made first closed: the servers and
// listeners (already stopped when Run returned), the audit trail (signing
// its head), the decision-log exporter (uploading what it holds, within
// the shutdown timeout), the store (unless Config gave it), and then the
// embedded etcd member. Call it once Run has returned; New calls it when
// it fails.
func (s *Server) Close() error {
	var errs []error
	if s.grpc != nil {
		s.grpc.Stop()
	}
	if s.http != nil {
		if err := s.http.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close HTTP server: %w", err))
		}
	}
	for _, ln := range []net.Listener{s.httpLn, s.grpcLn} {
		if ln == nil {
			continue
		}
		if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("close listener: %w", err))
		}
	}
	if s.trail != nil {
		if err := s.trail.Close(); err != nil { // signs the head last
			errs = append(errs, fmt.Errorf("close audit trail: %w", err))
		}
	}
	if s.decisions != nil {
		// The servers have stopped: every decision is buffered. What the
		// service does not take by the deadline is lost, and said so; it
		// does not fail the shutdown.
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		if err := s.decisions.Close(ctx); err != nil {
			s.log.Warn("decision log", "err", err)
		}
		cancel()
	}
	if s.store != nil && s.ownStore {
		if err := s.store.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close store: %w", err))
		}
	}
	if s.member != nil {
		s.member.Close()
	}
	if s.traces != nil {
		// Last: the spans of the shutdown's requests are exported too.
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		if err := s.traces.Shutdown(ctx); err != nil {
			s.log.Warn("traces not exported at shutdown", "err", err)
		}
		cancel()
	}
	return errors.Join(errs...)
}

// trailWriter is the audit trail as the follower writes it.
type trailWriter struct{ *audit.Trail }

func (w trailWriter) Append(ctx context.Context, evs []authz.TrailEvent) error {
	entries := make([]audit.Entry, len(evs))
	for i, e := range evs {
		entries[i] = audit.Entry{Kind: e.Kind, Schema: e.Schema, Revision: e.Revision, Time: e.Time, Data: e.Data}
	}
	return w.Trail.Append(ctx, entries)
}

// openTrail opens this replica's audit trail, signed with key, unless
// AuditDir is off.
func openTrail(cfg *Config, key jwk.Key, log *slog.Logger) (*audit.Trail, error) {
	if cfg.AuditDir == AuditOff {
		log.Warn("--audit-dir off: no audit trail is kept")
		return nil, nil
	}
	dir := cfg.AuditDir
	if dir == "" {
		dir = filepath.Join(cfg.DataDir, "audit")
	}
	replica := cfg.Replica
	if replica == "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("audit trail: --replica not given and no host name: %w", err)
		}
		replica = host
	}
	t, err := audit.Open(audit.Config{Root: dir, Replica: replica, Key: key, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("audit trail: %w", err)
	}
	seq, _ := t.Head()
	log.Info("audit trail", "dir", dir, "replica", replica, "events", seq)
	return t, nil
}

// URL is the base URL the HTTP server listens on: http://host:port, or
// https:// with TLSCert.
func (s *Server) URL() string { return s.url }

// Addr is the HTTP listener's address.
func (s *Server) Addr() net.Addr { return s.httpLn.Addr() }

// GRPCAddr is the ext_authz gRPC listener's address; nil without
// GRPCListen.
func (s *Server) GRPCAddr() net.Addr {
	if s.grpcLn == nil {
		return nil
	}
	return s.grpcLn.Addr()
}

// Store is the store the server serves on.
func (s *Server) Store() *lease.Store { return s.store }

// UseCases are the use cases the server's handlers call (the registry
// among them).
func (s *Server) UseCases() *authz.UseCases { return s.useCases }

// Policies is the policy manager in force.
func (s *Server) Policies() *policy.Manager { return s.policies }

// Issuer is the dispatch-token issuer; nil without a signing key.
func (s *Server) Issuer() *authz.TokenIssuer { return s.issuer }

// Trail is this replica's audit trail; nil without a signing key or with
// AuditDir off.
func (s *Server) Trail() *audit.Trail { return s.trail }

// Follower keeps the trail, following the store's history; nil without
// a trail.
func (s *Server) Follower() *authz.Follower { return s.follower }
