package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/authz/policy"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/policies"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// serve runs the server until ctx ends (SIGINT or SIGTERM), then shuts
// down gracefully: in-flight requests finish, etcd is closed cleanly.
func serve(ctx context.Context, args []string, stderr io.Writer) error {
	cfg, err := parseServeFlags(args)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return fmt.Errorf("log level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	var dev *devCredentials
	if cfg.Dev {
		if dev, err = devSetup(&cfg, stderr); err != nil {
			return err
		}
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}

	verifier, err := manifest.LoadVerifier(cfg.RegistrarKeys)
	if err != nil {
		return err
	}
	auth, err := loadCredentials(cfg.Credentials)
	if err != nil {
		return err
	}

	endpoints := cfg.EtcdEndpoints
	if len(endpoints) == 0 {
		member, err := lease.StartEmbedded(ctx, lease.EmbedConfig{
			Dir:       filepath.Join(cfg.DataDir, "etcd"),
			ClientURL: cfg.EmbeddedEtcdClientURL,
			PeerURL:   cfg.EmbeddedEtcdPeerURL,
			LogFile:   filepath.Join(cfg.DataDir, "etcd.log"),
		})
		if err != nil {
			return err
		}
		defer member.Close()
		endpoints = member.Endpoints()
		log.Info("embedded etcd started", "dir", filepath.Join(cfg.DataDir, "etcd"), "endpoints", endpoints,
			"log", filepath.Join(cfg.DataDir, "etcd.log"))
	}
	var etcdTLS *tls.Config
	if cfg.EtcdCA != "" || cfg.EtcdCert != "" {
		info := transport.TLSInfo{TrustedCAFile: cfg.EtcdCA, CertFile: cfg.EtcdCert, KeyFile: cfg.EtcdKey}
		if etcdTLS, err = info.ClientConfig(); err != nil {
			return fmt.Errorf("etcd TLS: %w", err)
		}
	}
	store, err := lease.Open(ctx, lease.Config{Endpoints: endpoints, Prefix: cfg.EtcdPrefix, Logger: log, TLS: etcdTLS})
	if err != nil {
		return err
	}
	defer store.Close()

	src := policy.Source{Dir: cfg.PolicyDir, FS: policies.FS}
	pm, err := policy.NewManager(ctx, src, policy.ManagerConfig{Logger: log})
	if err != nil {
		return err
	}
	log.Info("policies loaded", "source", src.String(), "digest", pm.Status().Digest)
	if cfg.PolicyDir != "" {
		go pm.Watch(ctx, time.Duration(cfg.PolicyPoll))
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				// A failed reload keeps the working set; Reload logs why.
				_ = pm.Reload(ctx)
			}
		}
	}()

	var certificates *manifest.Verifier
	if cfg.IssuerKeys != "" {
		if certificates, err = manifest.LoadVerifier(cfg.IssuerKeys); err != nil {
			return fmt.Errorf("issuer keys: %w", err)
		}
	}
	registry, err := authz.NewRegistry(authz.RegistryConfig{Store: store, Manifests: verifier, Certificates: certificates, Logger: log})
	if err != nil {
		return err
	}

	var issuer *authz.TokenIssuer
	if cfg.SigningKey != "" {
		key, err := manifest.LoadPrivateKey(cfg.SigningKey)
		if err != nil {
			return fmt.Errorf("signing key: %w", err)
		}
		if issuer, err = authz.NewTokenIssuer(authz.TokenIssuerConfig{Key: key, Issuer: cfg.Issuer, Lifetime: time.Duration(cfg.TokenLifetime)}); err != nil {
			return err
		}
		go issuer.Publish(ctx, store)
		log.Info("dispatch tokens", "kid", issuer.KeyID(), "issuer", cfg.Issuer, "lifetime", issuer.Lifetime())
	} else {
		log.Warn("no --signing-key: admission is disabled")
	}

	useCases, err := authz.New(authz.Config{
		Store: store, Decider: pm, TTL: time.Duration(cfg.FormationTTL), Logger: log, Issuer: issuer, Certificates: certificates,
		ReportGrace: time.Duration(cfg.ReportGrace), GatewayCaller: authz.CallerBinding(cfg.GatewayCaller),
	})
	if err != nil {
		return err
	}
	// Leases whose backend never reported become uncertain, visible to
	// operators, instead of holding their epoch back silently.
	go useCases.Leases.RunSweeper(ctx, time.Minute)

	apiCfg := api.Config{
		Registry:     registry,
		UseCases:     useCases,
		PolicyStatus: pm.Status,
		Auth:         auth,
		BodyLimit:    cfg.BodyLimit,
		Logger:       log,
	}
	handler, err := api.New(apiCfg)
	if err != nil {
		return err
	}
	// The gRPC service shares the HTTP handler's use cases (and their
	// caches): a call formed through one is admitted through the other.
	var tlsCfg *tls.Config
	if cfg.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return fmt.Errorf("tls: %w", err)
		}
		tlsCfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	var grpcSrv *grpc.Server
	var grpcLn net.Listener
	if cfg.GRPCListen != "" {
		var opts []grpc.ServerOption
		if tlsCfg != nil {
			opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
		}
		if grpcSrv, err = api.NewCheckServer(apiCfg, opts...); err != nil {
			return err
		}
		if grpcLn, err = net.Listen("tcp", cfg.GRPCListen); err != nil {
			return fmt.Errorf("grpc listen: %w", err)
		}
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		if grpcLn != nil {
			grpcLn.Close()
		}
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      authz.MaxRetireWait + 30*time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	url := "http://" + ln.Addr().String()
	if tlsCfg != nil {
		srv.TLSConfig = tlsCfg.Clone()
		url = "https://" + ln.Addr().String()
	}
	if dev != nil {
		if err := writeEnvFile(filepath.Join(cfg.DataDir, devEnvFile), dev, url); err != nil {
			ln.Close()
			if grpcLn != nil {
				grpcLn.Close()
			}
			return err
		}
	}
	grpcErrc := make(chan error, 1)
	if grpcSrv != nil {
		go func() { grpcErrc <- grpcSrv.Serve(grpcLn) }()
		// Printed before the HTTP line, so that whoever waits for that one
		// knows both addresses.
		fmt.Fprintf(stderr, "authzd: ext_authz gRPC on %s\n", grpcLn.Addr())
	}
	// This line is the contract of scripts and tests that start authzd.
	fmt.Fprintf(stderr, "authzd: listening on %s\n", url)

	errc := make(chan error, 1)
	go func() {
		if tlsCfg != nil {
			errc <- srv.ServeTLS(ln, "", "") // HTTP/2 and HTTP/1.1 over TLS
			return
		}
		errc <- srv.Serve(ln)
	}()
	select {
	case err := <-errc:
		if grpcSrv != nil {
			grpcSrv.Stop()
		}
		return fmt.Errorf("serve: %w", err)
	case err := <-grpcErrc:
		_ = srv.Close()
		return fmt.Errorf("serve gRPC: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if grpcSrv != nil {
		// In-flight checks finish; past the deadline they are cut.
		stopped := make(chan struct{})
		go func() { grpcSrv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-sctx.Done():
			grpcSrv.Stop()
		}
	}
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	log.Info("stopped")
	return nil
}
