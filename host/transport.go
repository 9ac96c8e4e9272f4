package host

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fcd-authz/fcd/client"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Headers the transport reads and sets.
const (
	// FormationHeader carries the formation id of a tools/call to the
	// gateway.
	FormationHeader = "Fcd-Formation"
	// MethodHeader names the JSON-RPC method of a POST, so that a gateway
	// that cannot read bodies tells a call from session traffic.
	MethodHeader = "Mcp-Method"
	// SessionHeader is the MCP session of a request; a call is formed in
	// it.
	SessionHeader = "Mcp-Session-Id"
	// ProblemHeader names the cause of a refusal (authzd's problem type,
	// fencecheck's reason).
	ProblemHeader = "Fcd-Problem"
)

// Credential is a bearer credential. It prints and logs as "[redacted]",
// so that a Config can be logged whole.
type Credential string

func (Credential) String() string { return "[redacted]" }

// GoString keeps %#v from printing the secret too.
func (Credential) GoString() string { return `"[redacted]"` }

// LogValue keeps slog from printing the secret.
func (Credential) LogValue() slog.Value { return slog.StringValue("[redacted]") }

// MarshalJSON keeps a JSON log of a struct holding it from printing the
// secret.
func (Credential) MarshalJSON() ([]byte, error) { return []byte(`"[redacted]"`), nil }

// Principal is who a call is formed for, as the host vouches
// (FormationRequest.principal). Behind a gateway that binds callers
// (authzd --gateway-caller principal, the default), ID must be the user
// the gateway authenticates.
type Principal struct {
	// ID is the principal's id; empty means the host credential's id.
	ID string
	// Attributes are what the policies may use (groups, department, ...).
	Attributes map[string]any
}

// Config configures a [Transport]. AuthzdURL and Credential are
// required; every other zero field means its default.
type Config struct {
	// AuthzdURL is authzd's base URL (scheme://host:port).
	AuthzdURL string
	// Credential is the host's bearer credential (role host).
	Credential Credential
	// Snapshot is the id of the catalog snapshot the model was shown.
	// Empty: New takes one of Servers.
	Snapshot string
	// Servers are the MCP servers (as registered) New snapshots when
	// Snapshot is empty; empty means every server.
	Servers []string
	// Server is the registered server this transport's MCP endpoint
	// serves: a call of tool "x" is formed as "Server/x". Empty: the
	// snapshot must list exactly one tool named x.
	Server string
	// Principal is who calls are formed for; [WithPrincipal] overrides it
	// for one call.
	Principal Principal
	// Session is the session a call is formed in when its request carries
	// no Mcp-Session-Id (a stateless server); empty means an id New draws
	// at random, one for the transport's life.
	Session string
	// WaitForApproval makes RoundTrip wait, for as long as the request's
	// context allows, until approvers decide a call that needs approval;
	// false ends such a call at once with a [*PendingError].
	WaitForApproval bool
	// OnPending, if set, is called once for each call that waits for
	// approval, before waiting (to show the host's user the approval
	// page). It must not block for long.
	OnPending func(ctx context.Context, pending *PendingError)
	// PollInterval is how often a waiting call reads its formation;
	// zero means 1 s. A Retry-After from authzd lengthens a wait.
	PollInterval time.Duration
	// Base sends the requests to the MCP endpoint (the gateway); nil
	// means http.DefaultTransport.
	Base http.RoundTripper
	// AuthzdClient sends the requests to authzd; nil means
	// http.DefaultClient.
	AuthzdClient *http.Client
	// Logger receives one debug record per formed call; nil means none.
	// Credentials are never logged.
	Logger *slog.Logger
}

// LogValue logs the configuration without its credential and functions.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(slog.String("authzdURL", c.AuthzdURL), slog.Any("credential", c.Credential),
		slog.String("snapshot", c.Snapshot), slog.Any("servers", c.Servers), slog.String("server", c.Server),
		slog.String("principal", c.Principal.ID), slog.Bool("waitForApproval", c.WaitForApproval))
}

// Transport is an [http.RoundTripper] for an MCP host's client: it forms
// each tools/call with authzd and sends it with its formation (the package
// documentation says what it does with each request). Give it to the
// official SDK as StreamableClientTransport.HTTPClient's Transport, or use
// [Transport.MCPTransport]. It is safe for concurrent use.
type Transport struct {
	api          authzd
	base         http.RoundTripper
	snapshot     string
	tools        map[string]bool // server/tool
	server       string
	principal    Principal
	session      string
	wait         bool
	onPending    func(context.Context, *PendingError)
	poll         time.Duration
	approvalPage string
	log          *slog.Logger
}

