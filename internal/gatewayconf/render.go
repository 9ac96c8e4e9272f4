// Package gatewayconf renders fcd's gateway configurations — nginx, Caddy,
// Envoy and Traefik — for `authzd gateway config`. The templates are the
// example files in examples/gateways (embedded there, so that the command
// and the end-to-end tests, through internal/gatewaytest, use the very
// files the examples show); examples/gateways/README.md describes the
// templating scheme, and [Data] is its definition.
package gatewayconf

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/url"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"golang.org/x/crypto/bcrypt"

	"github.com/fcd-authz/fcd/examples/gateways"
)

// The example files, by name.
const (
	Nginx          = "nginx.conf"
	Caddyfile      = "Caddyfile"
	Envoy          = "envoy.yaml"
	Traefik        = "traefik.yml"
	TraefikDynamic = "traefik-dynamic.yml"
)

// files are the templates, the example files.
var files = gateways.Files

// NginxUsers is the name of nginx's user file (auth_basic_user_file), which
// nginx.conf names relative to its own directory. [Htpasswd] writes it.
const NginxUsers = "fcd-users"

// Names lists the templated example files.
func Names() []string { return []string{Nginx, Caddyfile, Envoy, Traefik, TraefikDynamic} }

// Source returns the unrendered text of the named example file.
func Source(name string) ([]byte, error) { return files.ReadFile(name) }

// Endpoint is a network address, spelled every way a configuration needs
// it. Build one with [ParseEndpoint].
type Endpoint struct {
	URL      string // scheme://host:port, no path, e.g. http://127.0.0.1:7070
	HostPort string // host:port
	Host     string // host (an IP or a name)
	Port     int
}

// IsZero reports whether e is unset, so templates can test it with "if".
func (e Endpoint) IsZero() bool { return e == Endpoint{} }

// Pool is one backend pool: the name authzd returns in Fcd-Target, and
// where its servers are.
type Pool struct {
	// Endpoint is the pool's first server, for files that name one.
	Endpoint
	Index int    // position in Data.Pools, for names that must be simple
	Name  string // the pool name, e.g. github-v1-4
	// Servers are all the pool's upstream servers (at least one, the
	// first is Endpoint), which the gateway balances requests over.
	Servers []Endpoint
}

// Data is what the example files are rendered with. The fields are the
// templating contract: a file may use any of them.
type Data struct {
	// Listen is where the gateway listens (URL is http://Listen.HostPort).
	Listen Endpoint
	// Authzd is authzd's HTTP listener (/v1/forward_auth, /v1/ext_authz/).
	Authzd Endpoint
	// AuthzdGRPC is authzd's ext_authz gRPC listener; only envoy.yaml
	// uses it.
	AuthzdGRPC Endpoint
	// Credential is the bearer credential of role gateway the gateway
	// presents to authzd.
	Credential string
	// Pools are the backend pools, sorted by name.
	Pools []Pool
	// Default names the pool (one of Pools) that gets requests authzd lets
	// through without a target: MCP session traffic. Empty: such requests
	// are answered 502.
	Default string
	// Users are the clients the gateway authenticates with HTTP basic
	// authentication (nginx, Caddy, Traefik); build them with [NewUser].
	// The gateway names the authenticated user to authzd in Fcd-Caller,
	// and authzd (serve --gateway-caller principal, its default) admits a
	// formation only for its principal. nginx reads them from its user
	// file ([Htpasswd]); Caddy and Traefik list them inline. A file that
	// authenticates by user fails to render without one.
	Users []User
	// CallerJWT is the issuer of the clients' JWTs, for gateways that
	// authenticate clients by JWT (envoy.yaml: jwt_authn, whose sub claim
	// becomes Fcd-Caller).
	CallerJWT JWTIssuer
	// TraefikRouted is Traefik's loopback entry point whose routers match
	// Fcd-Target (traefik.yml explains why there are two). NewData sets
	// 127.0.0.1:8481.
	TraefikRouted Endpoint
	// TraefikDynamicFile is the path traefik.yml's file provider reads
	// the rendered traefik-dynamic.yml from. NewData sets
	// /etc/traefik/fcd-dynamic.yml.
	TraefikDynamicFile string
}

// ClientHeaders returns the request headers of fcd's protocols that no
// backend may receive from a client: every example removes each of them
// (or replaces it with authzd's or its own value) before proxying.
// Fcd-Dispatch-Token and Fcd-Target reach a backend only as authzd set
// them; Fcd-Caller only as the gateway authenticated the client (and only
// to authzd); Fcd-Recovery-Of only as fencecheck set it from a verified
// token; Fcd-Snapshot, Fcd-Session, Fcd-Server and Fcd-Principal only as
// the gateway vouches for them (to authzd, in one-step mode). A client's
// Fcd-Formation goes to authzd, which decides on it, and no further.
func ClientHeaders() []string {
	return []string{
		"Fcd-Dispatch-Token", "Fcd-Target", "Fcd-Recovery-Of", "Fcd-Outcome", "Fcd-Problem",
		"Fcd-Caller", "Fcd-Formation", "Fcd-Snapshot", "Fcd-Session", "Fcd-Server", "Fcd-Principal",
	}
}

