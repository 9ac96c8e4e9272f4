package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/audit"
	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/internal/cmdtest"
	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/internal/testutil"
	"github.com/fcd-authz/fcd/lease"
)

var listeningLine = regexp.MustCompile(`authzd: listening on (https?://\S+)`)

// startServer runs `authzd serve` in-process with the given extra flags
// and a fresh embedded etcd on free ports; it returns the server URL and a
// stop function that asserts a clean, graceful exit.
func startServer(t *testing.T, dataDir string, extra ...string) (string, func()) {
	t.Helper()
	url, _, stop := startServerLog(t, dataDir, extra...)
	return url, stop
}

// startServerLog is startServer that also returns what authzd printed so
// far (e.g. the line naming its gRPC address).
func startServerLog(t *testing.T, dataDir string, extra ...string) (string, string, func()) {
	t.Helper()
	// Free ports can be taken by another process before etcd binds them
	// (several test binaries run at once): start again on fresh ones.
	for attempt := 0; ; attempt++ {
		args := append([]string{"serve", "--listen", "127.0.0.1:0", "--data-dir", dataDir,
			"--embedded-etcd-client-url", "http://" + etcdtest.FreeAddr(t),
			"--embedded-etcd-peer-url", "http://" + etcdtest.FreeAddr(t)}, extra...)
		c, url, err := cmdtest.Start(t, "authzd", listeningLine, func(ctx context.Context, stderr io.Writer) int {
			return run(ctx, args, nil, io.Discard, stderr)
		})
		if err == nil {
			return url, c.Stderr.String(), func() { c.Stop(t) }
		}
		if attempt == 7 || !strings.Contains(c.Stderr.String(), "address already in use") {
			t.Fatal(err)
		}
	}
}

