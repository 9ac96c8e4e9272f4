package fencecheck_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
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
		{"vertical tab before the object (not JSON whitespace)", "github/create_repository", "\v{}", false, fencecheck.ErrArguments},
		{"no-break space after the object", "github/create_repository", "{}\u00a0", false, fencecheck.ErrArguments},
		{"JSON whitespace around the object", "github/create_repository", " \t\r\n{\"name\":\"demo\",\"private\":true,\"labels\":[\"a\",\"b\"]}\n", true, nil},
		{"duplicate key", "github/create_repository", `{"name":"a","name":"b"}`, false, fencecheck.ErrArguments},
		{"names differing only in case", "github/create_repository", `{"name":"a","Name":"b"}`, false, fencecheck.ErrArguments},
		{"nested names differing only in case", "github/create_repository", `{"name":"a","opts":[{"x":1},{"X":1,"x":2}]}`, false, fencecheck.ErrArguments},
		{"a name that folds alike once unescaped", "github/create_repository", `{"name":"a","N\u0061ME":"b"}`, false, fencecheck.ErrArguments},
		{"names that fold alike after a value with an escaped quote", "github/create_repository", `{"a":"x\",\"A\":\"y","A":1}`, false, fencecheck.ErrArguments},
		{"strings of an array are not names", "github/create_repository", `{"a":["b","B"],"c":{"d":["e","E"]}}`, false, nil},
		{"the same name in sibling objects", "github/create_repository", `{"a":{"x":1},"b":{"X":1},"c":[{"x":1},{"X":2}]}`, false, nil},
		{"members after the object", "github/create_repository", `{"name":"demo"},"x":{"y":1}`, false, fencecheck.ErrArguments},
		{"two objects", "github/create_repository", `{"name":"demo"}{"name":"x"}`, false, fencecheck.ErrArguments},
		{"integer beyond 2^53", "github/create_repository", `{"id":9007199254740993}`, false, fencecheck.ErrArguments},
		{"snowflake id", "github/create_repository", `{"id":1234567890123456789}`, false, fencecheck.ErrArguments},
		{"digits a double cannot hold", "github/create_repository", `{"n":0.10000000000000001}`, false, fencecheck.ErrArguments},
		{"underflow", "github/create_repository", `{"n":1e-400}`, false, fencecheck.ErrArguments},
		{"huge exponent", "github/create_repository", `{"n":1e-1000000000}`, false, fencecheck.ErrArguments},
		{"overflow", "github/create_repository", `{"n":1e309}`, false, fencecheck.ErrArguments},
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
	// Numbers a double holds exactly digest by value, whatever their
	// spelling; numbers inside strings are left alone.
	for _, same := range [][2]string{
		{`{"n":1}`, `{"n":1.0}`},
		{`{"n":100}`, `{"n":1e2}`},
		{`{"n":0.1}`, `{"n":0.10}`},
		{`{"n":9007199254740992}`, `{"n":9007199254740992.0}`},
		{`{"n":1.5e300}`, `{"n":15e299}`},
		{`{"s":"9007199254740993","n":[-0.25]}`, `{"n":[-2.5e-1],"s":"9007199254740993"}`},
	} {
		if must(t, "t/t", same[0]) != must(t, "t/t", same[1]) {
			t.Errorf("%s and %s digest differently", same[0], same[1])
		}
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

func TestArgumentDigestAllowsCaseVariantsInDifferentObjects(t *testing.T) {
	for _, args := range []string{`{"a":{"x":1},"b":{"X":1}}`, `{"list":[{"k":1},{"K":2}],"K":"v"}`, `{"s":"Name","name":"s"}`} {
		if _, err := fencecheck.ArgumentDigest("t/t", json.RawMessage(args)); err != nil {
			t.Errorf("%s: %v", args, err)
		}
	}
}

// TestArgumentDigestWideObjects: names that fold alike are found among
// many members too (past the short list, in the set), in any position.
func TestArgumentDigestWideObjects(t *testing.T) {
	wide := func(n int, extra string) string {
		var b strings.Builder
		b.WriteString(`{`)
		for i := range n {
			fmt.Fprintf(&b, `"member%d":%d,`, i, i)
		}
		b.WriteString(extra)
		b.WriteString(`}`)
		return b.String()
	}
	for _, tc := range []struct {
		note, args string
		refused    bool
	}{
		{"10,000 distinct members", wide(10000, `"last":0`), false},
		{"a fold of the first member last", wide(10000, `"MEMBER0":0`), true},
		{"a fold of a middle member last", wide(10000, `"Member5000":0`), true},
		{"a fold just past the short list", wide(17, `"MEMBER16":0`), true},
		{"a fold inside the short list", wide(3, `"MEMBER2":0`), true},
	} {
		_, err := fencecheck.ArgumentDigest("github/create_repository", json.RawMessage(tc.args))
		if got := errors.Is(err, fencecheck.ErrArguments); got != tc.refused {
			t.Errorf("%s: refused %v (%v), want %v", tc.note, got, err, tc.refused)
		}
	}
}

// BenchmarkArgumentDigestWide: a wide object costs time proportional to
// its size (it ran in O(n²) once: 30 s for 100,000 members).
func BenchmarkArgumentDigestWide(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		var sb strings.Builder
		sb.WriteString(`{`)
		for i := range n {
			fmt.Fprintf(&sb, `"member%d":%d,`, i, i)
		}
		sb.WriteString(`"last":0}`)
		args := json.RawMessage(sb.String())
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				if _, err := fencecheck.ArgumentDigest("github/create_repository", args); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
