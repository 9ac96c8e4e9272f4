package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/front"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestFrontForwardsProgress: the MCP reference server (server-everything),
// unmodified, behind a `fencecheck proxy` process, streams the progress
// of trigger-long-running-operation; through the front, the stock client
// that asked for progress receives them, under its own progress token,
// before the result, and the call runs once.
func TestFrontForwardsProgress(t *testing.T) {
	_, fenceBin := buildBinaries(t)
	s := startStack(t, nil)
	everything := startEverything(t)
	raw, err := os.ReadFile(filepath.Join("testdata", "everything-manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Pool     string
		Artifact struct{ Digest string }
		Config   struct{ Digest string }
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	jws, err := manifest.Sign(bytes.TrimSpace(raw), s.registrar.Key, manifest.TypManifest)
	if err != nil {
		t.Fatal(err)
	}
	s.registerManifest(jws)
	credFile := filepath.Join(t.TempDir(), "backend.cred")
	if err := os.WriteFile(credFile, []byte(s.creds[api.RoleBackend]), 0o600); err != nil {
		t.Fatal(err)
	}
	px := startProc(t, "fencecheck everything", fenceBin, "proxy", "--listen", "127.0.0.1:0", "--upstream", everything,
		"--pool", m.Pool, "--artifact", m.Artifact.Digest, "--config", m.Config.Digest, "--generation", "0",
		"--jwks", s.URL+"/.well-known/jwks.json", "--issuer", issuerName, "--server", "everything",
		"--authzd", s.URL, "--credential-file", credFile, "--timeout", "30s")
	f, err := front.New(t.Context(), front.Config{AuthzdURL: s.URL, Credential: string(s.creds[api.RoleHost]),
		Servers: []string{"everything"}, Pools: map[string]string{m.Pool: px.URL + "/mcp"}, Auth: frontUsers,
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
