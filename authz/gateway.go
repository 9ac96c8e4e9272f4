package authz

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Errors of gateway decisions.
var (
	// ErrFormationRequired: the request is a tools/call (by its body or its
	// Mcp-Method header) and carries no formation id, and the gateway did
	// not ask to form it in one step. Nothing is formed or admitted.
	ErrFormationRequired = errors.New("authz: a tools/call needs a formation")
	// ErrMalformedMCP: the MCP request body a gateway forwarded cannot be
	// read safely: not JSON, an object with two members whose names differ
	// only in letter case, a batch holding a tools/call, or a body that
	// disagrees with its Mcp-Method or Mcp-Name header. Another parser
	// could find a call in it that fcd does not see, so it is refused.
	ErrMalformedMCP = errors.New("authz: the MCP request body cannot be read as one JSON-RPC message")
)

// MetaFormation is the key of a tools/call's params._meta that carries its
// formation id, for gateways that forward the body.
const MetaFormation = "dev.fcd/formation"

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
	// empty means the gateway itself.
	Principal string
}

// GateDecision is what the gateway does with the request. With a nil
// error and a nil Admission the request goes on without a dispatch token:
// it is MCP session traffic, not a call.
type GateDecision struct {
	// Admission is the granted admission of a call; its token and pool go
	// with the request.
	Admission *Admission
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

// Gate decides one request a gateway is about to proxy. With a formation
// id (from the gateway, or params._meta["dev.fcd/formation"] of a
// tools/call body) it admits that formation, exactly as Admit does. Without
// one, a tools/call — by its body, or by its Mcp-Method header when there
// is no body — is refused with ErrFormationRequired, unless the body is a
// tools/call and the gateway asked for one-step mode (Snapshot and
// Session): then the call is formed and, if ready, admitted
// (FormAndAdmit). Anything else (initialize, notifications, tools/list, a
// GET stream, DELETE) goes on without a token; the backend's fencecheck
// refuses any tools/call that arrives without a valid one.
func (f *Formations) Gate(ctx context.Context, req GateRequest) (GateDecision, error) {
	var msg mcpMessage
	hasBody := len(bytes.Trim(req.Body, jsonSpace)) > 0
	if hasBody {
		var err error
		if msg, err = readMCP(req.Body); err != nil {
			return GateDecision{}, err
		}
		if err := msg.matchHeaders(req.MCPMethods, req.MCPNames); err != nil {
			return GateDecision{}, err
		}
	}
	d := GateDecision{Call: msg.call || (!hasBody && saysCall(req.MCPMethods))}
	id := req.Formation
	if msg.formation != "" {
		if id != "" && id != msg.formation {
			return d, fmt.Errorf("%w: the formation header and params._meta[%q] name different formations",
				ErrBadRequest, MetaFormation)
		}
		id = msg.formation
	}
	if id != "" {
		if len(id) > maxIDLength || strings.ContainsAny(id, "\x00\n\r") {
			return d, fmt.Errorf("%w: a formation id is 1-%d characters without control characters", ErrBadRequest, maxIDLength)
		}
		d.Formation = id
		a, err := f.Admit(ctx, d.Formation)
		d.Admission = a
		return d, err
	}
	if !d.Call {
		return d, nil
	}
	if !msg.call || (req.Snapshot == "" && req.Session == "") {
		return d, fmt.Errorf("%w: send its formation id, or (with the body) ask for one-step formation", ErrFormationRequired)
	}
	if req.Snapshot == "" || req.Session == "" {
		return d, fmt.Errorf("%w: one-step formation needs both a snapshot and a session", ErrBadRequest)
	}
	tool := msg.name
	if req.Server != "" {
		tool = req.Server + "/" + msg.name
	}
	rec, a, err := f.FormAndAdmit(ctx, FormRequest{
		Snapshot: req.Snapshot, Session: req.Session, Tool: tool, Arguments: msg.arguments,
		PrincipalID: req.Principal, Host: req.Gateway,
	})
	if rec != nil {
		d.Formation, d.Formed = rec.ID, true
	}
	d.Admission = a
	return d, err
}

// FormAndAdmit forms a call (as Form does) and admits it at once when it
// is ready. A call that needs approval is recorded pending_approval and
// answered ErrNotApproved; one the policy denies is recorded denied and
// answered ErrFormationDenied. In both cases the formation is returned
// with the error, so that the caller can name it: after approval, admit it
// by id. When Form itself fails, no formation is returned.
func (f *Formations) FormAndAdmit(ctx context.Context, req FormRequest) (*Formation, *Admission, error) {
	rec, err := f.Form(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	switch rec.Status {
	case StatusDenied:
		return rec, nil, fmt.Errorf("authz: admit %s: %w", rec.ID, ErrFormationDenied)
	case StatusPendingApproval:
		return rec, nil, fmt.Errorf("authz: admit %s: %w: 0 of %d approvals", rec.ID, ErrNotApproved, rec.ApprovalsRequired)
	}
	a, err := f.Admit(ctx, rec.ID)
	return rec, a, err
}

// mcpMessage is what a gateway decision needs of an MCP request body.
type mcpMessage struct {
	method    string // "" for a response or a batch
	call      bool   // a single tools/call request
	name      string // params.name of a call
	arguments json.RawMessage
	formation string // params._meta["dev.fcd/formation"] of a call
}

// saysCall reports whether an Mcp-Method header value names tools/call.
func saysCall(methods []string) bool {
	for _, m := range methods {
		if strings.EqualFold(strings.TrimSpace(m), "tools/call") {
			return true
		}
	}
	return false
}

// matchHeaders refuses a body that its Mcp-Method or Mcp-Name headers
// contradict: a server that dispatches on the headers must not run a call
// other than the one decided here.
func (m mcpMessage) matchHeaders(methods, names []string) error {
	if saysCall(methods) && !m.call {
		return fmt.Errorf("%w: the Mcp-Method header says tools/call, the body does not", ErrMalformedMCP)
	}
	if m.method != "" {
		for _, h := range methods {
			if !strings.EqualFold(strings.TrimSpace(h), m.method) {
				return fmt.Errorf("%w: the Mcp-Method header does not match the body", ErrMalformedMCP)
			}
		}
	}
	if m.call {
		for _, n := range names {
			if strings.TrimSpace(n) != m.name {
				return fmt.Errorf("%w: the Mcp-Name header does not match the body", ErrMalformedMCP)
			}
		}
	}
	return nil
}

// readMCP reads a JSON-RPC body conservatively, as fencecheck does at the
// backend: member names are matched ignoring letter case (as lenient
// parsers do) and must be unique under case folding; a method named
// tools/call in any case is a call. So no parser finds a call, a tool name
// or arguments in the body that readMCP did not.
func readMCP(body []byte) (mcpMessage, error) {
	trimmed := bytes.Trim(body, jsonSpace)
	switch {
	case !json.Valid(trimmed):
		return mcpMessage{}, fmt.Errorf("%w: not JSON", ErrMalformedMCP)
	case trimmed[0] == '[':
		var batch []json.RawMessage
		if err := json.Unmarshal(trimmed, &batch); err != nil {
			return mcpMessage{}, fmt.Errorf("%w: %v", ErrMalformedMCP, err)
		}
		for _, el := range batch {
			m, err := readMCPObject(el)
			if err != nil {
				return mcpMessage{}, err
			}
			if m.call {
				return mcpMessage{}, fmt.Errorf("%w: a batch holds a tools/call; send calls one per request", ErrMalformedMCP)
			}
		}
		return mcpMessage{}, nil
	case trimmed[0] == '{':
		return readMCPObject(trimmed)
	}
	return mcpMessage{}, fmt.Errorf("%w: not a JSON-RPC message", ErrMalformedMCP)
}

// Member names as foldedMembers keys them.
var (
	foldedMethod    = foldName("method")
	foldedParams    = foldName("params")
	foldedName      = foldName("name")
	foldedArguments = foldName("arguments")
	foldedMeta      = foldName("_meta")
	foldedFormation = foldName(MetaFormation)
)

// readMCPObject reads one JSON-RPC message (valid JSON).
func readMCPObject(raw []byte) (mcpMessage, error) {
	members, err := foldedMembers(raw)
	if err != nil {
		return mcpMessage{}, err
	}
	var m mcpMessage
	if v, ok := members[foldedMethod]; ok {
		if json.Unmarshal(v, &m.method) != nil {
			return mcpMessage{}, fmt.Errorf("%w: method is not a string", ErrMalformedMCP)
		}
		m.call = strings.EqualFold(m.method, "tools/call")
	}
	if !m.call {
		return m, nil
	}
	p, ok := members[foldedParams]
	if !ok || !bytes.HasPrefix(bytes.Trim(p, jsonSpace), []byte("{")) {
		return m, nil // no tool name: forming it fails, admitting it needs an id
	}
	params, err := foldedMembers(p)
	if err != nil {
		return mcpMessage{}, err
	}
	if n, ok := params[foldedName]; ok && json.Unmarshal(n, &m.name) != nil {
		return mcpMessage{}, fmt.Errorf("%w: params.name is not a string", ErrMalformedMCP)
	}
	m.arguments = params[foldedArguments]
	if err := uniqueFolded(m.arguments); err != nil {
		// {"name":"x","Name":"y"}: the policy and the approver see x, a
		// lenient backend may run y.
		return mcpMessage{}, fmt.Errorf("%w: params.arguments: %v", ErrMalformedMCP, err)
	}
	if raw, ok := params[foldedMeta]; ok && !bytes.Equal(bytes.Trim(raw, jsonSpace), []byte("null")) {
		meta, err := foldedMembers(raw)
		if err != nil {
			return mcpMessage{}, fmt.Errorf("%w: params._meta is not an object", ErrMalformedMCP)
		}
		if v, ok := meta[foldedFormation]; ok && json.Unmarshal(v, &m.formation) != nil {
			return mcpMessage{}, fmt.Errorf("%w: params._meta[%q] is not a string", ErrMalformedMCP, MetaFormation)
		}
	}
	return m, nil
}

// foldedMembers returns the members of a JSON object by case-folded name;
// raw must be an object whose names are unique under case folding.
func foldedMembers(raw []byte) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("%w: not a JSON object", ErrMalformedMCP)
	}
	members := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrMalformedMCP, err)
		}
		name := foldName(tok.(string))
		if _, dup := members[name]; dup {
			return nil, fmt.Errorf("%w: member %q appears twice (ignoring letter case)", ErrMalformedMCP, tok)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrMalformedMCP, err)
		}
		members[name] = v
	}
	return members, nil
}

