package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
	"github.com/lestrrat-go/jwx/v2/jws"
)

// issuer stands in for authzd's token signing: an Ed25519 key and the
// JWKS of its public half.
type issuer struct {
	priv ed25519.PrivateKey
	jwks []byte
}

func newIssuer(t *testing.T) *issuer {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k, err := jwk.FromRaw(pub)
	if err != nil {
		t.Fatal(err)
	}
	_ = k.Set(jwk.KeyIDKey, "authzd-1")
	set := jwk.NewSet()
	_ = set.AddKey(k)
	doc, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	return &issuer{priv: priv, jwks: doc}
}

var jti atomic.Int64

// token signs a dispatch token for a call of tool with args, as authzd
// would for the backend the tests guard.
func (is *issuer) token(t *testing.T, tool, args string) (string, string) {
	t.Helper()
	digest, err := fencecheck.ArgumentDigest(tool, json.RawMessage(args))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().Unix()
	id := "lease-" + strconv.FormatInt(jti.Add(1), 10)
	payload, _ := json.Marshal(fencecheck.Claims{
		Issuer: "https://authzd.test", Audience: "github-prod", Subject: "s-1", ID: id,
		IssuedAt: now, NotBefore: now, Expiry: now + 30,
		Formation: "f-1", Tool: tool, ArgumentDigest: digest, Epoch: "sha256:e1",
		Artifact: "sha256:a1", Config: "sha256:c1", Generation: 4, Revision: 9, Cluster: "c1",
	})
	hdr := jws.NewHeaders()
	_ = hdr.Set(jws.TypeKey, fencecheck.TokenType)
	_ = hdr.Set(jws.KeyIDKey, "authzd-1")
	out, err := jws.Sign(payload, jws.WithKey(jwa.EdDSA, is.priv, jws.WithProtectedHeaders(hdr)))
	if err != nil {
		t.Fatal(err)
	}
	return string(out), id
}

// syncBuffer is an io.Writer safe to read while run writes to it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var listening = regexp.MustCompile(`fencecheck: listening on (http://\S+)`)

