package front

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/internal/bounded"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
)

// Defaults of the zero fields of a Config. DefaultApprovalWait stays
// under the 60 s most MCP clients give a request (the TypeScript SDK's
// default) before they give up on it themselves.
const (
	DefaultApprovalWait   = 50 * time.Second
	DefaultPollInterval   = time.Second
	DefaultRelistInterval = 5 * time.Second
	DefaultSessionTimeout = 30 * time.Minute
)

// Paths the front serves.
const (
	// MCPPath is the MCP endpoint (streamable HTTP).
	MCPPath = "/mcp"
	// ResourceMetadataPath is the protected resource metadata (RFC 9728)
	// of the MCP endpoint.
	ResourceMetadataPath = "/.well-known/oauth-protected-resource"
)

// Config configures a [Front]. AuthzdURL, Credential and exactly one of
// Pools and Gateway are required; Auth is required to serve HTTP.
type Config struct {
	// AuthzdURL is authzd's base URL (scheme://host:port).
	AuthzdURL string
	// Credential is the front's bearer credential at authzd, of role host:
	// it snapshots, forms, admits (front → fence) and recovers calls.
	Credential string
	// Servers are the registered MCP servers the front fronts; empty
	// means every server with an ACTIVE epoch.
	Servers []string

	// Pools maps each backend pool authzd admits calls to (an epoch's
	// pool) to the MCP endpoint of that pool's fence: the front holds the
	// gateway role, admits each call itself and sends it there with its
	// dispatch token (front → fence). A call admitted to a pool not
	// listed is refused.
	Pools map[string]string
	// Gateway is the MCP endpoint of a gateway that admits calls (front →
	// gateway → fence): each call is sent there with its formation
	// (Fcd-Formation) and the gateway asks authzd. GatewayHeaders are
	// added to every request to it (the front's own credential there).
	Gateway        string
	GatewayHeaders map[string]string

	// Auth authenticates the front's clients (bearer tokens).
	Auth Authenticator
	// Resource is the front's resource identifier: the public URL of its
	// MCP endpoint, given in the protected resource metadata and, with a
	// JWTAuthenticator, the audience tokens must be for.
	Resource string
	// AuthorizationServers are the issuers a client may get tokens from,
	// named in the protected resource metadata.
	AuthorizationServers []string
	// Scopes, if any, must all be granted by a client's token.
	Scopes []string

	// ApprovalWait is how long a call that needs approval keeps its
	// request open; zero means [DefaultApprovalWait]. Past it the call is
	// answered "not approved yet" and the formation stays: the same call
	// made again in the session waits for it again.
	ApprovalWait time.Duration
	// PollInterval is how often a waiting call reads its formation; zero
	// means [DefaultPollInterval].
	PollInterval time.Duration
	// RelistInterval is how often the front looks for a change of the
	// ACTIVE releases; zero means [DefaultRelistInterval], negative never.
	RelistInterval time.Duration
	// SessionTimeout closes a client session idle that long; zero means
	// [DefaultSessionTimeout].
	SessionTimeout time.Duration

	// HTTPClient calls authzd and the upstream endpoints; nil means a
	// client without a timeout (calls and approval waits are long).
	HTTPClient *http.Client
	// Logger receives the front's records; nil means none. Tokens and
	// credentials are never logged.
	Logger *slog.Logger
}

func (c Config) validate() error {
	var errs []error
	if u, err := url.Parse(c.AuthzdURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("front: AuthzdURL %q is not an http(s) URL", c.AuthzdURL))
	}
	if c.Credential == "" {
		errs = append(errs, errors.New("front: Credential is empty: give the front's host credential at authzd"))
	}
	switch {
	case len(c.Pools) == 0 && c.Gateway == "":
		errs = append(errs, errors.New("front: give the pools' endpoints (front → fence) or a gateway (front → gateway)"))
	case len(c.Pools) > 0 && c.Gateway != "":
		errs = append(errs, errors.New("front: Pools and Gateway exclude each other"))
	}
	for pool, endpoint := range c.Pools {
		if u, err := url.Parse(endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("front: the endpoint %q of pool %s is not an http(s) URL", endpoint, pool))
		}
	}
	if c.Gateway != "" {
		if u, err := url.Parse(c.Gateway); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("front: Gateway %q is not an http(s) URL", c.Gateway))
		}
	}
	return errors.Join(errs...)
}

