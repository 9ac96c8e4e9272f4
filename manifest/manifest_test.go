package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// baseJSON is the compact JSON of baseManifest.
func baseJSON(t *testing.T) string {
	t.Helper()
	b, err := json.Marshal(baseManifest())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// replaceOnce replaces exactly one occurrence of old in s, or fails.
func replaceOnce(t *testing.T, s, old, new string) string {
	t.Helper()
	if n := strings.Count(s, old); n != 1 {
		t.Fatalf("%q occurs %d times", old, n)
	}
	return strings.Replace(s, old, new, 1)
}

func TestDecodeStrict(t *testing.T) {
	base := baseJSON(t)
	const getName = `"name":"get_repository"`
	tests := []struct {
		name string
		doc  func(t *testing.T) string
		ok   bool
	}{
		{"base", func(*testing.T) string { return base }, true},
		{"surrounding white space", func(*testing.T) string { return "\n\t " + base + " \n\n" }, true},
		{"unknown top-level member", func(*testing.T) string { return `{"bogus":1,` + base[1:] }, false},
		{"unknown member inside a tool", func(t *testing.T) string {
			return replaceOnce(t, base, getName, getName+`,"handler":"evil"`)
		}, false},
		{"unknown member inside the server", func(t *testing.T) string {
			return replaceOnce(t, base, `"release":"v1.4.0"`, `"release":"v1.4.0","channel":"beta"`)
		}, false},
		{"duplicate top-level member", func(t *testing.T) string {
			return replaceOnce(t, base, `"pool":"github-v1-4"`, `"pool":"github-v1-4","pool":"github-v1-3"`)
		}, false},
		{"duplicate member inside a tool", func(t *testing.T) string {
			return replaceOnce(t, base, `"requiresApproval":true,"failureModes":[{"error":"name_taken"`,
				`"requiresApproval":true,"requiresApproval":false,"failureModes":[{"error":"name_taken"`)
		}, false},
		{"duplicate member inside an input schema", func(t *testing.T) string {
			return replaceOnce(t, base, `"required":["name"]`, `"required":["name"],"required":[]`)
		}, false},
		{"duplicate member inside config values", func(t *testing.T) string {
			return replaceOnce(t, base, `"repository.defaultVisibility":"private"`,
				`"repository.defaultVisibility":"private","repository.defaultVisibility":"public"`)
		}, false},
		{"case-variant member name", func(t *testing.T) string {
			return replaceOnce(t, base, getName, `"Name":"get_repository"`)
		}, false},
		{"case-variant member beside the real one", func(t *testing.T) string {
			return replaceOnce(t, base, getName, getName+`,"NAME":"delete_repository"`)
		}, false},
		{"case-variant top-level member", func(t *testing.T) string {
			return replaceOnce(t, base, `"pool":`, `"Pool":`)
		}, false},
		{"trailing document", func(*testing.T) string { return base + "{}" }, false},
		{"trailing garbage", func(*testing.T) string { return base + " x" }, false},
		{"two documents", func(*testing.T) string { return base + "\n" + base }, false},
		{"truncated", func(*testing.T) string { return base[:len(base)-1] }, false},
		{"invalid UTF-8", func(t *testing.T) string {
			return replaceOnce(t, base, `"v1.4.0"`, "\"v1.4.0\xff\"")
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m Manifest
			err := DecodeStrict([]byte(tt.doc(t)), &m)
			if tt.ok {
				if err != nil {
					t.Fatalf("DecodeStrict: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("DecodeStrict = %v, want ErrMalformed", err)
			}
			if _, err := Decode([]byte(tt.doc(t))); !errors.Is(err, ErrMalformed) {
				t.Fatalf("Decode = %v, want ErrMalformed", err)
			}
		})
	}
}

func TestDecodeRoundTrip(t *testing.T) {
	m, err := Decode([]byte(baseJSON(t)))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := baseManifest().EpochID()
	got, _ := m.EpochID()
	if got != want {
		t.Fatalf("epoch after decode %s, want %s", got, want)
	}
	if m.Tool("delete_repository") == nil || m.Tool("nope") != nil {
		t.Fatal("Manifest.Tool")
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(m *Manifest)
		path   string
	}{
		{"server name syntax", func(m *Manifest) { m.Server.Name = "GitHub" }, "/server/name"},
		{"server name missing", func(m *Manifest) { m.Server.Name = "" }, "/server/name"},
		{"release missing", func(m *Manifest) { m.Server.Release = "" }, "/server/release"},
		{"pool missing", func(m *Manifest) { m.Pool = "" }, "/pool"},
		{"artifact missing", func(m *Manifest) { m.Artifact = Artifact{} }, "/artifact"},
		{"artifact digest malformed", func(m *Manifest) { m.Artifact.Digest = "sha256:" + strings.Repeat("AB", 32) }, "/artifact/digest"},
		{"artifact digest of another algorithm", func(m *Manifest) { m.Artifact.Digest = "sha512:" + strings.Repeat("ab", 32) }, "/artifact/digest"},
		{"deployment name missing", func(m *Manifest) { m.Deployment.Name = "" }, "/deployment/name"},
		{"config digest missing", func(m *Manifest) { m.Config.Digest = "" }, "/config/digest"},
		{"feature flags without snapshot", func(m *Manifest) { m.FeatureFlags.Snapshot = "" }, "/featureFlags/snapshot"},
		{"downstream without revision", func(m *Manifest) { m.Downstream[0].Revision = "" }, "/downstream/0"},
		{"secret without name", func(m *Manifest) { m.Secrets[0].Name = "" }, "/secrets/0/name"},
		{"policy without id", func(m *Manifest) { m.Policy.ID = "" }, "/policy/id"},
		{"no tools", func(m *Manifest) { m.Tools = nil }, "/tools"},
		{"tool name syntax", func(m *Manifest) { m.Tools[1].Name = "list repositories" }, "/tools/1/name"},
		{"unknown side effect", func(m *Manifest) { m.Tools[2].SideEffects = "admin" }, "/tools/2/sideEffects"},
		{"missing side effect", func(m *Manifest) { m.Tools[2].SideEffects = "" }, "/tools/2/sideEffects"},
		{"input schema not an object", func(m *Manifest) { m.Tools[0].InputSchema = json.RawMessage(`[]`) }, "/tools/0/inputSchema"},
		{"input schema missing", func(m *Manifest) { m.Tools[0].InputSchema = nil }, "/tools/0/inputSchema"},
		{"failure mode without error", func(m *Manifest) { m.Tools[0].FailureModes[1].Error = "" }, "/tools/0/failureModes/1/error"},
		{"unknown recovery", func(m *Manifest) { m.Tools[0].FailureModes[0].Recovery = "ignore" }, "/tools/0/failureModes/0/recovery"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := baseManifest()
			tt.mutate(m)
			err := m.Validate()
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Validate = %v, want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tt.path+" ") {
				t.Fatalf("Validate = %v, want it to name %s", err, tt.path)
			}
			// Decode reports the same for the document.
			raw, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Decode(raw); !errors.Is(err, ErrInvalid) {
				t.Fatalf("Decode = %v, want ErrInvalid", err)
			}
		})
	}
	t.Run("all errors reported", func(t *testing.T) {
		m := baseManifest()
		m.Pool = ""
		m.Tools[3].SideEffects = "erase"
		err := m.Validate()
		for _, p := range []string{"/pool ", "/tools/3/sideEffects "} {
			if !strings.Contains(fmt.Sprint(err), p) {
				t.Errorf("Validate = %v, want %s", err, p)
			}
		}
	})
}

// reorderJSON rewrites a JSON document with every object's members in
// reverse lexical order, different indentation and the numbers of input
// schemas spelled differently (Go int fields need plain integers), keeping
// its meaning.
func reorderJSON(t *testing.T, doc []byte) []byte {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	var write func(v any, indent string, inSchema bool)
	write = func(v any, indent string, inSchema bool) {
		switch v := v.(type) {
		case map[string]any:
			keys := sortedKeys(v)
			slices.Reverse(keys)
			buf.WriteString("{")
			for i, k := range keys {
				if i > 0 {
					buf.WriteString(" ,")
				}
				kb, _ := json.Marshal(k)
				fmt.Fprintf(&buf, "\n%s\t%s :  ", indent, kb)
				write(v[k], indent+"\t", inSchema || k == "inputSchema")
			}
			fmt.Fprintf(&buf, "\n%s}", indent)
		case []any:
			buf.WriteString("[ ")
			for i, e := range v {
				if i > 0 {
					buf.WriteString(",\r\n ")
				}
				write(e, indent+" ", inSchema)
			}
			buf.WriteString(" ]")
		case json.Number:
			if !inSchema {
				buf.WriteString(v.String())
				return
			}
			// 100 → 1.00E2: same number, different spelling.
			f, err := v.Float64()
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&buf, "%.2E", f)
		default:
			b, _ := json.Marshal(v)
			buf.Write(b)
		}
	}
	write(v, "", false)
	return buf.Bytes()
}

