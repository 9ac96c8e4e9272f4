package front

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// formation is what a call needs of its formation record.
type formation struct {
	ID, Tool, Status  string
	ApprovalsRequired int
	Approvals         []client.Approval
	Reasons           []string
	ExpiresAt         time.Time
}

func formationOf(r *client.Formation) formation {
	f := formation{ID: r.Id, Tool: r.Tool, Status: string(r.Status), ApprovalsRequired: r.ApprovalsRequired,
		Approvals: r.Approvals, ExpiresAt: r.ExpiresAt}
	for _, e := range r.Decision.Engines {
		for _, reason := range e.Reasons {
			if !slices.Contains(f.Reasons, reason) {
				f.Reasons = append(f.Reasons, reason)
			}
		}
	}
	return f
}

// callTool is every listed tool's handler: it forms the call, waits for
// its approval, has it admitted and sends it upstream. Whatever stops it
// on the way is a refusal the model reads (a tool error), never a call
// sent without its formation and admission.
func (s *session) callTool(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	e := s.formedAgainst().tools[req.Params.Name]
	if e == nil {
		// Listed now but not in the catalog the client was shown: it must
		// list again (it was sent list_changed).
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams,
			Message: fmt.Sprintf("unknown tool %q: it is not in the catalog this session was shown; list the tools again", req.Params.Name)}
	}
	snapshot := s.formedAgainst().snapshot
	// An HTTP request carries its bearer's principal; a stdio request
	// carries nothing (no Extra): the session's principal is its caller.
	p := s.principal
	if req.Extra != nil {
		if tp, ok := principalOf(req.Extra.TokenInfo); ok {
			p = tp
		}
	}
	args := req.Params.Arguments
	if len(bytes.TrimSpace(args)) == 0 {
		args = json.RawMessage("{}")
	}
	digest, err := fencecheck.ArgumentDigest(e.tool, args)
	if err != nil {
		return refusal(e, &Refusal{Problem: "invalid-arguments",
			Detail: "the arguments cannot be sent as they are: " + strings.TrimPrefix(err.Error(), "fencecheck: ")}), nil
	}
	sessionID := req.Session.ID()
	if sessionID == "" {
		sessionID = s.fallbackID
	}
	key := callKey{e.tool, digest}

	f, r := s.formOrResume(ctx, e, key, snapshot, sessionID, args, p)
	if r != nil {
		return refusal(e, r), nil
	}
	f, r = s.awaitApproval(ctx, req, e, key, f)
	if r != nil {
		return refusal(e, r), nil
	}
	res, r := s.deliver(ctx, req, e, f, args)
	if r != nil {
		if r.admitted {
			s.noteFailure(e, key, f.ID)
		}
		return refusal(e, r), nil
	}
	if res.IsError {
		s.noteFailure(e, key, f.ID)
	} else {
		s.clearFailure(e)
	}
	return res, nil
}

