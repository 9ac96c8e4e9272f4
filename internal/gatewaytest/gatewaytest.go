// Package gatewaytest runs real gateways (nginx, Caddy) for tests, with the
// example configurations of examples/gateways rendered by `authzd gateway
// config` (its function, gatewayconf.Configure, or with Config.Command the
// built command itself, given the same flags): the files an operator gets
// are the files the tests run. A gateway is rendered into a temporary
// directory, started on a free loopback port with no root-owned or global
// path, and stopped when the test ends; its logs are printed if the test
// failed.
//
// The binaries must be installed (.ci/run installs Debian's nginx and
// caddy); a missing one fails the test rather than skipping it.
//
// An end-to-end test runs every gateway kind against real authzd and MCP
// backends:
//
//	for _, kind := range gatewaytest.Kinds {
//		t.Run(kind, func(t *testing.T) {
//			gw := gatewaytest.Start(t, kind, gatewaytest.Config{
//				Authzd:     authzdURL, // http://127.0.0.1:port
//				Credential: gatewayCredential,
//				Pools:      map[string]string{"github-v1-4": v14URL, "github-v1-3": v13URL},
//				Default:    "github-v1-4",
//				Users:      map[string]string{"alice": "alice-password"},
//			})
//			transport := &mcp.StreamableClientTransport{
//				Endpoint: gw.URL + "/mcp",
//				HTTPClient: &http.Client{Transport: gatewaytest.FormationTransport(
//					gatewaytest.BasicAuth(nil, "alice", "alice-password"))},
//			}
//			// ... mcp.NewClient(...).Connect(ctx, transport, nil); CallTool with
//			// Meta{gatewaytest.FormationMetaKey: formationID} ...
//		})
//	}
package gatewaytest

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/cmdtest"
	"github.com/fcd-authz/fcd/internal/gatewayconf"
	"golang.org/x/crypto/bcrypt"
)

// Kinds of gateway this package runs, for table-driven tests.
const (
	Nginx = "nginx"
	Caddy = "caddy"
)

// Kinds lists every gateway this package runs.
var Kinds = []string{Nginx, Caddy}

// Config is what a gateway is rendered with.
type Config struct {
	// Authzd is authzd's HTTP base URL, scheme://host:port with no path,
	// e.g. "http://127.0.0.1:7070". The gateway calls Authzd +
	// "/v1/forward_auth".
	Authzd string
	// Credential is the bearer credential of role gateway the gateway
	// presents to authzd (token68 syntax).
	Credential string
	// Pools maps each pool name, as authzd returns it in Fcd-Target, to
	// the base URL of its upstream (scheme://host:port, no path). The
	// request's path and query go upstream unchanged. To make a gateway
	// route a pool to the wrong backend, map the pool to that backend.
	Pools map[string]string
	// Default names the pool (a key of Pools) that gets requests authzd
	// lets through without Fcd-Target: MCP session traffic. Empty: such
	// requests are answered 502 by the gateway.
	Default string
	// Users maps each client the gateway authenticates (HTTP basic
	// authentication) to its password; at least one is required, since
	// the examples always authenticate. The gateway names the user to
	// authzd in Fcd-Caller, so a user's calls must be formed with the user
	// name as their principal. Passwords are hashed with bcrypt's least
	// cost, which keeps each request's check cheap; send them with
	// [BasicAuth].
	Users map[string]string
	// Command, when set, is the path of a built authzd: the configuration
	// is then written by running `authzd gateway config KIND --out DIR`
	// with the flags [Config.Args] makes, as an operator would. Unset, the
	// same flags go to gatewayconf.Configure in this process, which is what
	// the command runs: either way the gateway runs what the command
	// renders.
	Command string
}

