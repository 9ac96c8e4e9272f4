// Command mcpfixture runs the fcd drift fixtures (internal/fixtures) as
// processes: one release of one MCP server per process, over streamable
// HTTP, each call's effect recorded in an effect log that tests read over
// HTTP.
//
//	mcpfixture serve --server NAME --release R [--listen ADDR]
//	                 [--recorder-url URL | --recorder-listen ADDR]
//	                 [--stateless] [--json-response] [--allow-any-host] [--log-level L]
//	                 [--jwks URL | --keys FILE] [--issuer I] [--generation N]
//	                 [--pool P] [--artifact A] [--config C]
//	                 [--authzd URL --credential-file F | --offline] [--timeout D] [--max-body N]
//	mcpfixture recorder [--listen ADDR]
//	mcpfixture list [--json]
//
// serve answers MCP at /mcp, its identity at /fixture, its registration
// manifest at /manifest and liveness at /healthz. With --jwks or --keys it
// guards /mcp with the fencecheck middleware in-process (the flags mirror
// `fencecheck proxy`; pool, artifact and config default to the release's
// manifest, generation to 0): online with --authzd and --credential-file
// (each call's lease claimed before the effect, its outcome reported), or
// --offline. Without them it is unguarded: put it behind
// `fencecheck proxy --upstream http://ADDR --server NAME ...` instead.
//
// Effects go to the effect log at --recorder-url (the /effects URL of
// `mcpfixture recorder` or of another fixture), or to a log of this process
// served at --recorder-listen, or else at /effects on --listen.
//
// Once ready, each command prints "mcpfixture: listening on http://ADDR" on
// stderr; scripts and tests wait for that line.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/internal/cli"
	"github.com/fcd-authz/fcd/internal/fixtures"
)

