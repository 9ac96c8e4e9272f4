package api

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/fcd-authz/fcd/authz"
)

// Headers of the gateway protocol. The names are case-insensitive; gRPC
// CheckRequests carry them lower-cased.
const (
	// headerFormation names the formation of a call (request), and the
	// formation decided on (answer).
	headerFormation = "Fcd-Formation"
	// headerToken and headerTarget carry the dispatch token and the
	// admitted pool on an allowed call; the same names as fencecheck.Header
	// and fencecheck.TargetHeader (a test keeps them equal).
	headerToken  = "Fcd-Dispatch-Token"
	headerTarget = "Fcd-Target"
	// One-step formation (ext_authz with the body): the snapshot the model
	// saw, the session, the MCP server of params.name, and who the call is
	// for. The gateway vouches for them: it must set them itself, never
	// pass a client's.
	headerSnapshot  = "Fcd-Snapshot"
	headerSession   = "Fcd-Session"
	headerServer    = "Fcd-Server"
	headerPrincipal = "Fcd-Principal"
	// headerCaller is the identity the gateway authenticated for the
	// request (mTLS, JWT, basic authentication). The gateway must set it
	// itself, replacing any value the client sent.
	headerCaller = "Fcd-Caller"
	// MCP clients from protocol 2026-07-28 on name the JSON-RPC method and
	// tool of a request in these headers.
	headerMCPMethod = "Mcp-Method"
	headerMCPName   = "Mcp-Name"
	// envoyHeadersToRemove asks Envoy (HTTP service mode) to remove request
	// headers before proxying an allowed request.
	envoyHeadersToRemove = "X-Envoy-Auth-Headers-To-Remove"
)

// Paths of the gateway routes.
const (
	forwardAuthPath = "/v1/forward_auth"
	extAuthzPrefix  = "/v1/ext_authz"
)

// extAuthzMethods are the methods /v1/ext_authz/* answers: Envoy sends the
// authorization request with the original request's method. CONNECT is not
// among them (nor in OpenAPI's).
var extAuthzMethods = []string{
	http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodOptions, http.MethodTrace,
}

// gatewayCall is one request a gateway asks about, whatever the transport.
type gatewayCall struct {
	transport string // forward_auth, ext_authz, ext_authz_grpc
	method    string // the original request's method, if known
	uri       string // the original request's target, if known
	in        authz.GateRequest
}

// gatewayInput reads the gateway protocol's headers through get, which
// returns the values of a header by its canonical name. A header that
// must name one thing and is given twice is refused.
func gatewayInput(get func(name string) []string, caller Credential, body []byte) (authz.GateRequest, error) {
	var errs []string
	one := func(name string) string {
		vs := get(name)
		if len(vs) > 1 {
			errs = append(errs, fmt.Sprintf("%d %s headers", len(vs), name))
		}
		if len(vs) == 0 {
			return ""
		}
		return strings.TrimSpace(vs[0])
	}
	in := authz.GateRequest{
		Gateway:    caller.ID,
		Formation:  one(headerFormation),
		MCPMethods: get(headerMCPMethod),
		MCPNames:   get(headerMCPName),
		Body:       body,
		Snapshot:   one(headerSnapshot),
		Session:    one(headerSession),
		Server:     one(headerServer),
		Principal:  one(headerPrincipal),
		Caller:     one(headerCaller),
	}
	if len(errs) > 0 {
		return in, fmt.Errorf("%w: %s", errBadParameter, strings.Join(errs, ", "))
	}
	return in, nil
}

// firstHeader returns the first non-empty value of the named headers.
func firstHeader(h http.Header, names ...string) string {
	for _, n := range names {
		if v := h.Get(n); v != "" {
			return v
		}
	}
	return ""
}

