package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/testutil"
	"github.com/fcd-authz/fcd/policies"
)

// copyPolicies copies the embedded default policy set into dir.
func copyPolicies(t *testing.T, dir string) {
	t.Helper()
	err := fs.WalkDir(policies.FS, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(policies.FS, p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, p), data, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestPolicyCommands(t *testing.T) {
	cli := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(context.Background(), args, nil, &out, &errb)
		return code, out.String(), errb.String()
	}
	if code, out, errs := cli("policy", "test"); code != 0 || !strings.HasPrefix(out, "PASS") {
		t.Fatalf("policy test (embedded): %d %s %s", code, out, errs)
	}
	dir := t.TempDir()
	copyPolicies(t, dir)
	if code, out, _ := cli("policy", "test", dir); code != 0 || !strings.HasPrefix(out, "PASS") {
		t.Fatalf("policy test dir: %d %s", code, out)
	}
	// A rule change that its tests catch fails the command.
	rego := filepath.Join(dir, "fcd.rego")
	data, _ := os.ReadFile(rego)
	broken := strings.Replace(string(data), `"count": 2`, `"count": 1`, 1)
	if broken == string(data) {
		t.Fatal("fcd.rego changed shape; update this test")
	}
	os.WriteFile(rego, []byte(broken), 0o600)
	if code, out, _ := cli("policy", "test", dir); code != 1 || !strings.Contains(out, "FAIL") {
		t.Fatalf("policy test with a failing rule: %d %s", code, out)
	}

	code, out, errs := cli("policy", "eval", "--input", "../../examples/policy-input.json")
	var d struct {
		Verdict   string
		Approvals int
		Engines   []struct {
			Engine string
			Rules  []string
		}
	}
	if err := json.Unmarshal([]byte(out), &d); code != 0 || err != nil || d.Verdict != "allow" || d.Approvals != 1 || len(d.Engines) != 2 {
		t.Fatalf("policy eval: %d %s %s", code, out, errs)
	}
	// The same input made a delete by a non-admin: denied, exit 1.
	in, _ := os.ReadFile("../../examples/policy-input.json")
	del := bytes.ReplaceAll(in, []byte(`"sideEffects": "write"`), []byte(`"sideEffects": "delete"`))
	f := filepath.Join(t.TempDir(), "delete.json")
	os.WriteFile(f, del, 0o600)
	if code, out, _ := cli("policy", "eval", "--input", f); code != 1 || !strings.Contains(out, "deny-delete-non-admin") {
		t.Fatalf("policy eval of a denied delete: %d %s", code, out)
	}
	if code, _, _ := cli("policy", "eval"); code != 2 {
		t.Fatalf("policy eval without --input: exit %d, want 2", code)
	}
}

// startPolicyServer runs a --dev server on a copy of the default
// policies in a directory of its own, polled every poll; it returns the
// server's URL, the directory and the function that stops the server.
func startPolicyServer(t *testing.T, poll string) (url, pol string, stop func()) {
	t.Helper()
	dir := t.TempDir()
	pol = filepath.Join(dir, "policies")
	os.Mkdir(pol, 0o700)
	copyPolicies(t, pol)
	url, stop = startServer(t, filepath.Join(dir, "data"), "--dev", "--policy-dir", pol, "--policy-poll", poll)
	return url, pol, stop
}

// readyPolicies is the policies check of the server's /readyz, which
// must answer ready.
func readyPolicies(t *testing.T, url string) map[string]any {
	t.Helper()
	raw := readyz(t, url, http.StatusOK)
	var out struct {
		Status string
		Checks struct{ Policies map[string]any }
	}
	if err := json.Unmarshal(raw, &out); err != nil || out.Status != "ready" {
		t.Fatalf("readyz: %s", raw)
	}
	return out.Checks.Policies
}

// appendComment appends a comment to the policy directory's fcd.rego: a
// valid change, with a new digest.
func appendComment(pol, comment string) {
	f, _ := os.OpenFile(filepath.Join(pol, "fcd.rego"), os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("\n# " + comment + "\n")
	f.Close()
}

// TestPolicyDirectoryReload: a server on a policy directory picks up a
// valid change by itself; a broken change leaves the working set in force
// and shows in /readyz.
func TestPolicyDirectoryReload(t *testing.T) {
	url, pol, stop := startPolicyServer(t, "100ms")
	defer stop()

	waitFor := func(what string, ok func(p map[string]any) bool) map[string]any {
		t.Helper()
		var p map[string]any
		testutil.EventuallyState(t, time.Minute, what, func() bool { p = readyPolicies(t, url); return ok(p) }, func() string { return fmt.Sprintf("policies: %v", p) })
		return p
	}
	first := readyPolicies(t, url)
	if first["source"] != pol || first["lastError"] != nil {
		t.Fatalf("initial policies: %v", first)
	}

	// A valid change (a comment) is loaded: new digest.
	appendComment(pol, "reviewed")
	second := waitFor("the new digest", func(p map[string]any) bool { return p["digest"] != first["digest"] })

	// A broken change is refused: same digest, error shown, still ready.
	os.WriteFile(filepath.Join(pol, "fcd.cedar"), []byte("permit (principal, action, resource) when {"), 0o600)
	broken := waitFor("the reload error", func(p map[string]any) bool { return p["lastError"] != nil })
	if broken["digest"] != second["digest"] {
		t.Fatalf("a broken policy replaced the working set: %v", broken)
	}
}

// TestSIGHUPReloadsPolicies: with polling effectively off, a change is
// picked up on SIGHUP. The signal goes to this test process, where the
// in-process server has registered for it.
func TestSIGHUPReloadsPolicies(t *testing.T) {
	url, pol, stop := startPolicyServer(t, "1h")
	defer stop()
	digest := func() any { return readyPolicies(t, url)["digest"] }
	before := digest()
	appendComment(pol, "reviewed again")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "SIGHUP to reload the policies", func() bool { return digest() != before })
}
