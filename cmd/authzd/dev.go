package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/fcd-authz/fcd/api"
	"github.com/lestrrat-go/jwx/v2/jwa"
)

// devCredentials is the content of <data-dir>/dev-credentials.json: what a
// newcomer needs to call a --dev server. The file is mode 0600.
type devCredentials struct {
	// Credentials maps each role to its bearer credential.
	Credentials map[api.Role]api.Secret `json:"credentials"`
	// Keys names the generated private keys by purpose.
	Keys map[string]string `json:"keys"`
	// RegistrarKeys is the JWKS of trusted registrar public keys.
	RegistrarKeys string `json:"registrarKeys"`
	// IssuerKeys is the JWKS of trusted compatibility issuer public keys.
	IssuerKeys string `json:"issuerKeys,omitempty"`
	// OperatorKeys is the JWKS of the operator keys resolutions of
	// uncertain leases are signed with.
	OperatorKeys string `json:"operatorKeys,omitempty"`
	// SecondApprover is a second approver's credential (id
	// dev-approver-2): a delete needs two distinct approvers.
	SecondApprover api.Secret `json:"secondApprover,omitempty"`
}

// devSecondApprover is the id of --dev's second approver.
const devSecondApprover = "dev-approver-2"

// devSetup prepares cfg.DataDir for development: a registrar key pair and
// one credential per role, created once and reused on later starts. It
// points cfg at the generated files unless they were set explicitly.
func devSetup(cfg *Config, stderr io.Writer) (*devCredentials, error) {
	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "keys"), 0o700); err != nil {
		return nil, fmt.Errorf("dev: %w", err)
	}
	path := filepath.Join(dir, "dev-credentials.json")
	credFile := filepath.Join(dir, "credentials.json")
	var dc devCredentials
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := json.Unmarshal(data, &dc); err != nil {
			return nil, fmt.Errorf("dev: %s: %w (delete the data directory to start over)", path, err)
		}
	case errors.Is(err, fs.ErrNotExist):
		if dc, err = devGenerate(dir, credFile, cfg.SigningAlg); err != nil {
			return nil, err
		}
		if err := writeJSONFile(path, dc, 0o600); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("dev: %w", err)
	}
	if dc.Keys["dispatch"] == "" || dc.Keys["issuer"] == "" || dc.Keys["operator"] == "" || dc.SecondApprover == "" {
		// A data directory from before admission, certificates or signed
		// resolutions existed: add the missing keys.
		if dc.Keys["dispatch"] == "" {
			if err := devDispatchKey(&dc, dir, cfg.SigningAlg); err != nil {
				return nil, err
			}
		}
		if dc.Keys["issuer"] == "" {
			if err := devIssuerKey(&dc, dir); err != nil {
				return nil, err
			}
		}
		if dc.Keys["operator"] == "" {
			if err := devOperatorKey(&dc, dir); err != nil {
				return nil, err
			}
		}
		if dc.SecondApprover == "" {
			if err := devAddSecondApprover(&dc, credFile); err != nil {
				return nil, err
			}
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("dev: %w", err)
		}
		if err := writeJSONFile(path, dc, 0o600); err != nil {
			return nil, err
		}
	}
	if cfg.SigningKey == "" {
		cfg.SigningKey = dc.Keys["dispatch"]
	}
	if cfg.IssuerKeys == "" {
		cfg.IssuerKeys = dc.IssuerKeys
	}
	if cfg.OperatorKeys == "" {
		cfg.OperatorKeys = dc.OperatorKeys
	}
	if cfg.RegistrarKeys == "" {
		cfg.RegistrarKeys = dc.RegistrarKeys
	}
	if cfg.Credentials == "" {
		cfg.Credentials = credFile
	}
	fmt.Fprintf(stderr, "authzd: dev mode: credentials for every role in %s (shell: . %s)\n", path, filepath.Join(dir, devEnvFile))
	fmt.Fprintf(stderr, "authzd: dev mode: registrar private key %s\n", dc.Keys["registrar"])
	return &dc, nil
}

// devEnvFile is the shell form of dev-credentials.json, rewritten at every
// start because it also carries the URL the server listens on.
const devEnvFile = "dev-credentials.env"

