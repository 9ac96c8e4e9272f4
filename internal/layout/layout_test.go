// Package layout holds the test that keeps fcd's import graph pointing
// one way: the README's "Import direction" table, checked against `go
// list` on every test run.
package layout

import (
	"bufio"
	"bytes"
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
	"manifest":         {"internal/public"},
	"policies":         {},
	"fencecheck":       {},
	"record":           {"manifest", "internal/public"},
	"lease":            {"record", "manifest"},
	"authz/policy":     {"record", "manifest", "internal/bounded"},
	"authz":            {"lease", "authz/policy", "authz/decisionlog", "fencecheck", "record", "manifest", "internal/public", "internal/bounded"},
	// The decision-log exporter knows OPA's wire format, not fcd's
	// records: authz hands it documents.
	"authz/decisionlog": {},
	// The trail stores and checks documents (signed as manifests are);
	// authz records to it through an interface of its own, so no server
	// package imports it.
	"audit": {"manifest"},
	"api":   {"authz", "authz/policy", "audit", "fencecheck", "record", "manifest", "internal/public"},
	// The typed REST client is generated from the document alone; hosts
	// and tools embed it, so it imports no server package.
	"client": {},
	// Hosts embed the host library: it speaks to authzd over HTTP only,
	// through the typed client.
	"host": {"client"},
	// The server assembles every part from one Config (etcd's embed):
	// authzd serve, the benchmarks and the end-to-end tests build it, and
	// nothing below it imports it.
	"server": {"api", "audit", "authz", "authz/decisionlog", "authz/policy", "lease", "manifest", "policies"},
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
