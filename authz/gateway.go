package authz

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/internal/public"
	"github.com/fcd-authz/fcd/internal/tracing"
	"github.com/fcd-authz/fcd/record"
	"go.opentelemetry.io/otel/attribute"
)

// Errors of gateway decisions.
var (
	// ErrFormationRequired: the request is a tools/call (by its body or its
	// Mcp-Method header) and carries no formation id, and the gateway did
	// not ask to form it in one step. Nothing is formed or admitted.
	ErrFormationRequired = public.New("authz", "a tools/call needs a formation")
	// ErrMalformedMCP: the MCP request body a gateway forwarded cannot be
	// read one way only (fencecheck.ReadMessage refused it: not JSON, a
	// duplicate member, a member that is a name fcd reads only under case
	// folding, argument names that fold alike, a lone surrogate, a batch
	// holding a tools/call), or it disagrees with its Mcp-Method or
	// Mcp-Name header. Another parser could find a call in it that fcd
	// does not see, so it is refused.
	ErrMalformedMCP = public.New("authz", "the MCP request body cannot be read as one JSON-RPC message")
	// ErrCallerMismatch: the gateway's authenticated caller is missing or
	// is not the formation's principal (with CallerPrincipal binding).
	// Nothing is admitted.
	ErrCallerMismatch = public.New("authz", "the gateway's caller is not the principal of the formation")
)

// GateRequest is one request of an MCP session that a gateway asks about
// before proxying it, as the gateway's transport (forward-auth, Envoy
// ext_authz over HTTP or gRPC) reported it.
type GateRequest struct {
	// Gateway is the authenticated gateway credential id. A call formed in
	// one step is recorded with it as the host.
	Gateway string
	// Formation is the formation id the gateway sent beside the request
	// (the Fcd-Formation header); empty if none.
	Formation string
	// MCPMethods and MCPNames are the values of the request's Mcp-Method
	// and Mcp-Name headers (MCP clients from protocol 2026-07-28 on).
	MCPMethods, MCPNames []string
	// Method is the original request's HTTP method, where the gateway
	// tells it (forward-auth's X-Original-Method or X-Forwarded-Method;
	// ext_authz's own); empty when unknown. A tools/call is always a POST
	// (MCP streamable HTTP): a GET (the event stream) or a DELETE (session
	// close) is session traffic whatever it carries. A client that lies
	// about it only has its own call refused at the fence (no token).
	Method string
	// Body is the request body when the gateway forwards it; empty when it
	// does not (forward-auth never does).
	Body []byte
	// Snapshot and Session ask for one-step mode: a tools/call body without
	// a formation id is formed against Snapshot in Session and admitted at
	// once. Both or neither.
	Snapshot, Session string
	// Server names the MCP server of a one-step call: the tool is
	// Server+"/"+params.name. Empty means params.name is "server/tool".
	Server string
	// Principal is who a one-step call is for, as vouched by the gateway;
	// empty means Caller, else the gateway itself.
	Principal string
	// Caller is the identity the gateway authenticated for the request
	// (its mTLS, JWT or basic authentication; the Fcd-Caller header the
	// gateway sets, never the client's). With CallerPrincipal binding a
	// formation is admitted only for its principal.
	Caller string
}

// GateDecision is what the gateway does with the request. With a nil
// error and a nil Grant the request goes on without a dispatch token:
// it is MCP session traffic, not a call.
type GateDecision struct {
	// Grant is the granted admission of a call; its token and pool go
	// with the request.
	Grant *Grant
	// Formation is the id of the formation decided on: the one the request
	// named, or the one formed in one step (also when that one was refused:
	// pending approval or denied). Empty for session traffic.
	Formation string
	// Call reports whether the request was recognised as a tools/call.
	Call bool
	// Formed reports whether the formation was formed by this request (one
	// step).
	Formed bool
}

