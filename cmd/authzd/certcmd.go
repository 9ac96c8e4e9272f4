package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/fcd-authz/fcd/internal/cli"
	"github.com/fcd-authz/fcd/manifest"
)

// certCommand runs `authzd cert sign|verify`, the compatibility issuer's
// tools. Issuer keys are a trust set of their own, separate from the
// registrar keys of `authzd manifest`.
func certCommand(sub string, args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("cert "+sub, flag.ContinueOnError)
	key := fs.String("key", "", "private JWK of the compatibility issuer (sign)")
	keys := fs.String("keys", "", "JWKS of trusted compatibility issuer keys (verify)")
	validFor := fs.Duration("valid-for", 0, "sign: set issuedAt to now and expiresAt to now plus this (e.g. 720h) instead of the document's")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %w", cli.ErrUsage, err)
	}
	if fs.NArg() > 1 {
		return fmt.Errorf("%w: at most one input file", cli.ErrUsage)
	}
	switch sub {
	case "sign":
		if *key == "" {
			return fmt.Errorf("%w: sign needs --key FILE", cli.ErrUsage)
		}
	case "verify":
		if *keys == "" {
			return fmt.Errorf("%w: verify needs --keys JWKS", cli.ErrUsage)
		}
	default:
		return fmt.Errorf("%w: unknown cert command %q", cli.ErrUsage, sub)
	}
	in, err := readInput(fs.Arg(0), stdin)
	if err != nil {
		return err
	}
	if sub == "sign" {
		if *validFor < 0 {
			return fmt.Errorf("%w: --valid-for must be positive", cli.ErrUsage)
		}
		if *validFor > 0 {
			if in, err = revalidate(in, time.Now().UTC().Truncate(time.Second), *validFor); err != nil {
				return err
			}
		}
		return signDocument(stdout, in, *key, manifest.TypCertificate, func(b []byte) error {
			_, err := manifest.DecodeCertificate(b)
			return err
		})
	}
	v, err := manifest.LoadVerifier(*keys)
	if err != nil {
		return err
	}
	sc, err := v.VerifyCertificate(in)
	if err != nil {
		return err
	}
	c := sc.Certificate
	return printJSON(stdout, map[string]string{
		"id": sc.ID, "source": c.Source, "target": c.Target, "tool": c.Tool,
		"expiresAt": c.ExpiresAt.UTC().Format(time.RFC3339), "signer": sc.KeyID,
	})
}

// revalidate returns the certificate document with issuedAt = now and
// expiresAt = now + d: an issuer signs a reviewed document for a validity
// it chooses at signing time. The document is decoded strictly first, so
// nothing is dropped on the way.
func revalidate(doc []byte, now time.Time, d time.Duration) ([]byte, error) {
	c, err := manifest.DecodeCertificate(doc)
	if err != nil {
		return nil, err
	}
	c.IssuedAt, c.ExpiresAt = now, now.Add(d)
	return json.Marshal(c)
}