// TestREADMEWalkthrough runs the README's walkthrough block, as written,
// twice in a row against one fresh `serve --dev`: the newcomer's path
// must keep working, and a second run on the same server must tell the
// same story. The server's data directory is not ./fcd-data (and has a
// space in its name), so the block must find it through $FCD_DATA; the
// repository root must hold no new file afterwards but bin/.
func TestREADMEWalkthrough(t *testing.T) {
	for _, tool := range []string{"curl", "jq"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed for the README walkthrough (.ci/run installs it)", tool)
		}
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)<!-- walkthrough:begin -->\\s*```sh\\n(.*?)```\\s*<!-- walkthrough:end -->").FindSubmatch(readme)
	if block == nil {
		t.Fatal("README has no walkthrough block")
	}
	// The walkthrough runs at the repository root; give it a root of its
	// own that links to the real sources, so that what it leaves there
	// can be seen.
	root := t.TempDir()
	entries, err := os.ReadDir("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		switch e.Name() {
		case "fcd-data", "bin", ".git":
			continue
		}
		abs, _ := filepath.Abs(filepath.Join("../..", e.Name()))
		if err := os.Symlink(abs, filepath.Join(root, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	before := dirNames(t, root)
	dataDir := filepath.Join(t.TempDir(), "fcd data")
	scratch := t.TempDir() // the walkthrough's mktemp -d makes its directories here
	_, stop := startServer(t, dataDir, "--dev")
	defer stop()

	// The README's first command runs the server with its defaults; only the
	// ports and the data directory differ here. The walkthrough learns the
	// URL from the env file it finds through FCD_DATA.
	var outputs []string
	for range 2 {
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", string(block[1]))
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "FCD_DATA="+dataDir, "TMPDIR="+scratch)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("walkthrough run %d failed: %v\n%s", len(outputs)+1, err, out.String())
		}
		outputs = append(outputs, out.String())
	}
	var firstSnapshots []string
	for i, got := range outputs {
		checkWalkthroughRun(t, i+1, got)
		firstSnapshots = append(firstSnapshots, regexp.MustCompile(`\{"id":"(sha256:[0-9a-f]+)","tools"`).FindStringSubmatch(got)[1])
	}
	if firstSnapshots[0] == firstSnapshots[1] {
		t.Errorf("both runs froze the same snapshot %s: the second run did not register epochs of its own", firstSnapshots[0])
	}
	for _, name := range dirNames(t, root) {
		if !slices.Contains(before, name) && name != "bin" {
			t.Errorf("the walkthrough left %s in the repository root", name)
		}
	}
	for _, name := range []string{"v1.3.jws", "v1.4.jws", "cert.jws", "certificate.json", "manifest-v1.3.json"} {
		if found, _ := filepath.Glob(filepath.Join(scratch, "*", name)); len(found) != 2 {
			t.Errorf("%s in the scratch directories of the two runs: %v", name, found)
		}
	}

	// The server stopped signs its trail's head: the trail of the whole
	// walkthrough verifies, holds every kind of change it made, and fails
	// once a byte of it is edited.
	stop()
	trail := filepath.Join(dataDir, "audit")
	var report bytes.Buffer
	if code := run(t.Context(), []string{"audit", "verify", trail}, nil, &report, &report); code != 0 || !strings.Contains(report.String(), "ok: ") {
		t.Fatalf("audit verify exited %d:\n%s", code, report.String())
	}
	for _, id := range []string{audit.PropFormed, audit.PropApproval, audit.PropEpochActive, audit.PropSuccessor, audit.PropSession,
		audit.PropOneClaim, audit.PropOneEffect, audit.PropRetire, audit.PropUncertain, audit.PropPolicy} {
		if !strings.Contains(report.String(), id+": ") {
			t.Errorf("the clean report does not name %s:\n%s", id, report.String())
		}
	}
	// What the trail keeps of the first call formed, as etcd no longer
	// will once its retention ends: formed, approved, admitted, claimed, reported.
	fm := regexp.MustCompile(`"id":"(fm_[a-z0-9]+)"`).FindStringSubmatch(outputs[0])
	if fm == nil {
		t.Fatalf("no formation id in the walkthrough's output")
	}
	var history bytes.Buffer
	if code := run(t.Context(), []string{"audit", "formation", fm[1], trail}, nil, &history, &history); code != 0 {
		t.Fatalf("audit formation exited %d:\n%s", code, history.String())
	}
	var kinds []string
	for _, line := range strings.Split(strings.TrimSpace(history.String()), "\n") {
		var ev audit.Event
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("audit formation printed %q: %v", line, err)
		}
		kinds = append(kinds, ev.Kind)
	}
	if want := []string{"formation", "approval", "admission", "claim", "outcome"}; !slices.Equal(kinds, want) {
		t.Errorf("audit formation %s: events %v, want %v:\n%s", fm[1], kinds, want, history.String())
	}
	if code := run(t.Context(), []string{"audit", "formation", "fm_unknown", trail}, nil, &history, &history); code != 1 {
		t.Errorf("audit formation of an unknown id exited %d", code)
	}
	files, _ := filepath.Glob(filepath.Join(trail, "*", "trail-*.jsonl"))
	if len(files) != 1 {
		t.Fatalf("trail files %v", files)
	}
	data, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"manifest", "snapshot", "formation", "approval", "admission", "outcome", "drain", "retire",
		"certificate", "policy"} {
		if !bytes.Contains(data, []byte(`"kind":"`+kind+`"`)) {
			t.Errorf("the trail has no %s event", kind)
		}
	}
	edited := bytes.Replace(data, []byte(`"kind":"approval"`), []byte(`"kind":"approvaL"`), 1)
	if err := os.WriteFile(files[0], edited, 0o600); err != nil {
		t.Fatal(err)
	}
	report.Reset()
	if code := run(t.Context(), []string{"audit", "verify", trail}, nil, &report, &report); code != 1 ||
		!strings.Contains(report.String(), "chain.hash") || !strings.Contains(report.String(), filepath.Base(files[0])) {
		t.Fatalf("audit verify of an edited trail exited %d:\n%s", code, report.String())
	}

	// The certified call of each run, admitted to its successor, was
	// claimed and its effect reported too: its lease never turns uncertain.
	for i, got := range outputs {
		reported := regexp.MustCompile(`\{"outcome":"effect","formation":"(fm_[a-z0-9]+)"\}`).FindAllStringSubmatch(got, -1)
		if len(reported) != 2 {
			t.Fatalf("run %d reported %d outcomes, want 2", i+1, len(reported))
		}
		history.Reset()
		if code := run(t.Context(), []string{"audit", "formation", reported[1][1], trail}, nil, &history, &history); code != 0 ||
			!strings.Contains(history.String(), `"kind":"claim"`) || !strings.Contains(history.String(), `"kind":"outcome"`) {
			t.Errorf("run %d: the certified call's history (exit %d) lacks its claim or outcome:\n%s", i+1, code, history.String())
		}
	}

	info, err := os.Stat(filepath.Join(dataDir, "dev-credentials.json"))
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("dev-credentials.json: %v, mode %v", err, info.Mode())
	}
	var dc devCredentials
	data, _ = os.ReadFile(filepath.Join(dataDir, "dev-credentials.json"))
	if err := json.Unmarshal(data, &dc); err != nil || len(dc.Credentials) != 6 || dc.Keys["registrar"] == "" {
		t.Fatalf("dev-credentials.json content: %v %+v", err, dc)
	}
	for _, k := range dc.Keys {
		if fi, err := os.Stat(k); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("private key %s: %v", k, err)
		}
	}
}