// Front is the MCP front. Serve its [Front.Handler] over HTTP, or one
// client over stdio with [Front.ServeStdio]. It is safe for concurrent
// use.
type Front struct {
	cfg    Config
	api    *client.ClientWithResponses
	hc     *http.Client
	log    *slog.Logger
	ui     string // authzd's approval page
	stop   context.CancelFunc
	loopWG sync.WaitGroup

	mu       sync.Mutex
	latest   *catalog // the catalog new sessions open; nil until one was taken
	epochs   string   // the ACTIVE epochs latest was taken at
	sessions map[*session]struct{}
	// catalogs are the catalogs built, by snapshot id (immutable); a
	// session holds its own, so one forgotten here is only built again.
	catalogs bounded.Cache[string, *catalog]
}

// New checks cfg and returns the front. Its relisting runs until
// [Front.Close].
func New(ctx context.Context, cfg Config) (*Front, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.ApprovalWait, DefaultApprovalWait)
	def(&cfg.PollInterval, DefaultPollInterval)
	def(&cfg.RelistInterval, DefaultRelistInterval)
	def(&cfg.SessionTimeout, DefaultSessionTimeout)
	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	base := strings.TrimRight(cfg.AuthzdURL, "/")
	api, err := client.New(base, cfg.Credential, client.WithHTTPClient(hc))
	if err != nil {
		return nil, fmt.Errorf("front: %w", err)
	}
	f := &Front{cfg: cfg, api: api, hc: hc, log: log, ui: base + "/ui/",
		sessions: map[*session]struct{}{}}
	f.catalogs.Max = 64
	loopCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	f.stop = stop
	if cfg.RelistInterval > 0 {
		f.loopWG.Add(1)
		go func() {
			defer f.loopWG.Done()
			f.relistLoop(loopCtx)
		}()
	}
	return f, nil
}

// Close stops the relisting and closes every client session (and its
// upstream sessions).
func (f *Front) Close() error {
	f.stop()
	f.loopWG.Wait()
	f.mu.Lock()
	open := make([]*session, 0, len(f.sessions))
	for s := range f.sessions {
		open = append(open, s)
	}
	f.mu.Unlock()
	for _, s := range open {
		s.close()
	}
	return nil
}

// Handler serves the MCP endpoint at [MCPPath] (bearer tokens required)
// and its protected resource metadata at [ResourceMetadataPath].
func (f *Front) Handler() (http.Handler, error) {
	if f.cfg.Auth == nil {
		return nil, errors.New("front: Config.Auth is required to serve HTTP: clients must be authenticated")
	}
	streamable := mcp.NewStreamableHTTPHandler(f.serverFor, &mcp.StreamableHTTPOptions{
		Logger: f.log, SessionTimeout: f.cfg.SessionTimeout,
		// The front is meant to be reached under its public name, not
		// only on loopback.
		DisableLocalhostProtection: true,
	})
	metaURL := ""
	if f.cfg.Resource != "" {
		if u, err := url.Parse(f.cfg.Resource); err == nil {
			metaURL = (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: ResourceMetadataPath}).String()
		}
	}
	bearer := auth.RequireBearerToken(verifier(f.cfg.Auth), &auth.RequireBearerTokenOptions{
		ResourceMetadataURL: metaURL, Scopes: f.cfg.Scopes})
	mux := http.NewServeMux()
	mux.Handle(MCPPath, bearer(answerDiscoverAsLegacy(f.catalogFirst(streamable))))
	mux.Handle(ResourceMetadataPath, auth.ProtectedResourceMetadataHandler(&oauthex.ProtectedResourceMetadata{
		Resource: f.cfg.Resource, AuthorizationServers: f.cfg.AuthorizationServers,
		ScopesSupported: f.cfg.Scopes, BearerMethodsSupported: []string{"header"}, ResourceName: "fcd MCP front",
	}))
	return mux, nil
}