// User is a client the gateway authenticates with HTTP basic
// authentication.
type User struct {
	// Name is the user name: the caller id the gateway sends authzd in
	// Fcd-Caller, so the principal id of the user's formations. Letters,
	// digits and ._@+- (nothing any configuration reads as syntax).
	Name string
	// Hash is the bcrypt hash of the password ($2a$, $2b$ or $2y$), which
	// nginx (through the system's crypt), Caddy and Traefik all check.
	Hash string
}

// JWTIssuer names who signs the clients' JWTs and where its public keys are.
type JWTIssuer struct {
	// Issuer is the iss the gateway accepts, e.g. https://idp.example.
	Issuer string
	// JWKSFile is the path of a JWKS file of the issuer's public keys, as
	// the gateway sees it, e.g. /etc/envoy/callers.jwks.json.
	JWKSFile string
}

var (
	// userName is what a user name may be: it goes unquoted into the
	// Caddyfile, nginx's user file and Traefik's YAML.
	userName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}$`)
	// bcryptHash is the shape of a bcrypt hash: $2a$NN$ and 53 characters
	// of bcrypt's base64 (./A-Za-z0-9), no syntax anywhere.
	bcryptHash = regexp.MustCompile(`^\$2[aby]\$[0-9]{2}\$[./A-Za-z0-9]{53}$`)
	// jwtField is what the JWT issuer and the JWKS path (and Traefik's
	// dynamic file) may be: URL and path characters only.
	jwtField = regexp.MustCompile(`^[A-Za-z0-9:/._~%+-]+$`)
)

// NewUser returns the user name with the bcrypt hash of password, at
// cost (zero means bcrypt.DefaultCost; tests may use bcrypt.MinCost, which
// keeps each check of a request's password cheap). `caddy hash-password`
// and `htpasswd -nbB` make the same kind of hash.
func NewUser(name, password string, cost int) (User, error) {
	if !userName.MatchString(name) {
		return User{}, fmt.Errorf("user %q: a name must match %s", name, userName)
	}
	if password == "" {
		return User{}, fmt.Errorf("user %q: empty password", name)
	}
	if cost == 0 {
		cost = bcrypt.DefaultCost
	}
	h, err := bcrypt.GenerateFromPassword([]byte(password), cost)
	if err != nil {
		return User{}, fmt.Errorf("user %q: %w", name, err)
	}
	return User{Name: name, Hash: string(h)}, nil
}

// check reports a user that NewUser would not have made.
func (u User) check() error {
	if !userName.MatchString(u.Name) {
		return fmt.Errorf("user %q: a name must match %s", u.Name, userName)
	}
	if !bcryptHash.MatchString(u.Hash) {
		return fmt.Errorf("user %q: the hash is not a bcrypt hash", u.Name)
	}
	return nil
}

// Htpasswd returns the user file nginx reads (auth_basic_user_file,
// [NginxUsers]): one "name:hash" line per user, the format of Apache's
// htpasswd -B.
func Htpasswd(users []User) ([]byte, error) {
	var b bytes.Buffer
	for _, u := range users {
		if err := u.check(); err != nil {
			return nil, err
		}
		fmt.Fprintf(&b, "%s:%s\n", u.Name, u.Hash)
	}
	return b.Bytes(), nil
}

// DefaultPool returns the pool Default names, or nil.
func (d Data) DefaultPool() *Pool {
	for i := range d.Pools {
		if d.Pools[i].Name == d.Default {
			return &d.Pools[i]
		}
	}
	return nil
}

var (
	// poolName is what a pool name may be in a gateway configuration: it
	// becomes part of nginx upstream names and YAML keys unquoted.
	poolName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	// token68 is the syntax of a bearer credential (RFC 7235); it holds
	// nothing nginx ($), Caddy ({}) or YAML would read as syntax.
	token68 = regexp.MustCompile(`^[A-Za-z0-9._~+/-]+=*$`)
)

// ParseEndpoint parses an http:// URL without a path (or a bare host:port,
// taken as http) into an Endpoint.
func ParseEndpoint(s string) (Endpoint, error) {
	raw := s
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		u, err = url.Parse("http://" + s)
		if err != nil {
			return Endpoint{}, fmt.Errorf("endpoint %q: %v", raw, err)
		}
	}
	if u.Scheme != "http" {
		return Endpoint{}, fmt.Errorf("endpoint %q: scheme must be http", raw)
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return Endpoint{}, fmt.Errorf("endpoint %q: want scheme://host:port with no path, query or user", raw)
	}
	host, portText, err := net.SplitHostPort(u.Host)
	if err != nil {
		return Endpoint{}, fmt.Errorf("endpoint %q: want an explicit port: %v", raw, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 1 || port > 65535 {
		return Endpoint{}, fmt.Errorf("endpoint %q: bad port", raw)
	}
	hp := net.JoinHostPort(host, portText)
	return Endpoint{URL: "http://" + hp, HostPort: hp, Host: host, Port: port}, nil
}

// NewData checks and assembles template data. pools maps pool name to its
// upstream URL, or to several separated by commas (the pool's servers);
// def names the default pool or is empty.
func NewData(listen, authzd, credential string, pools map[string]string, def string) (Data, error) {
	var d Data
	var err error
	if d.Listen, err = ParseEndpoint(listen); err != nil {
		return Data{}, fmt.Errorf("listen: %w", err)
	}
	if d.Authzd, err = ParseEndpoint(authzd); err != nil {
		return Data{}, fmt.Errorf("authzd: %w", err)
	}
	if !token68.MatchString(credential) {
		return Data{}, fmt.Errorf("credential: want a non-empty token68 (letters, digits, ._~+/- and trailing =)")
	}
	d.Credential = credential
	if len(pools) == 0 {
		return Data{}, fmt.Errorf("pools: none")
	}
	names := make([]string, 0, len(pools))
	for n := range pools {
		names = append(names, n)
	}
	sort.Strings(names)
	for i, n := range names {
		if !poolName.MatchString(n) {
			return Data{}, fmt.Errorf("pool %q: name must match %s", n, poolName)
		}
		var servers []Endpoint
		seen := map[string]bool{}
		for _, u := range strings.Split(pools[n], ",") {
			e, err := ParseEndpoint(strings.TrimSpace(u))
			if err != nil {
				return Data{}, fmt.Errorf("pool %q: %w", n, err)
			}
			if seen[e.HostPort] {
				return Data{}, fmt.Errorf("pool %q: server %s given twice", n, e.HostPort)
			}
			seen[e.HostPort] = true
			servers = append(servers, e)
		}
		d.Pools = append(d.Pools, Pool{Endpoint: servers[0], Index: i, Name: n, Servers: servers})
	}
	d.Default = def
	if def != "" && d.DefaultPool() == nil {
		return Data{}, fmt.Errorf("default pool %q is not one of the pools %v", def, names)
	}
	if d.TraefikRouted, err = ParseEndpoint("127.0.0.1:8481"); err != nil {
		return Data{}, err
	}
	d.TraefikDynamicFile = "/etc/traefik/fcd-dynamic.yml"
	return d, nil
}

// Render renders the named example file with d. A field the file uses and
// d lacks is an error, never an empty string in a configuration.
func Render(name string, d Data) ([]byte, error) {
	src, err := files.ReadFile(name)
	if err != nil {
		return nil, err
	}
	for _, u := range d.Users {
		if err := u.check(); err != nil {
			return nil, err
		}
	}
	for field, v := range map[string]string{"CallerJWT.Issuer": d.CallerJWT.Issuer, "CallerJWT.JWKSFile": d.CallerJWT.JWKSFile, "TraefikDynamicFile": d.TraefikDynamicFile} {
		if v != "" && !jwtField.MatchString(v) {
			return nil, fmt.Errorf("%s %q: want URL or path characters only", field, v)
		}
	}
	tmpl, err := template.New(name).Option("missingkey=error").Funcs(template.FuncMap{"need": need}).Parse(string(src))
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := tmpl.Execute(&b, d); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// need is the templates' "need FIELD VALUE": VALUE, or an error naming
// FIELD when it is empty (an empty string or list), so that a file that
// uses it cannot render without it.
func need(field string, v any) (any, error) {
	rv := reflect.ValueOf(v)
	if !rv.IsValid() || rv.IsZero() || ((rv.Kind() == reflect.Slice || rv.Kind() == reflect.Map) && rv.Len() == 0) {
		return nil, errors.New(field + " is required: " + strings.TrimSpace(needWhy[field]))
	}
	return v, nil
}

var needWhy = map[string]string{
	"Users":              "the gateway authenticates its clients and names them to authzd in Fcd-Caller; give at least one user (NewUser)",
	"CallerJWT.Issuer":   "the gateway authenticates its clients by JWT; name the issuer",
	"CallerJWT.JWKSFile": "the gateway authenticates its clients by JWT; give the issuer's JWKS file",
	"TraefikRouted":      "Traefik's loopback entry point that routes by Fcd-Target (NewData sets one)",
	"TraefikDynamicFile": "where Traefik reads the dynamic configuration (NewData sets one)",
}