// New checks cfg, takes the snapshot when cfg names none, reads its tools,
// and returns the transport.
func New(ctx context.Context, cfg Config) (*Transport, error) {
	u, err := url.Parse(cfg.AuthzdURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("host: AuthzdURL %q is not an http(s) URL", cfg.AuthzdURL)
	}
	if cfg.Credential == "" {
		return nil, errors.New("host: Credential is empty: give the host's bearer credential")
	}
	hc := cfg.AuthzdClient
	if hc == nil {
		hc = http.DefaultClient
	}
	base := strings.TrimRight(cfg.AuthzdURL, "/")
	api, err := newTypedAuthzd(base, cfg.Credential, hc)
	if err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	return newTransport(ctx, cfg, api, base+"/ui/")
}

// newTransport is New with an authzd of the caller's.
func newTransport(ctx context.Context, cfg Config, api authzd, approvalPage string) (*Transport, error) {
	t := &Transport{api: api, base: cfg.Base, snapshot: cfg.Snapshot, server: cfg.Server, principal: cfg.Principal,
		session: cfg.Session, wait: cfg.WaitForApproval, onPending: cfg.OnPending, poll: cfg.PollInterval,
		approvalPage: approvalPage, log: cfg.Logger}
	if t.base == nil {
		t.base = http.DefaultTransport
	}
	if t.poll <= 0 {
		t.poll = time.Second
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	if t.session == "" {
		var b [12]byte
		_, _ = rand.Read(b[:])
		t.session = "host-" + hex.EncodeToString(b[:])
	}
	if t.snapshot == "" {
		id, err := api.createSnapshot(ctx, cfg.Servers)
		if err != nil {
			return nil, fmt.Errorf("host: take a snapshot of %s: %w", serversText(cfg.Servers), err)
		}
		t.snapshot = id
	}
	names, err := api.snapshotTools(ctx, t.snapshot)
	if err != nil {
		return nil, fmt.Errorf("host: read snapshot %s: %w", t.snapshot, err)
	}
	t.tools = make(map[string]bool, len(names))
	for _, n := range names {
		t.tools[n] = true
	}
	return t, nil
}

func serversText(s []string) string {
	if len(s) == 0 {
		return "every server"
	}
	return strings.Join(s, ", ")
}

// Snapshot returns the id of the snapshot calls are formed against: the
// catalog to show the model.
func (t *Transport) Snapshot() string { return t.snapshot }

// HTTPClient returns an http.Client that sends through t.
func (t *Transport) HTTPClient() *http.Client { return &http.Client{Transport: t} }

// MCPTransport returns the official SDK's streamable HTTP client transport
// to the MCP endpoint (the gateway's URL of the server), sending through t.
func (t *Transport) MCPTransport(endpoint string) *mcp.StreamableClientTransport {
	return &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: t.HTTPClient()}
}

type principalKey struct{}

// WithPrincipal returns a context whose tools/call requests are formed for
// p instead of [Config.Principal]: pass it to the SDK's CallTool.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

type formationKey struct{}

// WithFormation returns a context whose tools/call request is sent with
// the formation id instead of a new formation: the call of a
// [*PendingError], sent again once approvers approved it. The formation
// must be for the same call (the gateway and the fence refuse any other)
// and is waited for as a new one is.
func WithFormation(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, formationKey{}, id)
}

