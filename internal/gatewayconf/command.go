package gatewayconf

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// The kinds of gateway `authzd gateway config` renders a configuration for.
const (
	KindNginx   = "nginx"
	KindCaddy   = "caddy"
	KindEnvoy   = "envoy"
	KindTraefik = "traefik"
)

// Kinds lists the kinds [Configure] knows, in the order the help names them.
func Kinds() []string { return []string{KindNginx, KindCaddy, KindEnvoy, KindTraefik} }

// CredentialEnv is the environment variable [Configure] reads the gateway
// credential from when --credential-file is not given: the variable
// `authzd serve --dev` exports for the gateway role.
const CredentialEnv = "FCD_GATEWAY"

// ErrFlag reports a command line [Configure] cannot use: a missing or
// ill-formed flag, named in the message. Callers print it with the usage.
var ErrFlag = errors.New("gateway config")

// File is one file of a rendered configuration.
type File struct {
	// Name is the file's name, e.g. nginx.conf; configurations of several
	// files name each other by it.
	Name string
	// Mode is the permission to write it with: 0600, since every file
	// holds the gateway credential or password hashes.
	Mode os.FileMode
	// Text is the content.
	Text []byte
}

// Output is what [Configure] produced: the files of one configuration and
// where the command line asked them written.
type Output struct {
	// Kind is the gateway kind.
	Kind string
	// Files are the rendered files, the main configuration first.
	Files []File
	// Out is the --out directory, or empty for standard output (which
	// takes a configuration of one file only: Files[0]).
	Out string
}

// Usage is the help of `authzd gateway config`, flags excluded.
const Usage = `usage: authzd gateway config nginx|caddy|envoy|traefik [flags]

Renders the example gateway configuration (examples/gateways) for your
authzd, pools and clients: the gateway authenticates each client, asks
authzd about every request, routes an admitted call to the pool authzd
names in Fcd-Target and session traffic to --default, strips the Fcd-*
headers a client must not send, and passes authzd's refusals (status,
Fcd-Problem, Retry-After, problem+json) to the client.

Writes the configuration to standard output, or its files into --out DIR
(mode 0600: they hold the gateway credential):
  nginx     nginx.conf, and with --out fcd-users (the --users file, which
            nginx reads from beside nginx.conf)
  caddy     Caddyfile
  envoy     envoy.yaml
  traefik   traefik.yml and traefik-dynamic.yml (--out is required)

The gateway credential (role gateway) is read from --credential-file, or
else from $FCD_GATEWAY, never from a flag's value (which ps would show).

Example:
  authzd credential new --role gateway --append credentials.json > gateway.secret
  htpasswd -cbB users.htpasswd alice "$ALICE_PASSWORD"
  authzd gateway config nginx --authzd http://127.0.0.1:8080 \
      --credential-file gateway.secret --users users.htpasswd \
      --listen 127.0.0.1:8000 \
      --pool github-v1-4=127.0.0.1:9014,127.0.0.1:9015 --pool github-v1-3=127.0.0.1:9013 \
      --default github-v1-4 --out /etc/fcd/nginx
  nginx -p /var/lib/fcd-gateway/ -c /etc/fcd/nginx/nginx.conf

Flags:
`

// options are the flags of `authzd gateway config`.
type options struct {
	listen, authzd, authzdGRPC string
	credentialFile             string
	pools                      poolFlags
	def                        string
	usersFile                  string
	jwtIssuer, jwtJWKS         string
	traefikRouted, traefikFile string
	out                        string
}

// poolFlags collects repeated --pool NAME=HOST:PORT[,HOST:PORT...].
type poolFlags []string

func (p *poolFlags) String() string     { return strings.Join(*p, " ") }
func (p *poolFlags) Set(v string) error { *p = append(*p, v); return nil }

