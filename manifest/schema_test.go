package manifest

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
)

func TestCompileSchemaNeverLoads(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"type":"string"}`))
	}))
	defer srv.Close()

	for name, schema := range map[string]string{
		"remote $ref":           `{"type":"object","properties":{"a":{"$ref":"` + srv.URL + `/a.json"}}}`,
		"remote $schema":        `{"$schema":"` + srv.URL + `/meta.json","type":"object"}`,
		"remote $id, relative":  `{"$id":"` + srv.URL + `/root.json","type":"object","properties":{"a":{"$ref":"a.json"}}}`,
		"relative $ref":         `{"$ref":"other.json"}`,
		"file $ref":             `{"$ref":"file:///etc/passwd"}`,
		"remote $ref, fragment": `{"allOf":[{"$ref":"` + srv.URL + `/x#/$defs/y"}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := CompileSchema(json.RawMessage(schema))
			if err == nil {
				t.Fatal("compiled")
			}
			if !errors.Is(err, ErrSchemaRefused) {
				t.Fatalf("err = %v, want ErrSchemaRefused", err)
			}
		})
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the schema server was hit %d times", n)
	}
}

func TestCompileSchema(t *testing.T) {
	for _, tt := range []struct {
		name, schema string
		ok           bool
	}{
		{"object", `{"type":"object","properties":{"a":{"type":"string"}}}`, true},
		{"local refs", `{"$defs":{"a":{"type":"string"}},"properties":{"a":{"$ref":"#/$defs/a"}}}`, true},
		{"embedded draft-07 meta-schema", `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object"}`, true},
		{"boolean schema", `false`, true},
		{"bad keyword value", `{"type":"strin"}`, false},
		{"bad pattern", `{"type":"string","pattern":"("}`, false},
		{"unresolvable local ref", `{"$ref":"#/$defs/missing"}`, false},
		{"duplicate member", `{"type":"object","type":"array"}`, false},
		{"trailing data", `{"type":"object"} {}`, false},
		{"not JSON", `{type: object}`, false},
		{"empty", ``, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := CompileSchema(json.RawMessage(tt.schema))
			if tt.ok != (err == nil) || tt.ok != (s != nil) {
				t.Fatalf("CompileSchema = %v, %v; want ok=%v", s, err, tt.ok)
			}
		})
	}
}

func TestCompileSchemaDefaultsToDraft2020(t *testing.T) {
	// prefixItems exists only since draft 2020-12; draft-07 ignores it.
	const items = `"prefixItems":[{"type":"string"}]`
	s2020, err := CompileSchema(json.RawMessage(`{` + items + `}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := ValidateArguments(s2020, json.RawMessage(`[1]`)); err == nil {
		t.Fatal("prefixItems was ignored: not draft 2020-12")
	}
	s07, err := CompileSchema(json.RawMessage(`{"$schema":"http://json-schema.org/draft-07/schema#",` + items + `}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := ValidateArguments(s07, json.RawMessage(`[1]`)); err != nil {
		t.Fatalf("draft-07 applied prefixItems: %v", err)
	}
}

func TestValidateArguments(t *testing.T) {
	s, err := CompileSchema(json.RawMessage(`{
		"type": "object",
		"required": ["name"],
		"additionalProperties": false,
		"properties": {
			"name": {"type": "string", "minLength": 1},
			"private": {"type": "boolean"},
			"a/b~c": {"type": "integer"},
			"topics": {"type": "array", "items": {"type": "string"}},
			"owner": {"anyOf": [{"type": "string"}, {"type": "null"}]}
		}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, ok := range []string{`{"name":"x"}`, `{"name":"x","private":true,"topics":["a"],"owner":null,"a/b~c":3}`, " {\"name\":\"x\"}\n"} {
		if err := ValidateArguments(s, json.RawMessage(ok)); err != nil {
			t.Errorf("ValidateArguments(%s) = %v", ok, err)
		}
	}
	for _, tt := range []struct {
		args  string
		paths []string
	}{
		{`{}`, []string{""}},
		{`{"name":""}`, []string{"/name"}},
		{`{"name":"x","private":"yes"}`, []string{"/private"}},
		{`{"name":"x","extra":1}`, []string{""}},
		{`{"name":"x","a/b~c":"s"}`, []string{"/a~1b~0c"}},
		{`{"name":"x","topics":["a",2,3]}`, []string{"/topics/1", "/topics/2"}},
		{`{"name":"x","owner":1}`, []string{"/owner", "/owner"}},
		{`{"private":1,"name":2}`, []string{"/name", "/private"}},
		{`[]`, []string{""}},
	} {
		err := ValidateArguments(s, json.RawMessage(tt.args))
		var ae *ArgumentError
		if !errors.As(err, &ae) {
			t.Errorf("ValidateArguments(%s) = %v, want an ArgumentError", tt.args, err)
			continue
		}
		var paths []string
		for _, v := range ae.Violations {
			if v.Message == "" {
				t.Errorf("%s: empty message", tt.args)
			}
			paths = append(paths, v.InstancePath)
		}
		if !slices.Equal(paths, tt.paths) {
			t.Errorf("ValidateArguments(%s) paths %q, want %q (%v)", tt.args, paths, tt.paths, ae)
		}
		if errors.Is(err, ErrMalformed) {
			t.Errorf("%s: a violation is not malformed input", tt.args)
		}
	}
	for _, bad := range []string{``, `{"name":"x","name":"y"}`, `{"name":"x"} {}`, "{\"name\":\"\xff\"}", `{name:1}`} {
		if err := ValidateArguments(s, json.RawMessage(bad)); !errors.Is(err, ErrMalformed) {
			t.Errorf("ValidateArguments(%q) = %v, want ErrMalformed", bad, err)
		}
	}
	if err := ValidateArguments(nil, json.RawMessage(`{}`)); err == nil {
		t.Error("ValidateArguments(nil schema) succeeded")
	}
}