func epochOf(t *testing.T, doc []byte) string {
	t.Helper()
	m, err := Decode(doc)
	if err != nil {
		t.Fatalf("Decode: %v\n%s", err, doc)
	}
	e, err := m.EpochID()
	if err != nil {
		t.Fatal(err)
	}
	if !ValidDigest(e) {
		t.Fatalf("epoch id %q is not a digest", e)
	}
	return e
}

func TestEpochIDStable(t *testing.T) {
	m := baseManifest()
	m.Tools[2].InputSchema = json.RawMessage(`{"type":"object","properties":{"name":{"type":"string","maxLength":100,"description":"Name."}}}`)
	compact, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	indented, err := json.MarshalIndent(m, "", "    ")
	if err != nil {
		t.Fatal(err)
	}
	reordered := reorderJSON(t, compact)
	if bytes.Equal(reordered, compact) || !bytes.Contains(reordered, []byte("1.00E+02")) {
		t.Fatalf("reorderJSON did not rewrite the document:\n%s", reordered)
	}
	want := epochOf(t, compact)
	for name, doc := range map[string][]byte{"indented": indented, "reordered": reordered} {
		if got := epochOf(t, doc); got != want {
			t.Errorf("%s: epoch %s, want %s", name, got, want)
		}
	}
	if got, _ := m.EpochID(); got != want {
		t.Errorf("epoch of the struct %s, want %s", got, want)
	}
	// Tool digests are just as stable.
	d1, _ := m.Tools[2].Digest()
	back, _ := Decode(reordered)
	d2, _ := back.Tools[2].Digest()
	if d1 != d2 {
		t.Errorf("tool digest changed with member order: %s vs %s", d1, d2)
	}
}