// formOrResume forms the call — as the recovery of the session's failed
// call of the tool (or of the tool it falls back to) if there is one, as
// a new call otherwise — or resumes a formation of the same call that is
// still waiting for approval.
func (s *session) formOrResume(ctx context.Context, e *entry, key callKey, snapshot, sessionID string, args json.RawMessage, p Principal) (formation, *Refusal) {
	s.mu.Lock()
	pendingID := s.pending[key]
	prev, recovering := s.failed[e.tool]
	if recovering && prev.args != key.args && !prev.entry.mode("prompt_user") {
		recovering = false // another call of the tool: formed as a new one
	}
	if !recovering {
		for _, fc := range s.failed {
			for _, m := range fc.entry.failureModes {
				if m.Recovery == "fallback" && (m.Fallback == e.tool || m.Fallback == e.upstream) {
					prev, recovering = fc, true
				}
			}
		}
	}
	s.mu.Unlock()
	api := s.front.api
	if pendingID != "" {
		resp, err := api.GetFormationWithResponse(ctx, pendingID)
		if err == nil && resp.JSON200 != nil && string(resp.JSON200.Status) != "expired" {
			return formationOf(resp.JSON200), nil
		}
	}
	if recovering {
		body, _ := json.Marshal(map[string]any{"tool": e.tool, "arguments": args})
		var resp *client.RecoverFormationResponse
		var err error
		// The fence reports the failure after answering: until authzd has
		// it, the recovery is blocked. Wait for it, briefly.
		for wait := 0; ; wait++ {
			resp, err = api.RecoverFormationWithBodyWithResponse(ctx, prev.formation, "application/json", bytes.NewReader(body))
			var p *client.Problem
			if err == nil || !errors.As(err, &p) || p.Slug() != "recovery-blocked" || wait >= 20 || ctx.Err() != nil {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		if err != nil {
			return formation{}, problemRefusal("recovering the failed call "+prev.formation, err)
		}
		s.mu.Lock()
		delete(s.failed, prev.entry.tool)
		s.mu.Unlock()
		switch {
		case resp.JSON201 != nil:
			return formationOf(resp.JSON201), nil
		case resp.JSON403 != nil:
			return formationOf(resp.JSON403), nil
		}
		return formation{}, &Refusal{Problem: "authzd-unexpected", Detail: fmt.Sprintf("authzd answered %d to the recovery", resp.StatusCode())}
	}
	body := struct {
		Snapshot  string          `json:"snapshot"`
		Session   string          `json:"session"`
		Tool      string          `json:"tool"`
		Arguments json.RawMessage `json:"arguments"`
		Principal map[string]any  `json:"principal"`
	}{snapshot, sessionID, e.tool, args, map[string]any{"id": p.ID}}
	if len(p.Attributes) > 0 {
		body.Principal["attributes"] = p.Attributes
	}
	raw, err := json.Marshal(body)
	if err != nil {
		return formation{}, &Refusal{Problem: "invalid-arguments", Detail: err.Error()}
	}
	resp, err := api.CreateFormationWithBodyWithResponse(ctx, "application/json", bytes.NewReader(raw))
	if err != nil {
		return formation{}, problemRefusal("forming the call", err)
	}
	switch {
	case resp.JSON201 != nil:
		return formationOf(resp.JSON201), nil
	case resp.JSON403 != nil: // denied: the record says why
		return formationOf(resp.JSON403), nil
	}
	return formation{}, &Refusal{Problem: "authzd-unexpected", Detail: fmt.Sprintf("authzd answered %d to the formation", resp.StatusCode())}
}

// awaitApproval waits, for up to ApprovalWait, while the formation needs
// approval, telling a client that asked for progress how many approvals
// it has. A formation still pending when the wait ends is kept for the
// same call made again.
func (s *session) awaitApproval(ctx context.Context, req *mcp.CallToolRequest, e *entry, key callKey, f formation) (formation, *Refusal) {
	token := req.Params.GetProgressToken()
	deadline := time.Now().Add(s.front.cfg.ApprovalWait)
	lastSent, lastCount := time.Time{}, -1
	for f.Status == "pending_approval" {
		s.mu.Lock()
		s.pending[key] = f.ID
		s.mu.Unlock()
		approved := 0
		for _, a := range f.Approvals {
			if a.Decision == "approve" {
				approved++
			}
		}
		if token != nil && (approved != lastCount || time.Since(lastSent) > 10*time.Second) {
			lastSent, lastCount = time.Now(), approved
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token,
				Progress: float64(approved), Total: float64(f.ApprovalsRequired),
				Message: fmt.Sprintf("waiting for approval: %d of %d given; approvers decide at %s (formation %s)",
					approved, f.ApprovalsRequired, s.front.ui, f.ID)})
		}
		if time.Now().After(deadline) {
			return f, &Refusal{Problem: "approval-pending", Formation: f.ID, ApprovalURL: s.front.ui,
				Detail: fmt.Sprintf("the call of %s needs %d approval(s) and has %d; approvers decide at %s", e.tool, f.ApprovalsRequired, approved, s.front.ui),
				Advice: "Tell the user the call waits for approval; call the tool again with the same arguments once it is approved."}
		}
		t := time.NewTimer(s.front.cfg.PollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return f, &Refusal{Problem: "approval-pending", Formation: f.ID, Detail: "the request ended while the call waited for approval"}
		case <-t.C:
		}
		resp, err := s.front.api.GetFormationWithResponse(ctx, f.ID)
		if err != nil {
			var p *client.Problem
			if errors.As(err, &p) && p.RetryAfter > 0 {
				continue
			}
			return f, problemRefusal("reading formation "+f.ID, err)
		}
		if resp.JSON200 != nil {
			f = formationOf(resp.JSON200)
		}
	}
	s.mu.Lock()
	delete(s.pending, key)
	s.mu.Unlock()
	switch f.Status {
	case "ready", "admitted":
		return f, nil
	case "denied":
		r := &Refusal{Problem: "formation-denied", Formation: f.ID, Reasons: f.Reasons,
			Detail: "the call of " + e.tool + " was denied", Advice: "Do not retry this call; tell the user why it was denied."}
		for _, a := range f.Approvals {
			if a.Decision == "deny" {
				reason := "denied by approver " + a.Approver
				if a.Reason != nil && *a.Reason != "" {
					reason += ": " + *a.Reason
				}
				r.Reasons = append(r.Reasons, reason)
			}
		}
		return f, r
	case "expired":
		return f, &Refusal{Problem: "formation-expired", Formation: f.ID, Detail: "the call was not admitted in time",
			Advice: "Call the tool again if the user still wants it."}
	}
	return f, &Refusal{Problem: "lease-closed", Formation: f.ID, Detail: fmt.Sprintf("the formation of this call is %s", f.Status)}
}