// catalogFirst answers a new session's first request (a POST without a
// session id: the initialize) 503 with a JSON-RPC error when no catalog
// can be had — authzd unreachable before any snapshot was taken — rather
// than the SDK's bare 400: the client is told why, and may try again.
func (f *Front) catalogFirst(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.Header.Get("Mcp-Session-Id") == "" {
			if _, err := f.current(r.Context()); err != nil {
				f.log.WarnContext(r.Context(), "fcd front: no catalog for a new session", "err", err)
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Retry-After", "5")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte(`{"jsonrpc":"2.0","id":null,"error":{"code":-32603,` +
					`"message":"fcd: the tool catalog cannot be read now (fcd's authorization server is unreachable); try again shortly"}}`))
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// ServeStdio serves one client session over in and out (newline-delimited
// JSON-RPC, MCP's stdio transport) for principal p, until the client
// closes its end or ctx ends: for desktop clients that launch the front
// as a command.
func (f *Front) ServeStdio(ctx context.Context, p Principal, t mcp.Transport) error {
	if p.ID == "" {
		return errors.New("front: stdio needs a principal")
	}
	s, err := f.open(ctx, p)
	if err != nil {
		return err
	}
	defer s.close()
	return s.server.Run(ctx, t)
}

// serverFor is the SDK's getServer: each new client session (an
// initialize without a session id) gets its own server, holding the
// session's snapshot. A session the front cannot open a snapshot for is
// not opened (the SDK answers 400): no catalog, no calls.
func (f *Front) serverFor(req *http.Request) *mcp.Server {
	p, ok := principalOf(auth.TokenInfoFromContext(req.Context()))
	if !ok {
		return nil // the bearer middleware runs first; never reached
	}
	s, err := f.open(req.Context(), p)
	if err != nil {
		f.log.WarnContext(req.Context(), "fcd front: a session was not opened", "principal", p.ID, "err", err)
		return nil
	}
	return s.server
}

// current returns the catalog new sessions open: the latest taken, or a
// new snapshot when none was.
func (f *Front) current(ctx context.Context) (*catalog, error) {
	f.mu.Lock()
	c := f.latest
	f.mu.Unlock()
	if c != nil {
		return c, nil
	}
	epochs, err := f.activeEpochs(ctx)
	if err != nil {
		return nil, err
	}
	c, err = f.takeCatalog(ctx)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	if f.latest == nil {
		f.latest, f.epochs = c, epochs
	}
	c = f.latest
	f.mu.Unlock()
	return c, nil
}

// relistLoop takes a new snapshot whenever the ACTIVE epochs of the
// fronted servers change, and gives it to every open session.
func (f *Front) relistLoop(ctx context.Context) {
	t := time.NewTicker(f.cfg.RelistInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := f.relist(ctx); err != nil && ctx.Err() == nil {
			f.log.WarnContext(ctx, "fcd front: relisting failed; sessions keep their snapshots", "err", err)
		}
	}
}

// relist is one round of relistLoop.
func (f *Front) relist(ctx context.Context) error {
	epochs, err := f.activeEpochs(ctx)
	if err != nil {
		return err
	}
	f.mu.Lock()
	same := f.latest != nil && f.epochs == epochs
	f.mu.Unlock()
	if same {
		return nil
	}
	c, err := f.takeCatalog(ctx)
	if err != nil {
		return err
	}
	f.mu.Lock()
	changed := f.latest == nil || f.latest.snapshot != c.snapshot
	f.latest, f.epochs = c, epochs
	open := make([]*session, 0, len(f.sessions))
	for s := range f.sessions {
		open = append(open, s)
	}
	f.mu.Unlock()
	if !changed {
		return nil
	}
	f.log.InfoContext(ctx, "fcd front: a new snapshot for the open sessions", "snapshot", c.snapshot, "sessions", len(open))
	for _, s := range open {
		s.offer(c)
	}
	return nil
}

// activeEpochs is a fingerprint of the ACTIVE epochs of the fronted
// servers.
func (f *Front) activeEpochs(ctx context.Context) (string, error) {
	state := client.EpochStateACTIVE
	resp, err := f.api.ListEpochsWithResponse(ctx, &client.ListEpochsParams{State: &state})
	if err != nil {
		return "", fmt.Errorf("list the ACTIVE epochs: %w", err)
	}
	if resp.JSON200 == nil {
		return "", fmt.Errorf("list the ACTIVE epochs: authzd answered %d", resp.StatusCode())
	}
	var ids []string
	for _, e := range resp.JSON200.Epochs {
		if len(f.cfg.Servers) == 0 || slices.Contains(f.cfg.Servers, e.Server) {
			ids = append(ids, e.Id)
		}
	}
	slices.Sort(ids)
	return strings.Join(ids, ","), nil
}
