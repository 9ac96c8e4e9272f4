// Command authzd is fcd's authorization server and its operator CLI.
//
//	authzd serve [--dev] [--listen ADDR] [--data-dir DIR] [--etcd-endpoints URLS] [--config FILE] ...
//	authzd manifest sign --key FILE [FILE|-]
//	authzd manifest verify --keys JWKS [FILE|-]
//	authzd manifest lint [--json] [FILE|-]
//	authzd manifest digest [--tools] [FILE|-]
//	authzd cert sign --key FILE [--valid-for D] [FILE|-]
//	authzd cert verify --keys JWKS [FILE|-]
//	authzd policy test [-v] [DIR]
//	authzd policy eval --input FILE [--policy-dir DIR]
//	authzd credential new --role ROLE [--id ID] [--pool POOL ...]
//	authzd lease resolve --key FILE --outcome effect|no_effect --reason TEXT [--operator ID] [--url URL] [--credential-file FILE] LEASE
//	authzd lease sign-resolution --key FILE --outcome effect|no_effect --reason TEXT [--operator ID] LEASE
//	authzd audit verify [--jwks FILE|URL] [--operator-keys FILE] [--json] [DIR]
//	authzd audit formation ID [DIR]
//	authzd store status | snapshot save FILE | snapshot restore FILE | compact [REV] | defrag | alarm list | alarm disarm
//	authzd gateway config nginx|caddy|envoy|traefik [flags]
//	authzd gateway user --users FILE NAME
//
// Every command reads a file or stdin and writes stdout; errors go to
// stderr with a non-zero exit status.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/fcd-authz/fcd/internal/cli"
)