// checkWalkthroughRun checks what one run of the walkthrough showed, in
// order: the same story on every run.
func checkWalkthroughRun(t *testing.T, n int, got string) {
	t.Helper()
	all := got
	for _, want := range []string{
		`"release":"v1.3.0"`, `"release":"v1.4.0"`,
		`{"release":"v1.3.0","state":"ACTIVE","activeLeases":0,"uncertainLeases":0}`,
		`{"release":"v1.4.0","state":"ACTIVE","activeLeases":0,"uncertainLeases":0}`,
		`"github/create_repository"`,
		`"status":"pending_approval","approvalsRequired":1`, `{"engine":"rego","rules":["allow-write"]}`,
		`"status":"ready","approvals":["dev-approver"]`,
		`{"lease":"ls_`, `"target":{"epoch":"sha256:`, `"pool":"github-v1-4"}`, `"crv":"Ed25519"`,
		`"claim":"walkthrough-1"}`, `{"outcome":"effect","formation":"fm_`,
		`"revoked":false}`,
		`{"status":"pending_approval","successor":"v1.3.0"}`, `{"status":"pending_approval","successor":null}`,
		`"state":"DRAINING"`, `"state":"STALE"`,
		`"target":{"epoch":"sha256:`, `"pool":"github-v1-3"}`,
		`"claim":"walkthrough-2"}`, `{"outcome":"effect","formation":"fm_`,
		`{"status":410,"type":"https://`, `#source-stale"}`,
		`{"release":"v1.3.0","state":"ACTIVE","activeLeases":0,"uncertainLeases":0}`,
		`{"release":"v1.4.0","state":"STALE","activeLeases":0,"uncertainLeases":0}`,
	} {
		i := strings.Index(got, want)
		if i < 0 {
			t.Fatalf("walkthrough run %d: output lacks %s (in order):\n%s", n, want, all)
		}
		got = got[i+len(want):]
	}
	// The two snapshots differ: the second binds the tools to v1.3.
	ids := regexp.MustCompile(`\{"id":"(sha256:[0-9a-f]+)","tools"`).FindAllStringSubmatch(all, -1)
	if len(ids) != 2 || ids[0][1] == ids[1][1] {
		t.Fatalf("walkthrough run %d: want two different snapshots, got %v", n, ids)
	}
}

// dirNames lists the names in dir, sorted.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	return names
}

// TestDevRestartKeepsCredentialsAndData: a second --dev start on the same
// data directory reuses its credentials and etcd data.
func TestDevRestartKeepsCredentialsAndData(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	_, stop := startServer(t, dir, "--dev")
	first, err := os.ReadFile(filepath.Join(dir, "dev-credentials.json"))
	if err != nil {
		t.Fatal(err)
	}
	stop()
	url, stop := startServer(t, dir, "--dev")
	defer stop()
	second, _ := os.ReadFile(filepath.Join(dir, "dev-credentials.json"))
	if !bytes.Equal(first, second) {
		t.Fatal("restart regenerated the dev credentials")
	}
	env, _ := os.ReadFile(filepath.Join(dir, "dev-credentials.env"))
	if !strings.Contains(string(env), "export FCD_URL="+url+"\n") {
		t.Fatalf("env file does not carry the current URL %s:\n%s", url, env)
	}
	// A second approver, for the calls that need two (a delete).
	var dc devCredentials
	if err := json.Unmarshal(second, &dc); err != nil || dc.SecondApprover == "" ||
		!strings.Contains(string(env), "export FCD_APPROVER_2="+string(dc.SecondApprover)+"\n") {
		t.Fatalf("no second approver: %v %s", err, env)
	}
	for secret, id := range map[string]string{string(dc.Credentials["approver"]): "dev-approver", string(dc.SecondApprover): "dev-approver-2"} {
		if got := approverID(t, url, secret); got != id {
			t.Fatalf("approver %s: authzd knows the credential as %q", id, got)
		}
	}
}

