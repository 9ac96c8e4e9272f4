package e2e_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/front"
	"github.com/fcd-authz/fcd/internal/fixtures"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The bearer tokens the fronts of these tests accept (static tokens; the
// JWT authenticator has its own test): alice is a developer, the
// principal of every call; bob another user.
var frontUsers = front.StaticTokens{
	"alice-token": {ID: "alice", Attributes: map[string]any{"groups": []any{"dev"}}},
	"bob-token":   {ID: "bob", Attributes: map[string]any{"groups": []any{"dev"}}},
}

// frontResource is the resource identifier of the fronts of these tests:
// their resource metadata's resource and, with JWTs, the audience.
const frontResource = "http://front.test/mcp"

// frontOptions are startFrontWith's.
type frontOptions struct {
	// Issuer, if set, is the only issuer whose JWTs for frontResource the
	// front accepts (front.NewJWTAuthenticator); nil means frontUsers'
	// static tokens.
	Issuer *testIssuer
}

// startFront starts an MCP front (front → fence: it admits each call and
// sends it to the pool's fixture with its token) before the stack, over
// real HTTP, and returns the URL of its MCP endpoint.
func startFront(t *testing.T, s *stack) (string, *front.Front) {
	t.Helper()
	return startFrontWith(t, s, frontOptions{})
}

// startFrontWith is startFront with options.
func startFrontWith(t *testing.T, s *stack, opts frontOptions) (string, *front.Front) {
	t.Helper()
	pools := map[string]string{}
	for pool, url := range s.Fixture {
		pools[pool] = url + "/mcp"
	}
	var authn front.Authenticator = frontUsers
	var servers []string
	if opts.Issuer != nil {
		a, err := front.NewJWTAuthenticator(t.Context(), front.JWTAuthenticator{Issuer: opts.Issuer.Name, Audience: frontResource,
			JWKSURL: opts.Issuer.JWKS, AttributeClaims: []string{"groups"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		authn, servers = a, []string{opts.Issuer.Name}
	}
	f, err := front.New(t.Context(), front.Config{
		AuthzdURL: s.URL, Credential: string(s.creds[api.RoleHost]), Servers: []string{"github"},
		Pools: pools, Auth: authn, AuthorizationServers: servers, ApprovalWait: 60 * time.Second, PollInterval: 50 * time.Millisecond,
		RelistInterval: 100 * time.Millisecond, Resource: frontResource,
	})
	if err != nil {
		t.Fatal(err)
	}
	h, err := f.Handler()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		srv.Close()
		_ = f.Close()
	})
	return srv.URL + front.MCPPath, f
}

// bearerTransport sends every request with a bearer token.
type bearerTransport struct{ token string }

func (b bearerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(req)
}

// frontClient is the official Go SDK's client, unmodified, connected to
// the front with a bearer token; it counts tools/list_changed.
type frontClient struct {
	cs       *mcp.ClientSession
	mu       sync.Mutex
	progress []*mcp.ProgressNotificationParams
	changed  int
}

func connectFront(t *testing.T, url, token string) *frontClient {
	t.Helper()
	fc := &frontClient{}
	c := mcp.NewClient(&mcp.Implementation{Name: "stock-client", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			fc.mu.Lock()
			fc.progress = append(fc.progress, req.Params)
			fc.mu.Unlock()
		},
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			fc.mu.Lock()
			fc.changed++
			fc.mu.Unlock()
		},
	})
	cs, err := c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: url,
		HTTPClient: &http.Client{Transport: bearerTransport{token}}}, nil)
	if err != nil {
		t.Fatalf("connect to the front: %v", err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	fc.cs = cs
	return fc
}

// approvePending approves, as the approver, the one pending formation of
// tool, once it exists, and returns its id ("" if none came in 30 s).
func (s *stack) approvePending(tool string) string {
	s.t.Helper()
	status := client.FormationStatusPendingApproval
	deadline := time.Now().Add(60 * time.Second) // a client launched per call (a CLI) starts slowly on a busy machine
	for {
		r, err := s.as(api.RoleApprover).ListFormationsWithResponse(s.t.Context(), &client.ListFormationsParams{Status: &status})
		s.must("list pending formations", err)
		for _, f := range r.JSON200.Formations {
			if f.Tool == "github/"+tool {
				s.approve(formation{ID: f.Id, Digest: f.Digest})
				return f.Id
			}
		}
		if time.Now().After(deadline) {
			// Errorf, not Fatalf: this runs beside the call, in a
			// goroutine of its own.
			s.t.Errorf("no formation of %s waits for approval", tool)
			return ""
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// frontRefusal reads the refusal a refused call's result carries.
func frontRefusal(t *testing.T, res *mcp.CallToolResult) front.Refusal {
	t.Helper()
	if res == nil || !res.IsError {
		t.Fatalf("the call was not refused: %+v", res)
	}
	raw, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var out struct{ Fcd front.Refusal }
	if err := json.Unmarshal(raw, &out); err != nil || out.Fcd.Problem == "" {
		t.Fatalf("the refusal carries no problem in structuredContent: %s (%v)", raw, err)
	}
	return out.Fcd
}

func textOf(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// TestFrontGoSDKClient: the official Go SDK client, unmodified, given only
// the front's URL and a bearer token, is shown exactly the snapshot its
// calls are formed against; reads run once; a write waits, with progress,
// for an approval given while the call is open; a denied call, a stale
// source and a source retired mid-call (substituted by its certified
// successor) read as the model should read them; a relisting is announced.
func TestFrontGoSDKClient(t *testing.T) {
	s := startStack(t, nil)
	url, _ := startFront(t, s)
	fc := connectFront(t, url, "alice-token")
	ctx := t.Context()

	// tools/list is the snapshot: the same tools, descriptions and
	// schemas as authzd's full view of a snapshot of github.
	listed, err := fc.cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	snap := s.snapshot()
	full := s.fullSnapshot(snap)
	if len(listed.Tools) != len(full.Tools) {
		t.Fatalf("listed %d tools, the snapshot has %d", len(listed.Tools), len(full.Tools))
	}
	for _, lt := range listed.Tools {
		i := slices.IndexFunc(full.Tools, func(ft client.FullTool) bool { return ft.Name == "github/"+lt.Name })
		if i < 0 {
			t.Fatalf("listed %s, not in the snapshot", lt.Name)
		}
		d := full.Tools[i].Descriptor
		want, _ := json.Marshal(d.InputSchema)
		got, _ := json.Marshal(lt.InputSchema)
		if string(got) != string(want) {
			t.Fatalf("%s: listed schema %s, snapshot %s", lt.Name, got, want)
		}
		if d.Summary != nil && !strings.HasPrefix(lt.Description, *d.Summary) {
			t.Fatalf("%s: the description does not open with the summary %q: %q", lt.Name, *d.Summary, lt.Description)
		}
		readOnly := d.SideEffects == client.SideEffectRead || d.SideEffects == client.SideEffectNone
		if lt.Annotations == nil || lt.Annotations.ReadOnlyHint != readOnly ||
			(d.SideEffects == client.SideEffectDelete) != (lt.Annotations.DestructiveHint != nil && *lt.Annotations.DestructiveHint) {
			t.Fatalf("%s (%s): annotations %+v", lt.Name, d.SideEffects, lt.Annotations)
		}
	}

	// A read runs once.
	res, err := fc.cs.CallTool(ctx, &mcp.CallToolParams{Name: "get_repository",
		Arguments: map[string]any{"owner": "octo-org", "repo": "hello-world"}})
	if err != nil || res.IsError {
		t.Fatalf("the read: %v %+v", err, res)
	}
	if n := len(s.Rec.Effects(fixtures.Filter{Tool: "get_repository"})); n != 1 {
		t.Fatalf("the read ran %d times", n)
	}

	// A write waits for its approval, given while the call is open; the
	// client that asked for progress is told where it stands.
	done := make(chan string, 1)
	go func() { done <- s.approvePending("create_repository") }()
	params := &mcp.CallToolParams{Name: "create_repository", Arguments: map[string]any{"name": "front-write"}}
	params.SetProgressToken("p1")
	res, err = fc.cs.CallTool(ctx, params)
	approved := <-done
	if err != nil || res.IsError {
		t.Fatalf("the approved write: %v %+v", err, res)
	}
	if es := effectsOf(s.Rec, "front-write"); len(es) != 1 || es[0].Release != "v1.4" {
		t.Fatalf("the write's effects: %+v, want one on v1.4", es)
	}
	s.waitStatus(approved, "completed")
	fc.mu.Lock()
	progress := slices.Clone(fc.progress)
	fc.mu.Unlock()
	if len(progress) == 0 || progress[0].ProgressToken != "p1" || progress[0].Total != 1 ||
		!strings.Contains(progress[0].Message, approved) || !strings.Contains(progress[0].Message, s.URL+"/ui/") {
		t.Fatalf("progress while waiting: %+v", progress)
	}

	// A denied call is a tool error the model reads, and nothing runs.
	res, err = fc.cs.CallTool(ctx, &mcp.CallToolParams{Name: "delete_repository",
		Arguments: map[string]any{"owner": "octo-org", "repo": "hello-world"}})
	if err != nil {
		t.Fatal(err)
	}
	if r := frontRefusal(t, res); r.Problem != "formation-denied" || r.Formation == "" || !strings.Contains(textOf(res), "denied") {
		t.Fatalf("the delete: %+v %q", r, textOf(res))
	}
	if n := len(s.Rec.Effects(fixtures.Filter{Tool: "delete_repository"})); n != 0 {
		t.Fatalf("the denied delete ran %d times", n)
	}

	// Mid-call, the source retires: the call waits for approval while
	// v1.4 drains and retires, and is admitted to its certified successor.
	s.certify()
	go func() {
		s.approvePendingAfter("create_repository", func() { s.retire(poolV14) })
		done <- ""
	}()
	res, err = fc.cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_repository",
		Arguments: map[string]any{"name": "front-successor", "private": true}})
	<-done
	if err != nil || res.IsError {
		t.Fatalf("the substituted write: %v %+v", err, res)
	}
	if es := effectsOf(s.Rec, "front-successor"); len(es) != 1 || es[0].Release != "v1.3" || es[0].Did["visibility"] != "private" {
		t.Fatalf("the substituted write's effects: %+v, want one private on v1.3", es)
	}

	// The relisting is announced; until the client lists again its calls
	// are formed against the snapshot it was shown, whose source is now
	// stale: a call with no successor is refused, and nothing runs.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		fc.mu.Lock()
		changed := fc.changed
		fc.mu.Unlock()
		if changed > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no notifications/tools/list_changed after the retirement")
		}
	}
	res, err = fc.cs.CallTool(ctx, &mcp.CallToolParams{Name: "get_repository",
		Arguments: map[string]any{"owner": "octo-org", "repo": "hello-world"}})
	if err != nil {
		t.Fatal(err)
	}
	if r := frontRefusal(t, res); r.Problem != "source-stale" {
		t.Fatalf("a read on the stale source: %+v", r)
	}
	if n := len(s.Rec.Effects(fixtures.Filter{Tool: "get_repository"})); n != 1 {
		t.Fatalf("reads ran %d times, want the first only", n)
	}
	// Listed again, the session calls v1.3.
	if _, err := fc.cs.ListTools(ctx, nil); err != nil {
		t.Fatal(err)
	}
	res, err = fc.cs.CallTool(ctx, &mcp.CallToolParams{Name: "get_repository",
		Arguments: map[string]any{"owner": "octo-org", "repo": "hello-world"}})
	if err != nil || res.IsError {
		t.Fatalf("the read after relisting: %v %+v", err, res)
	}
	if es := s.Rec.Effects(fixtures.Filter{Tool: "get_repository"}); len(es) != 2 || es[1].Release != "v1.3" {
		t.Fatalf("reads: %+v, want the second on v1.3", es)
	}
	// No drift: every write was private, as v1.4 makes it (the one on
	// v1.3 said so explicitly, as its certificate requires).
	for _, e := range s.Rec.Effects(fixtures.Filter{Tool: "create_repository"}) {
		if e.Did["visibility"] != "private" {
			t.Errorf("drifted effect: %+v", e)
		}
	}
}

// approvePendingAfter runs before once a formation of tool waits for
// approval, then approves it.
func (s *stack) approvePendingAfter(tool string, before func()) {
	s.t.Helper()
	status := client.FormationStatusPendingApproval
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		r, err := s.as(api.RoleApprover).ListFormationsWithResponse(s.t.Context(), &client.ListFormationsParams{Status: &status})
		s.must("list pending formations", err)
		for _, f := range r.JSON200.Formations {
			if f.Tool == "github/"+tool {
				before()
				s.approve(formation{ID: f.Id, Digest: f.Digest})
				return
			}
		}
		if time.Now().After(deadline) {
			s.t.Errorf("no formation of %s waits for approval", tool)
			return
		}
	}
}

