// Package layout holds the test that keeps fcd's import graph pointing
// one way: the README's "Import direction" table, checked against `go
// list` on every test run.
package layout

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/fcd-authz/fcd"

// allowed lists, for each package of the server and of what backends
// embed, the fcd packages it may import directly. Commands, benchmarks
// and internal test helpers sit above all of them and are not listed.
var allowed = map[string][]string{
	// The public text of errors meant for clients: the domain packages'
	// sentinels are made by it, and it imports nothing.
	"internal/public": {},
	// The example gateway templates, embedded: data only.
	"examples/gateways": {},
	// The renderer of `authzd gateway config` reads the example templates.
	"internal/gatewayconf": {"examples/gateways"},
	// The one bounded (LRU) cache of the in-memory caches.
	"internal/bounded": {},
	// The spans below the edge, with the provider of the request's span:
	// OpenTelemetry's API only.
	"internal/tracing": {},
	// The trace exporter, the propagator, the log handler with trace ids,
	// and fencecheck's tracing hook on OpenTelemetry.
	"internal/telemetry": {"fencecheck", "internal/cli"},
	"manifest":           {"internal/public"},
	"policies":           {},
	"fencecheck":         {},
	"record":             {"manifest", "internal/public"},
	"lease":              {"record", "manifest", "internal/tracing"},
	"authz/policy":       {"record", "manifest", "internal/bounded", "internal/tracing"},
	"authz":              {"lease", "authz/policy", "authz/decisionlog", "fencecheck", "record", "manifest", "internal/public", "internal/bounded", "internal/tracing"},
	// The decision-log exporter knows OPA's wire format, not fcd's
	// records: authz hands it documents.
	"authz/decisionlog": {},
	// The trail stores and checks documents (signed as manifests are);
	// authz records to it through an interface of its own, so no server
	// package imports it.
	"audit": {"manifest"},
	"api":   {"authz", "authz/policy", "audit", "fencecheck", "record", "manifest", "internal/public", "internal/telemetry"},
	// The typed REST client is generated from the document alone; hosts
	// and tools embed it, so it imports no server package.
	"client": {},
	// Hosts embed the host library: it speaks to authzd over HTTP only,
	// through the typed client, and reads MCP bodies with the fence's
	// reader.
	"host": {"client", "fencecheck"},
	// What backends' tests use in authzd's place: it signs tokens the
	// fence verifies.
	"fencecheck/fencechecktest": {"fencecheck"},
	// The MCP front is a host for stock clients: like host, it speaks to
	// authzd over HTTP only; the fence's argument digest tells it which
	// arguments can travel.
	"front": {"client", "fencecheck", "internal/bounded"},
	// The server assembles every part from one Config (etcd's embed):
	// authzd serve, the benchmarks and the end-to-end tests build it, and
	// nothing below it imports it.
	"server": {"api", "audit", "authz", "authz/decisionlog", "authz/policy", "lease", "manifest", "policies", "internal/telemetry"},
}

// forbiddenDeps are modules a package must not pull in, even indirectly:
// backends embed fencecheck (no etcd, no policy engines), and evaluating
// a policy needs no store.
var forbiddenDeps = map[string][]string{
	"internal/public": {"go.etcd.io/", "github.com/open-policy-agent/", "github.com/cedar-policy/"},
	"fencecheck":      {"go.etcd.io/", "github.com/open-policy-agent/", "github.com/cedar-policy/"},
	"record":          {"go.etcd.io/", "github.com/open-policy-agent/", "github.com/cedar-policy/"},
	"authz/policy":    {"go.etcd.io/"},
	// It writes OPA's format without running OPA (its tests decode with
	// OPA's own event type).
	"authz/decisionlog": {"go.etcd.io/", "github.com/open-policy-agent/", "github.com/cedar-policy/"},
	"manifest":          {"go.etcd.io/", "github.com/open-policy-agent/", "github.com/cedar-policy/"},
	"audit":             {"go.etcd.io/", "github.com/open-policy-agent/", "github.com/cedar-policy/"},
	// Hosts embed the client and the host library: no store, no policy
	// engine.
	"client": {"go.etcd.io/", "github.com/open-policy-agent/", "github.com/cedar-policy/"},
	"host":   {"go.etcd.io/", "github.com/open-policy-agent/", "github.com/cedar-policy/"},
	// The front runs apart from authzd: no store, no policy engine.
	"front": {"go.etcd.io/", "github.com/open-policy-agent/", "github.com/cedar-policy/"},
	// Backends' tests import it.
	"fencecheck/fencechecktest": {"go.etcd.io/", "github.com/open-policy-agent/", "github.com/cedar-policy/"},
}