// Configure runs the command line of `authzd gateway config KIND`: it
// parses args (the flags after KIND), reads the credential (from
// --credential-file, else getenv(CredentialEnv)) and the users file,
// checks everything into a [Data] and renders KIND's files. The command
// and the end-to-end tests (internal/gatewaytest) both call it, so a test
// runs what an operator gets. A bad command line is an [ErrFlag] naming
// the flag; -h prints the usage to help and returns flag.ErrHelp.
func Configure(kind string, args []string, getenv func(string) string, help io.Writer) (Output, error) {
	if !knownKind(kind) {
		return Output{}, fmt.Errorf("%w: unknown gateway %q (want one of %s)", ErrFlag, kind, strings.Join(Kinds(), ", "))
	}
	fs := flag.NewFlagSet("gateway config "+kind, flag.ContinueOnError)
	// The flag package prints errors with the whole usage; the caller
	// prints the error, and -h alone prints the help (to help).
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	var o options
	defAuthzd := "http://127.0.0.1:8080"
	if u := getenv("FCD_URL"); u != "" {
		defAuthzd = strings.TrimSuffix(u, "/")
	}
	fs.StringVar(&o.authzd, "authzd", defAuthzd, "authzd's HTTP base URL, http://HOST:PORT with no path (default: $FCD_URL, else http://127.0.0.1:8080)")
	fs.StringVar(&o.authzdGRPC, "authzd-grpc", "", "envoy: authzd's ext_authz gRPC listener HOST:PORT, for the gRPC variant (unset: HTTP service only)")
	fs.StringVar(&o.credentialFile, "credential-file", "", "file holding authzd's bearer credential of role gateway (default: $"+CredentialEnv+")")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8000", "HOST:PORT the gateway listens on")
	fs.Var(&o.pools, "pool", "a backend pool and its upstream servers, NAME=HOST:PORT[,HOST:PORT...], NAME as authzd returns it in Fcd-Target (repeat for each pool)")
	fs.StringVar(&o.def, "default", "", "the pool that gets MCP session traffic (requests authzd lets through without Fcd-Target): the pool of the epoch your hosts' snapshots name (docs/mcp-sessions.md); may be left out with one pool; \"none\": such requests get 502")
	fs.StringVar(&o.usersFile, "users", "", "nginx, caddy, traefik: the clients the gateway authenticates, an htpasswd file of bcrypt hashes (htpasswd -B, caddy hash-password); each user name is the principal id its calls are formed for")
	fs.StringVar(&o.jwtIssuer, "jwt-issuer", "", "envoy: the issuer (iss) of the clients' JWTs; their sub is the caller")
	fs.StringVar(&o.jwtJWKS, "jwt-jwks", "", "envoy: path of the JWKS file of the issuer's public keys, as Envoy sees it")
	fs.StringVar(&o.traefikRouted, "traefik-routed", "127.0.0.1:8481", "traefik: HOST:PORT (loopback) of the entry point that routes by Fcd-Target")
	fs.StringVar(&o.traefikFile, "traefik-dynamic-file", "", "traefik: where traefik.yml reads traefik-dynamic.yml (default: the absolute path of --out/traefik-dynamic.yml)")
	fs.StringVar(&o.out, "out", "", "directory to write the files into (created 0700; an existing file is replaced); unset: standard output")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(help, Usage)
			fs.SetOutput(help)
			fs.PrintDefaults()
			return Output{}, err
		}
		return Output{}, fmt.Errorf("%w: %v", ErrFlag, err)
	}
	if fs.NArg() > 0 {
		return Output{}, fmt.Errorf("%w: unexpected argument %q (flags come after the gateway kind)", ErrFlag, fs.Arg(0))
	}
	d, err := o.data(kind, getenv)
	if err != nil {
		return Output{}, err
	}
	files, err := Files(kind, d)
	if err != nil {
		return Output{}, fmt.Errorf("render %s: %w", kind, err)
	}
	if o.out == "" && kind == KindTraefik {
		return Output{}, fmt.Errorf("%w: --out DIR is required for traefik (two files: traefik.yml and traefik-dynamic.yml)", ErrFlag)
	}
	return Output{Kind: kind, Files: files, Out: o.out}, nil
}

func knownKind(kind string) bool {
	for _, k := range Kinds() {
		if k == kind {
			return true
		}
	}
	return false
}