func devGenerate(dir, credFile, alg string) (devCredentials, error) {
	dc := devCredentials{Credentials: map[api.Role]api.Secret{}, Keys: map[string]string{}}
	kp, err := generateKey(dir, "registrar", jwa.EdDSA, true)
	if err != nil {
		return dc, err
	}
	dc.Keys["registrar"], dc.RegistrarKeys = kp.private, kp.public
	if err := devDispatchKey(&dc, dir, alg); err != nil {
		return dc, err
	}
	if err := devIssuerKey(&dc, dir); err != nil {
		return dc, err
	}
	if err := devOperatorKey(&dc, dir); err != nil {
		return dc, err
	}
	var stored []api.Credential
	for _, role := range api.Roles() {
		secret, cred, err := api.NewCredential("dev-"+string(role), role)
		if err != nil {
			return dc, err
		}
		dc.Credentials[role] = secret
		stored = append(stored, cred)
	}
	secret, cred, err := api.NewCredential(devSecondApprover, api.RoleApprover)
	if err != nil {
		return dc, err
	}
	dc.SecondApprover = secret
	stored = append(stored, cred)
	if err := writeJSONFile(credFile, stored, 0o600); err != nil {
		return dc, err
	}
	return dc, nil
}

// devAddSecondApprover adds the second approver to a data directory made
// before it existed: its credential to the credentials file.
func devAddSecondApprover(dc *devCredentials, credFile string) error {
	data, err := os.ReadFile(credFile)
	if err != nil {
		return fmt.Errorf("dev: %w", err)
	}
	var stored []api.Credential
	if err := json.Unmarshal(data, &stored); err != nil {
		return fmt.Errorf("dev: %s: %w", credFile, err)
	}
	secret, cred, err := api.NewCredential(devSecondApprover, api.RoleApprover)
	if err != nil {
		return err
	}
	dc.SecondApprover = secret
	if err := os.Remove(credFile); err != nil {
		return fmt.Errorf("dev: %w", err)
	}
	return writeJSONFile(credFile, append(stored, cred), 0o600)
}

// devIssuerKey generates a compatibility-issuer key pair, so that a
// newcomer can sign certificates with `authzd cert sign`.
func devIssuerKey(dc *devCredentials, dir string) error {
	kp, err := generateKey(dir, "issuer", jwa.EdDSA, true)
	dc.Keys["issuer"], dc.IssuerKeys = kp.private, kp.public
	return err
}

// devOperatorKey generates an operator key pair, so that the dev server
// requires signed resolutions of uncertain leases and a newcomer can sign
// them with `authzd lease resolve`.
func devOperatorKey(dc *devCredentials, dir string) error {
	kp, err := generateKey(dir, "operator", jwa.EdDSA, true)
	dc.Keys["operator"], dc.OperatorKeys = kp.private, kp.public
	return err
}

// devDispatchKey generates the dispatch-token signing key.
func devDispatchKey(dc *devCredentials, dir, alg string) error {
	a := jwa.EdDSA
	if alg == "ES256" {
		a = jwa.ES256
	}
	kp, err := generateKey(dir, "dispatch", a, false)
	dc.Keys["dispatch"] = kp.private
	return err
}

// writeEnvFile writes shell exports for the README walkthrough:
// FCD_<ROLE>=credential, FCD_REGISTRAR_KEY, FCD_ISSUER_KEY, FCD_OPERATOR_KEY,
// FCD_REGISTRAR_JWKS, FCD_JWKS_URL, FCD_URL and FCD_DATA (the data
// directory, absolute, so that a script that sourced the file finds the
// audit trail and the keys wherever --data-dir put them). Values are
// quoted for the shell when they need it (a data directory with a space).
func writeEnvFile(path string, dc *devCredentials, url, dataDir string) error {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return fmt.Errorf("dev: %w", err)
	}
	export := func(name, value string) string { return "export " + name + "=" + shellQuote(value) }
	var lines []string
	for role, secret := range dc.Credentials {
		lines = append(lines, export("FCD_"+strings.ToUpper(string(role)), string(secret)))
	}
	if dc.SecondApprover != "" {
		lines = append(lines, export("FCD_APPROVER_2", string(dc.SecondApprover)))
	}
	sort.Strings(lines)
	lines = append(lines, export("FCD_REGISTRAR_KEY", dc.Keys["registrar"]), export("FCD_JWKS_URL", url+"/.well-known/jwks.json"),
		export("FCD_ISSUER_KEY", dc.Keys["issuer"]), export("FCD_OPERATOR_KEY", dc.Keys["operator"]),
		export("FCD_REGISTRAR_JWKS", dc.RegistrarKeys), export("FCD_URL", url), export("FCD_DATA", abs))
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		return fmt.Errorf("dev: %w", err)
	}
	return os.Rename(tmp, path)
}

// shellSafe matches the values a POSIX shell reads as one word, unquoted.
var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_@%+=:,./-]+$`)

// shellQuote returns s as one shell word: as it is when nothing in it is
// special to the shell, else in single quotes.
func shellQuote(s string) string {
	if shellSafe.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func writeJSONFile(path string, v any, mode os.FileMode) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	return writeFile(path, append(data, '\n'), mode)
}

// writeFile creates path with mode, refusing to overwrite: generated
// secrets are never silently replaced.
func writeFile(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("dev: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("dev: write %s: %w", path, err)
	}
	return f.Close()
}
