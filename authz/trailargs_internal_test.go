package authz

import (
	"encoding/json"
	"testing"

	"github.com/fcd-authz/fcd/manifest"
)

// TestTrailArguments: each mode keeps what it says of a call's arguments;
// a member is sensitive when its schema marks it writeOnly or its name
// looks like a secret's, at any depth (nested objects, arrays, members
// only additionalProperties describes), and only sensitive members are
// masked.
func TestTrailArguments(t *testing.T) {
	schema := json.RawMessage(`{"type":"object","properties":{
		"name":{"type":"string"},
		"pin":{"type":"string","writeOnly":true},
		"owner":{"type":"object","properties":{"login":{"type":"string"},"passphrase":{"type":"string","writeOnly":true}}},
		"hooks":{"type":"array","items":{"type":"object","properties":{"url":{"type":"string"},"secret":{"type":"string"}}}},
		"extra":{"type":"object","additionalProperties":{"type":"string","writeOnly":true}}
	}}`)
	args := json.RawMessage(`{"extra":{"k":"v"},"hooks":[{"secret":"s3","url":"https://h"}],"name":"payroll","owner":{"login":"alice","passphrase":"p4ss"},"pin":"1234","size":1e400,"api_key":"ak"}`)
	digest := func(v any) string {
		d, err := manifest.Digest(v)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	masked := func(hide func(any) any) string {
		b, _ := json.Marshal(map[string]any{
			"extra": map[string]any{"k": hide("v")}, "hooks": []any{map[string]any{"secret": hide("s3"), "url": "https://h"}},
			"name": "payroll", "owner": map[string]any{"login": "alice", "passphrase": hide("p4ss")}, "pin": hide("1234"),
			"size": json.Number("1e400"), "api_key": hide("ak"),
		})
		return string(b)
	}
	for _, tc := range []struct {
		mode TrailArguments
		want string // "" for none
	}{
		{TrailArgumentsNone, ""},
		{"", ""},
		{TrailArgumentsAll, string(args)},
		{TrailArgumentsRedacted, masked(func(any) any { return "[redacted]" })},
		{TrailArgumentsDigested, masked(func(v any) any { return digest(v) })},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			got, err := trailArguments(tc.mode, args, schema)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
	if _, err := ParseTrailArguments("some"); err == nil {
		t.Error("an unknown mode was accepted")
	}
	// Without a schema, names alone decide.
	got, err := trailArguments(TrailArgumentsRedacted, json.RawMessage(`{"token":"t","q":"x"}`), nil)
	if err != nil || string(got) != `{"q":"x","token":"[redacted]"}` {
		t.Errorf("no schema: %s %v", got, err)
	}
}