// nested are the modules of this repository that others embed, by folder:
// each has a go.mod of its own, so that a backend embedding fencecheck, or
// a host embedding client and host, takes part in the version selection of
// only what these need — not in the server's (etcd, OPA, Cedar, gRPC,
// chromedp). The workspace (go.work) lists them with this module.
var nested = []string{"fencecheck", "client", "host"}

// serverModulesList are modules only the server, its commands and its
// tests need. A nested module's whole module graph (`go list -m all`, its
// tests' dependencies included) must hold none of them — a module path
// equal to an entry, or under it ("entry/...") — nor the server's module
// itself.
var serverModulesList = []string{
	"go.etcd.io",                            // etcd, bbolt, raft
	"github.com/open-policy-agent",          // OPA
	"github.com/cedar-policy",               // Cedar
	"google.golang.org/grpc",                // gRPC
	"google.golang.org/genproto",            // gRPC's protobuf APIs
	"github.com/grpc-ecosystem",             // gRPC middleware and gateway
	"github.com/envoyproxy",                 // Envoy's ext_authz API
	"github.com/chromedp",                   // the approval UI's browser tests
	"github.com/getkin/kin-openapi",         // the OpenAPI document's checks
	"github.com/oapi-codegen/oapi-codegen",  // the client's generator (not its runtime)
	"github.com/prometheus",                 // the server's metrics
	"go.opentelemetry.io",                   // etcd's and gRPC's tracing
	"github.com/go-chi/chi",                 // the server's router
	"github.com/santhosh-tekuri/jsonschema", // the registry's schema checks
	"github.com/anishathalye/porcupine",     // the linearizability checks
}

type pkg struct {
	imports, deps []string
}

func list(t *testing.T) map[string]pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \",\"}} {{join .Deps \",\"}}", module+"/...")
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list: %v\n%s", err, stderr)
	}
	pkgs := map[string]pkg{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		f := strings.Split(sc.Text(), " ")
		for len(f) < 3 {
			f = append(f, "")
		}
		name := strings.TrimPrefix(strings.TrimPrefix(f[0], module), "/")
		pkgs[name] = pkg{imports: strings.Split(f[1], ","), deps: strings.Split(f[2], ",")}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return pkgs
}

func TestImportDirection(t *testing.T) {
	pkgs := list(t)
	for name, may := range allowed {
		p, ok := pkgs[name]
		if !ok {
			t.Errorf("package %s is not in the module any more: update the table", name)
			continue
		}
		for _, imp := range p.imports {
			own, ok := strings.CutPrefix(imp, module+"/")
			if !ok {
				continue
			}
			if !slices.Contains(may, own) {
				t.Errorf("%s imports %s; it may import only %v of fcd's packages", name, own, may)
			}
		}
	}
	// Nothing but the server, the commands, benchmarks and end-to-end
	// tests imports the transport.
	for name, p := range pkgs {
		if slices.Contains(p.imports, module+"/api") && name != "server" && !strings.HasPrefix(name, "cmd/") && !strings.HasPrefix(name, "bench/") {
			t.Errorf("%s imports api; only the server, commands and benchmarks may", name)
		}
	}
	// The examples hold data and demonstrations, not product code: no
	// command or server package imports them (internal/gatewayconf reads
	// the gateway templates that examples/gateways embeds).
	for name, p := range pkgs {
		if strings.HasPrefix(name, "examples/") || name == "internal/gatewayconf" {
			continue
		}
		for _, imp := range p.imports {
			if strings.HasPrefix(imp, module+"/examples/") && !strings.HasPrefix(name, "internal/") {
				t.Errorf("%s imports %s; product code lives outside examples/", name, imp)
			}
		}
	}
	// Nothing but the commands, benchmarks and test helpers imports the
	// server: it sits above every other package.
	for name, p := range pkgs {
		if slices.Contains(p.imports, module+"/server") && !strings.HasPrefix(name, "cmd/") && !strings.HasPrefix(name, "bench/") && !strings.HasPrefix(name, "internal/") {
			t.Errorf("%s imports server; only commands, benchmarks and test helpers may", name)
		}
	}
}

func TestForbiddenDependencies(t *testing.T) {
	pkgs := list(t)
	for name, prefixes := range forbiddenDeps {
		for _, dep := range pkgs[name].deps {
			for _, prefix := range prefixes {
				if strings.HasPrefix(dep, prefix) {
					t.Errorf("%s depends on %s (no %s* allowed there)", name, dep, prefix)
				}
			}
		}
	}
}

