package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
)

const manifestDoc = "../../docs/manifest.md"

// docSections splits a Markdown document into its "## " sections, by
// heading text.
func docSections(t *testing.T, path string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]string{}
	for _, part := range strings.Split("\n"+string(data), "\n## ")[1:] {
		heading, body, _ := strings.Cut(part, "\n")
		sections[heading] = body
	}
	return sections
}

// jsonPaths lists the JSON member paths of a document type as the
// reference writes them: "config.digest", "tools[].failureModes[].error".
// It descends into structs (through pointers and slices), not into maps,
// raw JSON or times.
func jsonPaths(typ reflect.Type, prefix string) []string {
	var paths []string
	for f := range typ.Fields() {
		tag := f.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if f.Anonymous {
			paths = append(paths, jsonPaths(f.Type, prefix)...)
			continue
		}
		path := prefix + name
		paths = append(paths, path)
		ft := f.Type
		sep := "."
		for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
			if ft.Kind() == reflect.Slice {
				if ft == reflect.TypeFor[json.RawMessage]() {
					break
				}
				sep = "[]."
			}
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct && ft != reflect.TypeFor[time.Time]() {
			paths = append(paths, jsonPaths(ft, path+sep)...)
		}
	}
	return paths
}

var docRow = regexp.MustCompile("(?m)^\\| `([^`]+)` \\|([^|]*)\\|")

// TestManifestReference keeps docs/manifest.md true to the code: each of
// its field tables has one row for every JSON member of its document type
// (manifests with their Tool+ descriptors, snapshots, certificates,
// resolutions) and no row for a member that does not exist; its lint
// table lists every lint rule with its severity, and nothing else; every
// token claim it names is one the fence reads.
func TestManifestReference(t *testing.T) {
	sections := docSections(t, manifestDoc)
	for _, tc := range []struct {
		section string
		typ     reflect.Type
	}{
		{"Fields", reflect.TypeFor[manifest.Manifest]()},
		{"Snapshots", reflect.TypeFor[record.Snapshot]()},
		{"Compatibility certificates", reflect.TypeFor[manifest.Certificate]()},
		{"Resolutions", reflect.TypeFor[manifest.Resolution]()},
	} {
		body, ok := sections[tc.section]
		if !ok {
			t.Errorf("docs/manifest.md has no section %q", tc.section)
			continue
		}
		want := jsonPaths(tc.typ, "")
		var got []string
		for _, m := range docRow.FindAllStringSubmatch(body, -1) {
			got = append(got, m[1])
		}
		for _, p := range want {
			if !slices.Contains(got, p) {
				t.Errorf("section %q has no row for `%s`", tc.section, p)
			}
		}
		for _, p := range got {
			if !slices.Contains(want, p) {
				t.Errorf("section %q has a row for `%s`, which %s does not have", tc.section, p, tc.typ)
			}
		}
	}

	rows := map[string]string{}
	for _, m := range docRow.FindAllStringSubmatch(sections["Lint rules"], -1) {
		rows[m[1]] = strings.TrimSpace(m[2])
	}
	for _, r := range manifest.Rules() {
		if sev, ok := rows[r.ID]; !ok || sev != string(r.Severity) {
			t.Errorf("lint rule %s (%s): the reference says %q", r.ID, r.Severity, sev)
		}
		delete(rows, r.ID)
	}
	for id := range rows {
		t.Errorf("the reference lists lint rule %s, which does not exist", id)
	}

	var claims []string
	for f := range reflect.TypeFor[fencecheck.Claims]().Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		claims = append(claims, name)
	}
	data, _ := os.ReadFile(manifestDoc)
	for _, m := range regexp.MustCompile("`(fcd_[a-z_]+)`").FindAllStringSubmatch(string(data), -1) {
		if !slices.Contains(claims, m[1]) {
			t.Errorf("the reference names token claim %s, which dispatch tokens do not have", m[1])
		}
	}
}

// docStep is one command of a worked example and what the page says it
// prints; "…" in a line stands for any text.
type docStep struct {
	command string
	output  []string
}

// consoleSteps reads the ```console blocks of a Markdown text: "$ " starts
// a command, a line ending in "\" continues it, other lines are output.
func consoleSteps(text string) []docStep {
	var steps []docStep
	for _, block := range regexp.MustCompile("(?s)```console\n(.*?)```").FindAllStringSubmatch(text, -1) {
		lines := strings.Split(strings.TrimSuffix(block[1], "\n"), "\n")
		for i := 0; i < len(lines); i++ {
			cmd, ok := strings.CutPrefix(lines[i], "$ ")
			if !ok {
				steps[len(steps)-1].output = append(steps[len(steps)-1].output, lines[i])
				continue
			}
			for strings.HasSuffix(cmd, "\\") && i+1 < len(lines) {
				i++
				cmd += "\n" + lines[i]
			}
			steps = append(steps, docStep{command: cmd})
		}
	}
	return steps
}

