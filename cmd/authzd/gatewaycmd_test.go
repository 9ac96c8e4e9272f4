package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/fcd-authz/fcd/internal/gatewayconf"
	"golang.org/x/crypto/bcrypt"
)

// gatewayFiles writes a gateway credential file and an htpasswd users
// file, and returns their paths and the credential.
func gatewayFiles(t *testing.T) (credFile, usersFile, credential string) {
	t.Helper()
	dir := t.TempDir()
	credential = "gw-secret.Zm9v~bar"
	credFile = filepath.Join(dir, "gateway.secret")
	if err := os.WriteFile(credFile, []byte(credential+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var users []gatewayconf.User
	for _, name := range []string{"alice", "bob"} {
		u, err := gatewayconf.NewUser(name, name+"-pw", bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		users = append(users, u)
	}
	text, err := gatewayconf.Htpasswd(users)
	if err != nil {
		t.Fatal(err)
	}
	usersFile = filepath.Join(dir, "users.htpasswd")
	if err := os.WriteFile(usersFile, append([]byte("# clients of the gateway\n"), text...), 0o600); err != nil {
		t.Fatal(err)
	}
	return credFile, usersFile, credential
}

// goInternals are words that would show Go's types or packages to a user.
var goInternals = regexp.MustCompile(`\*flag\.|main\.|gateways\.|\bstruct\b|\bstring\b\)|%!`)

// TestGatewayConfigFlags: every missing or ill-formed flag of `authzd
// gateway config` is a usage error (exit 2) that names the flag, and
// shows no Go internals; a good command line exits 0.
func TestGatewayConfigFlags(t *testing.T) {
	credFile, usersFile, _ := gatewayFiles(t)
	dir := t.TempDir()
	badUsers := filepath.Join(dir, "bad-users")
	if err := os.WriteFile(badUsers, []byte("alice:plain-password\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	badCred := filepath.Join(dir, "bad-cred")
	if err := os.WriteFile(badCred, []byte("two words\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--credential-file", credFile, "--users", usersFile}
	with := func(extra ...string) []string { return append(append([]string{}, base...), extra...) }
	for _, tc := range []struct {
		note string
		args []string // after "gateway"
		env  string   // $FCD_GATEWAY
		code int
		want string // in stderr
	}{
		{note: "one pool, default implied", args: append([]string{"config", "nginx"}, with("--pool", "p=127.0.0.1:9001")...)},
		{note: "credential from the environment", args: []string{"config", "caddy", "--users", usersFile, "--pool", "p=127.0.0.1:9001"}, env: "env-cred"},
		{note: "several servers and pools", args: append([]string{"config", "caddy"}, with("--pool", "a=127.0.0.1:1,http://127.0.0.1:2", "--pool", "b=127.0.0.1:3", "--default", "b")...)},
		{note: "no default on purpose", args: append([]string{"config", "nginx"}, with("--pool", "a=127.0.0.1:1", "--pool", "b=127.0.0.1:3", "--default", "none")...)},
		{note: "envoy", args: []string{"config", "envoy", "--credential-file", credFile, "--pool", "p=127.0.0.1:9001", "--jwt-issuer", "https://idp.example", "--jwt-jwks", "/etc/envoy/jwks.json"}},

		{note: "help", args: []string{"config", "nginx", "-h"}},

		{note: "no subcommand", args: nil, code: 2, want: "gateway needs config KIND"},
		{note: "no kind", args: []string{"config"}, code: 2, want: "needs the gateway kind first"},
		{note: "flags before the kind", args: append([]string{"config"}, with("--pool", "p=127.0.0.1:1")...), code: 2, want: "needs the gateway kind first"},
		{note: "unknown kind", args: []string{"config", "haproxy"}, code: 2, want: `unknown gateway "haproxy"`},
		{note: "stray argument", args: append([]string{"config", "nginx", "extra"}, base...), code: 2, want: `unexpected argument "extra"`},
		{note: "unknown flag", args: append([]string{"config", "nginx", "--credential", "x"}, base...), code: 2, want: "-credential"},
		{note: "no credential", args: []string{"config", "nginx", "--users", usersFile, "--pool", "p=127.0.0.1:1"}, code: 2, want: "--credential-file"},
		{note: "credential file missing", args: []string{"config", "nginx", "--credential-file", filepath.Join(dir, "nope"), "--users", usersFile, "--pool", "p=127.0.0.1:1"}, code: 2, want: "--credential-file"},
		{note: "credential not token68", args: []string{"config", "nginx", "--credential-file", badCred, "--users", usersFile, "--pool", "p=127.0.0.1:1"}, code: 2, want: "--credential-file " + badCred + ": not a bearer credential"},
		{note: "no pool", args: append([]string{"config", "nginx"}, base...), code: 2, want: "--pool: give at least one pool"},
		{note: "pool without =", args: append([]string{"config", "nginx"}, with("--pool", "127.0.0.1:1")...), code: 2, want: "--pool: \"127.0.0.1:1\": want NAME=HOST:PORT"},
		{note: "pool name", args: append([]string{"config", "nginx"}, with("--pool", "Bad_Name=127.0.0.1:1")...), code: 2, want: "--pool: \"Bad_Name\": a pool name must match"},
		{note: "pool server without port", args: append([]string{"config", "nginx"}, with("--pool", "p=127.0.0.1")...), code: 2, want: "--pool: pool \"p\""},
		{note: "pool server https", args: append([]string{"config", "nginx"}, with("--pool", "p=https://127.0.0.1:1")...), code: 2, want: "scheme must be http"},
		{note: "pool twice", args: append([]string{"config", "nginx"}, with("--pool", "p=127.0.0.1:1", "--pool", "p=127.0.0.1:2")...), code: 2, want: "--pool: pool \"p\" given twice"},
		{note: "server twice", args: append([]string{"config", "nginx"}, with("--pool", "p=127.0.0.1:1,127.0.0.1:1")...), code: 2, want: "given twice"},
		{note: "several pools, no default", args: append([]string{"config", "nginx"}, with("--pool", "a=127.0.0.1:1", "--pool", "b=127.0.0.1:2")...), code: 2, want: "--default: name the pool for MCP session traffic, one of a, b"},
		{note: "default unknown", args: append([]string{"config", "nginx"}, with("--pool", "a=127.0.0.1:1", "--default", "c")...), code: 2, want: "--default: \"c\" is not one of the pools a"},
		{note: "listen", args: append([]string{"config", "nginx"}, with("--pool", "a=127.0.0.1:1", "--listen", "8080")...), code: 2, want: "--listen:"},
		{note: "authzd with a path", args: append([]string{"config", "nginx"}, with("--pool", "a=127.0.0.1:1", "--authzd", "http://127.0.0.1:8080/v1")...), code: 2, want: "--authzd:"},
		{note: "no users", args: []string{"config", "traefik", "--credential-file", credFile, "--pool", "a=127.0.0.1:1", "--out", dir}, code: 2, want: "--users: traefik authenticates"},
		{note: "users not bcrypt", args: []string{"config", "caddy", "--credential-file", credFile, "--users", badUsers, "--pool", "a=127.0.0.1:1"}, code: 2, want: "--users: " + badUsers + " line 1: user \"alice\": the hash is not a bcrypt hash"},
		{note: "envoy without issuer", args: []string{"config", "envoy", "--credential-file", credFile, "--pool", "a=127.0.0.1:1"}, code: 2, want: "--jwt-issuer"},
		{note: "envoy without jwks", args: []string{"config", "envoy", "--credential-file", credFile, "--pool", "a=127.0.0.1:1", "--jwt-issuer", "https://idp"}, code: 2, want: "--jwt-jwks"},
		{note: "envoy grpc", args: []string{"config", "envoy", "--credential-file", credFile, "--pool", "a=127.0.0.1:1", "--jwt-issuer", "https://idp", "--jwt-jwks", "/j", "--authzd-grpc", "nope"}, code: 2, want: "--authzd-grpc:"},
		{note: "traefik needs --out", args: append([]string{"config", "traefik"}, with("--pool", "a=127.0.0.1:1")...), code: 2, want: "--out DIR is required for traefik"},
	} {
		t.Run(tc.note, func(t *testing.T) {
			t.Setenv(gatewayconf.CredentialEnv, tc.env)
			t.Setenv("FCD_URL", "")
			var out, errb bytes.Buffer
			code := run(context.Background(), append([]string{"gateway"}, tc.args...), nil, &out, &errb)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stderr %s", code, tc.code, errb.String())
			}
			first, _, _ := strings.Cut(errb.String(), "\n")
			if tc.code == 0 {
				if out.Len() == 0 {
					t.Fatal("nothing written")
				}
				if tc.note == "help" && (!strings.Contains(out.String(), "Example:") || !strings.Contains(out.String(), "-credential-file")) {
					t.Errorf("help lacks the example or the flags:\n%s", out.String())
				}
				return
			}
			if !strings.Contains(first, tc.want) {
				t.Errorf("stderr %q, want %q", first, tc.want)
			}
			if goInternals.MatchString(first) {
				t.Errorf("stderr %q shows Go internals", first)
			}
			if out.Len() != 0 {
				t.Errorf("wrote %d bytes to stdout on an error", out.Len())
			}
		})
	}
}

// TestGatewayConfigRenders checks what `authzd gateway config` writes, per
// kind: the flags' pools (every server), default pool, authzd and
// credential in the configuration; --out writes the same main file as
// stdout, the other files beside it, all 0600; the credential never on
// stderr.
func TestGatewayConfigRenders(t *testing.T) {
	t.Setenv(gatewayconf.CredentialEnv, "")
	credFile, usersFile, credential := gatewayFiles(t)
	common := []string{"--credential-file", credFile, "--authzd", "http://127.0.0.1:7070", "--listen", "127.0.0.1:8000",
		"--pool", "github-v1-4=127.0.0.1:9014,127.0.0.1:9015", "--pool", "github-v1-3=http://127.0.0.1:9013", "--default", "github-v1-4"}
	users, err := os.ReadFile(usersFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		kind  string
		extra []string
		files []string
		want  map[string][]string // file → substrings it must contain
	}{
		{kind: "nginx", extra: []string{"--users", usersFile}, files: []string{"nginx.conf", "fcd-users"}, want: map[string][]string{
			"nginx.conf": {"listen 127.0.0.1:8000;", "upstream fcd_pool_github-v1-4 {\n        server 127.0.0.1:9014;\n        server 127.0.0.1:9015;",
				"upstream fcd_pool_github-v1-3 {\n        server 127.0.0.1:9013;", `""        fcd_pool_github-v1-4;`,
				"server 127.0.0.1:7070;", `"Bearer ` + credential + `"`, "auth_basic_user_file fcd-users;", `proxy_set_header Fcd-Recovery-Of "";`},
			"fcd-users": {"alice:$2a$04$", "bob:$2a$04$"},
		}},
		{kind: "caddy", extra: []string{"--users", usersFile}, files: []string{"Caddyfile"}, want: map[string][]string{
			"Caddyfile": {"http://:8000 {", "bind 127.0.0.1", "reverse_proxy @pool1 http://127.0.0.1:9014 http://127.0.0.1:9015 {",
				"reverse_proxy @pool0 http://127.0.0.1:9013 {", "reverse_proxy @session http://127.0.0.1:9014 http://127.0.0.1:9015 {",
				"forward_auth http://127.0.0.1:7070 {", `"Bearer ` + credential + `"`, "alice $2a$04$", "request_header -Fcd-Recovery-Of"},
		}},
		{kind: "envoy", extra: []string{"--jwt-issuer", "https://idp.example", "--jwt-jwks", "/etc/envoy/callers.jwks.json"}, files: []string{"envoy.yaml"}, want: map[string][]string{
			"envoy.yaml": {"port_value: 8000", "address: 127.0.0.1, port_value: 9015", "cluster: fcd_pool_github-v1-4", `issuer: "https://idp.example"`, `"Bearer ` + credential + `"`, "remove: fcd-recovery-of"},
		}},
		{kind: "traefik", extra: []string{"--users", usersFile}, files: []string{"traefik.yml", "traefik-dynamic.yml"}, want: map[string][]string{
			"traefik.yml":         {`address: "127.0.0.1:8000"`, `address: "127.0.0.1:8481"`, "traefik-dynamic.yml\""},
			"traefik-dynamic.yml": {`- url: "http://127.0.0.1:9014"` + "\n" + `          - url: "http://127.0.0.1:9015"`, `"http://127.0.0.1:7070/v1/forward_auth"`, `"Bearer ` + credential + `"`, "Fcd-Recovery-Of: \"\""},
		}},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			args := append(append([]string{"gateway", "config", tc.kind}, common...), tc.extra...)
			var stdout, errb bytes.Buffer
			if tc.kind != "traefik" {
				if code := run(context.Background(), args, nil, &stdout, &errb); code != 0 {
					t.Fatalf("exit %d: %s", code, errb.String())
				}
			}
			out := filepath.Join(t.TempDir(), "gw")
			var errOut bytes.Buffer
			if code := run(context.Background(), append(args, "--out", out), nil, &bytes.Buffer{}, &errOut); code != 0 {
				t.Fatalf("--out: exit %d: %s", code, errOut.String())
			}
			if strings.Contains(errb.String()+errOut.String(), credential) {
				t.Fatal("the credential was printed on stderr")
			}
			entries, err := os.ReadDir(out)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
				fi, err := e.Info()
				if err != nil || fi.Mode().Perm() != 0o600 {
					t.Errorf("%s: mode %v (%v), want 0600", e.Name(), fi.Mode(), err)
				}
			}
			if strings.Join(names, ",") != strings.Join(sortedCopy(tc.files), ",") {
				t.Fatalf("--out wrote %v, want %v", names, tc.files)
			}
			for file, wants := range tc.want {
				text, err := os.ReadFile(filepath.Join(out, file))
				if err != nil {
					t.Fatal(err)
				}
				for _, w := range wants {
					if !strings.Contains(string(text), w) {
						t.Errorf("%s lacks %q", file, w)
					}
				}
				if strings.Contains(string(text), "{{") {
					t.Errorf("%s: template text left", file)
				}
			}
			if tc.kind != "traefik" {
				main, _ := os.ReadFile(filepath.Join(out, tc.files[0]))
				if !bytes.Equal(main, stdout.Bytes()) {
					t.Errorf("stdout differs from --out's %s", tc.files[0])
				}
			}
			if tc.kind == "nginx" {
				got, _ := os.ReadFile(filepath.Join(out, "fcd-users"))
				if want := strings.TrimPrefix(string(users), "# clients of the gateway\n"); string(got) != want {
					t.Errorf("fcd-users %q, want the users of %s", got, usersFile)
				}
			}
			if tc.kind == "traefik" {
				abs, _ := filepath.Abs(filepath.Join(out, "traefik-dynamic.yml"))
				static, _ := os.ReadFile(filepath.Join(out, "traefik.yml"))
				if !strings.Contains(string(static), `filename: "`+abs+`"`) {
					t.Errorf("traefik.yml does not read %s", abs)
				}
			}
		})
	}
}

func sortedCopy(s []string) []string {
	c := append([]string{}, s...)
	for i := range c {
		for j := i + 1; j < len(c); j++ {
			if c[j] < c[i] {
				c[i], c[j] = c[j], c[i]
			}
		}
	}
	return c
}

// TestGatewayUser: `authzd gateway user` adds a user with the bcrypt hash
// of the password read from standard input to the users file (0600), which
// the gateway configurations accept; a second user is appended, a name
// already there is refused and the file is unchanged, and bad command
// lines name what is missing.
func TestGatewayUser(t *testing.T) {
	users := filepath.Join(t.TempDir(), "users")
	add := func(stdin string, args ...string) (int, string) {
		var out, errb bytes.Buffer
		code := run(context.Background(), append([]string{"gateway", "user"}, args...), strings.NewReader(stdin), &out, &errb)
		return code, errb.String()
	}
	if code, msg := add("alice-password\n", "--users", users, "alice"); code != 0 {
		t.Fatalf("add alice: %d %s", code, msg)
	}
	if code, msg := add("bob-password", "bob", "--users", users); code != 0 {
		t.Fatalf("add bob (no newline): %d %s", code, msg)
	}
	data, err := os.ReadFile(users)
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(users); fi.Mode().Perm() != 0o600 {
		t.Errorf("users file mode %v", fi.Mode().Perm())
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 2 {
		t.Fatalf("users file: %q", data)
	}
	for i, want := range []struct{ name, password string }{{"alice", "alice-password"}, {"bob", "bob-password"}} {
		name, hash, _ := strings.Cut(lines[i], ":")
		if name != want.name || bcrypt.CompareHashAndPassword([]byte(hash), []byte(want.password)) != nil {
			t.Errorf("line %d %q: want %s with the hash of its password", i, lines[i], want.name)
		}
	}
	if code, msg := add("other\n", "--users", users, "alice"); code == 0 || !strings.Contains(msg, `"alice"`) {
		t.Errorf("a second alice: %d %s", code, msg)
	}
	if again, _ := os.ReadFile(users); !bytes.Equal(again, data) {
		t.Error("a refused user changed the file")
	}
	// The file is what the configurations take.
	cred := filepath.Join(t.TempDir(), "gateway.secret")
	if err := os.WriteFile(cred, []byte("fcd_gateway_secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"gateway", "config", "caddy", "--pool", "p=127.0.0.1:9000", "--users", users, "--credential-file", cred},
		nil, &out, &errb); code != 0 || !strings.Contains(out.String(), "alice") {
		t.Fatalf("gateway config caddy with the users file: %d %s", code, errb.String())
	}
	for _, c := range []struct {
		stdin string
		args  []string
		want  string
	}{
		{"pw\n", []string{"--users", users}, "NAME"},
		{"pw\n", []string{"carol"}, "--users"},
		{"\n", []string{"--users", users, "carol"}, "no password"},
		{"pw\n", []string{"--users", users, "carol dan"}, "carol dan"},
	} {
		if code, msg := add(c.stdin, c.args...); code == 0 || !strings.Contains(msg, c.want) {
			t.Errorf("gateway user %v: %d %s, want an error naming %q", c.args, code, msg, c.want)
		}
	}
}
