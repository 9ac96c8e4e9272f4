// Command fencecheck runs fcd's backend-side guard outside the backend's
// code: as a sidecar reverse proxy in front of an MCP server, or once, to
// tell whether a token would be accepted for a call.
//
//	fencecheck proxy --listen ADDR --upstream URL --pool P --artifact A --config C --generation N
//	                 (--jwks URL | --keys FILE) [--issuer I] [--server NAME]
//	                 [--authzd URL --credential-file F] [--timeout D] [--max-body N] [--log-level L]
//	                 [--log-format text|json] [--otlp-endpoint URL] [--otlp-protocol P]
//	fencecheck verify (--token T | --token-file F) --tool server/tool [--arguments JSON|@FILE]
//	                 --pool P --artifact A --config C --generation N (--jwks URL | --keys FILE) [--issuer I]
//
// verify exits 0 when the token is accepted, 1 when it is refused (or on
// an error), 2 on a command line it cannot understand.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/internal/cli"
)

const usage = `usage:
  fencecheck proxy [flags]    guard an MCP server: verify the dispatch token of every tools/call
                              before it reaches --upstream (-h for flags)
  fencecheck verify [flags]   print whether a token is accepted for a call, and why not
                              (exit 0 accepted, 1 refused; -h for flags)
  fencecheck --version        print the version, VCS revision and Go version
`

// errRejected reports a refused token; the verdict is already printed.
var errRejected = errors.New("rejected")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run executes one command line and returns the exit status.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return cli.ExitStatus(stderr, "fencecheck", usage, dispatch(ctx, args, stdin, stdout, stderr), errRejected)
}

func dispatch(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: no command", cli.ErrUsage)
	}
	switch args[0] {
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, cli.Version("fencecheck"))
		return nil
	case "proxy":
		return proxy(ctx, args[1:], stderr)
	case "verify":
		return verify(ctx, args[1:], stdin, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	return fmt.Errorf("%w: unknown command %q", cli.ErrUsage, args[0])
}

// verifierFlags are the flags that configure a fencecheck.Verifier, shared
// by both commands.
type verifierFlags struct {
	pool, artifact, config, issuer, jwks, keys string
	generation                                 int64
	// check is proxy's --check: verifier validates the flags without
	// reading --keys.
	check bool
}

// newFlagSet returns the flag set of command name, writing to stderr,
// with the verifier's flags registered into f.
func (f *verifierFlags) newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.pool, "pool", "", "this backend's pool, its manifest's pool: the only token audience accepted (required)")
	fs.StringVar(&f.artifact, "artifact", "", "the artifact this backend runs, as its manifest names it: artifact.digest, else artifact.image (required)")
	fs.StringVar(&f.config, "config", "", "this backend's configuration digest: exactly its manifest's config.digest (required; docs/manifest.md)")
	fs.Int64Var(&f.generation, "generation", -1, "this backend's generation in its pool: 0 until one is recorded with POST /v1/pools/{pool}/generation (required)")
	fs.StringVar(&f.issuer, "issuer", "", "the only token issuer (iss) accepted; empty accepts any issuer the keys vouch for")
	fs.StringVar(&f.jwks, "jwks", "", "authzd's JWKS URL, e.g. http://authzd:8080/.well-known/jwks.json")
	fs.StringVar(&f.keys, "keys", "", "a JWKS file of trusted public keys, instead of --jwks")
	return fs
}

// verifier builds the Verifier the flags describe, with its claimer (nil:
// offline) and start time (zero: now), and validates it.
func (f *verifierFlags) verifier(claimer fencecheck.Claimer, started time.Time) (*fencecheck.Verifier, error) {
	if f.generation < 0 {
		return nil, fmt.Errorf("%w: --generation is required", cli.ErrUsage)
	}
	if (f.jwks == "") == (f.keys == "") {
		return nil, fmt.Errorf("%w: give exactly one of --jwks and --keys", cli.ErrUsage)
	}
	v := &fencecheck.Verifier{
		Pool: f.pool, Artifact: f.artifact, Config: f.config, Generation: f.generation,
		Issuer: f.issuer, JWKSURL: f.jwks, Claimer: claimer, Started: started,
	}
	if f.keys != "" && f.check {
		// --check reads no file: a URL stands for the file's keys.
		v.JWKSURL = "http://keys.invalid/" + f.keys
	} else if f.keys != "" {
		data, err := os.ReadFile(f.keys)
		if err != nil {
			return nil, fmt.Errorf("keys: %w", err)
		}
		if v.Keys, err = fencecheck.ParseJWKS(data); err != nil {
			return nil, fmt.Errorf("keys %s: %w", f.keys, err)
		}
	}
	if err := v.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", cli.ErrUsage, err)
	}
	return v, nil
}