// Args returns the flags of `authzd gateway config` that render cfg for a
// gateway listening on listen, its credential and users written into dir
// (files the flags name) and its configuration into out.
func (cfg Config) Args(listen, dir, out string) ([]string, error) {
	credFile := filepath.Join(dir, "gateway.credential")
	if err := os.WriteFile(credFile, []byte(cfg.Credential+"\n"), 0o600); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(cfg.Users))
	for name := range cfg.Users {
		names = append(names, name)
	}
	sort.Strings(names)
	var users []gatewayconf.User
	for _, name := range names {
		u, err := gatewayconf.NewUser(name, cfg.Users[name], bcrypt.MinCost)
		if err != nil {
			return nil, err
		}
		users = append(users, u)
	}
	htpasswd, err := gatewayconf.Htpasswd(users)
	if err != nil {
		return nil, err
	}
	usersFile := filepath.Join(dir, "users.htpasswd")
	if err := os.WriteFile(usersFile, htpasswd, 0o600); err != nil {
		return nil, err
	}
	def := cfg.Default
	if def == "" {
		def = "none"
	}
	args := []string{"--authzd", cfg.Authzd, "--credential-file", credFile, "--users", usersFile,
		"--listen", listen, "--default", def, "--out", out}
	pools := make([]string, 0, len(cfg.Pools))
	for name := range cfg.Pools {
		pools = append(pools, name)
	}
	sort.Strings(pools)
	for _, name := range pools {
		args = append(args, "--pool", name+"="+cfg.Pools[name])
	}
	return args, nil
}

// Gateway is a running gateway.
type Gateway struct {
	// Kind is Nginx or Caddy.
	Kind string
	// URL is the gateway's base URL, e.g. "http://127.0.0.1:34567"; send
	// client requests (the MCP endpoint, e.g. URL+"/mcp") there.
	URL string
	// Addr is the host:port the gateway listens on.
	Addr string
	// Dir holds the rendered configuration, logs and temporary files.
	Dir string
	// ConfigFile is the rendered configuration.
	ConfigFile string

	t        testing.TB
	cmd      *exec.Cmd
	out      *cmdtest.SyncBuffer // the process's stdout and stderr
	done     chan struct{}
	waitErr  error
	stopOnce sync.Once
}

// Start starts a gateway of the given kind (Nginx or Caddy).
func Start(t testing.TB, kind string, cfg Config) *Gateway {
	t.Helper()
	switch kind {
	case Nginx:
		return StartNginx(t, cfg)
	case Caddy:
		return StartCaddy(t, cfg)
	}
	t.Fatalf("gatewaytest: unknown gateway kind %q (want one of %v)", kind, Kinds)
	return nil
}

// StartNginx renders examples/gateways/nginx.conf with cfg and runs
// nginx on it, on a free loopback port, until the test ends.
func StartNginx(t testing.TB, cfg Config) *Gateway {
	t.Helper()
	bin := binary(t, Nginx, "/usr/sbin/nginx")
	return start(t, Nginx, gatewayconf.Nginx, cfg, func(dir, conf string) *exec.Cmd {
		// -p: relative paths in the file (pid, logs, temporary files) are
		// inside dir. -e: the log nginx writes before it has read the
		// file. daemon off: stay in the foreground, a child of the test.
		// The example leaves worker_processes to the command line; two
		// workers keep many parallel tests light on big machines.
		global := "daemon off; worker_processes 2;"
		if os.Geteuid() == 0 {
			// Started as root, nginx runs its workers as "nobody", who
			// cannot enter the test's 0700 temporary directory (request
			// bodies are buffered there). The example has no user
			// directive; name root here.
			global += " user root;"
		}
		return exec.Command(bin, "-p", dir+string(filepath.Separator), "-c", conf,
			"-e", filepath.Join(dir, "error.log"), "-g", global)
	})
}

