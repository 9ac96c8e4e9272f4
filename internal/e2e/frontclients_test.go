package e2e_test

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/internal/cmdtest"
	"github.com/fcd-authz/fcd/internal/fixtures"
	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
	"github.com/lestrrat-go/jwx/v2/jwt"
	mcpgo "github.com/mark3labs/mcp-go/client"
	mcpgotransport "github.com/mark3labs/mcp-go/client/transport"
	mcpgotypes "github.com/mark3labs/mcp-go/mcp"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// testIssuer is an OAuth issuer for the fronts' clients: an Ed25519 key
// served as a JWKS over real HTTP, minting the bearer tokens an
// authorization server would (front/auth_test.go tests the refusals one
// by one).
type testIssuer struct {
	Name string // iss
	JWKS string // the JWKS URL
	key  jwk.Key
}

func newTestIssuer(t *testing.T) *testIssuer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	key, err := jwk.FromRaw(priv)
	if err != nil {
		t.Fatal(err)
	}
	_ = key.Set(jwk.KeyIDKey, "e2e-idp-1")
	_ = key.Set(jwk.AlgorithmKey, jwa.EdDSA)
	pub, err := key.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	set := jwk.NewSet()
	_ = set.AddKey(pub)
	raw, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(raw)
	}))
	t.Cleanup(srv.Close)
	// The issuer is named by its loopback URL: a client that looks for
	// the authorization server finds nothing but this machine.
	return &testIssuer{Name: srv.URL, JWKS: srv.URL + "/jwks.json", key: key}
}

// token mints a token of the issuer for sub, a developer, valid for an
// hour, for audience.
func (i *testIssuer) token(t *testing.T, sub, audience string) string {
	t.Helper()
	now := time.Now()
	tok, err := jwt.NewBuilder().Issuer(i.Name).Audience([]string{audience}).Subject(sub).
		IssuedAt(now).Expiration(now.Add(time.Hour)).Claim("groups", []string{"dev"}).Build()
	if err != nil {
		t.Fatal(err)
	}
	signed, err := jwt.Sign(tok, jwt.WithKey(jwa.EdDSA, i.key))
	if err != nil {
		t.Fatal(err)
	}
	return string(signed)
}

// listedTool is a tool as a client library shows it to its model.
type listedTool struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// InputSchema is the schema the library gives the model; null where it
	// exposes none.
	InputSchema json.RawMessage `json:"inputSchema"`
	// ReadOnly is the readOnlyHint annotation (every library tested
	// exposes the annotations); null when the library shows none.
	ReadOnly *bool `json:"readOnly"`
}

// callOutcome is what a client library gave back for one tools/call.
type callOutcome struct {
	IsError bool   `json:"isError"`
	Text    string `json:"text"`
	// Problem is structuredContent's fcd.problem, where the library
	// exposes the structured content of an error result.
	Problem string `json:"problem"`
	// Progress counts the notifications/progress the library passed on.
	Progress int `json:"progress"`
	// Error is what the library raised instead of giving a result.
	Error string `json:"error"`
}

// frontUser is one client library's use of the front, as its application
// would use it.
type frontUser interface {
	list(t *testing.T) []listedTool
	call(t *testing.T, name string, args map[string]any, progress bool) callOutcome
	close(t *testing.T)
}

// schemaView says how a library shows the model a tool's input schema.
type schemaView int

const (
	schemaExact      schemaView = iota // the listed schema, as it is
	schemaProperties                   // rewritten (closed, simplified): the same properties
)

// frontClientKind is one unmodified third-party client library.
type frontClientKind struct {
	name string
	// connect opens a session with the front at url as token's bearer; an
	// error is the library's own report of a refused connection.
	connect func(t *testing.T, url, token string) (frontUser, error)
	schemas schemaView
	// progress: the library passes notifications/progress on.
	progress bool
	// structured: the library exposes an error result's structuredContent.
	structured bool
	// perCall: every operation is a session of its own (a CLI), so a call
	// is formed against the latest snapshot, never a stale one.
	perCall bool
}

