package e2e_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/internal/fixtures"
	"github.com/fcd-authz/fcd/internal/gatewaytest"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/modelcontextprotocol/go-sdk/mcp"
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
	return runNodeHost(t, url, headers, tool, args, "")
}

// nodeHostProgress is nodeHost asking for the call's progress
// notifications, counted in "progress".
func nodeHostProgress(t *testing.T, url string, headers map[string]string, tool, args string) map[string]any {
	t.Helper()
	return runNodeHost(t, url, headers, tool, args, "progress")
}

// runNodeHostAsync is runNodeHost for a goroutine other than the test's:
// it reports a failure with t.Error and returns nil.
func runNodeHostAsync(t *testing.T, url string, headers map[string]string, tool, args, options string) map[string]any {
	out, err := execNodeHost(url, headers, tool, args, options)
	if err != nil {
		t.Error(err)
		return nil
	}
	return out
}

func runNodeHost(t *testing.T, url string, headers map[string]string, tool, args, options string) map[string]any {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatalf("node is needed for the TypeScript SDK tests (.ci/run installs Debian's nodejs and npm)")
	}
	installJS.Do(func() {
		if jsInstalled() {
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
	out, err := execNodeHost(url, headers, tool, args, options)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// jsInstalled says whether every package package.json names is in
// node_modules (a checkout whose lockfile gained a package needs npm ci).
func jsInstalled() bool {
	raw, err := os.ReadFile(filepath.Join(mcpjsDir, "package.json"))
	if err != nil {
		return false
	}
	var pkg struct{ Dependencies map[string]string }
	if json.Unmarshal(raw, &pkg) != nil || len(pkg.Dependencies) == 0 {
		return false
	}
	for name := range pkg.Dependencies {
		if _, err := os.Stat(filepath.Join(mcpjsDir, "node_modules", filepath.FromSlash(name), "package.json")); err != nil {
			return false
		}
	}
	return true
}

// execNodeHost runs client.mjs once and decodes what it printed.
func execNodeHost(url string, headers map[string]string, tool, args, options string) (map[string]any, error) {
	h, _ := json.Marshal(headers)
	cmd := exec.Command("node", "client.mjs", url, string(h), tool, args, options)
	cmd.Dir = mcpjsDir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return nil, fmt.Errorf("node client.mjs: %v\n%s", err, stderr.String())
		}
	case <-time.After(90 * time.Second):
		cmd.Process.Kill()
		return nil, fmt.Errorf("node client.mjs did not finish\n%s", stderr.String())
	}
	var out map[string]any
	if err := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &out); err != nil {
		return nil, fmt.Errorf("client.mjs printed %q: %v\n%s", stdout.String(), err, stderr.String())
	}
	if req, ok := out["unanswered"].(string); ok {
		// No test expects a request to go unanswered: say which one, not
		// what the test would make of the rest (a gateway that ends an SSE
		// answer early, as Caddy 2.6 did, leaves the SDK waiting).
		return nil, fmt.Errorf("client.mjs got no answer to its %s (see the gateway's log): %v\n%s", req, out, stderr.String())
	}
	return out, nil
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

// startEverything runs @modelcontextprotocol/server-everything (the MCP
// reference server, pinned by the lockfile) over streamable HTTP on a free
// loopback port, and returns its base URL.
func startEverything(t *testing.T) string {
	t.Helper()
	nodeHost(t, "", nil, "", "") // installs the packages
	addr := etcdtest.FreeAddr(t)
	_, port, _ := strings.Cut(addr, ":")
	cmd := exec.Command("node", filepath.Join("node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js"), "streamableHttp")
	cmd.Dir = mcpjsDir
	cmd.Env = append(os.Environ(), "PORT="+port)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", "127.0.0.1:"+port); err == nil {
			c.Close()
			return "http://127.0.0.1:" + port
		}
		if time.Now().After(deadline) {
			t.Fatalf("server-everything did not listen on %s:\n%s", port, log.String())
		}
	}
}

