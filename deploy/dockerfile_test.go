package deploy

import (
	"bytes"
	"debug/elf"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	dockerfile "github.com/moby/buildkit/frontend/dockerfile/parser"
)

// root is the repository's root, the image's build context.
const root = ".."

// instruction is one Dockerfile instruction: its name (lower case), its
// flags (--from=build), its arguments (each element of a JSON form) and
// whether it was written in JSON form.
type instruction struct {
	name  string
	flags []string
	args  []string
	json  bool
	line  int
}

// stage is one FROM and the instructions under it.
type stage struct {
	from, name string
	line       int
	body       []instruction
}

// dockerfileStages parses a Dockerfile with BuildKit's parser into its
// stages, with the ARGs declared before the first FROM (name → default).
func dockerfileStages(data []byte) (stages []stage, metaArgs map[string]string, err error) {
	res, err := dockerfile.Parse(bytes.NewReader(data))
	if err != nil {
		return nil, nil, err
	}
	metaArgs = map[string]string{}
	for _, n := range res.AST.Children {
		in := instruction{name: strings.ToLower(n.Value), flags: n.Flags, json: n.Attributes["json"], line: n.StartLine}
		for a := n.Next; a != nil; a = a.Next {
			in.args = append(in.args, a.Value)
		}
		switch {
		case in.name == "from":
			s := stage{line: in.line}
			if len(in.args) > 0 {
				s.from = in.args[0]
			}
			if len(in.args) == 3 && strings.EqualFold(in.args[1], "as") {
				s.name = strings.ToLower(in.args[2])
			}
			stages = append(stages, s)
		case len(stages) == 0 && in.name == "arg":
			for _, a := range in.args {
				k, v, _ := strings.Cut(a, "=")
				metaArgs[k] = strings.Trim(v, `"`)
			}
		case len(stages) == 0:
			return nil, nil, fmt.Errorf("line %d: %s before the first FROM", in.line, in.name)
		default:
			stages[len(stages)-1].body = append(stages[len(stages)-1].body, in)
		}
	}
	return stages, metaArgs, nil
}

