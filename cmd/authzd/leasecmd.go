package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/internal/cli"
	"github.com/fcd-authz/fcd/manifest"
)

// errResolveRefused: authzd refused the resolution (exit status 1; the
// error names the problem).
var errResolveRefused = errors.New("the resolution was refused")

// resolveTimeout bounds the request of `lease resolve`.
const resolveTimeout = 30 * time.Second

// leaseCommand runs `authzd lease resolve` (sign a resolution of an
// uncertain lease with an operator key and send it) and `authzd lease
// sign-resolution` (print the signed resolution only).
func leaseCommand(ctx context.Context, sub string, args []string, stdout io.Writer) error {
	if sub != "resolve" && sub != "sign-resolution" {
		return fmt.Errorf("%w: unknown lease command %q (resolve, sign-resolution)", cli.ErrUsage, sub)
	}
	fs := flag.NewFlagSet("lease "+sub, flag.ContinueOnError)
	key := fs.String("key", "", "private JWK of the operator (Ed25519 or P-256, with a kid) that signs the resolution")
	outcome := fs.String("outcome", "", "what the call did: effect or no_effect (no-effect)")
	reason := fs.String("reason", "", "how you found out (kept with the lease and in the audit trail)")
	operator := fs.String("operator", "", "who decides, in your organisation's terms (default: the login name)")
	var base, credFile *string
	if sub == "resolve" {
		base = fs.String("url", "", "authzd's base URL (default: $FCD_URL, else http://127.0.0.1:8080)")
		credFile = fs.String("credential-file", "", "file holding the operator's bearer credential (default: $FCD_OPERATOR)")
	}
	lease, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if *outcome == "no-effect" { // the spelling of the issue and of prose
		*outcome = manifest.ResolutionNoEffect
	}
	switch {
	case lease == "":
		return fmt.Errorf("%w: lease %s needs one LEASE", cli.ErrUsage, sub)
	case *key == "":
		return fmt.Errorf("%w: lease %s needs --key FILE", cli.ErrUsage, sub)
	case *outcome != manifest.ResolutionEffect && *outcome != manifest.ResolutionNoEffect:
		return fmt.Errorf("%w: --outcome must be effect or no_effect", cli.ErrUsage)
	case strings.TrimSpace(*reason) == "":
		return fmt.Errorf("%w: --reason TEXT is required", cli.ErrUsage)
	}
	if *operator == "" {
		*operator = loginName()
		if *operator == "" {
			return fmt.Errorf("%w: --operator ID is required (no login name to default to)", cli.ErrUsage)
		}
	}
	k, err := manifest.LoadPrivateKey(*key)
	if err != nil {
		return err
	}
	jws, err := manifest.SignResolution(&manifest.Resolution{Lease: lease, Outcome: *outcome, Reason: *reason, Operator: *operator,
		IssuedAt: time.Now().UTC().Truncate(time.Second)}, k)
	if err != nil {
		return err
	}
	if sub == "sign-resolution" {
		_, err := fmt.Fprintf(stdout, "%s\n", jws)
		return err
	}
	credential, err := operatorCredential(*credFile)
	if err != nil {
		return err
	}
	return postResolution(ctx, stdout, serverURL(*base), credential, lease, jws)
}

// parseInterspersed parses flags given before and after the one
// positional argument, which it returns ("" when none); more than one is
// a usage error.
func parseInterspersed(fs *flag.FlagSet, args []string) (string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return "", err
			}
			return "", fmt.Errorf("%w: %v", cli.ErrUsage, err)
		}
		if fs.NArg() == 0 {
			break
		}
		pos, args = append(pos, fs.Arg(0)), fs.Args()[1:]
	}
	if len(pos) > 1 {
		return "", fmt.Errorf("%w: unexpected argument %q", cli.ErrUsage, pos[1])
	}
	if len(pos) == 0 {
		return "", nil
	}
	return pos[0], nil
}

// loginName is the user's login name, "" when it cannot be told.
func loginName() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return os.Getenv("USER")
}

// serverURL is --url, else $FCD_URL, else authzd's default address.
func serverURL(flagURL string) string {
	for _, u := range []string{flagURL, os.Getenv("FCD_URL")} {
		if u != "" {
			return strings.TrimSuffix(u, "/")
		}
	}
	return "http://127.0.0.1:8080"
}

// operatorCredential reads the operator's bearer credential from file,
// else from $FCD_OPERATOR (what --dev's env file exports).
func operatorCredential(file string) (string, error) {
	credential := os.Getenv("FCD_OPERATOR")
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("operator credential: %w", err)
		}
		credential = string(data)
	}
	if credential = strings.TrimSpace(credential); credential == "" {
		return "", fmt.Errorf("%w: lease resolve needs the operator's bearer credential: --credential-file FILE or $FCD_OPERATOR", cli.ErrUsage)
	}
	return credential, nil
}

// postResolution sends the signed resolution to authzd and prints its
// answer; a refusal is errResolveRefused, naming the problem.
func postResolution(ctx context.Context, stdout io.Writer, base, credential, lease string, jws []byte) error {
	c, err := client.New(base, credential)
	if err != nil {
		return fmt.Errorf("%w: --url %q: %v", cli.ErrUsage, base, err)
	}
	ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	resolution := string(jws)
	resp, err := c.ResolveLeaseWithResponse(ctx, lease, client.ResolveRequest{Resolution: &resolution})
	if p, ok := errors.AsType[*client.Problem](err); ok {
		if p.Slug() == "" {
			return fmt.Errorf("%w: lease %s: %d %s: %s", errResolveRefused, lease, p.Status, p.Title, p.Detail)
		}
		return fmt.Errorf("%w: lease %s: %d %s (%s): %s", errResolveRefused, lease, p.Status, p.Slug(), p.Title, p.Detail)
	}
	if err != nil {
		return fmt.Errorf("resolve %s: %w", lease, err)
	}
	if resp.JSON200 == nil {
		return fmt.Errorf("resolve %s: authzd answered %s, not a resolution", lease, resp.Status())
	}
	return printJSON(stdout, resp.JSON200)
}