// TestServerEverythingBehindTheFence: the MCP reference server
// (server-everything), unmodified, registered with a manifest of two of
// its tools and guarded by a `fencecheck proxy` process, is called by the
// official TypeScript SDK client through real nginx and Caddy: a call of
// trigger-long-running-operation streams its progress notifications
// (SSE) to the client before the result, runs once (the formation
// completes), and the session closes; the Go SDK client's echo call, the
// formation on its call, runs there too.
// startEverythingFenced registers server-everything's manifest
// (testdata/everything-manifest.json) on the stack and starts the
// reference server behind a `fencecheck proxy` process that verifies
// against exactly what it pins, claims at authzd and reports there. It
// returns the manifest's pool and the fence.
func startEverythingFenced(t *testing.T, s *stack) (pool string, px *proc) {
	t.Helper()
	_, fenceBin := buildBinaries(t)
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
	px = startProc(t, "fencecheck everything", fenceBin, "proxy", "--listen", "127.0.0.1:0", "--upstream", everything,
		"--pool", m.Pool, "--artifact", m.Artifact.Digest, "--config", m.Config.Digest, "--generation", "0",
		"--jwks", s.URL+"/.well-known/jwks.json", "--issuer", issuerName, "--server", "everything",
		"--authzd", s.URL, "--credential-file", credFile, "--timeout", "30s")
	return m.Pool, px
}

func TestServerEverythingBehindTheFence(t *testing.T) {
	s := startStack(t, nil)
	pool, px := startEverythingFenced(t, s)
	snap := s.snapshotOf("everything")
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("alice:"+gatewayUsers["alice"]))
	for _, kind := range gatewaytest.Kinds {
		t.Run(kind, func(t *testing.T) {
			gw := gatewaytest.Start(t, kind, gatewaytest.Config{
				Authzd: s.URL, Credential: string(s.creds[api.RoleGateway]), Default: pool,
				Pools: map[string]string{pool: px.URL}, Users: gatewayUsers,
			})
			const args = `{"duration":1,"steps":3}`
			rec := s.create(everythingCall(t, snap, "sess-everything-"+kind, "trigger-long-running-operation", args))
			id := rec.Id
			if rec.Status != client.FormationStatusReady {
				t.Fatalf("formation: %+v", rec)
			}
			out := nodeHostProgress(t, gw.URL+"/mcp", map[string]string{"Authorization": auth, "Fcd-Formation": id},
				"trigger-long-running-operation", args)
			if out["error"] != nil || out["callError"] != nil || out["isError"] != false || out["terminated"] != true ||
				!strings.Contains(out["text"].(string), "Long running operation completed") {
				t.Fatalf("through %s: %v\n%s", kind, out, px.stderr.String())
			}
			if n, _ := out["progress"].(float64); n < 1 {
				t.Fatalf("through %s: %v progress notifications before the result, want some", kind, out["progress"])
			}
			s.waitStatus(id, "completed")

			// The Go SDK client, unmodified, the same server and gateway.
			echo := s.create(everythingCall(t, snap, "sess-everything-go-"+kind, "echo", `{"message":"from go"}`))
			h := connectHost(t, gw)
			res, err := h.call(formation{ID: echo.Id}, "echo", `{"message":"from go"}`)
			if err != nil || res.IsError || len(res.Content) == 0 {
				t.Fatalf("the Go SDK client through %s: %v %+v", kind, err, res)
			}
			if tc, ok := res.Content[0].(*mcp.TextContent); !ok || !strings.Contains(tc.Text, "from go") {
				t.Fatalf("the Go SDK client's echo: %+v", res.Content)
			}
			s.waitStatus(echo.Id, "completed")

			// The Go SDK client's long-running call: its progress
			// notifications arrive before the result.
			long := s.create(everythingCall(t, snap, "sess-everything-go-long-"+kind, "trigger-long-running-operation", args))
			var progressed atomic.Int64
			cs := goSession(t, gw, &mcp.ClientOptions{ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) {
				progressed.Add(1)
			}})
			text, err := goCall(t, cs, long.Id, "trigger-long-running-operation", args, true)
			if err != nil || !strings.Contains(text, "Long running operation completed") {
				t.Fatalf("the Go SDK client's long-running call through %s: %v %q", kind, err, text)
			}
			if n := progressed.Load(); n < 1 {
				t.Fatalf("the Go SDK client saw %d progress notifications before the result, want some", n)
			}
			if err := cs.Close(); err != nil {
				t.Fatalf("closing the Go SDK session: %v", err)
			}
			s.waitStatus(long.Id, "completed")
		})
	}
}

