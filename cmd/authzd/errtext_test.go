package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/internal/usertext"
	"github.com/fcd-authz/fcd/manifest"
)

// TestErrorTextNamesTheField is the table for the command line:
// bad configuration files, and bad manifests and certificates given to
// `manifest lint` (text and --json), `manifest verify` and `cert
// verify`. Each message names the setting or member — members by JSON
// Pointer — and shows no Go type, decoder word or repeated layer prefix;
// lint --json answers a list of findings whatever went wrong, and fails.
func TestErrorTextNamesTheField(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{DataDir: dir}
	dc, err := devSetup(&cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	run := func(stdin []byte, args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(context.Background(), args, bytes.NewReader(stdin), &out, &errb)
		return code, out.String(), errb.String()
	}
	clean := func(t *testing.T, text string) {
		t.Helper()
		if p := usertext.Problems(strings.TrimSpace(text)); len(p) > 0 {
			t.Errorf("%q: %s", text, strings.Join(p, "; "))
		}
	}
	example, err := os.ReadFile("../../examples/github/manifest-v1.4.json")
	if err != nil {
		t.Fatal(err)
	}
	edit := func(from, to string) []byte {
		if !bytes.Contains(example, []byte(from)) {
			t.Fatalf("the example has no %s", from)
		}
		return bytes.Replace(example, []byte(from), []byte(to), 1)
	}

	t.Run("configs", func(t *testing.T) {
		for _, tc := range []struct{ yaml, names string }{
			{"listenAddr: 1.2.3.4:80\n", `"listenAddr" (did you mean "listen"?)`},
			{"dev: yes-please\n", `"dev" must be true or false`},
			{"etcdEndpoints: http://a:2379\n", `"etcdEndpoints" must be a list of strings`},
			{"bodyLimit: lots\n", `"bodyLimit" must be a whole number`},
			{"formationTTL: soon\n", `"soon" is not a duration`},
			{"- a\n", "must be a map of settings"},
		} {
			var c Config
			err := decodeConfig([]byte(tc.yaml), &c)
			if err == nil || !strings.Contains(err.Error(), tc.names) {
				t.Errorf("%q: %v, want it to say %s", tc.yaml, err, tc.names)
				continue
			}
			clean(t, err.Error())
		}
	})

	t.Run("credentials", func(t *testing.T) {
		for _, tc := range []struct{ json, says string }{
			{`[{"id":"h","rol":"host","hash":"sha256:00"}]`, `/0/rol is not a known member (did you mean "role"?)`},
			{`[{"id":"h","role":"host","hash":"sha256:00","pools":"p"}]`, `/0/pools must be a list of strings, not a string`},
			{`{"id":"h"}`, `the document must be a list of objects, not an object`},
		} {
			file := filepath.Join(dir, "credentials.json")
			if err := os.WriteFile(file, []byte(tc.json), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := api.LoadCredentials(file)
			if err == nil || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), file) {
				t.Errorf("%s: %v, want it to name the file and say %q", tc.json, err, tc.says)
				continue
			}
			clean(t, err.Error())
			code, _, stderr := run(nil, "credential", "new", "--role", "host", "--id", "h2", "--append", file)
			if code == 0 || !strings.Contains(stderr, tc.says) {
				t.Errorf("credential new --append to %s: exit %d %q, want it to say %q", tc.json, code, stderr, tc.says)
			}
			clean(t, stderr)
		}
	})

	lintCases := []struct {
		name    string
		in      []byte
		rule    string
		pointer string
		says    string
	}{
		{"unknown member", edit(`"sideEffects"`, `"sideEfects"`), "malformed-document", "/tools/0/sideEfects", `did you mean "sideEffects"?`},
		{"wrong kind", edit(`"requiresApproval": true`, `"requiresApproval": "yes"`), "malformed-document", "/tools/2/requiresApproval", "must be true or false, not a string"},
		{"wrong kind of list", edit(`"name": "github"`, `"name": ["github"]`), "malformed-document", "/server/name", "must be a string, not a list"},
		{"missing field", edit(`"pool": "github-v1-4"`, `"pool": ""`), "invalid-document", "/pool", "/pool is required"},
		{"not JSON", []byte("pool = github\n"), "malformed-document", "", "not valid JSON"},
		{"cut short", example[:100], "malformed-document", "", "cut short"},
	}
	for _, tc := range lintCases {
		t.Run("lint --json "+tc.name, func(t *testing.T) {
			code, out, stderr := run(tc.in, "manifest", "lint", "--json")
			if code != 1 {
				t.Fatalf("exit %d, want 1: %s %s", code, out, stderr)
			}
			var findings []manifest.Finding
			if err := json.Unmarshal([]byte(out), &findings); err != nil || len(findings) == 0 {
				t.Fatalf("stdout is not a JSON list of findings (%v): %q", err, out)
			}
			f := findings[0]
			if f.Rule != tc.rule || f.Severity != manifest.SeverityError || !strings.HasPrefix(f.Path, tc.pointer) || !strings.Contains(f.Message, tc.says) {
				t.Errorf("finding %+v, want rule %s at %s saying %q", f, tc.rule, tc.pointer, tc.says)
			}
			if tc.pointer != "" && !strings.Contains(f.Message, tc.pointer) {
				t.Errorf("message %q does not name %s", f.Message, tc.pointer)
			}
			clean(t, f.Message)
		})
		t.Run("lint "+tc.name, func(t *testing.T) {
			code, _, stderr := run(tc.in, "manifest", "lint")
			if code != 1 || !strings.Contains(stderr, tc.says) {
				t.Fatalf("exit %d, stderr %q, want 1 saying %q", code, stderr, tc.says)
			}
			clean(t, stderr)
		})
	}
	t.Run("lint --json of a missing file", func(t *testing.T) {
		missing := filepath.Join(dir, "no-such-manifest.json")
		code, out, _ := run(nil, "manifest", "lint", "--json", missing)
		var findings []manifest.Finding
		if err := json.Unmarshal([]byte(out), &findings); code != 1 || err != nil || len(findings) != 1 ||
			findings[0].Rule != "unreadable-file" || !strings.Contains(findings[0].Message, missing) {
			t.Fatalf("exit %d, stdout %q: want 1 and one unreadable-file finding naming the file", code, out)
		}
		clean(t, findings[0].Message)
	})

	for _, tc := range []struct {
		name string
		args []string
		in   []byte
		says []string
	}{
		{"verify an unsigned manifest", []string{"manifest", "verify", "--keys", dc.RegistrarKeys}, example,
			[]string{"the manifest is not signed", "authzd manifest sign"}},
		{"verify something else", []string{"manifest", "verify", "--keys", dc.RegistrarKeys}, []byte("hello"),
			[]string{"not a signed document", "compact JWS", "authzd manifest sign"}},
		{"verify an unsigned certificate", []string{"cert", "verify", "--keys", dc.IssuerKeys}, []byte(`{"source":"sha256:x"}`),
			[]string{"the certificate is not signed", "authzd cert sign"}},
		{"sign a manifest with an unknown member", []string{"manifest", "sign", "--key", dc.Keys["registrar"]}, edit(`"sideEffects"`, `"sideEfects"`),
			[]string{"/tools/0/sideEfects is not a known member", `did you mean "sideEffects"?`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := run(tc.in, tc.args...)
			if code == 0 {
				t.Fatal("accepted")
			}
			for _, w := range tc.says {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr %q, want it to say %q", stderr, w)
				}
			}
			clean(t, stderr)
		})
	}
}