// StartCaddy renders examples/gateways/Caddyfile with cfg and runs caddy
// on it, on a free loopback port, until the test ends.
func StartCaddy(t testing.TB, cfg Config) *Gateway {
	t.Helper()
	bin := binary(t, Caddy, "/usr/bin/caddy")
	return start(t, Caddy, gatewayconf.Caddyfile, cfg, func(dir, conf string) *exec.Cmd {
		cmd := exec.Command(bin, "run", "--config", conf, "--adapter", "caddyfile")
		// Caddy keeps its state (autosaved config, certificates, locks)
		// under HOME and the XDG directories: all inside dir. The
		// Caddyfile turns the admin endpoint off.
		cmd.Env = append(filteredEnv("HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME"),
			"HOME="+dir,
			"XDG_CONFIG_HOME="+filepath.Join(dir, "config"),
			"XDG_DATA_HOME="+filepath.Join(dir, "data"),
			"XDG_CACHE_HOME="+filepath.Join(dir, "cache"),
		)
		return cmd
	})
}

// ValidateCaddyfile renders the Caddyfile with cfg on a free port and runs
// "caddy validate" on it; the test fails with caddy's output if it is not
// valid.
func ValidateCaddyfile(t testing.TB, cfg Config) {
	t.Helper()
	bin := binary(t, Caddy, "/usr/bin/caddy")
	dir := t.TempDir()
	conf := render(t, Caddy, gatewayconf.Caddyfile, cfg, FreeAddr(t), dir)
	cmd := exec.Command(bin, "validate", "--adapter", "caddyfile", "--config", conf)
	cmd.Env = append(filteredEnv("HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME"),
		"HOME="+dir, "XDG_CONFIG_HOME="+filepath.Join(dir, "config"), "XDG_DATA_HOME="+filepath.Join(dir, "data"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gatewaytest: caddy validate %s: %v\n%s", conf, err, out)
	}
}

// Logs returns what the gateway wrote: its standard output and error, and
// for nginx its error and access logs.
func (g *Gateway) Logs() string {
	var b strings.Builder
	fmt.Fprintf(&b, "--- %s output\n%s", g.Kind, g.out.String())
	if g.Kind == Nginx {
		for _, name := range []string{"error.log", "access.log"} {
			data, err := os.ReadFile(filepath.Join(g.Dir, name))
			if err == nil {
				fmt.Fprintf(&b, "--- nginx %s\n%s", name, data)
			}
		}
	}
	return b.String()
}

// stopWait is how long Stop waits after SIGTERM before it kills.
const stopWait = 3 * time.Second

// Stop stops the gateway: SIGTERM, then SIGKILL to its process group if it
// is still running after 3s. nginx's SIGTERM is its fast shutdown; Caddy's
// is graceful and waits for open connections (up to the Caddyfile's
// grace_period), e.g. an MCP client's GET stream, which a test need not
// wait for. Stop is called when the test ends; calling it again is
// harmless.
func (g *Gateway) Stop() {
	g.stopOnce.Do(func() {
		select {
		case <-g.done:
			return
		default:
		}
		_ = g.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-g.done:
		case <-time.After(stopWait):
			g.t.Logf("gatewaytest: %s still running %v after SIGTERM; killing its process group", g.Kind, stopWait)
			// The process was started in its own group: workers die too.
			_ = syscall.Kill(-g.cmd.Process.Pid, syscall.SIGKILL)
			<-g.done
		}
	})
}

// Exited reports whether the gateway process has ended, and how.
func (g *Gateway) Exited() (bool, error) {
	select {
	case <-g.done:
		return true, g.waitErr
	default:
		return false, nil
	}
}

// startAttempts bounds the retries when the free port was taken between
// finding it and the gateway binding it.
const startAttempts = 3