func TestServeRefusesIncompleteConfiguration(t *testing.T) {
	var stderr bytes.Buffer
	code := run(context.Background(), []string{"serve", "--data-dir", t.TempDir()}, nil, io.Discard, &stderr)
	if code == 0 || !strings.Contains(stderr.String(), "registrarKeys") || !strings.Contains(stderr.String(), "credentials") {
		t.Fatalf("serve without keys or credentials: exit %d, %s", code, stderr.String())
	}
}

func TestConfigFileAndFlagPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "authzd.yaml")
	write := func(s string) {
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("listen: 127.0.0.1:9000\ndataDir: state\netcdEndpoints: [http://10.0.0.1:2379, http://10.0.0.2:2379]\nbodyLimit: 2048\ndev: true\n")
	cases := []struct {
		note  string
		args  []string
		check func(c Config) error
	}{
		{"file over defaults", []string{"--config", file}, func(c Config) error {
			if c.Listen != "127.0.0.1:9000" || c.BodyLimit != 2048 || !c.Dev || len(c.EtcdEndpoints) != 2 {
				return fmt.Errorf("%+v", c)
			}
			if c.DataDir != filepath.Join(dir, "state") {
				return fmt.Errorf("dataDir %q not relative to the file", c.DataDir)
			}
			if c.EtcdPrefix != "/fcd/" {
				return fmt.Errorf("default lost: prefix %q", c.EtcdPrefix)
			}
			return nil
		}},
		{"flags over file", []string{"--config", file, "--listen", ":7000", "--etcd-endpoints", "http://a:1", "--body-limit", "10"}, func(c Config) error {
			if c.Listen != ":7000" || c.BodyLimit != 10 || len(c.EtcdEndpoints) != 1 || c.EtcdEndpoints[0] != "http://a:1" {
				return fmt.Errorf("%+v", c)
			}
			return nil
		}},
		{"defaults", nil, func(c Config) error {
			if c.Listen == "127.0.0.1:8080" && c.DataDir == "fcd-data" && !c.Dev && c.BodyLimit == 1<<20 {
				return nil
			}
			return fmt.Errorf("%+v", c)
		}},
	}
	for _, tc := range cases {
		c, err := parseServeFlags(tc.args)
		if err != nil {
			t.Fatalf("%s: %v", tc.note, err)
		}
		if err := tc.check(c); err != nil {
			t.Errorf("%s: %v", tc.note, err)
		}
	}
	write("listen: x\nlisten_addr: y\n")
	if _, err := parseServeFlags([]string{"--config", file}); err == nil {
		t.Error("unknown key in the config file was accepted")
	}
}