// fullSnapshot reads a snapshot's full view as the host.
func (s *stack) fullSnapshot(id string) *client.SnapshotFull {
	s.t.Helper()
	view := client.GetSnapshotParamsViewFull
	r, err := s.as(api.RoleHost).GetSnapshotWithResponse(s.t.Context(), id, &client.GetSnapshotParams{View: &view})
	s.must("read snapshot", err)
	full, err := r.JSON200.AsSnapshotFull()
	if err != nil {
		s.t.Fatal(err)
	}
	return &full
}

// TestFrontRefusesBadClients: without a token, with an unknown one, with
// another user's session, or calling a tool not in the snapshot, a client
// gets a clear error and nothing is formed.
func TestFrontRefusesBadClients(t *testing.T) {
	s := startStack(t, nil)
	url, _ := startFront(t, s)
	for _, tc := range []struct{ name, auth string }{{"no token", ""}, {"unknown token", "Bearer nope"}, {"basic", "Basic YWxpY2U6eA=="}} {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(resp.Header.Get("WWW-Authenticate"), "resource_metadata=") {
			t.Fatalf("%s: %d %q, want 401 naming the resource metadata", tc.name, resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
		}
	}
	// The protected resource metadata (RFC 9728).
	resp, err := http.Get(strings.TrimSuffix(url, front.MCPPath) + front.ResourceMetadataPath)
	if err != nil {
		t.Fatal(err)
	}
	var meta struct{ Resource string }
	err = json.NewDecoder(resp.Body).Decode(&meta)
	resp.Body.Close()
	if err != nil || meta.Resource != frontResource {
		t.Fatalf("resource metadata: %v %+v", err, meta)
	}

	// Bob cannot use alice's session.
	alice := connectFront(t, url, "alice-token")
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"jsonrpc":"2.0","id":9,"method":"tools/list"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer bob-token")
	req.Header.Set("Mcp-Session-Id", alice.cs.ID())
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode < 400 {
		t.Fatalf("bob used alice's session: %d", resp.StatusCode)
	}

	// A tool not in the snapshot is a JSON-RPC error; nothing is formed.
	before := s.formationCount()
	if _, err := alice.cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "drop_database", Arguments: map[string]any{}}); err == nil {
		t.Fatal("a call of a tool not in the snapshot was answered")
	}
	// Arguments the schema refuses: a tool error, nothing formed.
	res, err := alice.cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "get_repository", Arguments: map[string]any{"owner": 7}})
	if err != nil {
		t.Fatal(err)
	}
	if r := frontRefusal(t, res); r.Formation != "" {
		t.Fatalf("invalid arguments: %+v", r)
	}
	if n := s.formationCount(); n != before {
		t.Fatalf("%d formations after the bad calls, were %d", n, before)
	}
	if n := len(s.Rec.Effects(fixtures.Filter{})); n != 0 {
		t.Fatalf("%d effects", n)
	}
}