// frontClientKinds are the client libraries of issue 24, pinned by
// testdata/mcpjs/package-lock.json and go.mod.
var frontClientKinds = []frontClientKind{
	{name: "ts-sdk", connect: nodeFrontUser("front-sdk.mjs"), schemas: schemaExact, progress: true, structured: true},
	{name: "langchain", connect: nodeFrontUser("front-langchain.mjs"), schemas: schemaProperties, progress: true},
	{name: "ai-sdk", connect: nodeFrontUser("front-aisdk.mjs"), schemas: schemaProperties, structured: true},
	{name: "inspector-cli", connect: connectInspector, schemas: schemaExact, structured: true, perCall: true},
	{name: "mcp-go", connect: connectMCPGo, schemas: schemaExact, progress: true, structured: true},
}

// TestFrontClients: each unmodified third-party client library, given only
// the front's URL and a bearer token its issuer minted for the front, is
// shown exactly the snapshot its calls are formed against; a read runs
// once; a write waits for an approval given while the call is open
// (with progress where the library shows it); a denied call reads as a
// tool error and runs nowhere; a write whose source retires while it waits
// runs once on the certified successor; a call on the retired source (the
// session not listed again) is refused source-stale; listed again, the
// session calls the successor. A token for another audience is refused
// before anything is formed.
func TestFrontClients(t *testing.T) {
	for _, kind := range frontClientKinds {
		t.Run(kind.name, func(t *testing.T) { frontClientScenario(t, kind) })
	}
}

func frontClientScenario(t *testing.T, kind frontClientKind) {
	s := startStack(t, nil)
	idp := newTestIssuer(t)
	url, _ := startFrontWith(t, s, frontOptions{Issuer: idp})
	aliceToken := idp.token(t, "alice", frontResource)
	prefix := strings.ReplaceAll(kind.name, "-", "")

	// A token minted for another audience is refused (401) before any
	// session opens; the library reports it, and nothing is formed.
	other := idp.token(t, "alice", "http://other.test/mcp")
	if status := initializeStatus(t, url, other); status != http.StatusUnauthorized {
		t.Fatalf("a token for another audience: %d, want 401", status)
	}
	if u, err := kind.connect(t, url, other); err == nil {
		u.close(t)
		t.Fatal("the library connected with a token for another audience")
	} else {
		t.Logf("another audience: %v", err)
	}
	if n := s.formationCount(); n != 0 {
		t.Fatalf("%d formations after the refused connection", n)
	}

	u, err := kind.connect(t, url, aliceToken)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer u.close(t)
	// A Go SDK session of its own tells when the front has relisted.
	watcher := connectFront(t, url, aliceToken)

	// tools/list is the snapshot.
	checkListing(t, s, kind, u.list(t))

	// A read runs once.
	repo := map[string]any{"owner": "octo-org", "repo": "hello-world"}
	if out := u.call(t, "get_repository", repo, false); out.Error != "" || out.IsError || !strings.Contains(out.Text, "hello-world") {
		t.Fatalf("the read: %+v", out)
	}
	if n := len(s.Rec.Effects(fixtures.Filter{Tool: "get_repository"})); n != 1 {
		t.Fatalf("the read ran %d times", n)
	}

	// A write waits for its approval, given while the call is open.
	approved := make(chan string, 1)
	go func() { approved <- s.approvePending("create_repository") }()
	out := u.call(t, "create_repository", map[string]any{"name": prefix + "-write"}, kind.progress)
	id := <-approved
	if out.Error != "" || out.IsError {
		t.Fatalf("the approved write: %+v", out)
	}
	if es := effectsOf(s.Rec, prefix+"-write"); len(es) != 1 || es[0].Release != "v1.4" {
		t.Fatalf("the write's effects: %+v, want one on v1.4", es)
	}
	s.waitStatus(id, "completed")
	if kind.progress && out.Progress == 0 {
		t.Fatalf("the library passed on no progress while the write waited: %+v", out)
	}

	// A denied call is a tool error the model reads; nothing runs.
	out = u.call(t, "delete_repository", repo, false)
	refusedWith(t, kind, out, "formation-denied")
	if !strings.Contains(out.Text, "denied") {
		t.Fatalf("the model is not told the call was denied: %q", out.Text)
	}
	if n := len(s.Rec.Effects(fixtures.Filter{Tool: "delete_repository"})); n != 0 {
		t.Fatalf("the denied delete ran %d times", n)
	}

	// The source retires while a write waits for approval: it is admitted
	// to the certified successor and runs there once.
	s.certify()
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.approvePendingAfter("create_repository", func() { s.retire(poolV14) })
	}()
	out = u.call(t, "create_repository", map[string]any{"name": prefix + "-successor", "private": true}, false)
	<-done
	if out.Error != "" || out.IsError {
		t.Fatalf("the substituted write: %+v", out)
	}
	if es := effectsOf(s.Rec, prefix+"-successor"); len(es) != 1 || es[0].Release != "v1.3" || es[0].Did["visibility"] != "private" {
		t.Fatalf("the substituted write's effects: %+v, want one private on v1.3", es)
	}

	// The front relists (the watcher is told); a session that has not
	// listed again calls the retired source: refused, nothing runs.
	waitListChanged(t, watcher)
	if !kind.perCall {
		out = u.call(t, "get_repository", repo, false)
		refusedWith(t, kind, out, "source-stale")
		if n := len(s.Rec.Effects(fixtures.Filter{Tool: "get_repository"})); n != 1 {
			t.Fatalf("reads ran %d times, want the first only", n)
		}
	}

	// Listed again, the session calls the successor.
	checkListing(t, s, kind, u.list(t))
	if out := u.call(t, "get_repository", repo, false); out.Error != "" || out.IsError {
		t.Fatalf("the read after relisting: %+v", out)
	}
	if es := s.Rec.Effects(fixtures.Filter{Tool: "get_repository"}); len(es) != 2 || es[1].Release != "v1.3" {
		t.Fatalf("reads: %+v, want the second on v1.3", es)
	}
	for _, e := range s.Rec.Effects(fixtures.Filter{Tool: "create_repository"}) {
		if e.Did["visibility"] != "private" {
			t.Errorf("drifted effect: %+v", e)
		}
	}
}