// uniqueFolded checks that no object in raw (valid JSON, or empty) has
// two members whose names differ only in letter case, at any depth.
func uniqueFolded(raw []byte) error {
	type frame struct {
		names   map[string]bool // nil for an array
		wantKey bool
	}
	var stack []*frame
	valueDone := func() {
		if n := len(stack); n > 0 && stack[n-1].names != nil {
			stack[n-1].wantKey = true
		}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if n := len(stack); n > 0 && stack[n-1].wantKey {
			top := stack[n-1]
			if name, ok := tok.(string); ok {
				k := foldName(name)
				if top.names[k] {
					return fmt.Errorf("member %q appears twice (ignoring letter case)", name)
				}
				top.names[k], top.wantKey = true, false
				continue
			}
			// '}': the object ends.
			stack = stack[:n-1]
			valueDone()
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{names: map[string]bool{}, wantKey: true})
		case json.Delim('['):
			stack = append(stack, &frame{})
		case json.Delim(']'):
			stack = stack[:len(stack)-1]
			valueDone()
		default:
			valueDone()
		}
	}
}

// foldName maps s to one representative of its case-folding class: each
// rune becomes the smallest rune of its simple folding orbit, so two names
// fold alike exactly when strings.EqualFold holds for them.
func foldName(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		if r == utf8.RuneError {
			b.WriteRune(r)
			continue
		}
		lo := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			lo = min(lo, f)
		}
		b.WriteRune(lo)
	}
	return b.String()
}
