package host

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// authzd is what the transport asks of authzd's REST API. It is an
// interface so that the transport's logic reads apart from the wire.
// Implementations are safe for concurrent use.
type authzd interface {
	// createSnapshot freezes the servers' (all, when none) ACTIVE catalog
	// and returns the snapshot's id.
	createSnapshot(ctx context.Context, servers []string) (string, error)
	// snapshotTools lists the tools (server/tool) of a snapshot.
	snapshotTools(ctx context.Context, id string) ([]string, error)
	// form records a call. A call the policies deny is a formation with
	// status denied, not an error.
	form(ctx context.Context, req formRequest) (Formation, error)
	// formation reads a formation.
	formation(ctx context.Context, id string) (Formation, error)
}

// formRequest is a call to record.
type formRequest struct {
	Snapshot, Session, Tool string
	// Arguments are the call's arguments as its body holds them.
	Arguments json.RawMessage
	Principal Principal
}

// restAuthzd is a minimal caller of authzd's REST API.
type restAuthzd struct {
	base       string
	credential Credential
	client     *http.Client
}

// maxAnswer bounds what is read of one answer of authzd.
const maxAnswer = 8 << 20

func (a *restAuthzd) do(ctx context.Context, method, path string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode the request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+string(a.credential))
	req.Header.Set("Accept", "application/json, application/problem+json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return fmt.Errorf("read authzd's answer to %s %s: %w", method, path, err)
	}
	ct := resp.Header.Get("Content-Type")
	if resp.StatusCode >= 400 && !strings.HasPrefix(ct, "application/json") {
		return problemOf(resp, raw)
	}
	// A denied formation is answered 403 with the formation itself.
	if resp.StatusCode >= 400 && !(resp.StatusCode == http.StatusForbidden && method == http.MethodPost && path == "/v1/formations") {
		return problemOf(resp, raw)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("authzd's answer to %s %s is not the JSON expected: %w", method, path, err)
	}
	return nil
}

// problemOf reads a problem answer.
func problemOf(resp *http.Response, raw []byte) *ProblemError {
	var p struct {
		Type, Title, Detail string
		Violations          []struct{ InstancePath, Message string }
	}
	_ = json.Unmarshal(raw, &p)
	e := &ProblemError{Status: resp.StatusCode, Type: resp.Header.Get("Fcd-Problem"), Title: p.Title, Detail: p.Detail,
		RetryAfter: retryAfter(resp.Header)}
	if e.Type == "" {
		e.Type = p.Type[strings.LastIndexByte(p.Type, '#')+1:]
	}
	for _, v := range p.Violations {
		e.Violations = append(e.Violations, firstOf(v.InstancePath, "/")+": "+v.Message)
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

func (a *restAuthzd) createSnapshot(ctx context.Context, servers []string) (string, error) {
	var out struct{ ID string }
	if err := a.do(ctx, http.MethodPost, "/v1/snapshots", map[string]any{"servers": servers}, &out); err != nil {
		return "", err
	}
	return out.ID, nil
}

func (a *restAuthzd) snapshotTools(ctx context.Context, id string) ([]string, error) {
	var out struct{ Tools []struct{ Name string } }
	if err := a.do(ctx, http.MethodGet, "/v1/snapshots/"+url.PathEscape(id), nil, &out); err != nil {
		return nil, err
	}
	names := make([]string, len(out.Tools))
	for i, t := range out.Tools {
		names[i] = t.Name
	}
	return names, nil
}

// formationJSON is a formation as authzd answers it, in part.
type formationJSON struct {
	ID, Session, Tool, Digest, Status string
	ApprovalsRequired                 int
	ExpiresAt                         time.Time
	Approvals                         []struct{ Approver, Decision, Reason string }
	Decision                          struct {
		Engines []struct {
			Rules, Reasons []string
		}
	}
}

func (f formationJSON) formation() Formation {
	out := Formation{ID: f.ID, Tool: f.Tool, Session: f.Session, Status: f.Status, Digest: f.Digest,
		ApprovalsRequired: f.ApprovalsRequired, ExpiresAt: f.ExpiresAt}
	for _, a := range f.Approvals {
		out.Approvals = append(out.Approvals, Approval{Approver: a.Approver, Decision: a.Decision, Reason: a.Reason})
	}
	for _, e := range f.Decision.Engines {
		out.Rules = append(out.Rules, e.Rules...)
		out.Reasons = append(out.Reasons, e.Reasons...)
	}
	return out
}

func (a *restAuthzd) form(ctx context.Context, req formRequest) (Formation, error) {
	body := map[string]any{"snapshot": req.Snapshot, "session": req.Session, "tool": req.Tool, "arguments": req.Arguments}
	p := map[string]any{}
	if req.Principal.ID != "" {
		p["id"] = req.Principal.ID
	}
	if req.Principal.Attributes != nil {
		p["attributes"] = req.Principal.Attributes
	}
	if len(p) > 0 {
		body["principal"] = p
	}
	var out formationJSON
	if err := a.do(ctx, http.MethodPost, "/v1/formations", body, &out); err != nil {
		return Formation{}, err
	}
	return out.formation(), nil
}

func (a *restAuthzd) formation(ctx context.Context, id string) (Formation, error) {
	var out formationJSON
	if err := a.do(ctx, http.MethodGet, "/v1/formations/"+url.PathEscape(id), nil, &out); err != nil {
		return Formation{}, err
	}
	return out.formation(), nil
}