// TestProxy runs `fencecheck proxy` in-process in front of a real MCP
// backend, with real JWKS and authzd endpoints, and checks that calls are
// accepted and refused through it and that outcomes reach authzd.
func TestProxy(t *testing.T) {
	is := newIssuer(t)
	jwksSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(is.jwks)
	}))
	defer jwksSrv.Close()

	// An httptest server standing in for authzd's
	// POST /v1/leases/{lease}/complete (the real endpoint is written in
	// api/ concurrently).
	var mu sync.Mutex
	var completed []string
	authzd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Outcome string `json:"outcome"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		if r.Header.Get("Authorization") != "Bearer backend-secret" {
			http.Error(w, "bad credential", http.StatusUnauthorized)
			return
		}
		mu.Lock()
		completed = append(completed, r.Method+" "+r.URL.Path+" "+body.Outcome)
		mu.Unlock()
	}))
	defer authzd.Close()

	// The MCP backend: counts the tools/call requests it runs.
	var calls atomic.Int64
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if bytes.Contains(body, []byte(`"tools/call"`)) {
			calls.Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"ok":true}}`)
	}))
	defer backend.Close()

	cred := filepath.Join(t.TempDir(), "credential")
	if err := os.WriteFile(cred, []byte("backend-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stderr := &syncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"proxy", "--listen", "127.0.0.1:0", "--upstream", backend.URL,
			"--pool", "github-prod", "--artifact", "sha256:a1", "--config", "sha256:c1", "--generation", "4",
			"--jwks", jwksSrv.URL + "/.well-known/jwks.json", "--issuer", "https://authzd.test",
			"--server", "github", "--authzd", authzd.URL, "--credential-file", cred, "--log-level", "error",
		}, nil, io.Discard, stderr)
	}()
	var url string
	for deadline := time.Now().Add(10 * time.Second); url == "" && time.Now().Before(deadline); {
		select {
		case code := <-done:
			t.Fatalf("proxy exited %d: %s", code, stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
		if m := listening.FindStringSubmatch(stderr.String()); m != nil {
			url = m[1]
		}
	}
	if url == "" {
		t.Fatalf("no listening line: %s", stderr.String())
	}

	post := func(body, token string) (int, string) {
		req, _ := http.NewRequest("POST", url+"/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set(fencecheck.Header, token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}
	call := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_repository","arguments":{"name":"demo","private":true}}}`
	tok, lease := is.token(t, "github/create_repository", `{"private":true,"name":"demo"}`)

	if code, body := post(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, ""); code != 200 || !strings.Contains(body, `"ok":true`) {
		t.Fatalf("tools/list: %d %s", code, body)
	}
	if code, body := post(call, ""); code != 403 || !strings.Contains(body, `"reason":"missing"`) {
		t.Fatalf("no token: %d %s", code, body)
	}
	other, _ := is.token(t, "github/create_repository", `{"private":false,"name":"demo"}`)
	if code, body := post(call, other); code != 403 || !strings.Contains(body, `"reason":"arguments"`) {
		t.Fatalf("token for other arguments: %d %s", code, body)
	}
	if calls.Load() != 0 {
		t.Fatal("a refused call reached the backend")
	}
	if code, body := post(call, tok); code != 200 || !strings.Contains(body, `"ok":true`) {
		t.Fatalf("valid token: %d %s", code, body)
	}
	if code, body := post(call, tok); code != 403 || !strings.Contains(body, `"reason":"replay"`) {
		t.Fatalf("replay: %d %s", code, body)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("backend ran %d calls, want 1", n)
	}

	// Graceful shutdown drains the outcome reports.
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("proxy exited %d: %s", code, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("proxy did not stop")
	}
	mu.Lock()
	defer mu.Unlock()
	want := "POST /v1/leases/" + lease + "/complete effect"
	if len(completed) != 1 || completed[0] != want {
		t.Fatalf("authzd received %q, want [%q]", completed, want)
	}
}

func TestVerifyCommand(t *testing.T) {
	is := newIssuer(t)
	dir := t.TempDir()
	keys := filepath.Join(dir, "jwks.json")
	if err := os.WriteFile(keys, is.jwks, 0o600); err != nil {
		t.Fatal(err)
	}
	tok, lease := is.token(t, "github/create_repository", `{"name":"demo"}`)
	tokFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokFile, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	argsFile := filepath.Join(dir, "args.json")
	if err := os.WriteFile(argsFile, []byte(`{ "name": "demo" }`), 0o600); err != nil {
		t.Fatal(err)
	}
	backend := []string{"--pool", "github-prod", "--artifact", "sha256:a1", "--config", "sha256:c1", "--generation", "4", "--keys", keys}

	cases := []struct {
		note   string
		args   []string
		stdin  string
		code   int
		stdout string // prefix
	}{
		{"accepted", []string{"--token", tok, "--tool", "github/create_repository", "--arguments", `{"name":"demo"}`}, "", 0, "accept jti=" + lease},
		{"arguments from a file, token from a file", []string{"--token-file", tokFile, "--tool", "github/create_repository", "--arguments", "@" + argsFile}, "", 0, "accept"},
		{"token from stdin", []string{"--token-file", "-", "--tool", "github/create_repository", "--arguments", `{"name":"demo"}`}, tok, 0, "accept"},
		{"other arguments", []string{"--token", tok, "--tool", "github/create_repository", "--arguments", `{"name":"prod"}`}, "", 1, "reject arguments:"},
		{"other tool", []string{"--token", tok, "--tool", "github/delete_repository", "--arguments", `{"name":"demo"}`}, "", 1, "reject tool:"},
		{"not a token", []string{"--token", "abc", "--tool", "github/create_repository"}, "", 1, "reject malformed:"},
		{"other generation", append([]string{"--token", tok, "--tool", "github/create_repository", "--arguments", `{"name":"demo"}`},
			"--generation", "5"), "", 1, "reject generation:"},
		{"no tool", []string{"--token", tok}, "", 2, ""},
		{"no key source", []string{"--token", tok, "--tool", "t/t", "--keys", ""}, "", 2, ""},
	}
	for _, tc := range cases {
		t.Run(tc.note, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := append(append([]string{"verify"}, backend...), tc.args...)
			code := run(context.Background(), args, strings.NewReader(tc.stdin), &stdout, &stderr)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stdout %q stderr %q", code, tc.code, stdout.String(), stderr.String())
			}
			if !strings.HasPrefix(stdout.String(), tc.stdout) {
				t.Fatalf("stdout %q, want prefix %q", stdout.String(), tc.stdout)
			}
			if tc.stdout != "" {
				if sc := bufio.NewScanner(&stdout); sc.Scan() && sc.Scan() {
					t.Fatalf("more than one line: %q", stdout.String())
				}
			}
		})
	}
}
