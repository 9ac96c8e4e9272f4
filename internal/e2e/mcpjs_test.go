package e2e_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/fixtures"
)

// mcpjsDir holds the official MCP TypeScript SDK, pinned by its
// package-lock.json, and the host script the tests run with Node.
const mcpjsDir = "testdata/mcpjs"

var installJS sync.Once

// nodeHost runs one host session of the TypeScript SDK client
// (testdata/mcpjs/client.mjs) against url with headers on every request,
// calling tool with args, and returns what it printed. It installs the
// pinned packages (npm ci) on first use if .ci/run has not.
func nodeHost(t *testing.T, url string, headers map[string]string, tool, args string) map[string]any {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is needed for the TypeScript SDK tests (.ci/run installs Debian's nodejs and npm)")
	}
	installJS.Do(func() {
		if _, err := os.Stat(filepath.Join(mcpjsDir, "node_modules", "@modelcontextprotocol", "sdk")); err == nil {
			return
		}
		cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts")
		cmd.Dir = mcpjsDir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in %s: %v\n%s", mcpjsDir, err, out)
		}
	})
	if url == "" {
		return nil // the packages are installed: all that was asked
	}
	h, _ := json.Marshal(headers)
	cmd := exec.Command(node, "client.mjs", url, string(h), tool, args)
	cmd.Dir = mcpjsDir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("node client.mjs: %v\n%s", err, stderr.String())
		}
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("node client.mjs did not finish\n%s", stderr.String())
	}
	var out map[string]any
	if err := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &out); err != nil {
		t.Fatalf("client.mjs printed %q: %v\n%s", stdout.String(), err, stderr.String())
	}
	return out
}

// TestTypeScriptSDKHostThroughGateways: the official TypeScript SDK
// client, unmodified, with the formation in a session-wide custom header
// (sent on initialize, tools/list, the call and DELETE alike), runs one
// session through real nginx and Caddy to the github fixture behind
// fencecheck: the call runs exactly once, the formation completes, and the
// session closes (DELETE passes — it is never a call). A session whose
// formation is unknown is refused, and the client reads the problem type
// (formation-not-found) from the gateway's answer.
func TestTypeScriptSDKHostThroughGateways(t *testing.T) {
	eachGateway(t, func(t *testing.T, kind string, s *stack) {
		snap := s.snapshot()
		const repo = `{"owner":"octo-org","repo":"hello-world"}`
		gw := s.gateway(t, kind, nil)
		auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("alice:"+gatewayUsers["alice"]))
		f := s.formRead(snap, "sess-ts-"+kind, "get_repository", repo)
		out := nodeHost(t, gw.URL+"/mcp", map[string]string{"Authorization": auth, "Fcd-Formation": f.ID}, "get_repository", repo)
		if out["error"] != nil || out["callError"] != nil || out["isError"] != false || out["terminated"] != true ||
			!strings.Contains(out["text"].(string), "hello-world") {
			t.Fatalf("the TypeScript host through %s: %v", kind, out)
		}
		s.waitStatus(f.ID, "completed")
		reads := s.Rec.Effects(fixtures.Filter{Tool: "get_repository", Kind: fixtures.KindRead})
		if len(reads) != 1 {
			t.Fatalf("get_repository ran %d times, want once: %+v", len(reads), reads)
		}

		// Behind a forward-auth gateway the client's POSTs carry no body to
		// tell them apart (this SDK sends no Mcp-Method): its initialize,
		// carrying the session-wide formation, is taken for the call and
		// refused — docs/mcp-sessions.md. The client reads the problem type.
		refused := nodeHost(t, gw.URL+"/mcp", map[string]string{"Authorization": auth, "Fcd-Formation": "fm_unknown"}, "get_repository", repo)
		msg, _ := refused["callError"].(string)
		if m, ok := refused["error"].(string); ok {
			msg = m
		}
		if !strings.Contains(msg, "formation-not-found") {
			t.Fatalf("a call with an unknown formation through %s: %v", kind, refused)
		}
		if n := len(s.Rec.Effects(fixtures.Filter{Tool: "get_repository", Kind: fixtures.KindRead})); n != 1 {
			t.Fatalf("a refused call ran: %d reads", n)
		}
	})
}

// inspectorCall runs the MCP Inspector's CLI, unmodified, for one
// tools/call against url with headers, and returns what it printed and
// whether it succeeded.
func inspectorCall(t *testing.T, url string, headers map[string]string, tool string, args map[string]string) (string, error) {
	t.Helper()
	nodeHost(t, "", nil, "", "") // installs the packages; no session (empty URL)
	argv := []string{"--cli", url, "--transport", "http",
		"--method", "tools/call", "--tool-name", tool}
	for k, v := range args {
		argv = append(argv, "--tool-arg", k+"="+v)
	}
	for k, v := range headers {
		argv = append(argv, "--header", k+": "+v)
	}
	cmd := exec.Command(filepath.Join("node_modules", ".bin", "mcp-inspector"), argv...)
	cmd.Dir = mcpjsDir
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return out.String(), err
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("the inspector did not finish:\n%s", out.String())
		return "", nil
	}
}

// TestInspectorCLIThroughGateways: the MCP Inspector's CLI, unmodified,
// calls a tool through real nginx and Caddy with the formation in a header:
// the call runs once and the formation completes.
func TestInspectorCLIThroughGateways(t *testing.T) {
	eachGateway(t, func(t *testing.T, kind string, s *stack) {
		snap := s.snapshot()
		const repo = `{"owner":"octo-org","repo":"hello-world"}`
		gw := s.gateway(t, kind, nil)
		auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("alice:"+gatewayUsers["alice"]))
		f := s.formRead(snap, "sess-inspector-"+kind, "get_repository", repo)
		out, err := inspectorCall(t, gw.URL+"/mcp", map[string]string{"Authorization": auth, "Fcd-Formation": f.ID},
			"get_repository", map[string]string{"owner": "octo-org", "repo": "hello-world"})
		if err != nil || !strings.Contains(out, "hello-world") {
			t.Fatalf("the inspector through %s: %v\n%s", kind, err, out)
		}
		s.waitStatus(f.ID, "completed")
		if n := len(s.Rec.Effects(fixtures.Filter{Tool: "get_repository", Kind: fixtures.KindRead})); n != 1 {
			t.Fatalf("get_repository ran %d times, want once", n)
		}
	})
}