// deliver admits the call (front → fence) and sends it to the pool it
// was admitted to with its token, or sends it to the gateway with its
// formation (front → gateway).
func (s *session) deliver(ctx context.Context, req *mcp.CallToolRequest, e *entry, f formation, args json.RawMessage) (*mcp.CallToolResult, *Refusal) {
	h := http.Header{}
	h.Set(methodHeader, "tools/call")
	h.Set(nameHeader, e.upstream)
	endpoint := s.front.cfg.Gateway
	admitted := false
	if endpoint != "" {
		h.Set(formationHeader, f.ID)
	} else {
		resp, err := s.front.api.AdmitFormationWithResponse(ctx, f.ID)
		if err != nil {
			return nil, problemRefusal("admitting the call", err).with(f.ID)
		}
		if resp.JSON200 == nil {
			return nil, (&Refusal{Problem: "authzd-unexpected", Detail: fmt.Sprintf("authzd answered %d to the admission", resp.StatusCode())}).with(f.ID)
		}
		a := resp.JSON200
		admitted = true
		endpoint = s.front.cfg.Pools[a.Target.Pool]
		if endpoint == "" {
			s.front.log.ErrorContext(ctx, "fcd front: a call was admitted to a pool the front has no endpoint for; it is not sent",
				"formation", f.ID, "pool", a.Target.Pool)
			return nil, &Refusal{Problem: "no-route", Formation: f.ID, admitted: true,
				Detail: "the call was admitted to pool " + a.Target.Pool + ", which this front has no endpoint for; it was not sent"}
		}
		h.Set(tokenHeader, a.Token)
		h.Set(targetHeader, a.Target.Pool)
	}
	u, err := s.upstreamFor(ctx, endpoint)
	if err != nil {
		s.front.log.WarnContext(ctx, "fcd front: upstream unreachable", "formation", f.ID, "err", err)
		return nil, &Refusal{Problem: "upstream-unavailable", Formation: f.ID, admitted: admitted,
			Detail: "the server could not be reached; the call was not sent", Advice: "Try again later."}
	}
	var forward func(*mcp.ProgressNotificationParams)
	if token := req.Params.GetProgressToken(); token != nil {
		forward = func(p *mcp.ProgressNotificationParams) {
			q := *p
			q.ProgressToken = token
			_ = req.Session.NotifyProgress(ctx, &q)
		}
	}
	params := &mcp.CallToolParams{Name: e.upstream, Arguments: args}
	res, refused, err := u.call(ctx, h, params, forward)
	switch {
	case refused != nil:
		r := &Refusal{Problem: refused.Problem, Formation: f.ID, Detail: refused.Detail, RetryAfter: refused.RetryAfter,
			Status: refused.Status, admitted: admitted}
		return nil, r.advised()
	case err != nil:
		var rpc *jsonrpc.Error
		if errors.As(err, &rpc) {
			// The fence refuses with a JSON-RPC error whose data names its
			// reason; the server's own errors come back as they are.
			var data struct {
				Type string `json:"type"`
			}
			_ = json.Unmarshal(rpc.Data, &data)
			reason := data.Type
			if i := strings.LastIndex(reason, "#reason-"); i >= 0 {
				reason = reason[i+len("#reason-"):]
			}
			if reason != "" {
				return nil, (&Refusal{Problem: reason, Formation: f.ID, Detail: rpc.Message, admitted: admitted}).advised()
			}
			return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: rpc.Message}}}, nil
		}
		s.front.log.WarnContext(ctx, "fcd front: the call failed upstream", "formation", f.ID, "err", err)
		return nil, &Refusal{Problem: "upstream-unavailable", Formation: f.ID, admitted: admitted,
			Detail: "the server did not answer the call; whether it ran is not known to the front", Advice: "Do not assume it ran or not; ask the user."}
	}
	return res, nil
}

// noteFailure remembers the session's failed call of a tool: the next call
// of the tool is formed as its recovery.
func (s *session) noteFailure(e *entry, key callKey, formation string) {
	if len(e.failureModes) == 0 {
		return
	}
	s.mu.Lock()
	s.failed[e.tool] = failedCall{formation: formation, entry: e, args: key.args}
	s.mu.Unlock()
}

func (s *session) clearFailure(e *entry) {
	s.mu.Lock()
	delete(s.failed, e.tool)
	s.mu.Unlock()
}
