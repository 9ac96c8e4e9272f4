package e2e_test

import (
	"encoding/base64"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/front"
	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/internal/fixtures"
	"github.com/fcd-authz/fcd/internal/gatewaytest"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestFrontThroughGateway: the front before a real nginx and Caddy (front →
// gateway → fence): it sends each call with its formation, the gateway
// has authzd admit it and routes it to the pool's fence. The gateway
// authenticates the front as its own user, so authzd runs with
// --gateway-caller off (docs/front.md: the gateway reachable from the
// front only). A read runs once, an approved write once, a denied call
// never.
func TestFrontThroughGateway(t *testing.T) {
	m := etcdtest.Start(t)
	for _, kind := range gatewaytest.Kinds {
		t.Run(kind, func(t *testing.T) {
			s := startStackWith(t, m, stackOptions{GatewayCaller: "off"})
			gw := s.gateway(t, kind, nil)
			f, err := front.New(t.Context(), front.Config{
				AuthzdURL: s.URL, Credential: string(s.creds[api.RoleHost]), Servers: []string{"github"},
				Gateway: gw.URL + "/mcp", GatewayHeaders: map[string]string{
					"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("bob:"+gatewayUsers["bob"]))},
				Auth: frontUsers, PollInterval: 50 * time.Millisecond, RelistInterval: -1,
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
			fc := connectFront(t, srv.URL+front.MCPPath, "alice-token")
			ctx := t.Context()

			res, err := fc.cs.CallTool(ctx, &mcp.CallToolParams{Name: "get_repository",
				Arguments: map[string]any{"owner": "octo-org", "repo": "hello-world"}})
			if err != nil || res.IsError {
				t.Fatalf("the read through %s: %v %+v", kind, err, res)
			}
			done := make(chan string, 1)
			go func() { done <- s.approvePending("create_repository") }()
			res, err = fc.cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_repository", Arguments: map[string]any{"name": "via-" + kind}})
			id := <-done
			if err != nil || res.IsError {
				t.Fatalf("the approved write through %s: %v %+v", kind, err, res)
			}
			s.waitStatus(id, "completed")
			res, err = fc.cs.CallTool(ctx, &mcp.CallToolParams{Name: "delete_repository",
				Arguments: map[string]any{"owner": "octo-org", "repo": "hello-world"}})
			if err != nil {
				t.Fatal(err)
			}
			if r := frontRefusal(t, res); r.Problem != "formation-denied" {
				t.Fatalf("the delete through %s: %+v", kind, r)
			}
			if n := len(s.Rec.Effects(fixtures.Filter{Tool: "get_repository"})); n != 1 {
				t.Fatalf("the read ran %d times", n)
			}
			if es := effectsOf(s.Rec, "via-"+kind); len(es) != 1 || es[0].Did["visibility"] != "private" {
				t.Fatalf("the write's effects: %+v", es)
			}
			if n := len(s.Rec.Effects(fixtures.Filter{Tool: "delete_repository"})); n != 0 {
				t.Fatalf("the denied delete ran %d times", n)
			}
		})
	}
}