const usage = `usage:
  mcpfixture serve [flags]     run one release of one fixture MCP server (-h for flags)
  mcpfixture recorder [flags]  run an effect log other fixtures record into (GET/POST/DELETE /effects)
  mcpfixture list [--json]     list the fixture servers and releases with their pool, artifact and config
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run executes one command line and returns the exit status: 0, 1 on an
// error, 2 on a command line it cannot understand.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.ExitStatus(stderr, "mcpfixture", usage, dispatch(ctx, args, stdout, stderr))
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: no command", cli.ErrUsage)
	}
	switch args[0] {
	case "serve":
		return serve(ctx, args[1:], stderr)
	case "recorder":
		return recorder(ctx, args[1:], stderr)
	case "list":
		return list(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	return fmt.Errorf("%w: unknown command %q", cli.ErrUsage, args[0])
}

func newLogger(stderr io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("%w: --log-level: %v", cli.ErrUsage, err)
	}
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: l})), nil
}

// fenceFlags configure the in-process fencecheck guard; they mirror
// `fencecheck proxy`.
type fenceFlags struct {
	pool, artifact, config, issuer, jwks, keys, authzd, credFile string
	generation, maxBody                                          int64
	timeout                                                      time.Duration
	offline                                                      bool
}

func (f *fenceFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.jwks, "jwks", "", "guard /mcp with fencecheck, trusting authzd's JWKS at this URL, e.g. http://authzd:8080/.well-known/jwks.json")
	fs.StringVar(&f.keys, "keys", "", "guard /mcp with fencecheck, trusting the public keys of this JWKS file")
	fs.StringVar(&f.issuer, "issuer", "", "the only token issuer (iss) accepted; empty accepts any issuer the keys vouch for")
	fs.StringVar(&f.pool, "pool", "", "this backend's pool (default: the release manifest's)")
	fs.StringVar(&f.artifact, "artifact", "", "the artifact this backend runs (default: the release manifest's digest)")
	fs.StringVar(&f.config, "config", "", "this backend's configuration digest (default: the release manifest's)")
	fs.Int64Var(&f.generation, "generation", 0, "this backend's generation in its pool")
	fs.StringVar(&f.authzd, "authzd", "", "authzd's base URL: each call's lease is claimed there before the effect and its outcome reported (needs --credential-file; required unless --offline)")
	fs.BoolVar(&f.offline, "offline", false, "guard without authzd: no lease claims or outcome reports; only this process's replay memory, and tokens of leases admitted before it started are refused")
	fs.StringVar(&f.credFile, "credential-file", "", "file holding the bearer credential of role backend")
	fs.DurationVar(&f.timeout, "timeout", 0, "bound on a verified call; past it the outcome is reported uncertain (0: none)")
	fs.Int64Var(&f.maxBody, "max-body", fencecheck.DefaultMaxBodyBytes, "bound on request bodies in bytes (413 beyond)")
}

func (f *fenceFlags) enabled() bool { return f.jwks != "" || f.keys != "" }

// guard wraps h in the fencecheck middleware the flags describe; the
// returned close function drains the outcome reporter.
func (f *fenceFlags) guard(h http.Handler, rel fixtures.Release, log *slog.Logger) (http.Handler, func(), error) {
	if f.jwks != "" && f.keys != "" {
		return nil, nil, fmt.Errorf("%w: give at most one of --jwks and --keys", cli.ErrUsage)
	}
	if f.generation < 0 {
		return nil, nil, fmt.Errorf("%w: --generation is negative", cli.ErrUsage)
	}
	v := rel.Verifier(f.generation)
	v.Issuer, v.JWKSURL = f.issuer, f.jwks
	for dst, src := range map[*string]string{&v.Pool: f.pool, &v.Artifact: f.artifact, &v.Config: f.config} {
		if src != "" {
			*dst = src
		}
	}
	if f.keys != "" {
		data, err := os.ReadFile(f.keys)
		if err != nil {
			return nil, nil, fmt.Errorf("keys: %w", err)
		}
		if v.Keys, err = fencecheck.ParseJWKS(data); err != nil {
			return nil, nil, fmt.Errorf("keys %s: %w", f.keys, err)
		}
	}
	opts := fencecheck.MiddlewareConfig{Server: rel.Server, MaxBodyBytes: f.maxBody, Timeout: f.timeout, Logger: log}
	closeFn := func() {}
	switch {
	case f.offline && f.authzd != "":
		return nil, nil, fmt.Errorf("%w: --offline and --authzd exclude each other", cli.ErrUsage)
	case f.offline:
		log.Warn("offline: no lease claims and no outcome reports; a token runs at most once per process, and only for leases admitted after it started")
	case f.authzd == "":
		return nil, nil, fmt.Errorf("%w: --authzd (with --credential-file) is required, or --offline", cli.ErrUsage)
	case f.credFile == "":
		return nil, nil, fmt.Errorf("%w: --authzd needs --credential-file", cli.ErrUsage)
	default:
		cred, err := os.ReadFile(f.credFile)
		if err != nil {
			return nil, nil, fmt.Errorf("credential: %w", err)
		}
		credential := strings.TrimSpace(string(cred))
		claimer, err := fencecheck.NewLeaseClient(fencecheck.LeaseClientConfig{AuthzdURL: f.authzd, Credential: credential})
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %v", cli.ErrUsage, err)
		}
		v.Claimer = claimer
		rep, err := fencecheck.NewReporter(fencecheck.ReporterConfig{AuthzdURL: f.authzd, Credential: credential, Logger: log})
		if err != nil {
			return nil, nil, err
		}
		opts.Reporter = rep
		closeFn = func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := rep.Close(ctx); err != nil {
				log.Error("outcome reports abandoned at shutdown", "err", err, "stats", rep.Stats())
			}
		}
	}
	// Validated once complete (its Claimer included): a Verifier is not
	// changed after that.
	if err := v.Validate(); err != nil {
		closeFn()
		return nil, nil, fmt.Errorf("%w: %v", cli.ErrUsage, err)
	}
	log.Info("guarding /mcp with fencecheck", "pool", v.Pool, "artifact", v.Artifact, "config", v.Config,
		"generation", v.Generation, "keys", f.jwks+f.keys)
	return v.Middleware(h, opts), closeFn, nil
}

func serve(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("mcpfixture serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	server := fs.String("server", "", "fixture server: "+strings.Join(fixtures.Servers(), ", ")+" (required)")
	releaseName := fs.String("release", "", "release of the server, e.g. v1.4 (required; `mcpfixture list` shows them)")
	listen := fs.String("listen", "127.0.0.1:0", "listen address")
	recorderURL := fs.String("recorder-url", "", "record effects into the effect log at this URL, e.g. http://127.0.0.1:9000/effects")
	recorderListen := fs.String("recorder-listen", "", "serve this process's effect log at http://ADDR/effects instead of at /effects on --listen")
	stateless := fs.Bool("stateless", false, "serve without MCP sessions (protocol 2026-07-28): any request may reach any fixture process")
	jsonResponse := fs.Bool("json-response", false, "answer POSTs with application/json instead of an SSE stream")
	anyHost := fs.Bool("allow-any-host", false, "turn off the SDK's DNS-rebinding guard (403 for a non-loopback Host on a loopback address)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	var ff fenceFlags
	ff.register(fs)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *server == "" || *releaseName == "" {
		return fmt.Errorf("%w: --server and --release are required", cli.ErrUsage)
	}
	if *recorderURL != "" && *recorderListen != "" {
		return fmt.Errorf("%w: give at most one of --recorder-url and --recorder-listen", cli.ErrUsage)
	}
	if !ff.enabled() && (ff.authzd != "" || ff.offline || ff.pool != "" || ff.artifact != "" || ff.config != "" || ff.issuer != "") {
		return fmt.Errorf("%w: fence flags need --jwks or --keys", cli.ErrUsage)
	}
	log, err := newLogger(stderr, *logLevel)
	if err != nil {
		return err
	}
	rel, err := fixtures.Lookup(*server, *releaseName)
	if err != nil {
		return fmt.Errorf("%w: %v", cli.ErrUsage, err)
	}

	var sink fixtures.Sink
	var local *fixtures.Recorder
	if *recorderURL != "" {
		sink = &fixtures.RecorderClient{URL: *recorderURL}
	} else {
		local = fixtures.NewRecorder()
		sink = local
	}
	fx, err := fixtures.New(rel.Server, rel.Name, fixtures.Config{
		Sink: sink, Logger: log, Stateless: *stateless, JSONResponse: *jsonResponse, DisableLocalhostProtection: *anyHost,
	})
	if err != nil {
		return err
	}
	var mcpHandler http.Handler = fx
	closeFence := func() {}
	if ff.enabled() {
		if mcpHandler, closeFence, err = ff.guard(fx, rel, log); err != nil {
			return err
		}
	} else {
		log.Warn("unguarded: no --jwks or --keys, so tools/call runs without a dispatch token")
	}
	defer closeFence()

	var servers []*serverAt
	closeAll := func() {
		for _, s := range servers {
			s.close()
		}
	}
	effectsURL := *recorderURL
	if *recorderListen != "" {
		ln, err := net.Listen("tcp", *recorderListen)
		if err != nil {
			return fmt.Errorf("listen: %w", err)
		}
		servers = append(servers, serveOn(ln, effectsMux(local), log))
		effectsURL = "http://" + ln.Addr().String() + "/effects"
		fmt.Fprintf(stderr, "mcpfixture: recorder on %s\n", effectsURL)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		closeAll()
		return fmt.Errorf("listen: %w", err)
	}
	addr := ln.Addr().String()
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcpHandler)
	if effectsURL == "" {
		mux.Handle("/effects", local)
		effectsURL = "http://" + addr + "/effects"
	}
	info := map[string]any{
		"server": rel.Server, "release": rel.Name, "version": rel.Version, "pool": rel.Pool,
		"artifact": rel.Artifact, "config": rel.Config, "fenced": ff.enabled(), "generation": ff.generation,
		"mcp": "http://" + addr + "/mcp", "effects": effectsURL, "stateless": *stateless,
	}
	mux.HandleFunc("GET /fixture", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(info)
	})
	mux.HandleFunc("GET /manifest", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(rel.ManifestJSON())
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	servers = append(servers, serveOn(ln, mux, log))
	log.Info("serving", "release", rel.String(), "pool", rel.Pool, "mcp", info["mcp"], "effects", effectsURL, "fenced", ff.enabled())
	// This line is the contract of scripts and tests that start the fixture.
	fmt.Fprintf(stderr, "mcpfixture: listening on http://%s\n", addr)
	return wait(ctx, servers, log)
}

func effectsMux(rec *fixtures.Recorder) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/effects", rec)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	return mux
}

func recorder(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("mcpfixture recorder", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "listen address; the log is at http://ADDR/effects")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	log, err := newLogger(stderr, *logLevel)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	s := serveOn(ln, effectsMux(fixtures.NewRecorder()), log)
	log.Info("effect log", "url", "http://"+s.addr+"/effects")
	fmt.Fprintf(stderr, "mcpfixture: listening on http://%s\n", s.addr)
	return wait(ctx, []*serverAt{s}, log)
}

func list(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("mcpfixture list", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	type row struct {
		Server   string `json:"server"`
		Release  string `json:"release"`
		Version  string `json:"version"`
		Pool     string `json:"pool"`
		Artifact string `json:"artifact"`
		Config   string `json:"config"`
	}
	var rows []row
	for _, r := range fixtures.Releases() {
		rows = append(rows, row{r.Server, r.Name, r.Version, r.Pool, r.Artifact, r.Config})
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVER\tRELEASE\tPOOL\tARTIFACT\tCONFIG")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Server, r.Release, r.Pool, r.Artifact, r.Config)
	}
	return tw.Flush()
}

// serverAt is an HTTP server on a bound listener.
type serverAt struct {
	addr string
	srv  *http.Server
	errc chan error
}

// serveOn serves h on ln until the server is shut down or closed.
func serveOn(ln net.Listener, h http.Handler, log *slog.Logger) *serverAt {
	s := &serverAt{addr: ln.Addr().String(), errc: make(chan error, 1), srv: &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		// No WriteTimeout: MCP responses may be long-lived SSE streams.
	}}
	go func() { s.errc <- s.srv.Serve(ln) }()
	return s
}

// close stops the server at once and waits for Serve to return.
func (s *serverAt) close() {
	_ = s.srv.Close()
	<-s.errc
}

// wait serves until ctx ends or a server fails, then shuts every server
// down: in-flight calls get two seconds (fixture calls take milliseconds);
// then hanging SSE streams, and connections that never sent a request
// (which net/http would otherwise wait 5 s for), are cut.
func wait(ctx context.Context, servers []*serverAt, log *slog.Logger) error {
	failed := make(chan error, len(servers))
	for _, s := range servers {
		go func() { failed <- <-s.errc }()
	}
	var serveErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case serveErr = <-failed:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, s := range servers {
		if err := s.srv.Shutdown(sctx); err != nil {
			_ = s.srv.Close()
		}
	}
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", serveErr)
	}
	log.Info("stopped")
	return nil
}
