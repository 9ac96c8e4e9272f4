package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fcd-authz/fcd/api"
)

// TestDevEnvFileSourcesBack: dev-credentials.env, sourced by a shell,
// gives back every value as written — FCD_DATA the data directory made
// absolute — also when the directory's name holds a space or a quote.
func TestDevEnvFileSourcesBack(t *testing.T) {
	base := t.TempDir()
	for _, tc := range []struct{ note, dir string }{
		{"plain", "data"},
		{"space", "fcd data"},
		{"quote and dollar", "it's $HOME"},
	} {
		t.Run(tc.note, func(t *testing.T) {
			dir := filepath.Join(base, tc.dir)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			dc := &devCredentials{
				Credentials:    map[api.Role]api.Secret{api.RoleHost: "fcd_host_secret"},
				Keys:           map[string]string{"registrar": filepath.Join(dir, "keys", "registrar.jwk")},
				RegistrarKeys:  filepath.Join(dir, "keys", "registrar-jwks.json"),
				SecondApprover: "fcd_second",
			}
			path := filepath.Join(dir, devEnvFile)
			// The data directory as given on the command line: relative.
			t.Chdir(base)
			if err := writeEnvFile(path, dc, "http://127.0.0.1:8080", tc.dir); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command("bash", "-c", `. "$1" && printf '%s\n' "$FCD_DATA" "$FCD_REGISTRAR_KEY" "$FCD_HOST" "$FCD_APPROVER_2" "$FCD_URL"`, "bash", path).CombinedOutput()
			if err != nil {
				t.Fatalf("sourcing %s: %v\n%s", path, err, out)
			}
			want := strings.Join([]string{dir, dc.Keys["registrar"], "fcd_host_secret", "fcd_second", "http://127.0.0.1:8080"}, "\n") + "\n"
			if string(out) != want {
				t.Errorf("sourced values:\n%s\nwant:\n%s", out, want)
			}
		})
	}
}

// TestShellQuote: a value is written bare only when the shell reads it
// as one word unchanged.
func TestShellQuote(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"http://127.0.0.1:8080/.well-known/jwks.json", "http://127.0.0.1:8080/.well-known/jwks.json"},
		{"/tmp/fcd-data/keys/registrar.jwk", "/tmp/fcd-data/keys/registrar.jwk"},
		{"/tmp/fcd data", "'/tmp/fcd data'"},
		{"it's", `'it'\''s'`},
		{"$HOME", "'$HOME'"},
		{"", "''"},
	} {
		if got := shellQuote(tc.in); got != tc.want {
			t.Errorf("shellQuote(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}
