package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/fencecheck/fencechecktest"
	"github.com/fcd-authz/fcd/internal/cmdtest"
	"github.com/fcd-authz/fcd/internal/fixtures"
	"github.com/fcd-authz/fcd/internal/leaktest"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestMain fails the package if a test leaves goroutines behind: the
// commands run in-process are stopped, their sessions closed, by the
// tests that start them. Idle keep-alive connections are not leaks.
func TestMain(m *testing.M) {
	leaktest.VerifyTestMain(m, leaktest.IgnoreIdleHTTP()...)
}

var listening = regexp.MustCompile(`(?m)^mcpfixture: listening on (http://\S+)$`)

// start runs `mcpfixture args...` until the test ends and returns its base
// URL, from the line it prints when ready.
func start(t *testing.T, args ...string) string {
	t.Helper()
	base, _ := startOut(t, args...)
	return base
}

// startOut is start that also returns the command's stderr.
func startOut(t *testing.T, args ...string) (string, *cmdtest.SyncBuffer) {
	t.Helper()
	c, base, err := cmdtest.Start(t, fmt.Sprint("mcpfixture ", args), listening, func(ctx context.Context, stderr io.Writer) int {
		return run(ctx, args, io.Discard, stderr)
	})
	if err != nil {
		t.Fatal(err)
	}
	return base, c.Stderr
}

func connect(t *testing.T, endpoint string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "mcpfixture-test", Version: "0"}, nil)
	cs, err := c.Connect(t.Context(), fixtures.NewClientTransport(endpoint, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func callTool(t *testing.T, cs *mcp.ClientSession, token, tool, args string) (*mcp.CallToolResult, error) {
	t.Helper()
	ctx := t.Context()
	if token != "" {
		ctx = fixtures.WithDispatchToken(ctx, token)
	}
	return cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: json.RawMessage(args)})
}

func effects(t *testing.T, url string, f fixtures.Filter) []fixtures.Effect {
	t.Helper()
	got, err := (&fixtures.RecorderClient{URL: url}).Effects(t.Context(), f)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestServe(t *testing.T) {
	base := start(t, "serve", "--server", "github", "--release", "v1.3", "--log-level", "warn")
	cs := connect(t, base+"/mcp")
	stateless := connect(t, start(t, "serve", "--server", "github", "--release", "v1.3", "--stateless", "--json-response", "--log-level", "warn")+"/mcp")
	if cs.ID() == "" || stateless.ID() != "" {
		t.Errorf("session ids %q (stateful) and %q (--stateless)", cs.ID(), stateless.ID())
	}
	if res, err := callTool(t, stateless, "", "get_repository", `{"owner":"octo-org","repo":"hello-world"}`); err != nil || res.IsError {
		t.Errorf("--stateless --json-response: %v %+v", err, res)
	}
	if _, err := callTool(t, cs, "", "create_repository", `{"name":"payroll-exports"}`); err != nil {
		t.Fatal(err)
	}
	got := effects(t, base+"/effects", fixtures.Filter{})
	if len(got) != 1 || got[0].Did["visibility"] != "public" || got[0].Session != cs.ID() || got[0].Release != "v1.3" {
		t.Fatalf("effects %+v", got)
	}
	var info map[string]any
	resp, err := http.Get(base + "/fixture")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		t.Fatal(err)
	}
	rel, _ := fixtures.Lookup("github", "v1.3")
	if info["pool"] != rel.Pool || info["artifact"] != rel.Artifact || info["config"] != rel.Config ||
		info["fenced"] != false || info["mcp"] != base+"/mcp" || info["effects"] != base+"/effects" {
		t.Errorf("/fixture %v", info)
	}
	resp, err = http.Get(base + "/manifest")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if body, _ := io.ReadAll(resp.Body); !bytes.Equal(body, rel.ManifestJSON()) {
		t.Errorf("/manifest is not the release's manifest")
	}
}

// A fixture guarded in-process by fencecheck, offline, with a static key
// set and tokens signed here.
func TestServeFenced(t *testing.T) {
	key := fencechecktest.NewKey(fencechecktest.EdDSA, "k1")
	keys := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(keys, fencechecktest.JWKS(key), 0o600); err != nil {
		t.Fatal(err)
	}
	base := start(t, "serve", "--server", "azure", "--release", "v1.1", "--keys", keys, "--issuer", "fcd-test",
		"--generation", "3", "--offline", "--log-level", "error")
	rel, _ := fixtures.Lookup("azure", "v1.1")
	// Offline, the fence refuses leases admitted before it started; the
	// tokens below are for leases admitted after (beyond the 5 s skew),
	// except the one that tests the refusal.
	started := time.Now()
	sign := func(args string, gen int64, admitted time.Time) string {
		digest, _ := fencecheck.ArgumentDigest("azure/create_storage_account", json.RawMessage(args))
		now := time.Now().Unix()
		var id [9]byte
		rand.Read(id[:])
		return key.Issue(fencecheck.Claims{
			Issuer: "fcd-test", Audience: rel.Pool, Subject: "s1", ID: base64.RawURLEncoding.EncodeToString(id[:]),
			IssuedAt: now, NotBefore: now, Expiry: now + 30, Formation: "f1", Tool: "azure/create_storage_account",
			ArgumentDigest: digest, Epoch: "sha256:e", Artifact: rel.Artifact, Config: rel.Config, Generation: gen,
			Revision: 1, Cluster: "c", Admitted: admitted.UnixMilli(),
		})
	}
	cs := connect(t, base+"/mcp")
	const args = `{"name":"payrollexports"}`
	for _, tc := range []struct {
		token  string
		reason fencecheck.Reason
	}{
		{"", fencecheck.ReasonMissing},
		{sign(args, 2, started.Add(time.Minute)), fencecheck.ReasonGeneration},
		{sign(args, 3, started.Add(-time.Minute)), fencecheck.ReasonAdmittedBeforeStart},
	} {
		_, err := callTool(t, cs, tc.token, "create_storage_account", args)
		if got, ok := fixtures.RejectReason(err); !ok || got != tc.reason {
			t.Errorf("got %v, want refusal %s", err, tc.reason)
		}
	}
	if got := effects(t, base+"/effects", fixtures.Filter{}); len(got) != 0 {
		t.Fatalf("refused calls recorded %+v", got)
	}
	if res, err := callTool(t, cs, sign(args, 3, started.Add(time.Minute)), "create_storage_account", args); err != nil || res.IsError {
		t.Fatalf("admitted call: %v %+v", err, res)
	}
	if got := effects(t, base+"/effects", fixtures.Filter{}); len(got) != 1 || got[0].Did["publicNetworkAccess"] != "Disabled" || got[0].FcdSession != "s1" {
		t.Fatalf("effects %+v", got)
	}
}