// goSession connects the official MCP Go SDK client, unmodified, through
// gw as alice with opts; each call's formation goes in params._meta and,
// on the tools/call only, in Fcd-Formation (gatewaytest.FormationTransport).
// The session is closed (DELETE) at cleanup if the test has not.
func goSession(t *testing.T, gw *gatewaytest.Gateway, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	tr := &mcp.StreamableClientTransport{
		Endpoint: gw.URL + "/mcp",
		HTTPClient: &http.Client{Transport: gatewaytest.FormationTransport(
			gatewaytest.BasicAuth(nil, "alice", gatewayUsers["alice"]))},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "fcd-e2e-go", Version: "0"}, opts).Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("the Go SDK client through %s: %v", gw.Kind, err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// goCall calls tool with args (JSON) in cs, the formation in _meta, and
// returns the result's text; progress, if not nil, asks for progress
// notifications.
func goCall(t *testing.T, cs *mcp.ClientSession, formation, tool, args string, progress bool) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := &mcp.CallToolParams{Name: tool, Arguments: json.RawMessage(args), Meta: mcp.Meta{gatewaytest.FormationMetaKey: formation}}
	if progress {
		p.SetProgressToken("fcd-e2e-progress")
	}
	res, err := cs.CallTool(ctx, p)
	if err != nil {
		return "", err
	}
	if res.IsError {
		return "", fmt.Errorf("the tool answered an error: %+v", res.Content)
	}
	var text []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text = append(text, tc.Text)
		}
	}
	return strings.Join(text, "\n"), nil
}

// registerEverything registers testdata/everything-manifest.json as
// release rel on pool, its artifact digest made distinct, and returns the
// epoch id and the manifest's artifact and config digests.
func registerEverything(t *testing.T, s *stack, rel, pool string) (epoch, artifact, config string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "everything-manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	m["server"].(map[string]any)["release"] = rel
	m["pool"] = pool
	artifact = manifest.DigestBytes([]byte("server-everything " + rel))
	m["artifact"].(map[string]any)["digest"] = artifact
	config = m["config"].(map[string]any)["digest"].(string)
	doc, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	jws, err := manifest.Sign(doc, s.registrar.Key, manifest.TypManifest)
	if err != nil {
		t.Fatal(err)
	}
	epoch = s.registerManifest(jws)
	s.Epoch[pool] = epoch
	return epoch, artifact, config
}

// everythingCall is the request forming a call of server-everything's
// tool with args (a JSON object) in session, for alice.
func everythingCall(t *testing.T, snapshot, session, tool, args string) client.FormationRequest {
	t.Helper()
	return client.FormationRequest{Snapshot: snapshot, Session: session, Tool: "everything/" + tool,
		Arguments: object(t, args), Principal: &client.FormationRequest_Principal{Id: ptr("alice")}}
}

