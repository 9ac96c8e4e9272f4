package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/etcdtest"
)

// TestProtectGuide runs docs/protect.md's block, as written, from the
// repository root: from an empty directory through `authzd init`, `serve
// --config`, a manifest signed and registered with the generated key and
// secret, `fencecheck proxy` in front of the real server-everything,
// `authzd gateway config nginx` run by a real nginx, and the host library's
// MCP client making a call an approver approves from the CLI — no --dev,
// no JSON written by hand. Every output the guide shows in a comment must
// be printed, in order (the server's port is the test's).
func TestProtectGuide(t *testing.T) {
	runGuide(t, "../../docs/protect.md", "guide", "8181", "AUTHZD_PORT", "SERVER_PORT", "FENCE_PORT", "GATEWAY_PORT")
}

// TestFrontGuide runs docs/front.md's worked example, as written: authzd
// from `authzd init`, the reference server behind `fencecheck proxy`,
// `authzd front` with a development token, and the MCP Inspector's CLI,
// unmodified, listing the snapshot, calling a read and a call an approver
// approves while it is open.
func TestFrontGuide(t *testing.T) {
	runGuide(t, "../../docs/front.md", "front-guide", "", "AUTHZD_PORT", "SERVER_PORT", "FENCE_PORT", "FRONT_PORT")
}

// runGuide runs the block between <!-- MARKER:begin --> and <!-- MARKER:end
// --> of the document, as written, from the repository root, with a free
// port in each of the variables (the second is the server's: a shown
// output that names serverPortShown names the test's port instead), and
// checks that every output the block shows in a comment ("# {…}", "# […]"
// or "# word") is printed, in order.
func runGuide(t *testing.T, docPath, marker, serverPortShown string, portVars ...string) {
	t.Helper()
	for _, tool := range []string{"curl", "jq", "node", "nginx", "go", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed for %s (.ci/run installs it)", tool, docPath)
		}
	}
	nodeHost(t, "", nil, "", "") // installs server-everything (npm ci) if .ci/run has not
	doc, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)<!-- " + marker + ":begin -->\\s*```sh\\n(.*?)```\\s*<!-- " + marker + ":end -->").FindSubmatch(doc)
	if block == nil {
		t.Fatalf("%s has no %s block", docPath, marker)
	}
	port := func() string {
		_, p, _ := strings.Cut(etcdtest.FreeAddr(t), ":")
		return p
	}
	scratch := t.TempDir() // the guide's mktemp -d is made here
	env := append(os.Environ(), "TMPDIR="+scratch)
	ports := map[string]string{}
	for _, v := range portVars {
		ports[v] = port()
		env = append(env, v+"="+ports[v])
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", string(block[1]))
	cmd.Dir = "../.."
	cmd.Env = env
	// Its own process group, so that whatever it started in the
	// background ends with it even if it is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	if cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if err != nil {
		t.Fatalf("the guide failed: %v\n%s%s", err, out.String(), logTails(scratch))
	}

	// The outputs the guide shows, in its order.
	var want []string
	shown := regexp.MustCompile(`^# (\{.*\}|\[.*\]|[A-Za-z_0-9]+)$`)
	for _, line := range strings.Split(string(block[1]), "\n") {
		if m := shown.FindStringSubmatch(line); m != nil {
			w := m[1]
			if serverPortShown != "" {
				w = strings.ReplaceAll(w, `"`+serverPortShown+`"`, `"`+ports[portVars[1]]+`"`)
			}
			want = append(want, w)
		}
	}
	if len(want) < 5 {
		t.Fatalf("the guide shows %d outputs: %q", len(want), want)
	}
	got := strings.Split(strings.TrimSpace(out.String()), "\n")
	i := 0
	for _, line := range got {
		if i < len(want) && strings.TrimSpace(line) == want[i] {
			i++
		}
	}
	if i != len(want) {
		t.Fatalf("the guide printed no %q (after %d of its %d outputs):\n%s%s", want[i], i, len(want), out.String(), logTails(scratch))
	}
}

// logTails is the end of every log the guide wrote under dir (its
// server, sidecar, gateway and host), for a failure's report.
func logTails(dir string) string {
	var b strings.Builder
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".log") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		if len(data) > 4096 {
			data = data[len(data)-4096:]
		}
		fmt.Fprintf(&b, "\n--- %s\n%s", path, data)
		return nil
	})
	return b.String()
}