// RoundTrip forms a tools/call and sends it with its formation; it sends
// every other request untouched. It never changes req.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPost || req.Body == nil || req.Body == http.NoBody {
		return t.base.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("host: read the request body: %w", err)
	}
	// A RoundTripper must not change the caller's request: send a copy.
	out := req.Clone(req.Context())
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.ContentLength = int64(len(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	call, err := toolCallOf(body)
	if err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	if call == nil {
		return t.base.RoundTrip(out)
	}
	f, err := t.form(req.Context(), req, call)
	if err != nil {
		return nil, err
	}
	out.Header.Set(FormationHeader, f.ID)
	out.Header.Set(MethodHeader, "tools/call")
	resp, err := t.base.RoundTrip(out)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 400 && resp.Header.Get(ProblemHeader) != "" {
		return nil, refusalOf(resp, f.ID)
	}
	return resp, nil
}

// form forms the call and returns its formation once it is ready.
func (t *Transport) form(ctx context.Context, req *http.Request, call *toolCall) (Formation, error) {
	tool, err := t.resolve(call.Name)
	if err != nil {
		return Formation{}, err
	}
	session := req.Header.Get(SessionHeader)
	if session == "" {
		session = t.session
	}
	p := t.principal
	if cp, ok := ctx.Value(principalKey{}).(Principal); ok {
		p = cp
	}
	var f Formation
	if id, ok := ctx.Value(formationKey{}).(string); ok && id != "" {
		if f, err = t.api.formation(ctx, id); err != nil {
			return Formation{}, fmt.Errorf("host: read formation %s: %w", id, err)
		}
		if f.Tool != tool {
			return Formation{}, fmt.Errorf("host: formation %s is a call of %s, not of %s", id, f.Tool, tool)
		}
	} else {
		f, err = t.api.form(ctx, formRequest{Snapshot: t.snapshot, Session: session, Tool: tool, Arguments: call.Arguments, Principal: p})
		if err != nil {
			return Formation{}, fmt.Errorf("host: form the call of %s: %w", tool, err)
		}
		t.log.DebugContext(ctx, "fcd host: formed a call", "formation", f.ID, "tool", tool, "session", session, "status", f.Status)
	}
	if f.Status == "pending_approval" {
		pending := &PendingError{Formation: f, ApprovalURL: t.approvalPage}
		if !t.wait {
			return Formation{}, pending
		}
		if t.onPending != nil {
			t.onPending(ctx, pending)
		}
		if f, err = t.awaitDecision(ctx, f); err != nil {
			return Formation{}, err
		}
	}
	switch f.Status {
	case "ready":
		return f, nil
	case "denied":
		return Formation{}, deniedError(f)
	case "expired":
		return Formation{}, &ExpiredError{Formation: f}
	}
	return Formation{}, fmt.Errorf("host: formation %s of %s is %s, not ready to send", f.ID, tool, f.Status)
}

// awaitDecision reads the formation until it is no longer pending,
// waiting the poll interval (or authzd's Retry-After) in between.
func (t *Transport) awaitDecision(ctx context.Context, f Formation) (Formation, error) {
	for f.Status == "pending_approval" {
		wait := t.poll
		next, err := t.api.formation(ctx, f.ID)
		if err != nil {
			var p *client.Problem
			if !errors.As(err, &p) || p.RetryAfter == 0 {
				return Formation{}, fmt.Errorf("host: read formation %s: %w", f.ID, err)
			}
			wait = max(wait, p.RetryAfter)
		} else {
			f = next
			if f.Status != "pending_approval" {
				break
			}
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return Formation{}, fmt.Errorf("host: stopped waiting for the approval of formation %s: %w", f.ID, context.Cause(ctx))
		case <-timer.C:
		}
	}
	return f, nil
}

// resolve names the snapshot's tool of an MCP tool name.
func (t *Transport) resolve(name string) (string, error) {
	if t.server != "" {
		tool := t.server + "/" + name
		if !t.tools[tool] {
			return "", fmt.Errorf("host: %s: %w %s", tool, ErrUnknownTool, t.snapshot)
		}
		return tool, nil
	}
	found := ""
	for tool := range t.tools {
		if _, n, _ := strings.Cut(tool, "/"); n == name {
			if found != "" {
				return "", fmt.Errorf("host: %s: %w", name, ErrAmbiguousTool)
			}
			found = tool
		}
	}
	if found == "" {
		return "", fmt.Errorf("host: %s: %w %s", name, ErrUnknownTool, t.snapshot)
	}
	return found, nil
}

func deniedError(f Formation) *DeniedError {
	e := &DeniedError{Formation: f}
	// Both engines often give one reason alike: say it once.
	for _, r := range f.Reasons {
		if !slices.Contains(e.Reasons, r) {
			e.Reasons = append(e.Reasons, r)
		}
	}
	for _, a := range f.Approvals {
		if a.Decision == "deny" {
			e.Reasons = append(e.Reasons, "denied by "+a.Approver+prefixed(": ", a.Reason))
		}
	}
	return e
}

func prefixed(p, s string) string {
	if s == "" {
		return ""
	}
	return p + s
}

// refusalOf reads a refusal answer of the gateway or the fence and closes
// its body.
func refusalOf(resp *http.Response, formation string) *RefusedError {
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	e := &RefusedError{Formation: formation, Status: resp.StatusCode, Problem: resp.Header.Get(ProblemHeader),
		RetryAfter: retryAfter(resp.Header)}
	var body struct {
		Type, Title, Detail string
		Error               *struct {
			Message string
			Data    struct{ Type string }
		}
	}
	if json.Unmarshal(raw, &body) != nil {
		return e
	}
	if body.Error != nil {
		e.Fence, e.Type, e.Detail = true, body.Error.Data.Type, body.Error.Message
	} else {
		e.Type, e.Detail = body.Type, firstOf(body.Detail, body.Title)
	}
	return e
}

// retryAfter reads a Retry-After header of seconds; zero when absent or
// not seconds.
func retryAfter(h http.Header) time.Duration {
	s, err := strconv.Atoi(strings.TrimSpace(h.Get("Retry-After")))
	if err != nil || s < 0 {
		return 0
	}
	return time.Duration(s) * time.Second
}