// Gate is the use case of gateways in front of an MCP server: it decides
// each request of a session before the gateway proxies it, admitting the
// tools/calls it carries (Admissions) or forming and admitting them in one
// step (Formations), bound to the caller the gateway authenticated.
type Gate struct {
	formations *Formations
	admissions *Admissions
	caller     CallerBinding
}

// Check decides one request a gateway is about to proxy. A request its
// body or Mcp-Method header shows is not a tools/call passes as session
// traffic, whatever formation it names. Otherwise, with a formation id
// (from the gateway, or params._meta["dev.fcd/formation"] of a tools/call
// body) it admits that formation, exactly as Admit does. Without
// one, a tools/call — by its body, or by its Mcp-Method header when there
// is no body — is refused with ErrFormationRequired, unless the body is a
// tools/call and the gateway asked for one-step mode (Snapshot and
// Session): then the call is formed and, if ready, admitted
// (FormAndAdmit). Anything else (initialize, notifications, tools/list, a
// GET stream, DELETE) goes on without a token; the backend's fencecheck
// refuses any tools/call that arrives without a valid one.
func (g *Gate) Check(ctx context.Context, req GateRequest) (GateDecision, error) {
	ctx, span := tracing.Start(ctx, tracerScope, "authz.gate")
	d, err := g.check(ctx, req)
	span.SetAttributes(attribute.Bool("fcd.call", d.Call), attribute.Bool("fcd.formed", d.Formed))
	if d.Formation != "" {
		span.SetAttributes(attribute.String("fcd.formation", d.Formation))
	}
	tracing.End(span, err)
	return d, err
}

func (g *Gate) check(ctx context.Context, req GateRequest) (GateDecision, error) {
	var msg fencecheck.Message
	hasBody := len(bytes.Trim(req.Body, jsonSpace)) > 0
	if hasBody {
		var err error
		if msg, err = readMCP(req.Body); err != nil {
			return GateDecision{}, err
		}
		if err := matchHeaders(msg, req.MCPMethods, req.MCPNames); err != nil {
			return GateDecision{}, err
		}
	}
	d := GateDecision{Call: msg.Call || (!hasBody && saysCall(req.MCPMethods))}
	// Only a tools/call is admitted. A request known to be something else
	// — by its body, or by its Mcp-Method header — is session traffic even
	// when it carries a formation (an SDK's custom-header option sends the
	// header on every request of the session): it passes without a token,
	// and the formation waits for its call. So does a GET or DELETE. A POST
	// without a body or Mcp-Method (forward-auth with an older client)
	// cannot be told from a call, and its formation is admitted:
	// docs/mcp-sessions.md.
	if !d.Call && (hasBody || len(req.MCPMethods) > 0) {
		return d, nil
	}
	if !d.Call && req.Method != "" && !strings.EqualFold(req.Method, "POST") {
		return d, nil
	}
	id := req.Formation
	if msg.Formation != "" {
		if id != "" && id != msg.Formation {
			return d, fmt.Errorf("%w: the formation header and params._meta[%q] name different formations",
				ErrBadRequest, fencecheck.MetaFormation)
		}
		id = msg.Formation
	}
	if id != "" {
		if len(id) > maxIDLength || strings.ContainsAny(id, "\x00\n\r") {
			return d, fmt.Errorf("%w: a formation id is 1-%d characters without control characters", ErrBadRequest, maxIDLength)
		}
		d.Formation = id
		var check func(*record.Formation) error
		if g.caller != CallerOff {
			check = func(rec *record.Formation) error { return checkCaller(req.Caller, rec.Principal.ID) }
		}
		a, err := g.admissions.admitChecked(ctx, d.Formation, check)
		d.Grant = a
		return d, err
	}
	if !d.Call {
		return d, nil
	}
	if !msg.Call || (req.Snapshot == "" && req.Session == "") {
		return d, fmt.Errorf("%w: send its formation id, or (with the body) ask for one-step formation", ErrFormationRequired)
	}
	if req.Snapshot == "" || req.Session == "" {
		return d, fmt.Errorf("%w: one-step formation needs both a snapshot and a session", ErrBadRequest)
	}
	tool := msg.Name
	if req.Server != "" {
		tool = req.Server + "/" + msg.Name
	}
	principal := req.Principal
	if g.caller != CallerOff {
		if principal == "" {
			principal = req.Caller
		}
		if err := checkCaller(req.Caller, principal); err != nil {
			return d, err
		}
	}
	rec, a, err := g.FormAndAdmit(ctx, FormRequest{
		Snapshot: req.Snapshot, Session: req.Session, Tool: tool, Arguments: msg.Arguments,
		PrincipalID: principal, Host: req.Gateway,
	})
	if rec != nil {
		d.Formation, d.Formed = rec.ID, true
	}
	d.Grant = a
	return d, err
}

