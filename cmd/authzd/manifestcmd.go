package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/internal/cli"
	"github.com/fcd-authz/fcd/manifest"
)

// errLintFailed makes `manifest lint` exit 1 after printing its findings.
var errLintFailed = errors.New("lint errors")

func manifestCommand(sub string, args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("manifest "+sub, flag.ContinueOnError)
	key := fs.String("key", "", "private JWK of the registrar (sign)")
	keys := fs.String("keys", "", "JWKS of trusted registrar keys (verify)")
	asJSON := fs.Bool("json", false, "print findings as a JSON list (lint); a file that cannot be read or decoded is reported as findings too (rules unreadable-file, malformed-document, invalid-document, at the member's JSON Pointer)")
	tools := fs.Bool("tools", false, "also print each tool's descriptor digest (digest)")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %w", cli.ErrUsage, err)
	}
	if fs.NArg() > 1 {
		return fmt.Errorf("%w: at most one input file", cli.ErrUsage)
	}
	in, err := readInput(fs.Arg(0), stdin)
	if err != nil {
		if sub == "lint" && *asJSON {
			return lintReport(stdout, unreadable(fs.Arg(0), err))
		}
		return err
	}
	switch sub {
	case "sign":
		if *key == "" {
			return fmt.Errorf("%w: sign needs --key FILE", cli.ErrUsage)
		}
		// Refuse to sign what could never be registered.
		return signDocument(stdout, in, *key, manifest.TypManifest, func(b []byte) error {
			_, err := manifest.Decode(b)
			return err
		})
	case "verify":
		if *keys == "" {
			return fmt.Errorf("%w: verify needs --keys JWKS", cli.ErrUsage)
		}
		v, err := manifest.LoadVerifier(*keys)
		if err != nil {
			return err
		}
		sm, err := v.VerifyManifest(in)
		if err != nil {
			return err
		}
		return printJSON(stdout, map[string]string{
			"epoch": sm.Epoch, "server": sm.Manifest.Server.Name, "release": sm.Manifest.Server.Release, "signer": sm.KeyID,
		})
	case "lint":
		m, err := manifest.Decode(payloadOf(in))
		if err != nil {
			if *asJSON {
				return lintReport(stdout, undecodable(err))
			}
			return err
		}
		findings := manifest.Lint(m)
		if *asJSON {
			if findings == nil {
				findings = []manifest.Finding{}
			}
			if err := printJSON(stdout, findings); err != nil {
				return err
			}
		} else {
			for _, f := range findings {
				fmt.Fprintln(stdout, f.String())
			}
		}
		if manifest.HasErrors(findings) {
			return errLintFailed
		}
		return nil
	case "digest":
		m, err := manifest.Decode(payloadOf(in))
		if err != nil {
			return err
		}
		id, err := m.EpochID()
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, id)
		if *tools {
			for i := range m.Tools {
				d, err := m.Tools[i].Digest()
				if err != nil {
					return err
				}
				fmt.Fprintf(stdout, "%s %s/%s\n", d, m.Server.Name, m.Tools[i].Name)
			}
		}
		return nil
	}
	return fmt.Errorf("%w: unknown manifest command %q", cli.ErrUsage, sub)
}

// Rules of the findings `manifest lint --json` reports for a file it
// cannot lint, beside the lint rules of [manifest.Lint]: a script reads
// one shape, a list of findings, whatever went wrong.
const (
	// ruleUnreadable: the file could not be read.
	ruleUnreadable = "unreadable-file"
	// ruleMalformed: the file is not a manifest in JSON (nor a JWS of
	// one), or has a member fcd does not know or a value of the wrong kind.
	ruleMalformed = "malformed-document"
	// ruleInvalid: a manifest that misses or misforms a required field.
	ruleInvalid = "invalid-document"
)

// lintReport prints findings of a file that could not be linted as JSON
// and fails the command.
func lintReport(stdout io.Writer, findings []manifest.Finding) error {
	if err := printJSON(stdout, findings); err != nil {
		return err
	}
	return errLintFailed
}

// unreadable is the finding of a file that could not be read.
func unreadable(name string, err error) []manifest.Finding {
	msg := "cannot read the file"
	var pe *fs.PathError
	if errors.As(err, &pe) {
		msg = fmt.Sprintf("cannot read %s: %v", pe.Path, pe.Err)
	} else if name != "" {
		msg = fmt.Sprintf("cannot read %s: %v", name, err)
	}
	return []manifest.Finding{{Rule: ruleUnreadable, Severity: manifest.SeverityError, Path: "", Message: msg}}
}