// TestSubstitutionMidSessionWithTheTypeScriptSDK: a TypeScript SDK host's
// session begins on server-everything release A (the pool session traffic
// goes to); its echo call, formed on A with a captured successor (a
// certificate A → B), is held until A drains and retires, then admitted to
// B: through real nginx and Caddy it reaches B's fencecheck proxy with
// A's session id, the proxy adopts the session, the call runs once on B,
// and the client — unmodified, the formation on its tools/call only, as a
// host behind forward-auth sends it — gets its result and closes its
// session on A. The adopted session on B is closed once idle: nothing is
// left open. The official Go SDK client, unmodified, does the same in a
// session of its own, alongside.
func TestSubstitutionMidSessionWithTheSDKs(t *testing.T) {
	_, fenceBin := buildBinaries(t)
	for _, kind := range gatewaytest.Kinds {
		t.Run(kind, func(t *testing.T) {
			s := startStack(t, nil)
			serverA, serverB := startEverything(t), startEverything(t)
			epochB, artB, cfgB := registerEverything(t, s, "2026.8.31-b", "everything-b")
			epochA, artA, cfgA := registerEverything(t, s, "2026.8.31-a", "everything-a")
			credFile := filepath.Join(t.TempDir(), "backend.cred")
			if err := os.WriteFile(credFile, []byte(s.creds[api.RoleBackend]), 0o600); err != nil {
				t.Fatal(err)
			}
			proxy := func(name, upstream, pool, artifact, config string, extra ...string) *proc {
				args := append([]string{"proxy", "--listen", "127.0.0.1:0", "--upstream", upstream,
					"--pool", pool, "--artifact", artifact, "--config", config, "--generation", "0",
					"--jwks", s.URL + "/.well-known/jwks.json", "--issuer", issuerName, "--server", "everything",
					"--authzd", s.URL, "--credential-file", credFile, "--timeout", "30s"}, extra...)
				return startProc(t, name, fenceBin, args...)
			}
			pxA := proxy("fencecheck A", serverA, "everything-a", artA, cfgA)
			pxB := proxy("fencecheck B", serverB, "everything-b", artB, cfgB, "--adopted-idle", "1s")

			now := time.Now().UTC().Truncate(time.Second)
			cert, err := json.Marshal(map[string]any{
				"source": epochA, "target": epochB, "tool": "echo",
				"envelope": map[string]any{"type": "object"}, "effects": map[string]any{"echo": "same"},
				"profile":  map[string]any{"id": "everything-echo/1", "digest": manifest.DigestBytes([]byte("everything-echo/1"))},
				"issuedAt": now.Add(-time.Minute), "expiresAt": now.Add(time.Hour),
			})
			if err != nil {
				t.Fatal(err)
			}
			cjws, err := manifest.Sign(cert, s.issuerKey, manifest.TypCertificate)
			if err != nil {
				t.Fatal(err)
			}
			s.registerCertificate(cjws)
			snap := s.snapshotOf("everything")
			const args = `{"message":"substituted"}`
			sub := formationFrom(s.create(everythingCall(t, snap, "sess-sub", "echo", args)))
			if sub.Status != "ready" || sub.Pool != "everything-a" || sub.Successor != "everything-b" {
				t.Fatalf("the formation: %+v", sub)
			}
			id := sub.ID
			const goArgs = `{"message":"substituted for go"}`
			goID := s.create(everythingCall(t, snap, "sess-sub-go", "echo", goArgs)).Id

			gw := gatewaytest.Start(t, kind, gatewaytest.Config{
				Authzd: s.URL, Credential: string(s.creds[api.RoleGateway]), Default: "everything-a",
				Pools: map[string]string{"everything-a": pxA.URL, "everything-b": pxB.URL}, Users: gatewayUsers,
			})
			auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("alice:"+gatewayUsers["alice"]))
			gate := filepath.Join(t.TempDir(), "go")
			done := make(chan map[string]any, 1)
			go func() {
				done <- runNodeHostAsync(t, gw.URL+"/mcp", map[string]string{"Authorization": auth, "Fcd-Formation": id},
					"echo", args, "call-only,wait="+gate)
			}()
			for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				if _, err := os.Stat(gate + ".ready"); err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the host did not start its session")
				}
			}
			goHost := goSession(t, gw, nil) // its session begins on A too
			// The source retires under the open sessions.
			s.retire("everything-a")
			if err := os.WriteFile(gate, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			out := <-done
			if out == nil {
				t.Fatal("the host failed; see above")
			}
			if out["error"] != nil || out["callError"] != nil || out["isError"] != false || out["terminated"] != true ||
				!strings.Contains(out["text"].(string), "substituted") {
				t.Fatalf("the substituted call through %s: %v\nA: %s\nB: %s", kind, out, pxA.stderr.String(), pxB.stderr.String())
			}
			s.waitStatus(id, "completed")
			if text, err := goCall(t, goHost, goID, "echo", goArgs, false); err != nil || !strings.Contains(text, "substituted for go") {
				t.Fatalf("the Go SDK client's substituted call through %s: %v %q\nB: %s", kind, err, text, pxB.stderr.String())
			}
			if err := goHost.Close(); err != nil { // DELETE, to A
				t.Fatalf("closing the Go SDK session on A: %v", err)
			}
			s.waitStatus(goID, "completed")
			if n := strings.Count(pxB.stderr.String(), "adopted the host's session"); n != 2 {
				t.Fatalf("B adopted %d sessions, want the TypeScript host's and the Go host's:\n%s", n, pxB.stderr.String())
			}
			lease := s.leaseOf(id)
			if !strings.Contains(pxB.stderr.String(), "adopted the host's session") || lease == "" {
				t.Fatalf("the call did not run on B in an adopted session (lease %q):\n%s", lease, pxB.stderr.String())
			}
			for deadline := time.Now().Add(15 * time.Second); !strings.Contains(pxB.stderr.String(), "closed an idle adopted session"); time.Sleep(100 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the adopted session on B was left open:\n%s", pxB.stderr.String())
				}
			}
		})
	}
}