// checkCaller enforces the CallerPrincipal binding.
func checkCaller(caller, principal string) error {
	switch {
	case strings.TrimSpace(caller) == "":
		return fmt.Errorf("%w: the gateway named no authenticated caller", ErrCallerMismatch)
	case !SameIdentity(caller, principal):
		return fmt.Errorf("%w: caller %q, principal %q", ErrCallerMismatch, caller, principal)
	}
	return nil
}

// FormAndAdmit forms a call (as Form does) and admits it at once when it
// is ready. A call that needs approval is recorded pending_approval and
// answered ErrNotApproved; one the policy denies is recorded denied and
// answered ErrFormationDenied. In both cases the formation is returned
// with the error, so that the caller can name it: after approval, admit it
// by id. When Form itself fails, no formation is returned.
func (g *Gate) FormAndAdmit(ctx context.Context, req FormRequest) (*record.Formation, *Grant, error) {
	rec, err := g.formations.Form(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	switch rec.Status {
	case record.StatusDenied:
		return rec, nil, fmt.Errorf("authz: admit %s: %w", rec.ID, ErrFormationDenied)
	case record.StatusPendingApproval:
		return rec, nil, fmt.Errorf("authz: admit %s: %w: 0 of %d approvals", rec.ID, ErrNotApproved, rec.ApprovalsRequired)
	}
	a, err := g.admissions.Admit(ctx, rec.ID)
	return rec, a, err
}

// readMCP reads a gateway's MCP request body with fencecheck's one strict
// reader, so that the gateway and the backend's fence decide on the same
// reading of the same bytes; a refusal wraps ErrMalformedMCP and keeps the
// reader's reason (errors.As a *fencecheck.RejectError).
func readMCP(body []byte) (fencecheck.Message, error) {
	m, err := fencecheck.ReadMessage(body)
	if err != nil {
		return fencecheck.Message{}, fmt.Errorf("%w: %w", ErrMalformedMCP, err)
	}
	return m, nil
}

// saysCall reports whether an Mcp-Method header value names tools/call in
// any letter case: such a request is taken for a call.
func saysCall(methods []string) bool {
	for _, m := range methods {
		if fencecheck.FoldName(strings.TrimSpace(m)) == fencecheck.FoldName(fencecheck.MethodCall) {
			return true
		}
	}
	return false
}

// matchHeaders refuses a body that its Mcp-Method or Mcp-Name headers
// contradict (values must equal the body's exactly): a server that
// dispatches on the headers must not run a call other than the one decided
// here.
func matchHeaders(m fencecheck.Message, methods, names []string) error {
	if saysCall(methods) && !m.Call {
		return fmt.Errorf("%w: the Mcp-Method header says tools/call, the body does not", ErrMalformedMCP)
	}
	if m.Method != "" {
		for _, h := range methods {
			if strings.TrimSpace(h) != m.Method {
				return fmt.Errorf("%w: the Mcp-Method header does not match the body", ErrMalformedMCP)
			}
		}
	}
	if m.Call {
		for _, n := range names {
			if strings.TrimSpace(n) != m.Name {
				return fmt.Errorf("%w: the Mcp-Name header does not match the body", ErrMalformedMCP)
			}
		}
	}
	return nil
}
