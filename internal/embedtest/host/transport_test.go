package host_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/host"
	"github.com/fcd-authz/fcd/internal/fixtures"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

const helloWorld = `{"owner":"octo-org","repo":"hello-world"}`

// session is one MCP host session through the stack's gateway, its
// requests observed as they leave the host transport.
type session struct {
	cs  *mcp.ClientSession
	tap *tap
	tr  *host.Transport
}

// connect starts an MCP session of the official Go SDK client through the
// stack's gateway with a host transport of cfg (AuthzdURL, Credential,
// Servers, Server, Principal and Base filled in when zero).
func connect(t *testing.T, s *stack, cfg host.Config) *session {
	t.Helper()
	return connectTo(t, s, s.MCP, cfg)
}

// connectTo is connect to another MCP endpoint URL of the stack.
func connectTo(t *testing.T, s *stack, mcpURL string, cfg host.Config) *session {
	t.Helper()
	tp := &tap{}
	if cfg.AuthzdURL == "" {
		cfg.AuthzdURL = s.URL
	}
	if cfg.Credential == "" {
		cfg.Credential = host.Credential(s.creds[api.RoleHost])
	}
	if cfg.Snapshot == "" && cfg.Servers == nil {
		cfg.Servers = []string{"github"}
	}
	if cfg.Server == "" {
		cfg.Server = "github"
	}
	if cfg.Principal.ID == "" {
		cfg.Principal = host.Principal{ID: user, Attributes: map[string]any{"groups": []string{"dev"}}}
	}
	cfg.Base = tp
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr, err := host.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	mt := tr.MCPTransport(mcpURL)
	mt.DisableStandaloneSSE = true
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "fcd-host-test", Version: "0"}, nil).Connect(ctx, mt, nil)
	if err != nil {
		t.Fatalf("connect through the gateway: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return &session{cs: cs, tap: tp, tr: tr}
}

func (ss *session) call(ctx context.Context, tool, args string) (*mcp.CallToolResult, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	return ss.cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: json.RawMessage(args)})
}

// formed returns the formation ids the session's requests carried, and
// fails the test if a request other than a tools/call carried one or a
// tools/call carried none.
func (ss *session) formed(t *testing.T) []string {
	t.Helper()
	var ids []string
	for _, r := range ss.tap.sent() {
		isCall := r.HTTPMethod == "POST" && r.RPCMethod == "tools/call"
		switch {
		case isCall && (r.Formation == "" || r.McpMethod != "tools/call"):
			t.Errorf("a tools/call left without its formation: %+v", r)
		case !isCall && (r.Formation != "" || r.McpMethod == "tools/call"):
			t.Errorf("a request that is not a call carried a formation: %+v", r)
		case isCall:
			ids = append(ids, r.Formation)
		}
	}
	return ids
}

