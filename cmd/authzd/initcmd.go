package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/internal/cli"
	"github.com/lestrrat-go/jwx/v2/jwa"
)

// errInitExists: init would overwrite an earlier setup.
var errInitExists = errors.New("the directory already holds an fcd setup")

// initCommand runs `authzd init [--pool POOL ...] [--listen ADDR] DIR`: a
// production-shaped setup that `serve --config DIR/authzd.yaml` accepts
// unchanged. Keys: registrar, compatibility issuer, dispatch-token
// signing, operator (private JWKs 0600, their JWKS beside them).
// Credentials: one per role, a second approver, and a backend and a
// gateway credential limited to each --pool; their secrets go to
// DIR/secrets/ID (0600, one file a credential, what every
// --credential-file takes) once, only their hashes to the credentials
// file. The configuration names them all, relative to itself; the data
// directory is DIR/data. With --etcd-endpoints the store is that external
// cluster, reached as the etcd user fcd by a client certificate in
// DIR/etcd (externalEtcd.setup); without, the embedded member, which
// generates its own credential at its first start.
func initCommand(args []string, stdout io.Writer) error {
	flags := flag.NewFlagSet("init", flag.ContinueOnError)
	var pools stringList
	flags.Var(&pools, "pool", "a backend pool: its own backend and gateway credentials (repeat for several)")
	listen := flags.String("listen", "127.0.0.1:8080", "the address serve listens on (serve TLS beyond loopback: add tlsCert and tlsKey)")
	var etcd externalEtcd
	flags.StringVar(&etcd.endpoints, "etcd-endpoints", "", "comma-separated client URLs of an external etcd cluster (https); empty: the embedded member")
	flags.StringVar(&etcd.prefix, "etcd-prefix", "/fcd/", "fcd's key prefix in the external cluster: the only range its etcd role may read and write")
	flags.StringVar(&etcd.ca, "etcd-ca", "", "PEM CA of the external cluster (copied to DIR/etcd/ca.crt)")
	flags.StringVar(&etcd.caKey, "etcd-ca-key", "", "PEM private key of --etcd-ca: sign fcd's client certificate (CN fcd) now; without it init writes DIR/etcd/fcd.csr to have signed")
	flags.StringVar(&etcd.adminCert, "etcd-admin-cert", "", "PEM client certificate of the cluster's root user: create the etcd user fcd and its role (readwrite on --etcd-prefix only)")
	flags.StringVar(&etcd.adminKey, "etcd-admin-key", "", "PEM private key of --etcd-admin-cert")
	flags.BoolVar(&etcd.enableAuth, "etcd-enable-auth", false, "also turn etcd's authentication on (creating the root user and role if missing): from then on every client of the cluster needs a user")
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %w", cli.ErrUsage, err)
	}
	if flags.NArg() != 1 {
		return fmt.Errorf("%w: init needs one DIR", cli.ErrUsage)
	}
	if err := etcd.validate(); err != nil {
		return err
	}
	dir := flags.Arg(0)
	cfgPath := filepath.Join(dir, "authzd.yaml")
	if _, err := os.Stat(cfgPath); err == nil {
		return fmt.Errorf("%w: %s exists", errInitExists, cfgPath)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.MkdirAll(filepath.Join(dir, "keys"), 0o700); err != nil {
		return err
	}
	keys := map[string]string{} // kind → public JWKS path, relative to dir
	for _, kind := range []string{"registrar", "issuer", "signing", "operator"} {
		if _, err := generateKey(dir, kind, jwa.EdDSA, true); err != nil {
			return err
		}
		keys[kind] = filepath.Join("keys", kind+"-jwks.json")
	}

	type grant struct {
		id   string
		role api.Role
		pool string
	}
	grants := []grant{
		{"registrar", api.RoleRegistrar, ""}, {"host", api.RoleHost, ""}, {"gateway", api.RoleGateway, ""},
		{"approver-1", api.RoleApprover, ""}, {"approver-2", api.RoleApprover, ""}, {"operator", api.RoleOperator, ""},
	}
	for _, p := range pools {
		if p == "" || strings.ContainsAny(p, "/ \t\n") {
			return fmt.Errorf("%w: --pool %q", cli.ErrUsage, p)
		}
		grants = append(grants, grant{"backend-" + p, api.RoleBackend, p}, grant{"gateway-" + p, api.RoleGateway, p})
	}
	if len(pools) == 0 {
		grants = append(grants, grant{"backend", api.RoleBackend, ""})
	}
	if err := os.Mkdir(filepath.Join(dir, "secrets"), 0o700); err != nil {
		return fmt.Errorf("%w: %w", errInitExists, err)
	}
	secrets := map[string]string{}
	var stored []api.Credential
	for _, g := range grants {
		secret, cred, err := api.NewCredential(g.id, g.role)
		if err != nil {
			return err
		}
		if g.pool != "" {
			cred.Pools = []string{g.pool}
		}
		secrets[g.id] = string(secret)
		stored = append(stored, cred)
	}
	if _, err := api.NewAuthenticator(stored); err != nil {
		return err
	}
	if err := writeJSONFile(filepath.Join(dir, "credentials.json"), stored, 0o600); err != nil {
		return err
	}
	for id, secret := range secrets {
		if err := writeFile(filepath.Join(dir, "secrets", id), []byte(secret+"\n"), 0o600); err != nil {
			return err
		}
	}
	var etcdConfig string
	var etcdReport map[string]any
	if etcd.given() {
		var err error
		if etcdConfig, etcdReport, err = etcd.setup(context.Background(), dir); err != nil {
			return err
		}
	}
	cfg := fmt.Sprintf(`# authzd configuration written by authzd init; run: authzd serve --config %s
# Paths are relative to this file. The secret of each credential is in
# secrets/ID (mode 0600): hand each to its party, then delete it.
listen: %q
dataDir: data
registrarKeys: %s
issuerKeys: %s
operatorKeys: %s
signingKey: keys/signing.jwk
credentials: credentials.json
`, cfgPath, *listen, keys["registrar"], keys["issuer"], keys["operator"]) + etcdConfig
	if err := writeFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return err
	}
	out := map[string]any{"config": cfgPath, "secrets": filepath.Join(dir, "secrets"),
		"registrarKey": filepath.Join(dir, "keys", "registrar.jwk"), "issuerKey": filepath.Join(dir, "keys", "issuer.jwk"),
		"operatorKey": filepath.Join(dir, "keys", "operator.jwk"), "credentials": len(stored)}
	maps.Copy(out, etcdReport)
	return printJSON(stdout, out)
}