// formationCount counts every formation as the approver lists them.
func (s *stack) formationCount() int {
	s.t.Helper()
	limit := 1000
	r, err := s.as(api.RoleApprover).ListFormationsWithResponse(s.t.Context(), &client.ListFormationsParams{Limit: &limit})
	s.must("list formations", err)
	return len(r.JSON200.Formations)
}

// TestFrontRecovery: after a call whose tool declares failure modes
// answered an error, the same call made again in the session is formed as
// its recovery — linked to it, and run under the recovery's lease with
// Fcd-Recovery-Of — and a mode that does not allow it (abort) is a
// refusal the model reads, with nothing run.
func TestFrontRecovery(t *testing.T) {
	s := startStack(t, nil)
	url, _ := startFront(t, s)
	fc := connectFront(t, url, "alice-token")
	ctx := t.Context()
	var mu sync.Mutex
	failNext := ""
	s.setFail(func(_ context.Context, tool string) string {
		mu.Lock()
		defer mu.Unlock()
		code := failNext
		failNext = ""
		return code
	})
	fail := func(code string) {
		mu.Lock()
		failNext = code
		mu.Unlock()
	}
	read := &mcp.CallToolParams{Name: "get_repository", Arguments: map[string]any{"owner": "octo-org", "repo": "hello-world"}}

	// retry: rate_limited, then the same call again.
	fail("rate_limited")
	res, err := fc.cs.CallTool(ctx, read)
	if err != nil || !res.IsError {
		t.Fatalf("the injected failure: %v %+v", err, res)
	}
	res, err = fc.cs.CallTool(ctx, read)
	if err != nil || res.IsError {
		t.Fatalf("the retry: %v %+v", err, res)
	}
	reads := s.Rec.Effects(fixtures.Filter{Tool: "get_repository", Kind: fixtures.KindRead})
	if len(reads) != 1 || reads[0].RecoveryOf == "" {
		t.Fatalf("get_repository ran %+v, want once, as the recovery of the failed call", reads)
	}
	if r := s.record(reads[0].RecoveryOf); r.Status != client.FormationStatusFailed {
		t.Fatalf("the recovered formation is %s, want failed", r.Status)
	}
	// A later call after the success is a new call, not a recovery.
	res, err = fc.cs.CallTool(ctx, read)
	if err != nil || res.IsError {
		t.Fatalf("a new read: %v %+v", err, res)
	}
	if reads := s.Rec.Effects(fixtures.Filter{Tool: "get_repository", Kind: fixtures.KindRead}); len(reads) != 2 || reads[1].RecoveryOf != "" {
		t.Fatalf("reads %+v: the third call is no recovery", reads)
	}

	// abort: validation_failed; the same write again is refused.
	fail("validation_failed")
	done := make(chan string, 1)
	go func() { done <- s.approvePending("create_repository") }()
	write := &mcp.CallToolParams{Name: "create_repository", Arguments: map[string]any{"name": "bad-name"}}
	res, err = fc.cs.CallTool(ctx, write)
	<-done
	if err != nil || !res.IsError {
		t.Fatalf("the injected write failure: %v %+v", err, res)
	}
	res, err = fc.cs.CallTool(ctx, write)
	if err != nil {
		t.Fatal(err)
	}
	if r := frontRefusal(t, res); r.Problem != "recovery-not-allowed" {
		t.Fatalf("the write again after validation_failed: %+v %q", r, textOf(res))
	}
	if es := effectsOf(s.Rec, "bad-name"); len(es) != 0 {
		t.Fatalf("the refused write ran: %+v", es)
	}
}
