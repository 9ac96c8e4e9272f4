package e2e_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/internal/fixtures"
)

// runHostJS runs testdata/mcpjs/host.mjs (the TypeScript host recipe,
// fcd-host.mjs, in two SDK sessions) and decodes what it printed. It may
// run on any goroutine: it returns an error instead of failing the test.
func runHostJS(gatewayMCP, authzdURL, credential, snapshot, authorization string) (map[string]any, error) {
	cmd := exec.Command("node", "host.mjs", gatewayMCP, authzdURL, credential, snapshot, authorization)
	cmd.Dir = mcpjsDir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return nil, fmt.Errorf("node host.mjs: %v\n%s", err, stderr.String())
		}
	case <-time.After(3 * time.Minute):
		cmd.Process.Kill()
		<-done
		return nil, fmt.Errorf("node host.mjs did not finish\n%s", stderr.String())
	}
	var out map[string]any
	if err := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &out); err != nil {
		return nil, fmt.Errorf("host.mjs printed %q: %v\n%s", stdout.String(), err, stderr.String())
	}
	return out, nil
}

// TestTypeScriptHostRecipe runs docs/hosts.md's recipe for TypeScript
// hosts — fcd-host.mjs as the official TypeScript SDK client's fetch —
// through real nginx and Caddy to the github fixture behind fencecheck,
// with real authzd: a read is formed, sent with its formation and runs
// once; a write needing approval rejects with the pending formation and is
// never sent; a delete the policies deny rejects with their reasons; a
// tool the snapshot does not list is not formed; and in a session that
// waits, a write runs once after an approver approves it over REST; a
// call formed for bob and sent by alice is refused by the gateway
// (caller-mismatch). Only the tools/call requests carry a formation.
func TestTypeScriptHostRecipe(t *testing.T) {
	eachGateway(t, func(t *testing.T, kind string, s *stack) {
		nodeHost(t, "", nil, "", "") // installs the packages
		snap := s.snapshot()
		gw := s.gateway(t, kind, nil)
		auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("alice:"+gatewayUsers["alice"]))
		type result struct {
			out map[string]any
			err error
		}
		done := make(chan result, 1)
		go func() {
			out, err := runHostJS(gw.URL+"/mcp", s.URL, string(s.creds[api.RoleHost]), snap, auth)
			done <- result{out, err}
		}()
		// The approver approves the waiting write once it is listed.
		approved := ""
		var res result
		for res.out == nil && res.err == nil {
			select {
			case res = <-done:
				continue
			case <-time.After(50 * time.Millisecond):
			}
			if approved != "" {
				continue
			}
			pending := client.FormationStatusPendingApproval
			r, err := s.as(api.RoleApprover).ListFormationsWithResponse(t.Context(), &client.ListFormationsParams{Status: &pending})
			s.must("list the formations pending approval", err)
			if r.JSON200 == nil {
				t.Fatalf("list the formations pending approval: %d %s, want 200", r.StatusCode(), r.Body)
			}
			for _, f := range r.JSON200.Formations {
				if f.Arguments["name"] == "ts-waited" {
					approved = f.Id
					s.approve(formation{ID: approved, Digest: f.Digest})
				}
			}
		}
		if res.err != nil {
			t.Fatal(res.err)
		}
		out := res.out
		if out["done"] != true {
			t.Fatalf("the TypeScript host through %s: %v", kind, out)
		}
		field := func(name, key string) string {
			m, _ := out[name].(map[string]any)
			v, _ := m[key].(string)
			return v
		}
		if !strings.Contains(field("read", "text"), "hello-world") {
			t.Fatalf("the read: %v", out["read"])
		}
		if n := len(s.Rec.Effects(fixtures.Filter{Tool: "get_repository"})); n != 1 {
			t.Fatalf("get_repository ran %d times, want once", n)
		}
		pending := field("pending", "formation")
		if field("pending", "kind") != "pending" || pending == "" || s.status(pending) != "pending_approval" || len(effectsOf(s.Rec, "ts-pending")) != 0 {
			t.Fatalf("the write not waited for: %v", out["pending"])
		}
		denied, _ := out["denied"].(map[string]any)
		if denied["kind"] != "denied" || !strings.Contains(fmt.Sprint(denied["reasons"]), "deletes are allowed only for members of") ||
			len(s.Rec.Effects(fixtures.Filter{Tool: "delete_repository"})) != 0 {
			t.Fatalf("the denied delete: %v", denied)
		}
		if field("unknown", "kind") != "unknown-tool" || !strings.Contains(field("unknown", "message"), "github/transfer_repository") {
			t.Fatalf("the unknown tool: %v", out["unknown"])
		}
		if w, _ := out["waited"].(map[string]any); w["isError"] != false || approved == "" || out["announced"] != approved {
			t.Fatalf("the waited write: %v (approved %q, announced %v)", w, approved, out["announced"])
		}
		if es := effectsOf(s.Rec, "ts-waited"); len(es) != 1 || es[0].Did["visibility"] != "private" {
			t.Fatalf("the waited write's effects: %+v", es)
		}
		s.waitStatus(approved, "completed")
		if r, _ := out["refused"].(map[string]any); r["kind"] != "refused" || r["problem"] != "caller-mismatch" || r["fence"] != false {
			t.Fatalf("a call formed for bob, sent by alice: %v", r)
		}
		// Only the calls sent went out with a formation, each on its
		// tools/call; initialize, notifications, tools/list and DELETE
		// carried none.
		var sent []string
		reqs, _ := out["requests"].([]any)
		for _, x := range reqs {
			r := x.(map[string]any)
			isCall := r["method"] == "POST" && r["rpc"] == "tools/call"
			if isCall != (r["formation"] != "") || isCall != (r["mcpMethod"] == "tools/call") {
				t.Errorf("request %v", r)
			}
			if isCall {
				sent = append(sent, r["formation"].(string))
			}
		}
		if len(sent) != 3 || sent[1] != approved || len(reqs) < 12 {
			t.Fatalf("formations sent %v in %d requests; want the read's, %s and bob's", sent, len(reqs), approved)
		}
	})
}

// TestHostsDocShowsTheRecipe: docs/hosts.md shows fcd-host.mjs as the
// tests run it.
func TestHostsDocShowsTheRecipe(t *testing.T) {
	doc, err := os.ReadFile("../../docs/hosts.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join(mcpjsDir, "fcd-host.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok1 := strings.Cut(string(doc), "<!-- fcd-host.mjs:begin -->\n```js\n")
	block, _, ok2 := strings.Cut(rest, "```\n<!-- fcd-host.mjs:end -->")
	if !ok1 || !ok2 {
		t.Fatal("docs/hosts.md has no fcd-host.mjs block between its markers")
	}
	if block != string(src) {
		t.Fatal("docs/hosts.md's fcd-host.mjs differs from internal/e2e/testdata/mcpjs/fcd-host.mjs: copy the file into the block")
	}
}