func TestManifestCommands(t *testing.T) {
	dir := t.TempDir()
	// A registrar key pair from a --dev setup.
	cfg := Config{DataDir: dir}
	dc, err := devSetup(&cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	example := "../../examples/github/manifest-v1.4.json"
	cli := func(stdin []byte, args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(context.Background(), args, bytes.NewReader(stdin), &out, &errb)
		return code, out.String(), errb.String()
	}
	code, jws, stderr := cli(nil, "manifest", "sign", "--key", dc.Keys["registrar"], example)
	if code != 0 || strings.Count(strings.TrimSpace(jws), ".") != 2 {
		t.Fatalf("sign: %d %q %s", code, jws, stderr)
	}
	code, digest, _ := cli(nil, "manifest", "digest", example)
	if code != 0 || !strings.HasPrefix(digest, "sha256:") {
		t.Fatalf("digest: %d %q", code, digest)
	}
	// verify reads stdin and prints the same epoch as digest.
	code, verified, stderr := cli([]byte(jws), "manifest", "verify", "--keys", dc.RegistrarKeys, "-")
	if code != 0 || !strings.Contains(verified, strings.TrimSpace(digest)) {
		t.Fatalf("verify: %d %s %s", code, verified, stderr)
	}
	// digest of the signed form equals digest of the plain form.
	if code, d2, _ := cli([]byte(jws), "manifest", "digest"); code != 0 || d2 != digest {
		t.Fatalf("digest of JWS %q != %q", d2, digest)
	}
	tampered := strings.Replace(jws, ".", ".e30", 1)
	if code, _, stderr := cli([]byte(tampered), "manifest", "verify", "--keys", dc.RegistrarKeys); code == 0 {
		t.Fatalf("tampered JWS verified: %s", stderr)
	}
	if code, out, _ := cli(nil, "manifest", "lint", example); code != 0 || out != "" {
		t.Fatalf("lint of the example: %d %q", code, out)
	}
	bad, _ := os.ReadFile(example)
	bad = bytes.ReplaceAll(bad, []byte(`"requiresApproval": true`), []byte(`"requiresApproval": false`))
	code, out, _ := cli(bad, "manifest", "lint", "--json")
	if code != 1 || !strings.Contains(out, `"approval-required"`) {
		t.Fatalf("lint of a bad manifest: %d %s", code, out)
	}
	if code, _, stderr := cli([]byte(`{"server":{}, "nope": 1}`), "manifest", "digest"); code == 0 || !strings.Contains(stderr, "malformed") {
		t.Fatalf("digest of malformed input: %d %s", code, stderr)
	}
	for _, help := range [][]string{{"serve", "-h"}, {"cert", "sign", "-h"}, {"manifest", "lint", "-h"}} {
		if code, _, _ := cli(nil, help...); code != 0 {
			t.Errorf("%v: exit %d, want 0", help, code)
		}
	}
	if code, _, _ := cli(nil, "manifest", "frobnicate"); code != 2 {
		t.Fatalf("unknown subcommand exit %d, want 2", code)
	}
	code, cred, _ := cli(nil, "credential", "new", "--role", "operator")
	if code != 0 || !strings.Contains(cred, `"role": "operator"`) || !strings.Contains(cred, `"hash": "sha256:`) {
		t.Fatalf("credential new: %d %s", code, cred)
	}
	code, cred, _ = cli(nil, "credential", "new", "--role", "backend", "--pool", "github-v1-4", "--pool", "github-v1-3")
	if code != 0 || !strings.Contains(cred, `"pools": [`) || !strings.Contains(cred, `"github-v1-3"`) {
		t.Fatalf("credential new with pools: %d %s", code, cred)
	}
	if code, _, stderr := cli(nil, "credential", "new", "--role", "approver", "--pool", "x"); code != 2 || !strings.Contains(stderr, "pools") {
		t.Fatalf("approver with pools: exit %d %s", code, stderr)
	}
}

// TestCredentialNewCommandLine: `credential new` prints a credential for a
// valid role and refuses an unknown role or a stray argument as a usage
// error (exit 2).
func TestCredentialNewCommandLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"credential", "new", "--role", "backend", "--pool", "github-v1-4"}, 0},
		{[]string{"credential", "new", "--role", "nobody"}, 2},
		{[]string{"credential", "new", "--role", "backend", "stray"}, 2},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), tc.args, nil, &out, &errb)
		if code != tc.code || (code == 0) != strings.Contains(out.String(), `"role": "backend"`) {
			t.Errorf("%q: exit %d, want %d\nstdout %s\nstderr %s", tc.args, code, tc.code, out.String(), errb.String())
		}
	}
}

// TestSecondServerOnOneDataDir: a second `serve --dev` on a data directory
// a running server holds exits within seconds with an error naming the
// directory and the process that holds it — it never waits on etcd's
// database lock — and the first server goes on; started with its default
// ports, the embedded etcd listens on free ones, recorded in the data
// directory.
func TestSecondServerOnOneDataDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	_, stop := startServer(t, dir, "--dev")
	defer stop()
	var stderr bytes.Buffer
	start := time.Now()
	code := run(t.Context(), []string{"serve", "--dev", "--listen", "127.0.0.1:0", "--data-dir", dir}, nil, io.Discard, &stderr)
	if code == 0 || !strings.Contains(stderr.String(), "in use by another process") || !strings.Contains(stderr.String(), filepath.Join(dir, "etcd")) ||
		!strings.Contains(stderr.String(), fmt.Sprint(os.Getpid())) {
		t.Fatalf("a second server exited %d:\n%s", code, stderr.String())
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("the second server took %s to give up", took)
	}

	fresh := filepath.Join(t.TempDir(), "fresh")
	url, stopFresh := startServerDefaultPorts(t, fresh)
	defer stopFresh()
	raw, err := os.ReadFile(filepath.Join(fresh, "etcd", lease.EndpointsFile))
	if err != nil || !strings.Contains(string(raw), "https://127.0.0.1:") || strings.Contains(string(raw), ":2379\"") {
		t.Fatalf("recorded endpoints %s (%v)", raw, err)
	}
	readyz(t, url, http.StatusOK)
}