// flagErr is an ErrFlag naming the flag.
func flagErr(name, format string, args ...any) error {
	return fmt.Errorf("%w: --%s: %s", ErrFlag, name, fmt.Sprintf(format, args...))
}

// data checks the flags of kind and assembles the template data.
func (o options) data(kind string, getenv func(string) string) (Data, error) {
	credential, err := o.credential(getenv)
	if err != nil {
		return Data{}, err
	}
	if _, err := ParseEndpoint(o.listen); err != nil {
		return Data{}, flagErr("listen", "%v", err)
	}
	if _, err := ParseEndpoint(o.authzd); err != nil {
		return Data{}, flagErr("authzd", "%v", err)
	}
	if len(o.pools) == 0 {
		return Data{}, flagErr("pool", "give at least one pool, NAME=HOST:PORT[,HOST:PORT...]")
	}
	pools := map[string]string{}
	for _, p := range o.pools {
		name, servers, ok := strings.Cut(p, "=")
		if !ok || name == "" || servers == "" {
			return Data{}, flagErr("pool", "%q: want NAME=HOST:PORT[,HOST:PORT...]", p)
		}
		if _, dup := pools[name]; dup {
			return Data{}, flagErr("pool", "pool %q given twice", name)
		}
		if !poolName.MatchString(name) {
			return Data{}, flagErr("pool", "%q: a pool name must match %s", name, poolName)
		}
		for _, s := range strings.Split(servers, ",") {
			if _, err := ParseEndpoint(s); err != nil {
				return Data{}, flagErr("pool", "pool %q: %v", name, err)
			}
		}
		pools[name] = servers
	}
	def := o.def
	switch {
	case def == "none":
		def = ""
	case def == "" && len(pools) == 1:
		for name := range pools {
			def = name
		}
	case def == "":
		return Data{}, flagErr("default", "name the pool for MCP session traffic, one of %s (or none: such requests get 502)", strings.Join(sortedKeys(pools), ", "))
	case pools[def] == "":
		return Data{}, flagErr("default", "%q is not one of the pools %s", def, strings.Join(sortedKeys(pools), ", "))
	}
	d, err := NewData(o.listen, o.authzd, credential, pools, def)
	if err != nil {
		return Data{}, fmt.Errorf("%w: %v", ErrFlag, err)
	}
	if d.TraefikRouted, err = ParseEndpoint(o.traefikRouted); err != nil {
		return Data{}, flagErr("traefik-routed", "%v", err)
	}
	switch {
	case o.traefikFile != "":
		d.TraefikDynamicFile = o.traefikFile
	case o.out != "":
		abs, err := filepath.Abs(filepath.Join(o.out, TraefikDynamic))
		if err != nil {
			return Data{}, flagErr("out", "%v", err)
		}
		d.TraefikDynamicFile = abs
	}
	if !jwtField.MatchString(d.TraefikDynamicFile) {
		return Data{}, flagErr("traefik-dynamic-file", "%q: want path characters only (letters, digits, /._~%%+-)", d.TraefikDynamicFile)
	}
	if o.authzdGRPC != "" {
		if d.AuthzdGRPC, err = ParseEndpoint(o.authzdGRPC); err != nil {
			return Data{}, flagErr("authzd-grpc", "%v", err)
		}
	}
	switch kind {
	case KindEnvoy:
		if o.jwtIssuer == "" {
			return Data{}, flagErr("jwt-issuer", "envoy authenticates its clients by JWT: name the issuer")
		}
		if o.jwtJWKS == "" {
			return Data{}, flagErr("jwt-jwks", "envoy authenticates its clients by JWT: give the issuer's JWKS file")
		}
		for name, v := range map[string]string{"jwt-issuer": o.jwtIssuer, "jwt-jwks": o.jwtJWKS} {
			if !jwtField.MatchString(v) {
				return Data{}, flagErr(name, "%q: want URL or path characters only", v)
			}
		}
		d.CallerJWT = JWTIssuer{Issuer: o.jwtIssuer, JWKSFile: o.jwtJWKS}
	default:
		if o.usersFile == "" {
			return Data{}, flagErr("users", "%s authenticates its clients with HTTP basic authentication: give an htpasswd file of bcrypt hashes (htpasswd -nbB NAME PASSWORD)", kind)
		}
		if d.Users, err = readUsers(o.usersFile); err != nil {
			return Data{}, err
		}
	}
	return d, nil
}