// start renders file, starts the command newCmd builds, and waits until
// the gateway accepts connections.
func start(t testing.TB, kind, file string, cfg Config, newCmd func(dir, conf string) *exec.Cmd) *Gateway {
	t.Helper()
	var lastLogs string
	for attempt := 1; attempt <= startAttempts; attempt++ {
		dir := t.TempDir()
		addr := FreeAddr(t)
		conf := render(t, kind, file, cfg, addr, dir)
		g := &Gateway{
			Kind: kind, URL: "http://" + addr, Addr: addr, Dir: dir, ConfigFile: conf,
			t: t, out: &cmdtest.SyncBuffer{}, done: make(chan struct{}),
		}
		g.cmd = newCmd(dir, conf)
		g.cmd.Dir = dir
		g.cmd.Stdout, g.cmd.Stderr = g.out, g.out
		g.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		// A worker that outlived its master would hold the output pipe
		// open; do not let Wait hang on it.
		g.cmd.WaitDelay = 5 * time.Second
		if err := g.cmd.Start(); err != nil {
			t.Fatalf("gatewaytest: start %s: %v", kind, err)
		}
		go func() {
			g.waitErr = g.cmd.Wait()
			close(g.done)
		}()
		t.Cleanup(func() {
			g.Stop()
			if t.Failed() {
				t.Logf("gatewaytest: %s at %s, config %s\n%s", kind, g.Addr, g.ConfigFile, g.Logs())
			}
		})
		err := g.waitReady(15 * time.Second)
		if err == nil {
			return g
		}
		g.Stop()
		lastLogs = g.Logs()
		if !strings.Contains(lastLogs, "in use") {
			t.Fatalf("gatewaytest: %s did not start: %v\n%s", kind, err, lastLogs)
		}
		t.Logf("gatewaytest: %s: port %s was taken, trying another (attempt %d)", kind, addr, attempt)
	}
	t.Fatalf("gatewaytest: %s did not start after %d attempts\n%s", kind, startAttempts, lastLogs)
	return nil
}

// waitReady waits until the gateway accepts connections, or its process
// ended, or timeout passed.
func (g *Gateway) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if exited, err := g.Exited(); exited {
			return fmt.Errorf("%s exited: %v", g.Kind, err)
		}
		c, err := net.DialTimeout("tcp", g.Addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not accepting connections on %s after %v: %v", g.Kind, g.Addr, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// render writes the configuration of a gateway of kind listening on addr
// into dir, through `authzd gateway config` (cfg.Command) or the function
// it runs, and returns the path of file, the main configuration file.
func render(t testing.TB, kind, file string, cfg Config, addr, dir string) string {
	t.Helper()
	in := filepath.Join(dir, "in")
	if err := os.Mkdir(in, 0o700); err != nil {
		t.Fatalf("gatewaytest: %v", err)
	}
	args, err := cfg.Args(addr, in, dir)
	if err != nil {
		t.Fatalf("gatewaytest: config for %s: %v", kind, err)
	}
	if cfg.Command != "" {
		cmd := exec.Command(cfg.Command, append([]string{"gateway", "config", kind}, args...)...)
		cmd.Env = filteredEnv("FCD_GATEWAY", "FCD_URL")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("gatewaytest: %s gateway config %s %s: %v\n%s", cfg.Command, kind, strings.Join(args, " "), err, out)
		}
	} else {
		out, err := gatewayconf.Configure(kind, args, func(string) string { return "" }, io.Discard)
		if err != nil {
			t.Fatalf("gatewaytest: gateway config %s %s: %v", kind, strings.Join(args, " "), err)
		}
		if err := out.Write(io.Discard); err != nil {
			t.Fatalf("gatewaytest: %v", err)
		}
	}
	return filepath.Join(dir, file)
}

// binary finds a gateway's executable on PATH or at its Debian path.
func binary(t testing.TB, name, debianPath string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if _, err := os.Stat(debianPath); err == nil {
		return debianPath
	}
	t.Fatalf("gatewaytest: %s not found on PATH or at %s: install nginx/caddy (.ci/run does: apt-get install nginx caddy)", name, debianPath)
	return ""
}

// FreeAddr returns a loopback host:port that was free a moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("gatewaytest: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().String()
}

// filteredEnv is the environment without the named variables.
func filteredEnv(drop ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		keep := true
		for _, d := range drop {
			if name == d {
				keep = false
			}
		}
		if keep {
			env = append(env, kv)
		}
	}
	return env
}
