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
	"strings"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/front"
	"github.com/fcd-authz/fcd/internal/cli"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// frontTokenEnv holds the bearer token of a stdio session (what a desktop
// client's configuration sets for the command it launches).
const frontTokenEnv = "FCD_FRONT_TOKEN"

// frontCommand runs `authzd front`: the MCP front (package front) for
// unmodified MCP clients, over streamable HTTP or, with --stdio, for one
// client that launched it as a command.
func frontCommand(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("front", flag.ContinueOnError)
	fs.SetOutput(stderr)
	remote := addRemoteFlags(fs, api.RoleHost)
	listen := fs.String("listen", "127.0.0.1:7090", "where the MCP endpoint (/mcp) and its resource metadata listen")
	resource := fs.String("resource", "", "the public URL of the MCP endpoint: the resource metadata's resource and the JWT audience (default http://LISTEN/mcp)")
	var servers, pools, attrs, issuersFlag []string
	fs.Var(&listFlag{p: &servers}, "server", "a registered MCP server to front (repeatable; default every server with an ACTIVE epoch)")
	fs.Var(&listFlag{p: &pools}, "pool", "POOL=URL: the MCP endpoint of a pool's fence; the front admits each call and sends it there with its token (repeatable)")
	gateway := fs.String("gateway", "", "the MCP endpoint of a gateway that admits calls (front → gateway); excludes --pool")
	gatewayCred := fs.String("gateway-credential-file", "", "file holding the front's credential at the gateway, sent as Authorization (e.g. \"Basic …\" or \"Bearer …\")")
	issuer := fs.String("jwt-issuer", "", "accept JWT bearer tokens of this issuer (iss)")
	jwks := fs.String("jwt-jwks", "", "the issuer's JWKS URL")
	audience := fs.String("jwt-audience", "", "the audience (aud) tokens must be for (default --resource)")
	claim := fs.String("principal-claim", "sub", "the JWT claim that is the principal's id")
	fs.Var(&listFlag{p: &attrs}, "attribute-claim", "a JWT claim copied into the principal's attributes, for the policies (repeatable, e.g. groups)")
	fs.Var(&listFlag{p: &issuersFlag}, "authorization-server", "an authorization server named in the resource metadata (repeatable; default --jwt-issuer)")
	tokens := fs.String("tokens", "", "development: a JSON file of static bearer tokens, {\"TOKEN\": {\"id\": \"alice\", \"attributes\": {…}}}")
	wait := fs.Duration("approval-wait", front.DefaultApprovalWait, "how long a call waiting for approval keeps its request open")
	relist := fs.Duration("relist-interval", front.DefaultRelistInterval, "how often to look for a changed set of ACTIVE releases")
	stdio := fs.Bool("stdio", false, "serve one client session on standard input and output, as $"+frontTokenEnv+"'s principal")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return fmt.Errorf("%w: %v", cli.ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: front takes no arguments, got %q", cli.ErrUsage, fs.Args())
	}
	credential, err := roleCredential(api.RoleHost, *remote.credFile)
	if err != nil {
		return err
	}
	if *resource == "" {
		*resource = "http://" + *listen + front.MCPPath
	}
	cfg := front.Config{AuthzdURL: serverURL(*remote.url), Credential: credential, Servers: servers,
		Gateway: *gateway, Resource: *resource, ApprovalWait: *wait, RelistInterval: *relist,
		Logger: slog.New(slog.NewJSONHandler(stderr, nil))}
	if len(pools) > 0 {
		cfg.Pools = map[string]string{}
		for _, p := range pools {
			name, url, ok := strings.Cut(p, "=")
			if !ok || name == "" || url == "" {
				return fmt.Errorf("%w: --pool %q is not POOL=URL", cli.ErrUsage, p)
			}
			cfg.Pools[name] = url
		}
	}
	if *gatewayCred != "" {
		raw, err := os.ReadFile(*gatewayCred)
		if err != nil {
			return fmt.Errorf("the gateway credential: %w", err)
		}
		cfg.GatewayHeaders = map[string]string{"Authorization": strings.TrimSpace(string(raw))}
	}
	cfg.Auth, cfg.AuthorizationServers, err = frontAuth(ctx, *issuer, *jwks, firstNonEmpty(*audience, *resource), *claim, attrs, *tokens)
	if err != nil {
		return err
	}
	if len(issuersFlag) > 0 {
		cfg.AuthorizationServers = issuersFlag
	}
	f, err := front.New(ctx, cfg)
	if err != nil {
		return fmt.Errorf("%w: %w", cli.ErrUsage, err)
	}
	defer f.Close()
	if *stdio {
		p, err := cfg.Auth.Authenticate(ctx, strings.TrimSpace(os.Getenv(frontTokenEnv)))
		if err != nil {
			return fmt.Errorf("--stdio: $%s: %w", frontTokenEnv, err)
		}
		return f.ServeStdio(ctx, p, &mcp.IOTransport{Reader: io.NopCloser(stdin), Writer: nopWriteCloser{stdout}})
	}
	h, err := f.Handler()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("front: listen: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	cfg.Logger.Info("fcd front: serving MCP", "url", "http://"+ln.Addr().String()+front.MCPPath, "resource", *resource)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

// frontAuth builds the authenticator the flags give: JWTs of an issuer,
// static development tokens, or both (a token is tried as a JWT first).
func frontAuth(ctx context.Context, issuer, jwks, audience, claim string, attrs []string, tokensFile string) (front.Authenticator, []string, error) {
	var chain authChain
	var servers []string
	if issuer != "" || jwks != "" {
		a, err := front.NewJWTAuthenticator(ctx, front.JWTAuthenticator{Issuer: issuer, JWKSURL: jwks, Audience: audience,
			PrincipalClaim: claim, AttributeClaims: attrs}, nil)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %w", cli.ErrUsage, err)
		}
		chain = append(chain, a)
		servers = []string{issuer}
	}
	if tokensFile != "" {
		raw, err := os.ReadFile(tokensFile)
		if err != nil {
			return nil, nil, fmt.Errorf("--tokens: %w", err)
		}
		var doc map[string]struct {
			ID         string         `json:"id"`
			Attributes map[string]any `json:"attributes"`
		}
		dec := json.NewDecoder(strings.NewReader(string(raw)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&doc); err != nil {
			return nil, nil, fmt.Errorf("%w: --tokens %s: %v", cli.ErrUsage, tokensFile, err)
		}
		st := front.StaticTokens{}
		for tok, p := range doc {
			if tok == "" || p.ID == "" {
				return nil, nil, fmt.Errorf("%w: --tokens %s: every token needs an id", cli.ErrUsage, tokensFile)
			}
			st[tok] = front.Principal{ID: p.ID, Attributes: p.Attributes}
		}
		chain = append(chain, st)
	}
	if len(chain) == 0 {
		return nil, nil, fmt.Errorf("%w: front needs --jwt-issuer and --jwt-jwks, or --tokens: its clients must be authenticated", cli.ErrUsage)
	}
	return chain, servers, nil
}

// authChain accepts a token the first of its authenticators accepts.
type authChain []front.Authenticator

func (c authChain) Authenticate(ctx context.Context, token string) (front.Principal, error) {
	var errs []error
	for _, a := range c {
		p, err := a.Authenticate(ctx, token)
		if err == nil {
			return p, nil
		}
		errs = append(errs, err)
	}
	return front.Principal{}, errors.Join(errs...)
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}
