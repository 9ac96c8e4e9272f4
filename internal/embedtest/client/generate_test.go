package client_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// clientDir is the client module's folder. Its go:generate line runs
// oapi-codegen, a tool of this module (go.mod): the workspace (go.work)
// makes it available there, and the client module itself stays without
// the generator's dependencies.
const clientDir = "../../../client"

// TestGeneratedIsCurrent runs client/generate.go's go:generate line with
// its output in a temporary directory and fails when client.gen.go differs
// from what api/openapi.yaml generates now: the document changed and
// `go generate ./client/...` was not run, or the generated file was
// edited by hand.
func TestGeneratedIsCurrent(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(clientDir, "generate.go"))
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	for line := range strings.Lines(string(src)) {
		if rest, ok := strings.CutPrefix(line, "//go:generate "); ok {
			args = strings.Fields(rest)
		}
	}
	out := slices.Index(args, "-o")
	if len(args) < 2 || args[0] != "go" || out < 0 || out+1 >= len(args) {
		t.Fatalf("generate.go has no go:generate line of the form `go tool ... -o FILE ...`: %q", args)
	}
	committed := args[out+1]
	fresh := filepath.Join(t.TempDir(), filepath.Base(committed))
	args[out+1] = fresh

	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = clientDir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	want, err := os.ReadFile(fresh)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(clientDir, committed))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is not what api/openapi.yaml generates (%s); run `go generate ./client/...` and commit the result:\n%s",
			committed, strings.Join(args, " "), firstDifference(got, want))
	}
}

// firstDifference shows the first line where the committed and the fresh
// code differ, with its number.
func firstDifference(got, want []byte) string {
	g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := range max(len(g), len(w)) {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return "line " + strconv.Itoa(i+1) + ":\n  committed: " + gl + "\n  generated: " + wl
		}
	}
	return "(same lines; line endings differ)"
}