var (
	argRef     = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?`)
	pinnedTag  = regexp.MustCompile(`^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)+:[A-Za-z0-9_][A-Za-z0-9._-]*(@sha256:[0-9a-f]{64})?$`)
	pinnedHash = regexp.MustCompile(`^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)+@sha256:[0-9a-f]{64}$`)
	numericIDs = regexp.MustCompile(`^([0-9]+)(:[0-9]+)?$`)
)

// checkDockerfile returns what is wrong with the image's Dockerfile, by
// the rules docs/deploy.md states:
//   - each base image is named by its registry and pinned by a tag other
//     than latest, or by a digest (ARG defaults resolved);
//   - no ADD fetches a URL or a Git repository;
//   - every COPY --from names an earlier stage;
//   - the final stage runs as a numeric non-root user (Kubernetes'
//     runAsNonRoot can check only a numeric one), and its entrypoint, in
//     JSON form, is authzd, copied into it from a build stage;
//   - its default command is serve --config, the data directory a volume;
//   - the build runs go build with CGO_ENABLED=0 and -trimpath, the
//     version injected by -ldflags -X into variables internal/cli has, of
//     exactly the repository's commands authzd and fencecheck;
//   - the image is labelled with its version.
func checkDockerfile(data []byte) []string {
	stages, metaArgs, err := dockerfileStages(data)
	if err != nil {
		return []string{"parse: " + err.Error()}
	}
	var problems []string
	bad := func(line int, format string, args ...any) {
		problems = append(problems, fmt.Sprintf("line %d: ", line)+fmt.Sprintf(format, args...))
	}
	if len(stages) < 2 {
		return []string{"want a multi-stage build: a build stage and the image"}
	}
	names := map[string]bool{}
	var builds []string // the go build commands
	for i, s := range stages {
		from := argRef.ReplaceAllStringFunc(s.from, func(ref string) string {
			return metaArgs[argRef.FindStringSubmatch(ref)[1]]
		})
		switch {
		case names[strings.ToLower(from)]:
		case from == "scratch":
		case strings.Contains(from, ":latest"):
			bad(s.line, "FROM %s: latest is no pin", from)
		case !pinnedTag.MatchString(from) && !pinnedHash.MatchString(from):
			bad(s.line, "FROM %s: name the registry and pin a tag or digest", from)
		}
		for _, in := range s.body {
			switch in.name {
			case "add":
				for _, a := range in.args {
					if strings.Contains(a, "://") || strings.HasPrefix(a, "git@") {
						bad(in.line, "ADD %s: no downloads in the build; COPY from the context", a)
					}
				}
			case "copy":
				for _, f := range in.flags {
					if v, ok := strings.CutPrefix(f, "--from="); ok && !names[strings.ToLower(v)] {
						bad(in.line, "COPY --from=%s: no earlier stage is named so", v)
					}
				}
			case "run":
				cmd := strings.Join(in.args, " ")
				if strings.Contains(cmd, "go build") {
					builds = append(builds, cmd)
				}
				if regexp.MustCompile(`\b(curl|wget)\b`).MatchString(cmd) {
					bad(in.line, "RUN downloads (%s): the build takes only the context and the module proxy", cmd)
				}
			}
		}
		if s.name != "" {
			names[s.name] = true
		}
		_ = i
	}
	final := stages[len(stages)-1]
	var user, entrypoint, cmd []string
	var userLine, entryLine int
	var copied []string // paths the final stage copies from a build stage
	volumes, labels := map[string]bool{}, map[string]string{}
	for _, in := range final.body {
		switch in.name {
		case "user":
			user, userLine = in.args, in.line
		case "entrypoint":
			entrypoint, entryLine = in.args, in.line
			if !in.json {
				bad(in.line, "ENTRYPOINT in shell form: write it as JSON (no shell in the image, signals reach authzd)")
			}
		case "cmd":
			cmd = in.args
		case "volume":
			for _, v := range in.args {
				volumes[v] = true
			}
		case "label":
			for i := 0; i+1 < len(in.args); i += 3 { // key, value, "=": BuildKit's triples
				labels[in.args[i]] = strings.Trim(in.args[i+1], `"`)
			}
		case "copy":
			if slices.ContainsFunc(in.flags, func(f string) bool { return strings.HasPrefix(f, "--from=") }) && len(in.args) > 1 {
				dst := in.args[len(in.args)-1]
				for _, src := range in.args[:len(in.args)-1] {
					if strings.HasSuffix(dst, "/") {
						copied = append(copied, path.Join(dst, path.Base(src)))
					} else {
						copied = append(copied, dst)
					}
				}
			}
		}
	}
	switch {
	case len(user) == 0:
		bad(final.line, "the image has no USER: it would run as root")
	case !numericIDs.MatchString(user[0]):
		bad(userLine, "USER %s: give a numeric uid (Kubernetes' runAsNonRoot checks only those)", user[0])
	case strings.Split(user[0], ":")[0] == "0":
		bad(userLine, "USER %s: root", user[0])
	}
	switch {
	case len(entrypoint) == 0:
		bad(final.line, "no ENTRYPOINT")
	case path.Base(entrypoint[0]) != "authzd":
		bad(entryLine, "ENTRYPOINT %q: want authzd", entrypoint)
	case !slices.Contains(copied, entrypoint[0]):
		bad(entryLine, "ENTRYPOINT %s: the image copies no such file from a build stage (it copies %q)", entrypoint[0], copied)
	}
	if len(cmd) < 3 || cmd[0] != "serve" || !slices.Contains(cmd, "--config") {
		bad(final.line, "CMD %q: want serve --config FILE", cmd)
	}
	if !volumes["/var/lib/fcd"] {
		bad(final.line, "the data directory /var/lib/fcd is no VOLUME")
	}
	if v := labels["org.opencontainers.image.version"]; !strings.Contains(v, "${VERSION}") {
		bad(final.line, "label org.opencontainers.image.version = %q: want ${VERSION}", v)
	}
	if len(builds) != 1 {
		return append(problems, fmt.Sprintf("want one RUN with go build, found %d", len(builds)))
	}
	problems = append(problems, checkBuildCommand(builds[0])...)
	return problems
}

// checkBuildCommand checks the image's go build command against the
// repository: the flags that make the binaries static and reproducible,
// the version variables internal/cli declares, and exactly the commands
// the image is for.
func checkBuildCommand(build string) []string {
	var problems []string
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-buildvcs=false"} {
		if !strings.Contains(build, want) {
			problems = append(problems, "go build without "+want)
		}
	}
	vars := cliVars()
	for _, m := range regexp.MustCompile(`-X ([^ =]+)\.([A-Za-z_]+)=`).FindAllStringSubmatch(build, -1) {
		if m[1] != "github.com/fcd-authz/fcd/internal/cli" || !vars[m[2]] {
			problems = append(problems, fmt.Sprintf("-X %s.%s: internal/cli declares no such string variable", m[1], m[2]))
		}
	}
	if !strings.Contains(build, "internal/cli.version=${VERSION}") {
		problems = append(problems, "go build does not inject ${VERSION} into internal/cli.version")
	}
	pkgs := regexp.MustCompile(`\./cmd/[a-z0-9]+`).FindAllString(build, -1)
	if !slices.Equal(pkgs, []string{"./cmd/authzd", "./cmd/fencecheck"}) {
		problems = append(problems, fmt.Sprintf("go build builds %q: want ./cmd/authzd ./cmd/fencecheck", pkgs))
	}
	for _, p := range pkgs {
		if _, err := os.Stat(filepath.Join(root, p, "main.go")); err != nil {
			problems = append(problems, fmt.Sprintf("go build %s: the repository has no such command", p))
		}
	}
	return problems
}

