package host

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/fcd-authz/fcd/client"
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

// typedAuthzd calls authzd through the client generated from its OpenAPI
// document. Its refusals are *client.Problem errors.
type typedAuthzd struct {
	c *client.ClientWithResponses
}

func newTypedAuthzd(baseURL string, credential Credential, hc *http.Client) (*typedAuthzd, error) {
	c, err := client.New(baseURL, string(credential), client.WithHTTPClient(hc))
	if err != nil {
		return nil, err
	}
	return &typedAuthzd{c: c}, nil
}

// unexpected is the error of an answer the document does not give the
// operation (a proxy's 200 page, say).
func unexpected(op string, resp *http.Response) error {
	status := 0
	if resp != nil {
		status = resp.StatusCode
	}
	return fmt.Errorf("%s: authzd answered %d without the JSON the API document gives", op, status)
}

func (a *typedAuthzd) createSnapshot(ctx context.Context, servers []string) (string, error) {
	req := client.SnapshotRequest{}
	if len(servers) > 0 {
		req.Servers = &servers
	}
	resp, err := a.c.CreateSnapshotWithResponse(ctx, req)
	if err != nil {
		return "", err
	}
	if resp.JSON201 == nil {
		return "", unexpected("take a snapshot", resp.HTTPResponse)
	}
	return resp.JSON201.Id, nil
}

func (a *typedAuthzd) snapshotTools(ctx context.Context, id string) ([]string, error) {
	resp, err := a.c.GetSnapshotWithResponse(ctx, id, nil)
	if err != nil {
		return nil, err
	}
	if resp.JSON200 == nil {
		return nil, unexpected("read the snapshot", resp.HTTPResponse)
	}
	snap, err := resp.JSON200.AsSnapshot()
	if err != nil {
		return nil, fmt.Errorf("read the snapshot: %w", err)
	}
	names := make([]string, len(snap.Tools))
	for i, t := range snap.Tools {
		names[i] = t.Name
	}
	return names, nil
}

// formationRequest is client.FormationRequest with the arguments kept as
// the call's body holds them: decoded into a map and encoded again, a
// number could be written otherwise than the backend's fence reads it.
type formationRequest struct {
	Snapshot  string                             `json:"snapshot"`
	Session   string                             `json:"session"`
	Tool      string                             `json:"tool"`
	Arguments json.RawMessage                    `json:"arguments,omitempty"`
	Principal *client.FormationRequest_Principal `json:"principal,omitempty"`
}

func (a *typedAuthzd) form(ctx context.Context, req formRequest) (Formation, error) {
	body := formationRequest{Snapshot: req.Snapshot, Session: req.Session, Tool: req.Tool, Arguments: req.Arguments}
	if p := req.Principal; p.ID != "" || p.Attributes != nil {
		body.Principal = &client.FormationRequest_Principal{}
		if p.ID != "" {
			body.Principal.Id = &p.ID
		}
		if p.Attributes != nil {
			body.Principal.Attributes = &p.Attributes
		}
	}
	raw, err := json.Marshal(body)
	if err != nil {
		return Formation{}, fmt.Errorf("encode the formation request: %w", err)
	}
	resp, err := a.c.CreateFormationWithBodyWithResponse(ctx, "application/json", bytes.NewReader(raw))
	if err != nil {
		return Formation{}, err
	}
	switch {
	case resp.JSON201 != nil:
		return formationOf(resp.JSON201), nil
	case resp.JSON403 != nil: // denied by policy: the record itself
		return formationOf(resp.JSON403), nil
	}
	return Formation{}, unexpected("form the call", resp.HTTPResponse)
}

func (a *typedAuthzd) formation(ctx context.Context, id string) (Formation, error) {
	resp, err := a.c.GetFormationWithResponse(ctx, id)
	if err != nil {
		return Formation{}, err
	}
	if resp.JSON200 == nil {
		return Formation{}, unexpected("read the formation", resp.HTTPResponse)
	}
	return formationOf(resp.JSON200), nil
}

// formationOf is what the host is told of a formation record.
func formationOf(f *client.Formation) Formation {
	out := Formation{ID: f.Id, Tool: f.Tool, Session: f.Session, Status: string(f.Status), Digest: f.Digest,
		ApprovalsRequired: f.ApprovalsRequired, ExpiresAt: f.ExpiresAt}
	for _, a := range f.Approvals {
		ap := Approval{Approver: a.Approver, Decision: string(a.Decision)}
		if a.Reason != nil {
			ap.Reason = *a.Reason
		}
		out.Approvals = append(out.Approvals, ap)
	}
	for _, e := range f.Decision.Engines {
		out.Rules = append(out.Rules, e.Rules...)
		out.Reasons = append(out.Reasons, e.Reasons...)
	}
	return out
}