// undecodable is a finding per member at fault in a manifest that did not
// decode or validate, or one finding for the whole document.
func undecodable(err error) []manifest.Finding {
	rule := ruleMalformed
	if errors.Is(err, manifest.ErrInvalid) {
		rule = ruleInvalid
	}
	var out []manifest.Finding
	for _, e := range manifest.DecodeErrors(err) {
		out = append(out, manifest.Finding{Rule: rule, Severity: manifest.SeverityError, Path: e.Pointer, Message: e.Error()})
	}
	if len(out) == 0 {
		msg := strings.TrimPrefix(err.Error(), "manifest: ")
		out = append(out, manifest.Finding{Rule: rule, Severity: manifest.SeverityError, Path: "", Message: msg})
	}
	return out
}

// signDocument checks in with check (refusing to sign what no verifier
// would accept), signs it as a compact JWS of type typ with the private key
// in keyFile, and prints it.
func signDocument(stdout io.Writer, in []byte, keyFile, typ string, check func([]byte) error) error {
	k, err := manifest.LoadPrivateKey(keyFile)
	if err != nil {
		return err
	}
	if err := check(in); err != nil {
		return err
	}
	jws, err := manifest.Sign(bytes.TrimSpace(in), k, typ)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s\n", jws)
	return err
}

// payloadOf returns the payload of a compact JWS without verifying it, so
// that lint and digest accept a signed manifest too; anything else is
// returned as it is.
func payloadOf(in []byte) []byte {
	parts := bytes.Split(bytes.TrimSpace(in), []byte("."))
	if len(parts) != 3 {
		return in
	}
	p, err := base64.RawURLEncoding.DecodeString(string(parts[1]))
	if err != nil {
		return in
	}
	return p
}

func readInput(name string, stdin io.Reader) ([]byte, error) {
	if name == "" || name == "-" {
		return io.ReadAll(io.LimitReader(stdin, 16<<20))
	}
	return os.ReadFile(name)
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func credentialNew(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("credential new", flag.ContinueOnError)
	role := fs.String("role", "", "role of the credential: registrar, host, gateway, approver, operator, backend")
	id := fs.String("id", "", "id of the credential, safe to log (default: the role)")
	var pools stringList
	fs.Var(&pools, "pool", "backend or gateway only: the pool whose lease outcomes it may report (repeat for several; default: any)")
	appendTo := fs.String("append", "", "add the stored credential to this JSON list (the --credentials file; created, mode 0600, if missing) and print only the secret")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if !api.Role(*role).Valid() {
		return fmt.Errorf("%w: --role must be one of %v", cli.ErrUsage, api.Roles())
	}
	if *id == "" {
		*id = *role
	}
	secret, cred, err := api.NewCredential(*id, api.Role(*role))
	if err != nil {
		return err
	}
	cred.Pools = pools
	if _, err := api.NewAuthenticator([]api.Credential{cred}); err != nil {
		return fmt.Errorf("%w: %w", cli.ErrUsage, err)
	}
	if *appendTo != "" {
		if err := appendCredential(*appendTo, cred); err != nil {
			return err
		}
		return printJSON(stdout, map[string]any{"secret": string(secret), "id": cred.ID, "role": cred.Role, "file": *appendTo})
	}
	// The secret is printed once, for the caller; only the hash is stored.
	return printJSON(stdout, map[string]any{"secret": string(secret), "credential": cred})
}

// errCredentialExists: --append to a file that already has a credential of
// that id.
var errCredentialExists = errors.New("a credential of this id is already in the file")

// appendCredential adds cred to the JSON list in path, which it creates
// (mode 0600) if missing. The whole list must load as authzd loads it:
// ids are unique.
func appendCredential(path string, cred api.Credential) error {
	var list []api.Credential
	switch data, err := os.ReadFile(path); {
	case err == nil:
		if err := manifest.Unmarshal(bytes.TrimSpace(data), &list); err != nil {
			return fmt.Errorf("%s is not a JSON list of credentials: %w", path, err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	for _, c := range list {
		if c.ID == cred.ID {
			return fmt.Errorf("%w: %q in %s (choose another --id)", errCredentialExists, cred.ID, path)
		}
	}
	list = append(list, cred)
	if _, err := api.NewAuthenticator(list); err != nil {
		return fmt.Errorf("%s with the new credential: %w", path, err)
	}
	data, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(v string) error {
	*l = append(*l, v)
	return nil
}