// TestTypeScriptSDKHostReadsEachRefusal: a host built on the official
// TypeScript SDK client, unmodified, reads why a call was refused from the
// answer alone — the Fcd-Problem header and the type the body names
// (authzd's problem through the gateway, fencecheck's JSON-RPC error
// data) — through its fetch option, as docs/mcp-sessions.md tells hosts
// to. Through real nginx and Caddy, the formation on the tools/call only:
// an unknown formation, a write awaiting approval, a formation whose call
// already ran, a source being drained (with Retry-After); and straight at
// the backend's fence, a call with no token. None of them runs.
func TestTypeScriptSDKHostReadsEachRefusal(t *testing.T) {
	eachGateway(t, func(t *testing.T, kind string, s *stack) {
		snap := s.snapshot()
		const repo = `{"owner":"octo-org","repo":"hello-world"}`
		gw := s.gateway(t, kind, nil)
		auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("alice:"+gatewayUsers["alice"]))
		reads := func() int {
			return len(s.Rec.Effects(fixtures.Filter{Tool: "get_repository", Kind: fixtures.KindRead}))
		}

		ran := s.form(snap, "sess-ts-ran-"+kind, "get_repository", repo)
		if out := runNodeHost(t, gw.URL+"/mcp", map[string]string{"Authorization": auth, "Fcd-Formation": ran.ID},
			"get_repository", repo, "call-only,problems"); out["callError"] != nil || out["isError"] != false {
			t.Fatalf("the first call: %v", out)
		}
		s.waitStatus(ran.ID, "completed")
		pending := s.form(snap, "sess-ts-pending-"+kind, "create_repository", `{"name":"never-approved"}`)
		if pending.Status != "pending_approval" {
			t.Fatalf("the write: %+v", pending)
		}
		draining := s.form(snap, "sess-ts-draining-"+kind, "get_repository", repo)

		type want struct {
			problem, retryAfter, formation string
			fence                          bool
		}
		cases := []struct {
			name, url, formation, tool, args string
			before                           func()
			want                             want
		}{
			{name: "unknown formation", url: gw.URL + "/mcp", formation: "fm_unknown", tool: "get_repository", args: repo,
				want: want{problem: "formation-not-found", formation: "fm_unknown"}},
			{name: "awaiting approval", url: gw.URL + "/mcp", formation: pending.ID, tool: "create_repository", args: `{"name":"never-approved"}`,
				want: want{problem: "not-approved", formation: pending.ID}},
			{name: "already ran", url: gw.URL + "/mcp", formation: ran.ID, tool: "get_repository", args: repo,
				want: want{problem: "lease-closed", formation: ran.ID}},
			{name: "no token at the fence", url: s.Fixture[poolV14] + "/mcp", tool: "get_repository", args: repo,
				want: want{problem: "missing", fence: true}},
			// Last: a drain does not reverse.
			{name: "source draining", url: gw.URL + "/mcp", formation: draining.ID, tool: "get_repository", args: repo,
				before: func() { s.drain(poolV14) }, want: want{problem: "source-draining", retryAfter: "5", formation: draining.ID}},
		}
		for _, c := range cases {
			if c.before != nil {
				c.before()
			}
			headers := map[string]string{"Authorization": auth}
			if c.formation != "" {
				headers["Fcd-Formation"] = c.formation
			}
			before := reads()
			out := runNodeHost(t, c.url, headers, c.tool, c.args, "call-only,problems")
			if out["callError"] == nil || out["terminated"] != true {
				t.Fatalf("%s through %s: the call was not refused, or the session not closed: %v", c.name, kind, out)
			}
			refusals, _ := out["refusals"].([]any)
			if len(refusals) != 1 {
				t.Fatalf("%s through %s: %d refused answers, want the call's alone: %v", c.name, kind, len(refusals), out)
			}
			r := refusals[0].(map[string]any)
			typ := "docs/problems.md#" + c.want.problem
			if c.want.fence {
				typ = "fencecheck/README.md#reason-" + c.want.problem
			}
			if r["method"] != "POST" || r["problem"] != c.want.problem || !strings.HasSuffix(r["type"].(string), typ) ||
				r["retryAfter"] != c.want.retryAfter || r["formation"] != c.want.formation {
				t.Fatalf("%s through %s: the host read %v, want Fcd-Problem %s, a type ending %s, Retry-After %q, formation %q",
					c.name, kind, r, c.want.problem, typ, c.want.retryAfter, c.want.formation)
			}
			if n := reads(); n != before {
				t.Fatalf("%s through %s: a refused call ran (%d reads, were %d)", c.name, kind, n, before)
			}
		}
		if n := len(s.Rec.Effects(fixtures.Filter{Tool: "create_repository"})); n != 0 {
			t.Fatalf("the unapproved write ran %d times", n)
		}
	})
}