// credential reads the gateway credential from the file, else from the
// environment; surrounding white space (a file's final newline) is not
// part of it.
func (o options) credential(getenv func(string) string) (string, error) {
	c := getenv(CredentialEnv)
	source := "$" + CredentialEnv
	if o.credentialFile != "" {
		b, err := os.ReadFile(o.credentialFile)
		if err != nil {
			return "", flagErr("credential-file", "%v", err)
		}
		c, source = string(b), "--credential-file "+o.credentialFile
	}
	c = strings.TrimSpace(c)
	switch {
	case c == "" && o.credentialFile == "":
		return "", flagErr("credential-file", "the gateway's credential (role gateway) is needed: --credential-file FILE or $%s", CredentialEnv)
	case !token68.MatchString(c):
		return "", fmt.Errorf("%w: %s: not a bearer credential (want one line of letters, digits, ._~+/- and trailing =)", ErrFlag, source)
	}
	return c, nil
}

// readUsers reads an htpasswd file of bcrypt hashes.
func readUsers(path string) ([]User, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, flagErr("users", "%v", err)
	}
	var users []User
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, hash, ok := strings.Cut(line, ":")
		u := User{Name: name, Hash: hash}
		if !ok {
			return nil, flagErr("users", "%s line %d: want NAME:BCRYPT-HASH", path, n)
		}
		if err := u.check(); err != nil {
			return nil, flagErr("users", "%s line %d: %v (make one with htpasswd -nbB NAME PASSWORD)", path, n, err)
		}
		if seen[name] {
			return nil, flagErr("users", "%s line %d: user %q given twice", path, n, name)
		}
		seen[name] = true
		users = append(users, u)
	}
	if err := sc.Err(); err != nil {
		return nil, flagErr("users", "%s: %v", path, err)
	}
	if len(users) == 0 {
		return nil, flagErr("users", "%s names no user", path)
	}
	return users, nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Files renders the files of a gateway kind's configuration with d, the
// main configuration first: nginx.conf and its user file (fcd-users),
// Caddyfile, envoy.yaml, or traefik.yml and traefik-dynamic.yml.
func Files(kind string, d Data) ([]File, error) {
	var names []string
	switch kind {
	case KindNginx:
		names = []string{Nginx}
	case KindCaddy:
		names = []string{Caddyfile}
	case KindEnvoy:
		names = []string{Envoy}
	case KindTraefik:
		names = []string{Traefik, TraefikDynamic}
	default:
		return nil, fmt.Errorf("unknown gateway %q (want one of %s)", kind, strings.Join(Kinds(), ", "))
	}
	var files []File
	for _, name := range names {
		text, err := Render(name, d)
		if err != nil {
			return nil, err
		}
		files = append(files, File{Name: name, Mode: 0o600, Text: text})
	}
	if kind == KindNginx {
		users, err := Htpasswd(d.Users)
		if err != nil {
			return nil, err
		}
		files = append(files, File{Name: NginxUsers, Mode: 0o600, Text: users})
	}
	return files, nil
}

// Write writes the output: every file into o.Out (created 0700 if
// missing), or the main file to stdout when o.Out is empty.
func (o Output) Write(stdout io.Writer) error {
	if o.Out == "" {
		if len(o.Files) == 0 {
			return errors.New("gateway config: nothing rendered")
		}
		_, err := stdout.Write(o.Files[0].Text)
		return err
	}
	if err := os.MkdirAll(o.Out, 0o700); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	for _, f := range o.Files {
		p := filepath.Join(o.Out, f.Name)
		if err := os.WriteFile(p, f.Text, f.Mode); err != nil {
			return fmt.Errorf("--out: %w", err)
		}
		// WriteFile keeps an existing file's mode; the credential is in it.
		if err := os.Chmod(p, f.Mode); err != nil {
			return fmt.Errorf("--out: %w", err)
		}
	}
	return nil
}
