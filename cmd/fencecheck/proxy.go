package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/internal/cli"
	"github.com/fcd-authz/fcd/internal/telemetry"
	"go.opentelemetry.io/otel/propagation"
)

// proxy runs the sidecar until ctx ends (SIGINT or SIGTERM), then shuts
// down gracefully: in-flight calls finish, queued outcomes are sent.
func proxy(ctx context.Context, args []string, stderr io.Writer) error {
	var vf verifierFlags
	fs := vf.newFlagSet("fencecheck proxy", stderr)
	listen := fs.String("listen", "127.0.0.1:8090", "listen address")
	upstream := fs.String("upstream", "", "the MCP server's base URL, e.g. http://127.0.0.1:3000 (required)")
	server := fs.String("server", "", "the MCP server's name in fcd: params.name N is verified as the tool SERVER/N")
	authzd := fs.String("authzd", "", "authzd's base URL: each call's lease is claimed there before the effect and its outcome reported (needs --credential-file; required unless --offline)")
	credFile := fs.String("credential-file", "", "file holding the bearer credential of role backend")
	offline := fs.Bool("offline", false, "run without authzd: no lease claims or outcome reports; only this process's replay memory, and tokens of leases admitted before it started are refused (see fencecheck/README.md)")
	timeout := fs.Duration("timeout", 0, "bound on a verified call; past it the outcome is reported uncertain (0: none)")
	maxBody := fs.Int64("max-body", fencecheck.DefaultMaxBodyBytes, "bound on request bodies in bytes (413 beyond)")
	adoptedIdle := fs.Duration("adopted-idle", defaultAdoptedIdle, "close an MCP session the proxy opened for a call from another pool's session once idle this long")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&vf.check, "check", false, "check the command line, then exit without serving: 0 if the proxy would start with it (--keys and --credential-file are not read)")
	logFormat := fs.String("log-format", telemetry.LogText, "text or json (lines of a traced call carry trace_id and span_id)")
	otlpEndpoint := fs.String("otlp-endpoint", "", "OpenTelemetry collector to export traces to over OTLP, e.g. http://collector:4318 (default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or $OTEL_EXPORTER_OTLP_ENDPOINT, else no tracing)")
	otlpProtocol := fs.String("otlp-protocol", "", "OTLP protocol: http/protobuf or grpc (default: $OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("%w: --log-level: %v", cli.ErrUsage, err)
	}
	log, err := telemetry.NewLogger(stderr, *logFormat, level)
	if err != nil {
		return fmt.Errorf("%w: --log-format: %v", cli.ErrUsage, err)
	}
	tc := telemetry.Config{Endpoint: *otlpEndpoint, Protocol: *otlpProtocol, Service: "fencecheck", Version: telemetry.Build().Version}
	if err := tc.Validate(); err != nil {
		return fmt.Errorf("%w: %v", cli.ErrUsage, err)
	}

	target, err := url.Parse(*upstream)
	if err != nil || (target.Scheme != "http" && target.Scheme != "https") || target.Host == "" {
		return fmt.Errorf("%w: --upstream must be an http(s) URL", cli.ErrUsage)
	}
	var reporter *fencecheck.Reporter
	var claim fencecheck.Claimer
	switch {
	case *offline && *authzd != "":
		return fmt.Errorf("%w: --offline and --authzd exclude each other", cli.ErrUsage)
	case *offline:
		log.Warn("offline: no lease claims and no outcome reports; a token runs at most once per process, and only for leases admitted after it started")
	case *authzd == "":
		return fmt.Errorf("%w: --authzd (with --credential-file) is required, or --offline", cli.ErrUsage)
	case *credFile == "":
		return fmt.Errorf("%w: --authzd needs --credential-file", cli.ErrUsage)
	case vf.check:
		// The credential file is read at start, not by --check.
	default:
		cred, err := os.ReadFile(*credFile)
		if err != nil {
			return fmt.Errorf("credential: %w", err)
		}
		credential := strings.TrimSpace(string(cred))
		claimer, err := fencecheck.NewLeaseClient(fencecheck.LeaseClientConfig{AuthzdURL: *authzd, Credential: credential})
		if err != nil {
			return fmt.Errorf("%w: %v", cli.ErrUsage, err)
		}
		claim = claimer
		reporter, err = fencecheck.NewReporter(fencecheck.ReporterConfig{
			AuthzdURL: *authzd, Credential: credential, Logger: log,
		})
		if err != nil {
			return err
		}
	}

	v, err := vf.verifier(claim, time.Time{})
	if err != nil {
		return err
	}
	if vf.check {
		fmt.Fprintln(stderr, "fencecheck: command line ok")
		return nil
	}
	// Traces: each request's span continues the traceparent the gateway
	// forwarded (the client's), the fence's steps are its children, and
	// the claims and reports carry it to authzd.
	traces, err := telemetry.New(ctx, tc)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := traces.Shutdown(sctx); err != nil {
			log.Warn("traces not exported at shutdown", "err", err)
		}
		cancel()
	}()
	if tc.Enabled() {
		v.Tracer = telemetry.FenceTracer(traces)
		log.Info("traces exported over OTLP", "endpoint", cmp.Or(tc.Endpoint, "(from the environment)"))
	}

	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.SetXForwarded()
			if tc.Enabled() {
				// The backend's spans are children of the fence's.
				telemetry.Propagator.Inject(pr.Out.Context(), propagation.HeaderCarrier(pr.Out.Header))
			}
		},
		FlushInterval: -1, // stream SSE responses as they come
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			// A 502 makes the middleware report the call uncertain: the
			// upstream may have run it before the connection broke.
			log.Warn("upstream failed", "err", err, "method", r.Method, "path", r.URL.Path)
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	opts := fencecheck.MiddlewareConfig{
		Server: *server, MaxBodyBytes: *maxBody, Timeout: *timeout, Logger: log,
	}
	if reporter != nil {
		opts.Reporter = reporter
	}
	// Inside the fence: only a verified call may open an upstream session
	// (adopt.go).
	adopter := newSessionAdopter(rp, target, log)
	if *adoptedIdle > 0 {
		adopter.idle = *adoptedIdle
	}
	handler := v.Middleware(adopter, opts)
	if tc.Enabled() {
		handler = telemetry.Handler(handler, telemetry.HandlerConfig{Provider: traces, Scope: "github.com/fcd-authz/fcd/cmd/fencecheck"})
	}

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	actx, stopAdopter := context.WithCancel(context.WithoutCancel(ctx))
	adopterDone := make(chan struct{})
	go func() { adopter.run(actx); close(adopterDone) }()
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		// No WriteTimeout: MCP responses may be long-lived SSE streams.
	}
	// This line is the contract of scripts and tests that start the proxy.
	fmt.Fprintf(stderr, "fencecheck: listening on http://%s\n", ln.Addr())
	log.Info("guarding", "upstream", target.String(), "pool", vf.pool, "server", *server, "keys", vf.jwks+vf.keys)

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	var serveErr error
	select {
	case serveErr = <-errc:
	case <-ctx.Done():
		log.Info("shutting down")
		sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		if err := srv.Shutdown(sctx); err != nil {
			serveErr = fmt.Errorf("shutdown: %w", err)
		}
		cancel()
		if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) && serveErr == nil {
			serveErr = err
		}
	}
	// The sessions it opened close with it.
	stopAdopter()
	<-adopterDone
	if reporter != nil {
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := reporter.Close(rctx); err != nil {
			log.Error("outcome reports abandoned at shutdown", "err", err, "stats", reporter.Stats())
		}
		cancel()
	}
	if serveErr != nil {
		return fmt.Errorf("serve: %w", serveErr)
	}
	log.Info("stopped")
	return nil
}
