package fencecheck_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/fcd-authz/fcd/fencecheck"
)

func TestArgumentDigest(t *testing.T) {
	base := must(t, "github/create_repository", `{"name":"demo","private":true,"labels":["a","b"]}`)
	cases := []struct {
		note string
		tool string
		args string
		same bool
		err  error
	}{
		{"key order and whitespace", "github/create_repository", "{ \"private\": true,\n \"labels\":[\"a\",\"b\"], \"name\":\"demo\" }", true, nil},
		{"number spelling", "github/create_repository", `{"name":"demo","private":true,"labels":["a","b"],"n":1.0}`, false, nil},
		{"one value differs", "github/create_repository", `{"name":"demo","private":false,"labels":["a","b"]}`, false, nil},
		{"extra field", "github/create_repository", `{"name":"demo","private":true,"labels":["a","b"],"x":null}`, false, nil},
		{"omitted field", "github/create_repository", `{"name":"demo","labels":["a","b"]}`, false, nil},
		{"array order matters", "github/create_repository", `{"name":"demo","private":true,"labels":["b","a"]}`, false, nil},
		{"other tool", "github/delete_repository", `{"name":"demo","private":true,"labels":["a","b"]}`, false, nil},
		{"not an object", "github/create_repository", `["demo"]`, false, fencecheck.ErrArguments},
		{"invalid JSON", "github/create_repository", `{"name":`, false, fencecheck.ErrArguments},
		{"duplicate key", "github/create_repository", `{"name":"a","name":"b"}`, false, fencecheck.ErrArguments},
	}
	for _, tc := range cases {
		t.Run(tc.note, func(t *testing.T) {
			got, err := fencecheck.ArgumentDigest(tc.tool, json.RawMessage(tc.args))
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err = %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (got == base) != tc.same {
				t.Fatalf("digest equal to base = %v, want %v", got == base, tc.same)
			}
		})
	}
	// Empty and null arguments are the empty object.
	empty := must(t, "github/list_repositories", `{}`)
	for _, a := range []string{"", "null", " "} {
		if got := must(t, "github/list_repositories", a); got != empty {
			t.Errorf("arguments %q digest differs from {}", a)
		}
	}
}

func must(t *testing.T, tool, args string) string {
	t.Helper()
	d, err := fencecheck.ArgumentDigest(tool, json.RawMessage(args))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func ExampleArgumentDigest() {
	a, _ := fencecheck.ArgumentDigest("github/create_repository", json.RawMessage(`{"name":"demo","private":true}`))
	b, _ := fencecheck.ArgumentDigest("github/create_repository", json.RawMessage(`{"private": true, "name": "demo"}`))
	fmt.Println(a == b, a[:7])
	// Output: true sha256:
}
