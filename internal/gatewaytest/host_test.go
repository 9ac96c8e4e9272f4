package gatewaytest_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fcd-authz/fcd/internal/gatewaytest"
)

func TestBasicAuth(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if ok {
			got = append(got, u+":"+p)
		}
	}))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
	resp, err := (&http.Client{Transport: gatewaytest.BasicAuth(nil, "alice", "pw:1")}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(got) != 1 || got[0] != "alice:pw:1" {
		t.Errorf("server got %q", got)
	}
	if req.Header.Get("Authorization") != "" {
		t.Error("the caller's request was changed")
	}
}

func TestFormationTransport(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, r.Header.Get("Fcd-Formation")+"|"+string(body))
		mu.Unlock()
	}))
	defer srv.Close()
	client := &http.Client{Transport: gatewaytest.FormationTransport(nil)}
	for _, c := range []struct {
		name, method, body, preset, want string
	}{
		{"tools/call with formation", "POST", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":{"dev.fcd/formation":"f1"}}}`, "", "f1"},
		{"tools/call without formation", "POST", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"}}`, "", ""},
		{"other method with the meta", "POST", `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"dev.fcd/formation":"f1"}}}`, "", ""},
		{"batch with one call", "POST", `[{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"_meta":{"dev.fcd/formation":"f2"}}}]`, "", "f2"},
		{"batch with two calls", "POST", `[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":{"dev.fcd/formation":"f1"}}},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"_meta":{"dev.fcd/formation":"f2"}}}]`, "", ""},
		{"header already set", "POST", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":{"dev.fcd/formation":"f1"}}}`, "mine", "mine"},
		{"not JSON", "POST", `nope`, "", ""},
		{"GET", "GET", ``, "", ""},
	} {
		req, _ := http.NewRequest(c.method, srv.URL, strings.NewReader(c.body))
		if c.preset != "" {
			req.Header.Set("Fcd-Formation", c.preset)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		resp.Body.Close()
		mu.Lock()
		last := got[len(got)-1]
		mu.Unlock()
		if want := c.want + "|" + c.body; last != want {
			t.Errorf("%s: server got %q, want %q", c.name, last, want)
		}
		if h := req.Header.Get("Fcd-Formation"); h != c.preset {
			t.Errorf("%s: the caller's request was changed: Fcd-Formation %q", c.name, h)
		}
	}
}

// mcpBackend is a real MCP server (official Go SDK, streamable HTTP) that
// records, per JSON-RPC method, the dispatch token each request carried.
type mcpBackend struct {
	srv    *httptest.Server
	mu     sync.Mutex
	tokens map[string][]string // method → Fcd-Dispatch-Token of each request
}

func newMCPBackend(t *testing.T, release string) *mcpBackend {
	b := &mcpBackend{tokens: map[string][]string{}}
	server := mcp.NewServer(&mcp.Implementation{Name: "github", Version: release}, nil)
	type in struct {
		Name string `json:"name"`
	}
	type out struct {
		Release string `json:"release"`
		Name    string `json:"name"`
	}
	mcp.AddTool(server, &mcp.Tool{Name: "create_repository", Description: "create a repository"},
		func(ctx context.Context, req *mcp.CallToolRequest, args in) (*mcp.CallToolResult, out, error) {
			return nil, out{Release: release, Name: args.Name}, nil
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		method := r.Method
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(strings.NewReader(string(body)))
			var m struct {
				Method string `json:"method"`
			}
			if json.Unmarshal(body, &m) == nil && m.Method != "" {
				method = m.Method
			}
		}
		b.mu.Lock()
		b.tokens[method] = append(b.tokens[method], r.Header.Get("Fcd-Dispatch-Token"))
		b.mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(b.srv.Close)
	return b
}

func (b *mcpBackend) seen(method string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.tokens[method]...)
}

// TestMCPThroughGateways runs the official MCP Go SDK client against an
// SDK server through each real gateway: initialize, tools/list, a
// tools/call carrying its formation in _meta, and close (DELETE). Session traffic
// reaches the default pool without a token; the call reaches the admitted
// pool with the token authzd (here the stand-in) issued.
func TestMCPThroughGateways(t *testing.T) {
	for _, g := range kinds {
		t.Run(g.kind, func(t *testing.T) {
			t.Parallel()
			auth := newStandIn(t)
			v14 := newMCPBackend(t, "v1.4")
			gw := gatewaytest.Start(t, g.kind, gatewaytest.Config{
				Authzd: auth.srv.URL, Credential: credential,
				Pools:   map[string]string{"github-v1-4": v14.srv.URL, "github-v1-3": newMCPBackend(t, "v1.3").srv.URL},
				Default: "github-v1-4", Users: users,
			})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			client := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "test"}, nil)
			session, err := client.Connect(ctx, &mcp.StreamableClientTransport{
				Endpoint:   gw.URL + "/mcp",
				HTTPClient: &http.Client{Transport: gatewaytest.FormationTransport(gatewaytest.BasicAuth(nil, "alice", users["alice"]))},
			}, nil)
			if err != nil {
				t.Fatalf("connect through %s: %v", g.kind, err)
			}
			tools, err := session.ListTools(ctx, nil)
			if err != nil || len(tools.Tools) != 1 || tools.Tools[0].Name != "create_repository" {
				t.Fatalf("tools/list: %v %v", tools, err)
			}
			res, err := session.CallTool(ctx, &mcp.CallToolParams{
				Meta: mcp.Meta{gatewaytest.FormationMetaKey: "ok-v14"},
				Name: "create_repository", Arguments: map[string]any{"name": "x"},
			})
			if err != nil || res.IsError {
				t.Fatalf("tools/call: %v %v", res, err)
			}
			if s, _ := json.Marshal(res.StructuredContent); !strings.Contains(string(s), `"release":"v1.4"`) {
				t.Errorf("tools/call result %s, want v1.4's", s)
			}
			if err := session.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
			if got := v14.seen("tools/call"); len(got) != 1 || got[0] != "tok14" {
				t.Errorf("tools/call reached v1.4 with tokens %q, want [tok14]", got)
			}
			// Session traffic, including the DELETE of Close, goes to the
			// default pool without a token.
			for _, m := range []string{"initialize", "tools/list", http.MethodDelete} {
				if got := v14.seen(m); len(got) == 0 || strings.Join(got, "") != "" {
					t.Errorf("%s reached v1.4 with tokens %q, want at least one request and no token", m, got)
				}
			}
			var formations []string
			for _, a := range auth.take() {
				formations = append(formations, a.Header.Get("Fcd-Formation"))
				if c := a.Header.Values("Fcd-Caller"); len(c) != 1 || c[0] != "alice" {
					t.Errorf("authzd got Fcd-Caller %q, want [alice]", c)
				}
			}
			if strings.Count(strings.Join(formations, ","), "ok-v14") != 1 {
				t.Errorf("authzd saw formations %q, want ok-v14 once (the call) and none on session traffic", formations)
			}
		})
	}
}
