package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/fcd-authz/fcd/server"
)

// serve runs the server until ctx ends (SIGINT or SIGTERM), then shuts
// down gracefully: in-flight requests finish, every goroutine the server
// started returns, and only then are the store and etcd closed.
func serve(ctx context.Context, args []string, stderr io.Writer) (err error) {
	d, err := build(ctx, args, stderr)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := d.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
		if err == nil {
			d.log.Info("stopped")
		}
	}()
	return d.run(ctx)
}

// daemon is the server `authzd serve` runs, with what the command adds
// to it: the SIGHUP registration, --dev's credentials and the lines
// scripts wait for.
type daemon struct {
	*server.Server
	cfg    Config
	log    *slog.Logger
	stderr io.Writer
	dev    *devCredentials // nil without --dev
	hup    chan os.Signal  // SIGHUP, registered for as long as the server lives
}

// build parses the command line, maps the flags and the configuration
// file onto a server.Config and builds the server, listening (see
// server.New). If it fails, it closes what it built.
func build(ctx context.Context, args []string, stderr io.Writer) (_ *daemon, err error) {
	cfg, err := parseServeFlags(args)
	if err != nil {
		return nil, err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return nil, fmt.Errorf("log level: %w", err)
	}
	d := &daemon{cfg: cfg, stderr: stderr, log: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))}
	if d.cfg.Dev {
		if d.dev, err = devSetup(&d.cfg, stderr); err != nil {
			return nil, err
		}
	}
	if err := d.cfg.Validate(); err != nil {
		return nil, fmt.Errorf("configuration: %w", err)
	}
	// Registered before the server is built, so that a SIGHUP once it
	// listens reloads the policies instead of ending the process.
	d.hup = make(chan os.Signal, 1)
	signal.Notify(d.hup, syscall.SIGHUP)
	defer func() {
		if err != nil {
			signal.Stop(d.hup)
		}
	}()
	sc := d.cfg.server(d.log, d.hup)
	sc.Serving = d.serving
	if d.Server, err = server.New(ctx, sc); err != nil {
		return nil, err
	}
	if d.dev != nil {
		if err := writeEnvFile(filepath.Join(d.cfg.DataDir, devEnvFile), d.dev, d.URL(), d.cfg.DataDir); err != nil {
			return nil, errors.Join(err, d.Close())
		}
	}
	return d, nil
}

// run serves until ctx ends.
func (d *daemon) run(ctx context.Context) error { return d.Run(ctx) }

// serving prints the addresses once the server serves: every loop runs,
// and a client that reads them connects at once.
func (d *daemon) serving() {
	if addr := d.GRPCAddr(); addr != nil {
		// Printed before the HTTP line, so that whoever waits for that one
		// knows both addresses.
		fmt.Fprintf(d.stderr, "authzd: ext_authz gRPC on %s\n", addr)
	}
	// This line is the contract of scripts and tests that start authzd.
	fmt.Fprintf(d.stderr, "authzd: listening on %s\n", d.URL())
}

// Close closes the server and ends the SIGHUP registration.
func (d *daemon) Close() error {
	err := d.Server.Close()
	signal.Stop(d.hup)
	return err
}

// server maps the configuration onto the server's: the same settings,
// with durations as time.Duration and --formation-rate 0 as no limit.
func (c *Config) server(log *slog.Logger, reload <-chan os.Signal) server.Config {
	rate := c.FormationRate
	if rate == 0 {
		rate = server.NoFormationLimit
	}
	mask := c.DecisionLogMask
	if mask == nil {
		mask = []string{} // the flag's default is written out: none given is none
	}
	return server.Config{
		Listen: c.Listen, TLSCert: c.TLSCert, TLSKey: c.TLSKey, GRPCListen: c.GRPCListen,
		DataDir: c.DataDir, EtcdEndpoints: c.EtcdEndpoints, EtcdPrefix: c.EtcdPrefix,
		EtcdCA: c.EtcdCA, EtcdCert: c.EtcdCert, EtcdKey: c.EtcdKey,
		EmbeddedEtcdClientURL: c.EmbeddedEtcdClientURL, EmbeddedEtcdPeerURL: c.EmbeddedEtcdPeerURL, EtcdQuota: c.EtcdQuota,
		FormationRate: rate, FormationBurst: c.FormationBurst, BodyLimit: c.BodyLimit,
		RegistrarKeys: c.RegistrarKeys, IssuerKeys: c.IssuerKeys, OperatorKeys: c.OperatorKeys, Credentials: c.Credentials,
		PolicyDir: c.PolicyDir, PolicyPoll: time.Duration(c.PolicyPoll), Reload: reload,
		FormationTTL: time.Duration(c.FormationTTL), FormationRetention: time.Duration(c.FormationRetention),
		ReportGrace: time.Duration(c.ReportGrace), GatewayCaller: c.GatewayCaller,
		SigningKey: c.SigningKey, Issuer: c.Issuer, TokenLifetime: time.Duration(c.TokenLifetime),
		AuditDir: c.AuditDir, Replica: c.Replica, AuditArguments: c.AuditArguments, AuditMaxLag: time.Duration(c.AuditMaxLag),
		DecisionLogURL: c.DecisionLogURL, DecisionLogResource: c.DecisionLogResource,
		DecisionLogCredentialFile: c.DecisionLogCredentialFile, DecisionLogMask: mask,
		DecisionLogLabels: c.DecisionLogLabels, DecisionLogBuffer: c.DecisionLogBuffer, DecisionLogUploadLimit: c.DecisionLogUploadLimit,
		DecisionLogMinDelay: time.Duration(c.DecisionLogMinDelay), DecisionLogMaxDelay: time.Duration(c.DecisionLogMaxDelay),
		NotifyURL: c.NotifyURL, NotifySecretFile: c.NotifySecretFile, NotifyFormat: c.NotifyFormat, NotifyPageURL: c.NotifyPageURL,
		NotifyQueue: int(c.NotifyQueue),
		Logger:      log,
	}
}