// outputMatches reports whether got is line for line what want says, "…"
// matching any text within a line.
func outputMatches(want []string, got string) bool {
	lines := strings.Split(got, "\n")
	if got == "" {
		lines = nil
	}
	if len(lines) != len(want) {
		return false
	}
	for i, w := range want {
		parts := strings.Split(w, "…")
		for j := range parts {
			parts[j] = regexp.QuoteMeta(parts[j])
		}
		if !regexp.MustCompile("^" + strings.Join(parts, ".*") + "$").MatchString(lines[i]) {
			return false
		}
	}
	return true
}

// TestManifestReferenceWorkedExample runs the worked example of
// docs/manifest.md, command by command in one shell, with authzd and
// fencecheck built from this tree and a fresh `serve --dev`, and requires
// each command to succeed and print what the page shows under it. It
// leaves nothing in the repository.
func TestManifestReferenceWorkedExample(t *testing.T) {
	for _, tool := range []string{"curl", "jq", "sha256sum", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed for the worked example of docs/manifest.md", tool)
		}
	}
	steps := consoleSteps(docSections(t, manifestDoc)["Worked example"])
	if len(steps) < 10 {
		t.Fatalf("the worked example has %d commands", len(steps))
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin, "./cmd/authzd", "./cmd/fencecheck")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	before := dirNames(t, root)
	dataDir := filepath.Join(t.TempDir(), "data")
	_, stop := startServer(t, dataDir, "--dev")
	defer stop()

	// One shell runs every command; a marker line after each carries its
	// exit status and splits the output.
	const marker = "\x1e step-end "
	var script strings.Builder
	for _, s := range steps {
		fmt.Fprintf(&script, "%s\nprintf '\\n%s%%d\\n' $?\n", s.command, marker)
	}
	cmd := exec.Command("bash", "-c", script.String())
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"FCD_DATA="+dataDir, "TMPDIR="+t.TempDir())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("the worked example's shell failed: %v\n%s", err, out.String())
	}
	parts := strings.Split(out.String(), "\n"+marker)
	if len(parts) != len(steps)+1 {
		t.Fatalf("%d commands, %d outputs:\n%s", len(steps), len(parts)-1, out.String())
	}
	for i, s := range steps {
		got := parts[i]
		if i > 0 { // the previous command's status, then this one's output
			status, rest, _ := strings.Cut(parts[i], "\n")
			if status != "0" {
				t.Errorf("$ %s\nexited %s", steps[i-1].command, status)
			}
			got = rest
		}
		got = strings.TrimSuffix(got, "\n")
		if !outputMatches(s.output, got) {
			t.Errorf("$ %s\nprinted:\n%s\nthe reference says:\n%s", s.command, got, strings.Join(s.output, "\n"))
		}
	}
	if status := strings.TrimSpace(parts[len(parts)-1]); status != "0" {
		t.Errorf("$ %s\nexited %s", steps[len(steps)-1].command, status)
	}
	for _, name := range dirNames(t, root) {
		if !slices.Contains(before, name) {
			t.Errorf("the worked example left %s in the repository", name)
		}
	}
}

// TestConsoleSteps: commands, continuations and outputs are read apart,
// and "…" matches within a line only.
func TestConsoleSteps(t *testing.T) {
	steps := consoleSteps("text\n```console\n$ a \\\n    b\none\ntwo\n$ c\n```\nmore\n```console\n$ d\nx…z\n```\n")
	want := []docStep{{"a \\\n    b", []string{"one", "two"}}, {"c", nil}, {"d", []string{"x…z"}}}
	if !reflect.DeepEqual(steps, want) {
		t.Fatalf("steps %q, want %q", steps, want)
	}
	for _, tc := range []struct {
		want []string
		got  string
		ok   bool
	}{
		{[]string{"x…z"}, "xyz", true},
		{[]string{"x…z"}, "xz", true},
		{[]string{"x…z"}, "xy\nz", false},
		{[]string{"a.b"}, "axb", false},
		{nil, "", true},
		{nil, "extra", false},
		{[]string{"one"}, "one\ntwo", false},
	} {
		if outputMatches(tc.want, tc.got) != tc.ok {
			t.Errorf("outputMatches(%q, %q) = %v", tc.want, tc.got, !tc.ok)
		}
	}
}
