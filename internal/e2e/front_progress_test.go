package e2e_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/front"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestFrontForwardsProgress: the MCP reference server (server-everything),
// unmodified, behind a `fencecheck proxy` process, streams the progress
// of trigger-long-running-operation; through the front, the stock client
// that asked for progress receives them, under its own progress token,
// before the result, and the call runs once.
func TestFrontForwardsProgress(t *testing.T) {
	s := startStack(t, nil)
	pool, px := startEverythingFenced(t, s)
	f, err := front.New(t.Context(), front.Config{AuthzdURL: s.URL, Credential: string(s.creds[api.RoleHost]),
		Servers: []string{"everything"}, Pools: map[string]string{pool: px.URL + "/mcp"}, Auth: frontUsers,
		PollInterval: 50 * time.Millisecond, RelistInterval: -1})
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
	var mu sync.Mutex
	var progress []*mcp.ProgressNotificationParams
	c := mcp.NewClient(&mcp.Implementation{Name: "stock-client", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			progress = append(progress, req.Params)
			mu.Unlock()
		},
	})
	cs, err := c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: srv.URL + front.MCPPath,
		HTTPClient: &http.Client{Transport: bearerTransport{"alice-token"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	params := &mcp.CallToolParams{Name: "trigger-long-running-operation", Arguments: map[string]any{"duration": 1, "steps": 3}}
	params.SetProgressToken("client-token")
	res, err := cs.CallTool(t.Context(), params)
	if err != nil || res.IsError {
		t.Fatalf("the long-running call: %v %+v", err, res)
	}
	// It ran once: one formation of the tool, completed.
	status := client.FormationStatusCompleted
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		r, err := s.as(api.RoleApprover).ListFormationsWithResponse(t.Context(), &client.ListFormationsParams{Status: &status})
		s.must("list formations", err)
		if n := len(r.JSON200.Formations); n == 1 && r.JSON200.Formations[0].Tool == "everything/trigger-long-running-operation" {
			break
		} else if n > 1 || time.Now().After(deadline) {
			t.Fatalf("completed formations: %+v, want the long-running call's alone", r.JSON200.Formations)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(progress) == 0 {
		t.Fatal("no progress notification reached the client")
	}
	for _, p := range progress {
		if p.ProgressToken != "client-token" {
			t.Fatalf("a progress notification under %v, not the client's token", p.ProgressToken)
		}
	}
}