const usage = `usage:
  authzd serve [flags]                      run the server (--dev for a local setup; -h for flags)
  authzd manifest sign --key FILE [FILE|-]  sign a manifest as a JWS with a registrar key
  authzd manifest verify --keys JWKS [FILE|-]
                                            verify a signed manifest; print its epoch
  authzd manifest lint [--json] [FILE|-]    MCP+ lint of a manifest (exit 1 on errors)
  authzd manifest digest [--tools] [FILE|-] print the epoch id (and tool digests)
  authzd manifest register FILE|-           register a signed manifest (as the registrar)
  authzd formation show|pending|approve|deny [ID] [--reason TEXT] [--json]
                                            a call's record with what differs between the
                                            releases it may run on, the calls awaiting approval
                                            (tables; --json: authzd's answer), and an
                                            approver's decision on the record shown now
  authzd cert sign --key FILE [--valid-for D] [FILE|-]
                                            sign a compatibility certificate with an issuer key
                                            (--valid-for: valid from now for D, e.g. 720h)
  authzd cert verify --keys JWKS [FILE|-]   verify a signed certificate against issuer keys;
                                            print its id, epochs, tool, expiry and signer
  authzd policy test [-v] [DIR]             run the Rego tests and Cedar cases of a policy set
                                            (default: the embedded defaults); exit 1 on failure
  authzd policy eval --input FILE [--policy-dir DIR]
                                            print the combined decision for a policy input
  authzd credential new --role ROLE [--id ID] [--pool POOL ...] [--append FILE]
                                            create a bearer credential and its stored hash
                                            (--pool: a backend or gateway limited to POOL;
                                            --append: add it to the --credentials FILE and
                                            print only the secret)
  authzd lease resolve --key FILE --outcome effect|no_effect --reason TEXT [--operator ID]
                [--url URL] [--credential-file FILE] LEASE
                                            sign a resolution of an uncertain lease with an
                                            operator key and send it (--url: default $FCD_URL;
                                            credential: default $FCD_OPERATOR; --operator: who
                                            decides, default the login name); exit 1 naming
                                            the problem if refused
  authzd lease sign-resolution --key FILE --outcome effect|no_effect --reason TEXT
                [--operator ID] LEASE       print the signed resolution only (send it as
                                            {"resolution": JWS} to POST /v1/leases/LEASE/resolve)
  authzd audit verify [--jwks FILE|URL] [--operator-keys FILE] [--json] [DIR]
                                            verify the audit trail's hash chains and signed
                                            checkpoints (default DIR: fcd-data/audit), the
                                            properties, and with --operator-keys every signed
                                            resolution; exit 1 naming each problem
  authzd audit formation ID [DIR]           print what the trail holds of one formation (also
                                            once etcd collected it), as JSON lines
  authzd store status | snapshot save FILE | snapshot restore [--force] FILE | compact [REV] | defrag |
               alarm list | alarm disarm [--force]
                                            maintain the store without etcdctl, connecting as
                                            serve does (--data-dir, --etcd-endpoints, TLS flags
                                            or --config); restore needs authzd stopped
                                            (docs/operations.md)
  authzd init [--pool POOL ...] [--listen ADDR] [--etcd-endpoints URLS --etcd-ca FILE
                [--etcd-ca-key FILE] [--etcd-admin-cert FILE --etcd-admin-key FILE]
                [--etcd-enable-auth] [--etcd-prefix P]] DIR
                                            write a production-shaped setup: keys, credentials
                                            (two approvers, per-pool backends), secrets/ID and
                                            DIR/authzd.yaml for serve --config; with
                                            --etcd-endpoints, fcd's etcd client certificate
                                            (CN fcd) and its user and role limited to its prefix
                                            (docs/trust.md)
  authzd keys new --kind KIND [--alg EdDSA|ES256] [--out DIR]
                                            generate a key pair: KIND.jwk (private, 0600) and
                                            KIND-jwks.json; KIND is registrar, issuer, signing
                                            or operator
  authzd front [--pool POOL=URL ... | --gateway URL] [--jwt-issuer ISS --jwt-jwks URL | --tokens FILE]
               [--listen ADDR] [--stdio]   the MCP front for unmodified MCP clients: lists each session's
                                            snapshot, forms every call for the bearer's user, waits for
                                            approvals, admits and sends it (docs/front.md)
  authzd gateway config nginx|caddy|envoy|traefik --pool NAME=HOST:PORT[,...] ... [--out DIR]
                                            render the example gateway configuration for your
                                            authzd (--authzd), pools (--pool, --default) and
                                            clients (--users; envoy: --jwt-issuer, --jwt-jwks);
                                            the credential from --credential-file or
                                            $FCD_GATEWAY; -h for every flag and an example
  authzd gateway user --users FILE NAME     add a client the gateway authenticates (bcrypt; the
                                            password is read from standard input)
  authzd --version                          print the version, VCS revision and Go version
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run executes one command line and returns the exit status.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return cli.ExitStatus(stderr, "authzd", usage, dispatch(ctx, args, stdin, stdout, stderr), errLintFailed, errPolicyFailed, errTrailFailed)
}

func dispatch(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: no command", cli.ErrUsage)
	}
	switch args[0] {
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, cli.Version("authzd"))
		return nil
	case "serve":
		return serve(ctx, args[1:], stderr)
	case "init":
		return initCommand(args[1:], stdout)
	case "keys":
		if len(args) < 2 {
			return fmt.Errorf("%w: keys needs new", cli.ErrUsage)
		}
		return keysCommand(args[1], args[2:], stdout)
	case "manifest":
		if len(args) < 2 {
			return fmt.Errorf("%w: manifest needs sign, verify, lint, digest or register", cli.ErrUsage)
		}
		if args[1] == "register" {
			return manifestRegister(ctx, args[2:], stdin, stdout)
		}
		return manifestCommand(args[1], args[2:], stdin, stdout)
	case "formation":
		if len(args) < 2 {
			return fmt.Errorf("%w: formation needs show, pending, approve or deny", cli.ErrUsage)
		}
		return formationCommand(ctx, args[1], args[2:], stdout)
	case "cert":
		if len(args) < 2 {
			return fmt.Errorf("%w: cert needs sign or verify", cli.ErrUsage)
		}
		return certCommand(args[1], args[2:], stdin, stdout)
	case "policy":
		if len(args) < 2 {
			return fmt.Errorf("%w: policy needs test or eval", cli.ErrUsage)
		}
		return policyCommand(ctx, args[1], args[2:], stdin, stdout)
	case "audit":
		if len(args) < 2 {
			return fmt.Errorf("%w: audit needs verify or formation", cli.ErrUsage)
		}
		return auditCommand(ctx, args[1], args[2:], stdout)
	case "lease":
		if len(args) < 2 {
			return fmt.Errorf("%w: lease needs resolve or sign-resolution", cli.ErrUsage)
		}
		return leaseCommand(ctx, args[1], args[2:], stdout)
	case "store":
		return storeCommand(ctx, args[1:], stdout, stderr)
	case "front":
		return frontCommand(ctx, args[1:], stdin, stdout, stderr)
	case "gateway":
		return gatewayCommand(args[1:], os.Getenv, stdin, stdout, stderr)
	case "credential":
		if len(args) < 2 || args[1] != "new" {
			return fmt.Errorf("%w: credential new --role ROLE", cli.ErrUsage)
		}
		return credentialNew(args[2:], stdout)
	case "serve-doc": // hidden: go generate's, for docs/configuration.md
		return serveDoc(args[1:])
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	return fmt.Errorf("%w: unknown command %q", cli.ErrUsage, args[0])
}