// startServerDefaultPorts starts `serve --dev` without naming the embedded
// etcd's ports.
func startServerDefaultPorts(t *testing.T, dataDir string) (string, func()) {
	t.Helper()
	args := []string{"serve", "--dev", "--listen", "127.0.0.1:0", "--data-dir", dataDir}
	c, url, err := cmdtest.Start(t, "authzd", listeningLine, func(ctx context.Context, stderr io.Writer) int {
		return run(ctx, args, nil, io.Discard, stderr)
	})
	if err != nil {
		t.Fatal(err)
	}
	return url, func() { c.Stop(t) }
}

// TestVersionCommand: --version (and version, -version) print one line
// naming authzd and the Go version, exit 0.
func TestVersionCommand(t *testing.T) {
	for _, arg := range []string{"--version", "-version", "version"} {
		var out, errb bytes.Buffer
		if code := run(t.Context(), []string{arg}, nil, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "authzd ") ||
			!strings.Contains(out.String(), "go1.") || strings.Count(out.String(), "\n") != 1 {
			t.Fatalf("%s: exit %d, %q %q", arg, code, out.String(), errb.String())
		}
	}
}

// TestDevAddsTheSecondApprover: a --dev data directory made before the
// second approver existed gets one on its next start, added to its
// credentials file, and it authenticates as an approver.
func TestDevAddsTheSecondApprover(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	_, stop := startServer(t, dir, "--dev")
	stop()
	// Make the directory as an older authzd left it.
	path := filepath.Join(dir, "dev-credentials.json")
	var old map[string]any
	raw, _ := os.ReadFile(path)
	if err := json.Unmarshal(raw, &old); err != nil {
		t.Fatal(err)
	}
	delete(old, "secondApprover")
	raw, _ = json.Marshal(old)
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	credPath := filepath.Join(dir, "credentials.json")
	var creds []map[string]any
	raw, _ = os.ReadFile(credPath)
	if err := json.Unmarshal(raw, &creds); err != nil {
		t.Fatal(err)
	}
	kept := creds[:0]
	for _, c := range creds {
		if c["id"] != "dev-approver-2" {
			kept = append(kept, c)
		}
	}
	raw, _ = json.Marshal(kept)
	if err := os.WriteFile(credPath, raw, 0o600); err != nil {
		t.Fatal(err)
	}

	url, stop := startServer(t, dir, "--dev")
	defer stop()
	var dc devCredentials
	raw, _ = os.ReadFile(path)
	if err := json.Unmarshal(raw, &dc); err != nil || dc.SecondApprover == "" {
		t.Fatalf("no second approver after the upgrade: %v %s", err, raw)
	}
	approverID(t, url, string(dc.SecondApprover))
}

// approverID returns the id of the approver credential secret as the
// authzd at url knows it (GET /v1/approvers/me); it fails the test unless
// authzd answers 200.
func approverID(t *testing.T, url, secret string) string {
	t.Helper()
	c, err := client.New(url, secret)
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.GetApproverWithResponse(t.Context())
	if err != nil {
		t.Fatalf("the approver: %v", err)
	}
	if r.JSON200 == nil {
		t.Fatalf("the approver: %d %s, want 200", r.StatusCode(), r.Body)
	}
	return r.JSON200.Id
}

// readyz polls url's /readyz until it answers want and returns that
// answer's body (a server is ready once its signing key is published, a
// moment after it listens); after 30 s it fails t with the last answer.
func readyz(t *testing.T, url string, want int) []byte {
	t.Helper()
	var code int
	var body []byte
	testutil.EventuallyState(t, 30*time.Second, fmt.Sprintf("/readyz to answer %d", want), func() bool {
		code, body = getReadyz(t, url)
		return code == want
	}, func() string { return fmt.Sprintf("%d %s", code, body) })
	return body
}

// getReadyz asks url's /readyz once.
func getReadyz(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}
