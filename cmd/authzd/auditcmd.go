package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fcd-authz/fcd/audit"
	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/internal/cli"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/lestrrat-go/jwx/v2/jwk"
)

// errTrailFailed: verify found problems (exit status 1, the report says
// which).
var errTrailFailed = errors.New("the audit trail does not verify")

// auditCommand runs `authzd audit verify [--jwks FILE|URL]
// [--operator-keys FILE] [--json] [DIR]`
// and `authzd audit formation ID [DIR]`.
func auditCommand(ctx context.Context, sub string, args []string, stdout io.Writer) error {
	switch sub {
	case "verify":
	case "formation":
		return auditFormation(args, stdout)
	default:
		return fmt.Errorf("%w: unknown audit command %q (verify, formation)", cli.ErrUsage, sub)
	}
	fs := flag.NewFlagSet("audit verify", flag.ContinueOnError)
	jwks := fs.String("jwks", "", "the published signing keys: a JWKS file, or authzd's URL (its /.well-known/jwks.json); default: the dispatch key --dev keeps beside DIR")
	operatorKeys := fs.String("operator-keys", "", "a JWKS file of the operator keys (serve's --operator-keys): every resolution must keep a signed document that verifies against them")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %w", cli.ErrUsage, err)
	}
	if fs.NArg() > 1 {
		return fmt.Errorf("%w: at most one trail directory", cli.ErrUsage)
	}
	dir := fs.Arg(0)
	if dir == "" {
		dir = filepath.Join("fcd-data", "audit")
	}
	keys, from, err := checkpointKeys(ctx, *jwks, dir)
	if err != nil {
		return err
	}
	vc := audit.VerifyConfig{Keys: keys}
	if *operatorKeys != "" {
		if vc.OperatorKeys, err = manifest.LoadKeySet(*operatorKeys); err != nil {
			return fmt.Errorf("--operator-keys: %w", err)
		}
	}
	r, err := vc.Verify(dir)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(struct {
			*audit.Report
			Keys string `json:"keys"`
		}{r, from}); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(stdout, "trail %s, checkpoint keys from %s\n%s", dir, from, r.Summary())
	}
	if !r.OK {
		return errTrailFailed
	}
	return nil
}

// errNoSuchFormation: the trail holds nothing of the formation asked for.
var errNoSuchFormation = errors.New("the audit trail holds no event of that formation")

// auditFormation prints the trail's events of one formation, one JSON
// object a line, in etcd's order.
func auditFormation(args []string, stdout io.Writer) error {
	if len(args) < 1 || len(args) > 2 || strings.HasPrefix(args[0], "-") {
		return fmt.Errorf("%w: audit formation ID [DIR]", cli.ErrUsage)
	}
	dir := filepath.Join("fcd-data", "audit")
	if len(args) == 2 {
		dir = args[1]
	}
	events, err := audit.FormationHistory(dir, args[0])
	if err != nil {
		return err
	}
	if len(events) == 0 {
		return fmt.Errorf("%w: %s under %s", errNoSuchFormation, args[0], dir)
	}
	enc := json.NewEncoder(stdout)
	for _, ev := range events {
		if err := enc.Encode(ev); err != nil {
			return err
		}
	}
	return nil
}

// checkpointKeys loads the keys checkpoints are verified against, and
// says where they came from.
func checkpointKeys(ctx context.Context, src, dir string) (jwk.Set, string, error) {
	switch {
	case strings.HasPrefix(src, "http://") || strings.HasPrefix(src, "https://"):
		set, u, err := fetchJWKS(ctx, src)
		if err != nil {
			return nil, "", err
		}
		return set, u, nil
	case src != "":
		data, err := os.ReadFile(src)
		if err != nil {
			return nil, "", fmt.Errorf("read --jwks: %w", err)
		}
		set, err := jwk.Parse(data)
		if err != nil {
			return nil, "", fmt.Errorf("--jwks %s: %w", src, err)
		}
		return set, src, nil
	}
	// --dev keeps its dispatch key beside the trail: the key that signed
	// the checkpoints, trusted because it is the operator's own machine.
	credPath := filepath.Join(filepath.Dir(filepath.Clean(dir)), "dev-credentials.json")
	data, err := os.ReadFile(credPath)
	if err != nil {
		return nil, "", fmt.Errorf("%w: no --jwks, and no %s to take the dev dispatch key from", cli.ErrUsage, credPath)
	}
	var dc devCredentials
	if err := json.Unmarshal(data, &dc); err != nil || dc.Keys["dispatch"] == "" {
		return nil, "", fmt.Errorf("%s names no dispatch key", credPath)
	}
	key, err := manifest.LoadPrivateKey(dc.Keys["dispatch"])
	if err != nil {
		return nil, "", err
	}
	set, err := manifest.PublicSet(key)
	if err != nil {
		return nil, "", err
	}
	return set, dc.Keys["dispatch"] + " (--dev)", nil
}

// fetchJWKS reads the published keys from src: authzd's URL (its
// /.well-known/jwks.json, through the typed client), or the URL of a JWKS
// document elsewhere (one ending in .json). It returns the set and the
// URL it was read from.
func fetchJWKS(ctx context.Context, src string) (jwk.Set, string, error) {
	u := strings.TrimSuffix(src, "/")
	base, isAuthzd := strings.CutSuffix(u, jwksPath)
	if !isAuthzd && !strings.HasSuffix(u, ".json") {
		base, isAuthzd = u, true
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var body []byte
	if isAuthzd {
		u = base + jwksPath
		c, err := client.New(base, "")
		if err != nil {
			return nil, "", fmt.Errorf("%w: --jwks %q: %v", cli.ErrUsage, src, err)
		}
		resp, err := c.GetJWKSWithResponse(ctx)
		if err != nil {
			return nil, "", fmt.Errorf("fetch the published keys from %s: %w", u, err)
		}
		if resp.StatusCode() != http.StatusOK {
			return nil, "", fmt.Errorf("fetch the published keys from %s: status %d", u, resp.StatusCode())
		}
		body = resp.Body
	} else {
		// A JWKS kept elsewhere than authzd (a file server, an object
		// store) is not an operation of the API.
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, "", fmt.Errorf("%w: --jwks %q: %v", cli.ErrUsage, src, err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, "", fmt.Errorf("fetch the published keys: %w", err)
		}
		defer resp.Body.Close()
		body, err = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if err != nil || resp.StatusCode != http.StatusOK {
			return nil, "", fmt.Errorf("fetch the published keys from %s: status %d %v", u, resp.StatusCode, err)
		}
	}
	set, err := jwk.Parse(body)
	if err != nil {
		return nil, "", fmt.Errorf("the published keys at %s: %w", u, err)
	}
	return set, u, nil
}

// jwksPath is where authzd publishes its signing keys.
const jwksPath = "/.well-known/jwks.json"