// TestNestedModulesStaySmall: the module graph of each nested module, in
// that module alone (GOWORK=off, as an embedder's build sees it), holds no
// server module, and the fcd modules it requires are its siblings,
// replaced by their folders here.
func TestNestedModulesStaySmall(t *testing.T) {
	for _, dir := range nested {
		t.Run(dir, func(t *testing.T) {
			mods := moduleGraph(t, "../../"+dir)
			if len(mods) == 0 || mods[0].path != module+"/"+dir {
				t.Fatalf("%s/go.mod is not the module %s/%s: %v", dir, module, dir, mods)
			}
			for _, m := range serverModules(mods[1:]) {
				t.Errorf("%s's module graph holds %s %s: it must not need what only the server needs", dir, m.path, m.version)
			}
			for _, m := range mods[1:] {
				if sib, ok := strings.CutPrefix(m.path, module+"/"); ok && (!slices.Contains(nested, sib) || m.replace != "../"+sib) {
					t.Errorf("%s requires %s (replaced by %q): a nested module may require only its siblings, replaced by ../FOLDER", dir, m.path, m.replace)
				}
			}
			t.Logf("%s: %d modules", dir, len(mods))
		})
	}
}

// TestServerModulesCheckFails shows that the check above can fail: the
// server's own module graph holds every kind of server module it looks
// for.
func TestServerModulesCheckFails(t *testing.T) {
	found := map[string]bool{}
	for _, m := range serverModules(moduleGraph(t, "../..")) {
		for _, prefix := range serverModulesList {
			if m.path == prefix || strings.HasPrefix(m.path, prefix+"/") {
				found[prefix] = true
			}
		}
	}
	for _, want := range []string{"go.etcd.io", "github.com/open-policy-agent", "github.com/cedar-policy", "google.golang.org/grpc",
		"github.com/chromedp", "github.com/getkin/kin-openapi", "github.com/prometheus"} {
		if !found[want] {
			t.Errorf("the server's module graph holds no %s module: the check of the nested modules would not see one either", want)
		}
	}
}

type mod struct{ path, version, replace string }

// moduleGraph is `go list -m all` in dir without the workspace: the main
// module first.
func moduleGraph(t *testing.T, dir string) []mod {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Path}} {{.Version}} {{with .Replace}}{{.Path}}{{end}}", "all")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list -m all in %s: %v\n%s", dir, err, stderr)
	}
	var mods []mod
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		for len(f) < 3 {
			f = append(f, "")
		}
		mods = append(mods, mod{f[0], f[1], f[2]})
	}
	return mods
}

// serverModules returns the modules of mods that only the server needs.
func serverModules(mods []mod) []mod {
	var bad []mod
	for _, m := range mods {
		if m.path == module {
			bad = append(bad, m)
			continue
		}
		for _, prefix := range serverModulesList {
			if m.path == prefix || strings.HasPrefix(m.path, prefix+"/") {
				bad = append(bad, m)
				break
			}
		}
	}
	return bad
}

// TestEveryModuleIsTested: in workspace mode `./...` stops at a nested
// module's folder, so the README's test command (the one .ci/run runs)
// must name each module of go.work, and go.work must list each nested
// module: a module left out would have its tests silently skipped.
func TestEveryModuleIsTested(t *testing.T) {
	work, err := os.ReadFile("../../go.work")
	if err != nil {
		t.Fatal(err)
	}
	var used []string
	in := false
	for line := range strings.Lines(string(work)) {
		f := strings.Fields(line)
		switch {
		case len(f) == 0:
		case f[0] == "use" && len(f) > 1 && f[1] == "(":
			in = true
		case f[0] == "use" && len(f) > 1:
			used = append(used, f[1])
		case in && f[0] == ")":
			in = false
		case in:
			used = append(used, f[0])
		}
	}
	for _, dir := range nested {
		if !slices.Contains(used, "./"+dir) {
			t.Errorf("go.work does not use ./%s", dir)
		}
	}

	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var command string
	for line := range strings.Lines(string(readme)) {
		if strings.HasPrefix(line, "go test ") {
			command = strings.TrimSpace(line)
			break
		}
	}
	args := strings.Fields(command)
	for _, dir := range used {
		want := strings.TrimSuffix(dir, "/.") + "/..."
		if dir == "." {
			want = "./..."
		}
		if !slices.Contains(args, want) {
			t.Errorf("the README's test command %q does not test %s (%s)", command, dir, want)
		}
	}
	ci, err := os.ReadFile("../../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	if command == "" || !slices.Contains(strings.Split(string(ci), "\n"), command) {
		t.Errorf(".ci/run does not run the README's test command %q", command)
	}
}
