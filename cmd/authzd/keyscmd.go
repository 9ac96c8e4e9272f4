package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/fcd-authz/fcd/internal/cli"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/lestrrat-go/jwx/v2/jwa"
)

// keyUse says what a kind of key an fcd deployment needs is for, and who
// uses each half; false for an unknown kind.
func keyUse(kind string) (string, bool) {
	switch kind {
	case "registrar":
		return "signs manifests (authzd manifest sign --key); serve --registrar-keys trusts the JWKS", true
	case "issuer":
		return "signs compatibility certificates (authzd cert sign --key); serve --issuer-keys trusts the JWKS", true
	case "signing":
		return "signs dispatch tokens and audit checkpoints (serve --signing-key); fences fetch the public half from /.well-known/jwks.json", true
	case "operator":
		return "signs resolutions of uncertain leases (authzd lease resolve --key); serve --operator-keys trusts the JWKS", true
	}
	return "", false
}

// keysCommand runs `authzd keys new --kind KIND [--alg EdDSA|ES256] [--kid ID] [--out DIR]`.
func keysCommand(sub string, args []string, stdout io.Writer) error {
	if sub != "new" {
		return fmt.Errorf("%w: unknown keys command %q (new)", cli.ErrUsage, sub)
	}
	fs := flag.NewFlagSet("keys new", flag.ContinueOnError)
	kind := fs.String("kind", "", "registrar, issuer, signing or operator")
	alg := fs.String("alg", "EdDSA", "EdDSA (Ed25519) or ES256 (P-256)")
	out := fs.String("out", ".", "directory to write KIND.jwk (private, mode 0600) and KIND-jwks.json (public) into")
	ifMissing := fs.Bool("if-missing", false, "keep a pair already in --out and exit 0 (a container's init step that may run again)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	use, ok := keyUse(*kind)
	if !ok {
		return fmt.Errorf("%w: --kind must be registrar, issuer, signing or operator", cli.ErrUsage)
	}
	var a jwa.SignatureAlgorithm
	switch *alg {
	case "EdDSA":
		a = jwa.EdDSA
	case "ES256":
		a = jwa.ES256
	default:
		return fmt.Errorf("%w: --alg must be EdDSA or ES256", cli.ErrUsage)
	}
	key, err := manifest.GenerateKey(a)
	if err != nil {
		return err
	}
	pub, err := manifest.PublicSet(key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o700); err != nil {
		return err
	}
	private := filepath.Join(*out, *kind+".jwk")
	public := filepath.Join(*out, *kind+"-jwks.json")
	if *ifMissing && fileExists(private) && fileExists(public) {
		return printJSON(stdout, map[string]any{"kind": *kind, "private": private, "public": public, "kept": true})
	}
	for _, p := range []string{private, public} {
		if _, err := os.Stat(p); err == nil {
			return fmt.Errorf("%w: %s exists; keys are never overwritten (move it away, or choose another --out)", errKeyExists, p)
		}
	}
	// writeJSONFile creates with O_EXCL: a key is never replaced.
	if err := writeJSONFile(private, key, 0o600); err != nil {
		return err
	}
	if err := writeJSONFile(public, pub, 0o644); err != nil {
		return err
	}
	return printJSON(stdout, map[string]any{"kind": *kind, "kid": key.KeyID(), "alg": *alg,
		"private": private, "public": public, "use": use})
}

// errKeyExists: keys new would overwrite a key file.
var errKeyExists = errors.New("key file exists")

// fileExists reports whether p names something that exists.
func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