func TestEpochIDCoversEveryField(t *testing.T) {
	mutations := map[string]func(m *Manifest){
		"server release":        func(m *Manifest) { m.Server.Release = "v1.4.1" },
		"pool":                  func(m *Manifest) { m.Pool = "github-v1-4-canary" },
		"artifact digest":       func(m *Manifest) { m.Artifact.Digest = "sha256:" + strings.Repeat("ac", 32) },
		"artifact image":        func(m *Manifest) { m.Artifact.Image = "ghcr.io/github/github-mcp-server:latest" },
		"deployment revision":   func(m *Manifest) { m.Deployment.Revision = "15" },
		"config digest":         func(m *Manifest) { m.Config.Digest = "sha256:" + strings.Repeat("ce", 32) },
		"config value":          func(m *Manifest) { m.Config.Values["repository.defaultVisibility"] = "public" },
		"feature flag snapshot": func(m *Manifest) { m.FeatureFlags.Snapshot = "flags-2025-06-02" },
		"feature flag value":    func(m *Manifest) { m.FeatureFlags.Values["repos.delete"] = false },
		"downstream revision":   func(m *Manifest) { m.Downstream[0].Revision = "2026-03-10" },
		"secret version":        func(m *Manifest) { m.Secrets[0].Version = "8" },
		"policy digest":         func(m *Manifest) { m.Policy.Digest = "sha256:" + strings.Repeat("e0", 32) },
		"tool description":      func(m *Manifest) { m.Tools[2].Description += " Really." },
		"tool input schema": func(m *Manifest) {
			m.Tools[2].InputSchema = json.RawMessage(`{"type":"object","properties":{"name":{"type":"string","description":"Name."}}}`)
		},
		"tool approval":     func(m *Manifest) { m.Tools[1].RequiresApproval = true },
		"tool annotation":   func(m *Manifest) { m.Tools[3].Annotations.IdempotentHint = ptr(true) },
		"tool failure mode": func(m *Manifest) { m.Tools[3].FailureModes[0].Recovery = RecoveryPromptUser },
		"tool dependency":   func(m *Manifest) { m.Tools[3].Dependencies.ExclusiveWith = nil },
	}
	base, err := baseManifest().EpochID()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{base: "base"}
	for name, mutate := range mutations {
		m := baseManifest()
		mutate(m)
		raw, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		e := epochOf(t, raw)
		if prev, dup := seen[e]; dup {
			t.Errorf("%s: epoch %s equals that of %s", name, e, prev)
		}
		seen[e] = name
	}
}