// TestFrontStdio: the official TypeScript SDK's client launches `authzd
// front --stdio` as a command (StdioClientTransport), as a desktop client
// does, its bearer token in $FCD_FRONT_TOKEN and the front's host
// credential in $FCD_HOST: it is listed the snapshot; a read runs once; a
// write waits, with progress, for an approval given while the call is
// open, and runs once; a denied call is a tool error and runs nowhere. A
// token the front does not know ends the command before any session: the
// client cannot connect, and nothing is formed.
func TestFrontStdio(t *testing.T) {
	s := startStack(t, nil)
	bin := buildAuthzd(t)
	tokens := filepath.Join(t.TempDir(), "tokens.json")
	if err := os.WriteFile(tokens, []byte(`{"alice-stdio": {"id": "alice", "attributes": {"groups": ["dev"]}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	args, _ := json.Marshal([]string{"front", "--stdio", "--url", s.URL, "--server", "github", "--tokens", tokens,
		"--pool", poolV14 + "=" + s.Fixture[poolV14] + "/mcp", "--pool", poolV13 + "=" + s.Fixture[poolV13] + "/mcp"})
	launch := func(token string) (*nodeUser, error) {
		env, _ := json.Marshal(map[string]string{"FCD_FRONT_TOKEN": token, "FCD_HOST": string(s.creds[api.RoleHost])})
		return startNodeUser(t, "front-sdk.mjs", "--stdio", bin, string(args), string(env))
	}
	if _, err := launch("nope"); err == nil || !strings.Contains(err.Error(), "FCD_FRONT_TOKEN") {
		t.Fatalf("a token the front does not know: %v, want the front to end naming $FCD_FRONT_TOKEN", err)
	}
	if n := s.formationCount(); n != 0 {
		t.Fatalf("%d formations after the refused launch", n)
	}

	u, err := launch("alice-stdio")
	if err != nil {
		t.Fatal(err)
	}
	defer u.close(t)
	kind := frontClientKind{name: "ts-sdk-stdio", schemas: schemaExact, progress: true, structured: true}
	checkListing(t, s, kind, u.list(t))

	repo := map[string]any{"owner": "octo-org", "repo": "hello-world"}
	if out := u.call(t, "get_repository", repo, false); out.Error != "" || out.IsError || !strings.Contains(out.Text, "hello-world") {
		t.Fatalf("the read: %+v", out)
	}
	if n := len(s.Rec.Effects(fixtures.Filter{Tool: "get_repository"})); n != 1 {
		t.Fatalf("the read ran %d times", n)
	}

	approved := make(chan string, 1)
	go func() { approved <- s.approvePending("create_repository") }()
	out := u.call(t, "create_repository", map[string]any{"name": "stdio-write"}, true)
	id := <-approved
	if out.Error != "" || out.IsError || out.Progress == 0 {
		t.Fatalf("the approved write: %+v, want a result and progress", out)
	}
	if es := effectsOf(s.Rec, "stdio-write"); len(es) != 1 || es[0].Release != "v1.4" {
		t.Fatalf("the write's effects: %+v, want one on v1.4", es)
	}
	s.waitStatus(id, "completed")

	out = u.call(t, "delete_repository", repo, false)
	refusedWith(t, kind, out, "formation-denied")
	if n := len(s.Rec.Effects(fixtures.Filter{Tool: "delete_repository"})); n != 0 {
		t.Fatalf("the denied delete ran %d times", n)
	}
}

// initializeStatus is the front's status for an initialize with token.
func initializeStatus(t *testing.T, url, token string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// refusedWith requires a refusal of problem that the model reads as a tool
// error: the library's error flag, the problem named in the text, and in
// structuredContent where the library exposes it.
func refusedWith(t *testing.T, kind frontClientKind, out callOutcome, problem string) {
	t.Helper()
	if out.Error != "" || !out.IsError || !strings.Contains(out.Text, problem) {
		t.Fatalf("want a tool error naming %s, got %+v", problem, out)
	}
	if kind.structured && out.Problem != problem {
		t.Fatalf("structuredContent's problem is %q, want %s", out.Problem, problem)
	}
}

// checkListing requires the tools a library lists to be the snapshot's:
// the same names, descriptions opening with the summary, the same input
// schemas (or, where the library rewrites them, the same properties), and
// the read-only annotation of the tool's side effects.
func checkListing(t *testing.T, s *stack, kind frontClientKind, listed []listedTool) {
	t.Helper()
	full := s.fullSnapshot(s.snapshot())
	var names, want []string
	for _, lt := range listed {
		names = append(names, lt.Name)
	}
	for _, ft := range full.Tools {
		want = append(want, strings.TrimPrefix(ft.Name, "github/"))
	}
	slices.Sort(names)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("listed %v, the snapshot has %v", names, want)
	}
	for _, lt := range listed {
		i := slices.IndexFunc(full.Tools, func(ft client.FullTool) bool { return ft.Name == "github/"+lt.Name })
		d := full.Tools[i].Descriptor
		if d.Summary != nil && !strings.HasPrefix(lt.Description, *d.Summary) {
			t.Fatalf("%s: the description does not open with the summary %q: %q", lt.Name, *d.Summary, lt.Description)
		}
		wantSchema, _ := json.Marshal(d.InputSchema)
		switch kind.schemas {
		case schemaExact:
			if !schemaEqual(lt.InputSchema, wantSchema) {
				t.Fatalf("%s: listed schema %s, snapshot %s", lt.Name, lt.InputSchema, wantSchema)
			}
		case schemaProperties:
			if got, want := schemaProps(t, lt.InputSchema), schemaProps(t, wantSchema); !slices.Equal(got, want) {
				t.Fatalf("%s: listed properties %v (%s), snapshot %v", lt.Name, got, lt.InputSchema, want)
			}
		}
		readOnly := d.SideEffects == client.SideEffectRead || d.SideEffects == client.SideEffectNone
		if lt.ReadOnly == nil || *lt.ReadOnly != readOnly {
			t.Fatalf("%s (%s): readOnlyHint %v, want %v", lt.Name, d.SideEffects, lt.ReadOnly, readOnly)
		}
	}
}

// schemaEqual says whether two JSON schemas are the same document, an
// empty "required" being none (mcp-go's Tool writes one when there is
// none).
func schemaEqual(a, b []byte) bool {
	canon := func(raw []byte) (string, bool) {
		var doc map[string]any
		if json.Unmarshal(raw, &doc) != nil {
			return "", false
		}
		if r, ok := doc["required"].([]any); ok && len(r) == 0 {
			delete(doc, "required")
		}
		out, _ := json.Marshal(doc)
		return string(out), true
	}
	x, okx := canon(a)
	y, oky := canon(b)
	return okx && oky && x == y
}

// schemaProps is a JSON schema's property names, sorted.
func schemaProps(t *testing.T, schema []byte) []string {
	t.Helper()
	var doc struct{ Properties map[string]json.RawMessage }
	if err := json.Unmarshal(schema, &doc); err != nil {
		t.Fatalf("schema %s: %v", schema, err)
	}
	var out []string
	for k := range doc.Properties {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// waitListChanged waits until the front announced a relisting to fc.
func waitListChanged(t *testing.T, fc *frontClient) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		fc.mu.Lock()
		changed := fc.changed
		fc.mu.Unlock()
		if changed > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no notifications/tools/list_changed after the retirement")
		}
	}
}

// nodeUser is a Node script of testdata/mcpjs (front-driver.mjs's line
// protocol) running one client library's session.
type nodeUser struct {
	name   string
	cmd    *exec.Cmd
	in     io.WriteCloser
	lines  chan string
	stderr *cmdtest.SyncBuffer
	exited chan struct{}
}

// nodeFrontUser connects with the library that script runs.
func nodeFrontUser(script string) func(t *testing.T, url, token string) (frontUser, error) {
	return func(t *testing.T, url, token string) (frontUser, error) {
		t.Helper()
		return startNodeUser(t, script, url, token)
	}
}

// startNodeUser runs script with args and waits until its library
// connected, or reports why it did not.
func startNodeUser(t *testing.T, script string, args ...string) (*nodeUser, error) {
	t.Helper()
	nodeHost(t, "", nil, "", "") // installs the packages
	u := &nodeUser{name: script, lines: make(chan string, 16), stderr: &cmdtest.SyncBuffer{}, exited: make(chan struct{})}
	u.cmd = exec.Command("node", append([]string{script}, args...)...)
	u.cmd.Dir = mcpjsDir
	u.cmd.Stderr = u.stderr
	var err error
	if u.in, err = u.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := u.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := u.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 16<<20)
		for sc.Scan() {
			u.lines <- sc.Text()
		}
		close(u.lines)
	}()
	go func() {
		_ = u.cmd.Wait()
		close(u.exited)
	}()
	t.Cleanup(func() {
		u.kill()
		if t.Failed() {
			t.Logf("%s stderr:\n%s", script, u.stderr.String())
		}
	})
	var hello struct {
		Connected bool
		Error     string
	}
	u.read(t, &hello)
	if !hello.Connected {
		select {
		case <-u.exited:
		case <-time.After(10 * time.Second):
			u.kill()
		}
		return nil, fmt.Errorf("%s: %s\n%s", script, hello.Error, u.stderr.String())
	}
	return u, nil
}

// read decodes the script's next line; a library's request times out by
// itself well within the wait.
func (u *nodeUser) read(t *testing.T, v any) {
	t.Helper()
	select {
	case line, ok := <-u.lines:
		if !ok {
			t.Fatalf("%s exited:\n%s", u.name, u.stderr.String())
		}
		if err := json.Unmarshal([]byte(line), v); err != nil {
			t.Fatalf("%s printed %q: %v\n%s", u.name, line, err, u.stderr.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("%s answered nothing in 2 minutes:\n%s", u.name, u.stderr.String())
	}
}

func (u *nodeUser) send(t *testing.T, req map[string]any) {
	t.Helper()
	raw, _ := json.Marshal(req)
	if _, err := u.in.Write(append(raw, '\n')); err != nil {
		t.Fatalf("%s: %v\n%s", u.name, err, u.stderr.String())
	}
}

func (u *nodeUser) list(t *testing.T) []listedTool {
	t.Helper()
	u.send(t, map[string]any{"op": "list"})
	var out struct {
		Tools []listedTool
		Error string
	}
	u.read(t, &out)
	if out.Error != "" {
		t.Fatalf("%s: list: %s", u.name, out.Error)
	}
	return out.Tools
}

func (u *nodeUser) call(t *testing.T, name string, args map[string]any, progress bool) callOutcome {
	t.Helper()
	u.send(t, map[string]any{"op": "call", "name": name, "args": args, "progress": progress})
	var out callOutcome
	u.read(t, &out)
	t.Logf("%s %s: %+v", u.name, name, out)
	return out
}

func (u *nodeUser) close(t *testing.T) {
	t.Helper()
	select {
	case <-u.exited:
		return
	default:
	}
	u.send(t, map[string]any{"op": "close"})
	var out struct{ Closed bool }
	u.read(t, &out)
	select {
	case <-u.exited:
	case <-time.After(30 * time.Second):
		t.Errorf("%s did not exit after closing", u.name)
	}
}

func (u *nodeUser) kill() {
	select {
	case <-u.exited:
	default:
		_ = u.cmd.Process.Kill()
		<-u.exited
	}
}

// inspectorUser is the MCP Inspector's CLI: every operation is a run of
// its own, and so a client session of its own.
type inspectorUser struct{ url, token string }

func connectInspector(t *testing.T, url, token string) (frontUser, error) {
	t.Helper()
	u := &inspectorUser{url, token}
	if _, err := u.run(t, "--method", "tools/list"); err != nil {
		return nil, err
	}
	return u, nil
}

// run runs the inspector's CLI once with the bearer header.
func (u *inspectorUser) run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	nodeHost(t, "", nil, "", "") // installs the packages
	argv := append([]string{"--cli", u.url, "--transport", "http", "--header", "Authorization: Bearer " + u.token}, args...)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join("node_modules", ".bin", "mcp-inspector"), argv...)
	cmd.Dir = mcpjsDir
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("the inspector did not finish:\n%s%s", stdout.String(), stderr.String())
	}
	if err != nil {
		t.Logf("the inspector exited %v: %s", err, stderr.String())
	}
	return stdout.String(), err
}

func (u *inspectorUser) list(t *testing.T) []listedTool {
	t.Helper()
	out, err := u.run(t, "--method", "tools/list")
	if err != nil {
		t.Fatalf("the inspector's tools/list: %v\n%s", err, out)
	}
	var res mcp.ListToolsResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("the inspector's tools/list printed %q: %v", out, err)
	}
	var tools []listedTool
	for _, lt := range res.Tools {
		schema, _ := json.Marshal(lt.InputSchema)
		tool := listedTool{Name: lt.Name, Description: lt.Description, InputSchema: schema}
		if lt.Annotations != nil {
			tool.ReadOnly = &lt.Annotations.ReadOnlyHint
		}
		tools = append(tools, tool)
	}
	return tools
}

func (u *inspectorUser) call(t *testing.T, name string, args map[string]any, _ bool) callOutcome {
	t.Helper()
	raw, _ := json.Marshal(args)
	out, err := u.run(t, "--method", "tools/call", "--tool-name", name, "--tool-args-json", string(raw))
	// The CLI prints the result, and exits 5 (its tool_error) when it has
	// isError set.
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 5) {
		return callOutcome{Error: fmt.Sprintf("%v: %s", err, out)}
	}
	var res mcp.CallToolResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("the inspector's tools/call printed %q: %v", out, err)
	}
	o := callOutcome{IsError: res.IsError, Text: textOf(&res), Problem: structuredProblem(res.StructuredContent)}
	t.Logf("inspector %s: %+v", name, o)
	return o
}

func (u *inspectorUser) close(*testing.T) {}

// structuredProblem is structuredContent's fcd.problem.
func structuredProblem(v any) string {
	raw, _ := json.Marshal(v)
	var doc struct {
		Fcd struct{ Problem string }
	}
	_ = json.Unmarshal(raw, &doc)
	return doc.Fcd.Problem
}

// mcpGoUser is mark3labs/mcp-go's client over streamable HTTP, the bearer
// token in its static headers.
type mcpGoUser struct {
	c        *mcpgo.Client
	mu       sync.Mutex
	progress int
	seq      int
}

func connectMCPGo(t *testing.T, url, token string) (frontUser, error) {
	t.Helper()
	c, err := mcpgo.NewStreamableHttpClient(url, mcpgotransport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + token}))
	if err != nil {
		t.Fatal(err)
	}
	u := &mcpGoUser{c: c}
	c.OnNotification(func(n mcpgotypes.JSONRPCNotification) {
		if n.Method == string(mcpgotypes.MethodNotificationProgress) {
			u.mu.Lock()
			u.progress++
			u.mu.Unlock()
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	init := mcpgotypes.InitializeRequest{}
	init.Params.ClientInfo = mcpgotypes.Implementation{Name: "fcd-e2e-mcp-go", Version: "0"}
	if _, err := c.Initialize(ctx, init); err != nil {
		_ = c.Close()
		return nil, err
	}
	t.Cleanup(func() { _ = c.Close() })
	return u, nil
}

func (u *mcpGoUser) list(t *testing.T) []listedTool {
	t.Helper()
	res, err := u.c.ListTools(t.Context(), mcpgotypes.ListToolsRequest{})
	if err != nil {
		t.Fatalf("mcp-go's ListTools: %v", err)
	}
	var tools []listedTool
	for _, lt := range res.Tools {
		schema := lt.RawInputSchema
		if len(schema) == 0 {
			schema, _ = json.Marshal(lt.InputSchema)
		}
		tool := listedTool{Name: lt.Name, Description: lt.Description, InputSchema: schema}
		if lt.Annotations.ReadOnlyHint != nil {
			tool.ReadOnly = lt.Annotations.ReadOnlyHint
		}
		tools = append(tools, tool)
	}
	return tools
}

func (u *mcpGoUser) call(t *testing.T, name string, args map[string]any, progress bool) callOutcome {
	t.Helper()
	req := mcpgotypes.CallToolRequest{}
	req.Params.Name, req.Params.Arguments = name, args
	if progress {
		u.mu.Lock()
		u.seq++
		req.Params.Meta = &mcpgotypes.Meta{ProgressToken: fmt.Sprintf("mcp-go-%d", u.seq)}
		u.mu.Unlock()
	}
	u.mu.Lock()
	before := u.progress
	u.mu.Unlock()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	res, err := u.c.CallTool(ctx, req)
	if err != nil {
		return callOutcome{Error: err.Error()}
	}
	var text strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(mcpgotypes.TextContent); ok {
			text.WriteString(tc.Text)
		}
	}
	u.mu.Lock()
	seen := u.progress - before
	u.mu.Unlock()
	o := callOutcome{IsError: res.IsError, Text: text.String(), Problem: structuredProblem(res.StructuredContent), Progress: seen}
	t.Logf("mcp-go %s: %+v", name, o)
	return o
}

func (u *mcpGoUser) close(*testing.T) { _ = u.c.Close() }