// One effect log for several fixture processes: a standalone recorder, or
// one fixture's --recorder-listen.
func TestSharedRecorder(t *testing.T) {
	rec := start(t, "recorder", "--log-level", "warn") + "/effects"
	v11 := connect(t, start(t, "serve", "--server", "dbhub", "--release", "v0.11", "--recorder-url", rec, "--log-level", "warn")+"/mcp")
	v10 := connect(t, start(t, "serve", "--server", "dbhub", "--release", "v0.10", "--recorder-url", rec, "--log-level", "warn")+"/mcp")
	args, _ := json.Marshal(map[string]string{"sql": fixtures.DBHubEscalation})
	for _, cs := range []*mcp.ClientSession{v11, v10} {
		if _, err := callTool(t, cs, "", "execute_sql", string(args)); err != nil {
			t.Fatal(err)
		}
	}
	got := effects(t, rec, fixtures.Filter{Server: "dbhub"})
	if len(got) != 2 || got[0].Release != "v0.11" || got[0].Kind != fixtures.KindRefused || got[1].Release != "v0.10" || got[1].Kind != fixtures.KindWrite {
		t.Fatalf("effects %+v", got)
	}

	base, out := startOut(t, "serve", "--server", "openclaw", "--release", "v2026.1", "--recorder-listen", "127.0.0.1:0", "--log-level", "warn")
	recLine := regexp.MustCompile(`(?m)^mcpfixture: recorder on (http://\S+/effects)$`)
	url := recLine.FindStringSubmatch(out.String())[1]
	cs := connect(t, base+"/mcp")
	if _, err := callTool(t, cs, "", "list_tasks", `{}`); err != nil {
		t.Fatal(err)
	}
	if got := effects(t, url, fixtures.Filter{}); len(got) != 1 || got[0].Session != cs.ID() {
		t.Fatalf("effects %+v", got)
	}
}

func TestCommandLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{nil, 2, "no command"},
		{[]string{"nope"}, 2, "unknown command"},
		{[]string{"serve"}, 2, "--server and --release are required"},
		{[]string{"serve", "--server", "gitlab", "--release", "v1"}, 2, "unknown server"},
		{[]string{"serve", "--server", "github", "--release", "v9"}, 2, "no release"},
		{[]string{"serve", "--server", "github", "--release", "v1.4", "--recorder-url", "http://x/effects", "--recorder-listen", ":0"}, 2, "at most one"},
		{[]string{"serve", "--server", "github", "--release", "v1.4", "--pool", "p"}, 2, "need --jwks or --keys"},
		{[]string{"serve", "--server", "github", "--release", "v1.4", "--jwks", "http://x", "--keys", "f"}, 2, "at most one of --jwks and --keys"},
		{[]string{"serve", "--server", "github", "--release", "v1.4", "--jwks", "http://x", "--authzd", "http://y"}, 2, "needs --credential-file"},
		{[]string{"serve", "--server", "github", "--release", "v1.4", "--jwks", "http://x"}, 2, "--authzd (with --credential-file) is required, or --offline"},
		{[]string{"serve", "--server", "github", "--release", "v1.4", "--jwks", "http://x", "--authzd", "http://y", "--offline"}, 2, "exclude each other"},
		{[]string{"serve", "--server", "github", "--release", "v1.4", "--offline"}, 2, "need --jwks or --keys"},
		{[]string{"serve", "--server", "github", "--release", "v1.4", "extra"}, 2, "unexpected argument"},
	} {
		var stderr bytes.Buffer
		if code := run(t.Context(), tc.args, io.Discard, &stderr); code != tc.code || !strings.Contains(stderr.String(), tc.out) {
			t.Errorf("%v: exit %d, %q; want %d, %q", tc.args, code, stderr.String(), tc.code, tc.out)
		}
	}
	var stdout bytes.Buffer
	if code := run(t.Context(), []string{"list", "--json"}, &stdout, io.Discard); code != 0 {
		t.Fatal(code)
	}
	var rows []map[string]string
	if err := json.Unmarshal(stdout.Bytes(), &rows); err != nil || len(rows) != len(fixtures.Releases()) || rows[0]["pool"] == "" {
		t.Errorf("list: %v %s", err, stdout.String())
	}
}