// cliVars are the package-level string variables of internal/cli, which
// -ldflags -X can set.
func cliVars() map[string]bool {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filepath.Join(root, "internal/cli/version.go"), nil, 0)
	if err != nil {
		return nil
	}
	vars := map[string]bool{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.VAR {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); ok && id.Name == "string" {
				for _, n := range vs.Names {
					vars[n.Name] = true
				}
			}
		}
	}
	return vars
}

// TestDockerfile: the repository's Dockerfile keeps the image's rules
// (checkDockerfile).
func TestDockerfile(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range checkDockerfile(data) {
		t.Error(p)
	}
}

// TestDockerfileRulesCatch: each rule fails on a Dockerfile that breaks
// it, made from the repository's by one edit.
func TestDockerfileRulesCatch(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	good := string(data)
	for _, tc := range []struct{ note, old, new, want string }{
		{"root user", "USER 65532:65532", "USER root", "USER root"},
		{"uid 0", "USER 65532:65532", "USER 0:0", "root"},
		{"no user", "USER 65532:65532\n", "", "no USER"},
		{"latest base", "ARG BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot", "ARG BASE_IMAGE=gcr.io/distroless/static-debian12:latest", "latest"},
		{"unpinned base", "ARG BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot", "ARG BASE_IMAGE=gcr.io/distroless/static-debian12", "pin"},
		{"add url", "COPY . .", "ADD https://example.com/src.tar.gz .", "ADD https://"},
		{"copy from nowhere", "COPY --from=build /out/bin/authzd", "COPY --from=builder /out/bin/authzd", "--from=builder"},
		{"entrypoint shell", `ENTRYPOINT ["/usr/local/bin/authzd"]`, `ENTRYPOINT ["/bin/sh", "-c", "authzd"]`, "want authzd"},
		{"entrypoint not copied", `ENTRYPOINT ["/usr/local/bin/authzd"]`, `ENTRYPOINT ["/bin/authzd"]`, "copies no such file"},
		{"cgo", "CGO_ENABLED=0 go build", "go build", "CGO_ENABLED=0"},
		{"no trimpath", "go build -trimpath", "go build", "-trimpath"},
		{"version variable renamed", "internal/cli.version=${VERSION}", "internal/cli.Version=${VERSION}", "no such string variable"},
		{"a command that is not there", "./cmd/authzd ./cmd/fencecheck", "./cmd/authzd ./cmd/fencecheckd", "fencecheckd"},
		{"no version label", `org.opencontainers.image.version="${VERSION}"`, `org.opencontainers.image.version="dev"`, "image.version"},
	} {
		t.Run(tc.note, func(t *testing.T) {
			if !strings.Contains(good, tc.old) {
				t.Fatalf("the Dockerfile has no %q to edit", tc.old)
			}
			problems := checkDockerfile([]byte(strings.Replace(good, tc.old, tc.new, 1)))
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) }) {
				t.Fatalf("problems %q: want one naming %q", problems, tc.want)
			}
		})
	}
}

// TestImageBuildCommand runs the Dockerfile's own build command on the
// repository (its paths under a temporary /out), as the image's build
// stage does, and checks what it made: static binaries whose --version
// carries the build's VERSION and REVISION.
func TestImageBuildCommand(t *testing.T) {
	bin := binaries(t)
	for _, name := range []string{"authzd", "fencecheck"} {
		f, err := elf.Open(filepath.Join(bin, name))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s is dynamically linked", name)
			}
		}
		f.Close()
		out, err := exec.Command(filepath.Join(bin, name), "--version").CombinedOutput()
		if want := name + " " + testVersion + " rev " + testRevision + " go1."; err != nil || !strings.HasPrefix(string(out), want) {
			t.Errorf("%s --version: %q (%v), want %q…", name, out, err, want)
		}
	}
}