// textOf is the text of a tool result.
func textOf(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// repoEffects are the effects of create_repository on the named repository.
func repoEffects(rec *fixtures.Recorder, name string) []fixtures.Effect {
	var out []fixtures.Effect
	for _, e := range rec.Effects(fixtures.Filter{Tool: "create_repository"}) {
		if e.Did["repository"] == fixtures.GitHubAccount+"/"+name {
			out = append(out, e)
		}
	}
	return out
}

// TestTransportThroughTheGateway runs the official MCP Go SDK client with a
// host transport against real authzd, nginx and the github fixture behind
// fencecheck: each case is one host session.
func TestTransportThroughTheGateway(t *testing.T) {
	s := startStack(t)

	t.Run("a read runs once, only the call carries a formation", func(t *testing.T) {
		ss := connect(t, s, host.Config{})
		ctx := context.Background()
		if _, err := ss.cs.ListTools(ctx, nil); err != nil {
			t.Fatal(err)
		}
		res, err := ss.call(ctx, "get_repository", helloWorld)
		if err != nil || res.IsError || !strings.Contains(textOf(res), "hello-world") {
			t.Fatalf("the read: %v %+v", err, res)
		}
		ids := ss.formed(t)
		if len(ids) != 1 {
			t.Fatalf("formations sent: %v, want one", ids)
		}
		s.waitStatus(ids[0], "completed")
		reads := s.Rec.Effects(fixtures.Filter{Tool: "get_repository", Kind: fixtures.KindRead})
		if len(reads) != 1 {
			t.Fatalf("get_repository ran %d times, want once", len(reads))
		}
		// The formation's session is the MCP session the call ran in.
		f := s.formation(ids[0])
		if e := reads[0]; e.Session == "" || e.FcdSession != e.Session || f.Session != e.Session || f.Snapshot != ss.tr.Snapshot() {
			t.Fatalf("the call ran in session %q with a token for %q; the formation %+v", e.Session, e.FcdSession, f)
		}
	})

	t.Run("a stateless server: the call is formed in the host's session", func(t *testing.T) {
		// Without sessions the SDK speaks protocol 2026-07-28, which sends
		// Mcp-Method and Mcp-Name itself.
		url := s.serve(t, fixtures.Config{Stateless: true})
		ss := connectTo(t, s, url, host.Config{Session: "conversation-7"})
		res, err := ss.call(context.Background(), "get_repository", helloWorld)
		if err != nil || res.IsError {
			t.Fatalf("the read: %v %+v", err, res)
		}
		ids := ss.formed(t)
		if len(ids) != 1 {
			t.Fatalf("formations sent: %v, want one", ids)
		}
		if f := s.formation(ids[0]); f.Session != "conversation-7" {
			t.Fatalf("formed in session %q", f.Session)
		}
		s.waitStatus(ids[0], "completed")
	})

	t.Run("a write needing approval is pending, then sent once approved", func(t *testing.T) {
		ss := connect(t, s, host.Config{})
		const args = `{"name":"host-pending"}`
		_, err := ss.call(context.Background(), "create_repository", args)
		var pending *host.PendingError
		if !errors.As(err, &pending) {
			t.Fatalf("the write: %v, want a pending formation", err)
		}
		f := pending.Formation
		if f.Status != "pending_approval" || f.ApprovalsRequired != 1 || f.Tool != "github/create_repository" ||
			pending.ApprovalURL != s.URL+"/ui/" || !strings.Contains(err.Error(), f.ID) {
			t.Fatalf("the pending formation: %+v (%v)", pending, err)
		}
		if ids := ss.formed(t); len(ids) != 0 || len(repoEffects(s.Rec, "host-pending")) != 0 {
			t.Fatalf("a pending call was sent: %v", ids)
		}
		s.approve(f.ID, f.Digest)
		// The same session goes on: the refusal did not end it.
		res, err := ss.call(host.WithFormation(context.Background(), f.ID), "create_repository", args)
		if err != nil || res.IsError {
			t.Fatalf("the approved write: %v %+v", err, res)
		}
		if ids := ss.formed(t); len(ids) != 1 || ids[0] != f.ID {
			t.Fatalf("formations sent: %v, want %s", ids, f.ID)
		}
		if es := repoEffects(s.Rec, "host-pending"); len(es) != 1 || es[0].Did["visibility"] != "private" {
			t.Fatalf("effects: %+v, want one private repository", es)
		}
		s.waitStatus(f.ID, "completed")
	})

	t.Run("a waiting call is sent once an approver approves", func(t *testing.T) {
		var mu sync.Mutex
		var seen []*host.PendingError
		var approving sync.WaitGroup
		ss := connect(t, s, host.Config{WaitForApproval: true, PollInterval: 20 * time.Millisecond,
			OnPending: func(_ context.Context, p *host.PendingError) {
				mu.Lock()
				seen = append(seen, p)
				mu.Unlock()
				approving.Go(func() { s.approve(p.Formation.ID, p.Formation.Digest) })
			}})
		res, err := ss.call(context.Background(), "create_repository", `{"name":"host-waited"}`)
		approving.Wait()
		if err != nil || res.IsError {
			t.Fatalf("the waited write: %v %+v", err, res)
		}
		ids := ss.formed(t)
		if len(seen) != 1 || len(ids) != 1 || ids[0] != seen[0].Formation.ID {
			t.Fatalf("pending %v, sent %v: want one formation, announced and sent", seen, ids)
		}
		if es := repoEffects(s.Rec, "host-waited"); len(es) != 1 {
			t.Fatalf("effects: %+v, want one", es)
		}
		s.waitStatus(ids[0], "completed")
	})

	t.Run("a denied call says why and is not sent", func(t *testing.T) {
		ss := connect(t, s, host.Config{WaitForApproval: true})
		_, err := ss.call(context.Background(), "delete_repository", helloWorld)
		var denied *host.DeniedError
		if !errors.As(err, &denied) || denied.Formation.Status != "denied" ||
			!strings.Contains(strings.Join(denied.Reasons, "\n"), "deletes are allowed only for members of") {
			t.Fatalf("the delete: %v (%+v)", err, denied)
		}
		if ids := ss.formed(t); len(ids) != 0 || len(s.Rec.Effects(fixtures.Filter{Tool: "delete_repository"})) != 0 {
			t.Fatalf("a denied call was sent: %v", ids)
		}
	})

	t.Run("a tool the snapshot does not list is not formed", func(t *testing.T) {
		ss := connect(t, s, host.Config{})
		_, err := ss.call(context.Background(), "transfer_repository", helloWorld)
		if !errors.Is(err, host.ErrUnknownTool) || !strings.Contains(err.Error(), "github/transfer_repository") ||
			!strings.Contains(err.Error(), ss.tr.Snapshot()) {
			t.Fatalf("the unknown tool: %v", err)
		}
		if ids := ss.formed(t); len(ids) != 0 {
			t.Fatalf("sent %v", ids)
		}
	})

	t.Run("authzd's refusal to form a call is a client.Problem", func(t *testing.T) {
		ss := connect(t, s, host.Config{})
		_, err := ss.call(context.Background(), "create_repository", `{"nam":"typo"}`)
		var p *client.Problem
		if !errors.As(err, &p) || p.Slug() != "invalid-arguments" || p.Status != http.StatusUnprocessableEntity ||
			!strings.Contains(err.Error(), "github/create_repository") {
			t.Fatalf("arguments the schema refuses: %v", err)
		}
		if ids := ss.formed(t); len(ids) != 0 {
			t.Fatalf("sent %v", ids)
		}
	})

	t.Run("refusals of the gateway and the fence are typed, the session goes on", func(t *testing.T) {
		ss := connect(t, s, host.Config{})
		before := len(s.Rec.Effects(fixtures.Filter{Tool: "get_repository"}))
		// Formed for bob, sent by alice: authzd refuses it at the gateway.
		_, err := ss.call(host.WithPrincipal(context.Background(), host.Principal{ID: "bob"}), "get_repository", helloWorld)
		var refused *host.RefusedError
		if !errors.As(err, &refused) || refused.Fence || refused.Status != http.StatusForbidden || refused.Problem != "caller-mismatch" {
			t.Fatalf("a call formed for another principal: %v (%+v)", err, refused)
		}
		// A formation of other arguments: the gateway admits it, the fence
		// refuses the call it did not admit.
		otherArgs, alice := map[string]any{"owner": "octo-org", "repo": "other"}, user
		other, err := s.as(api.RoleHost).CreateFormationWithResponse(context.Background(), client.FormationRequest{
			Snapshot: ss.tr.Snapshot(), Session: "host-other", Tool: "github/get_repository", Arguments: &otherArgs,
			Principal: &client.FormationRequest_Principal{Id: &alice}})
		if err != nil || other.JSON201 == nil {
			t.Fatalf("form a call of other arguments: %v", err)
		}
		_, err = ss.call(host.WithFormation(context.Background(), other.JSON201.Id), "get_repository", helloWorld)
		if !errors.As(err, &refused) || !refused.Fence || refused.Problem != "arguments" || refused.Formation != other.JSON201.Id {
			t.Fatalf("a call of other arguments: %v (%+v)", err, refused)
		}
		if n := len(s.Rec.Effects(fixtures.Filter{Tool: "get_repository"})); n != before {
			t.Fatalf("a refused call ran (%d effects, %d before)", n, before)
		}
		res, err := ss.call(context.Background(), "get_repository", helloWorld)
		if err != nil || res.IsError {
			t.Fatalf("a call after the refusals: %v %+v", err, res)
		}
	})
}