// forwardAuth answers nginx auth_request, Caddy forward_auth and Traefik
// forwardAuth. No body: the call is named by its formation id, or told
// from session traffic by Mcp-Method.
func (s *server) forwardAuth(w http.ResponseWriter, r *http.Request) {
	caller, _ := CallerFrom(r.Context())
	in, err := gatewayInput(r.Header.Values, caller, nil)
	if err != nil {
		s.problem(w, r, err)
		return
	}
	s.gatewayHTTP(w, r, gatewayCall{
		transport: "forward_auth",
		method:    firstHeader(r.Header, "X-Original-Method", "X-Forwarded-Method"),
		uri:       firstHeader(r.Header, "X-Original-URI", "X-Forwarded-Uri"),
		in:        in,
	})
}

// extAuthz answers Envoy's ext_authz filter in HTTP service mode: the path
// after the prefix is the original path, the method the original method,
// and the body (with_request_body) the original body.
func (s *server) extAuthz(w http.ResponseWriter, r *http.Request) {
	caller, _ := CallerFrom(r.Context())
	body, err := io.ReadAll(r.Body)
	if err != nil {
		s.problem(w, r, err) // *http.MaxBytesError → 413
		return
	}
	in, err := gatewayInput(r.Header.Values, caller, body)
	if err != nil {
		s.problem(w, r, err)
		return
	}
	s.gatewayHTTP(w, r, gatewayCall{
		transport: "ext_authz",
		method:    r.Method,
		uri:       strings.TrimPrefix(r.URL.RequestURI(), extAuthzPrefix),
		in:        in,
	})
}

// gatewayHTTP decides c and answers over HTTP: 200 with the token and
// pool, 200 without them for session traffic, or a problem.
func (s *server) gatewayHTTP(w http.ResponseWriter, r *http.Request, c gatewayCall) {
	d, err := s.gate(r.Context(), c)
	h := w.Header()
	if d.Formation != "" {
		h.Set(headerFormation, d.Formation)
	}
	if err != nil {
		s.problemWith(w, r, err, gatewayExtensions(d))
		return
	}
	h.Set("Cache-Control", "no-store")
	switch {
	case d.Grant != nil:
		h.Set(headerToken, d.Grant.Token)
		h.Set(headerTarget, d.Grant.Target.Pool)
	case c.transport == "ext_authz":
		// Session traffic goes on without a token: make sure none that the
		// client sent itself goes with it. (Envoy overrides these headers
		// on an allowed call.)
		h.Set(envoyHeadersToRemove, strings.ToLower(headerToken)+", "+strings.ToLower(headerTarget))
	}
	w.WriteHeader(http.StatusOK)
}

// gate is the one decision of every gateway transport.
func (s *server) gate(ctx context.Context, c gatewayCall) (authz.GateDecision, error) {
	c.in.Method = c.method
	d, err := s.uc.Gate.Check(ctx, c.in)
	// Log the path only: a query string may carry secrets.
	path, _, _ := strings.Cut(c.uri, "?")
	attrs := []any{"transport", c.transport, "gateway", c.in.Gateway, "method", c.method, "path", path,
		"formation", d.Formation, "call", d.Call, "formed", d.Formed}
	switch {
	case err != nil:
		// 5xx causes are logged where the problem is rendered.
		s.log.InfoContext(ctx, "gateway deny", append(attrs, "problem", problemSlug(err))...)
	case d.Grant != nil:
		s.log.InfoContext(ctx, "gateway allow", append(attrs, "lease", d.Grant.Lease, "pool", d.Grant.Target.Pool)...)
	default:
		s.log.DebugContext(ctx, "gateway pass", attrs...)
	}
	return d, err
}

// gatewayExtensions are the extension members of a refusal: the formation
// decided on, so that a host can get a one-step call approved and retry it
// by id.
func gatewayExtensions(d authz.GateDecision) map[string]any {
	if d.Formation == "" {
		return nil
	}
	return map[string]any{"formation": d.Formation}
}

// problemSlug returns the problem type slug err maps to.
func problemSlug(err error) string {
	return strings.TrimPrefix(toProblem(err).Type, ProblemBase)
}
