package fencecheck

import (
	"encoding/json"
	"fmt"
	"testing"
)

func TestDecodeFlat(t *testing.T) {
	cases := []struct {
		in   string
		want string // members as "name"=value; or "error"
	}{
		{`{}`, ``},
		{` { "a" : "x" , "b":-12 } `, `"a"="x";"b"=-12;`},
		{`{"a":"x","a":"y"}`, `"a"="x";"a"="y";`}, // duplicates are the caller's to refuse
		{`{"\u0061\n":"\u00e9\"\\\/"}`, `"a\n"="é\"\\/";`},
		{`{"a":0}`, `"a"=0;`},
		{`{"a":-0}`, `"a"=0;`},
		{`{"a":01}`, `error`},
		{`{"a":1.0}`, `error`},
		{`{"a":1e3}`, `error`},
		{`{"a":-}`, `error`},
		{`{"a":9223372036854775808}`, `error`},
		{`{"a":true}`, `error`},
		{`{"a":null}`, `error`},
		{`{"a":["x"]}`, `error`},
		{`{"a":{"b":1}}`, `error`},
		{`{"a":"x"} {}`, `error`},
		{`{"a":"x",}`, `error`},
		{`{"a" "x"}`, `error`},
		{`{"a":"x`, `error`},
		{`{"a":"x\"}`, `error`},
		{`{"a":"\q"}`, `error`},
		{"{\"a\":\"x\ty\"}", `error`},
		{"{\"a\":\"\xff\"}", `error`},
		{`["a"]`, `error`},
		{``, `error`},
	}
	for _, tc := range cases {
		got := ""
		err := decodeFlat([]byte(tc.in), func(name []byte, v flatValue) error {
			if v.isString {
				got += fmt.Sprintf("%q=%q;", name, v.str)
			} else {
				got += fmt.Sprintf("%q=%d;", name, v.num)
			}
			return nil
		})
		if err != nil {
			got = "error"
		}
		if got != tc.want {
			t.Errorf("decodeFlat(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// FuzzDecodeFlat: whatever decodeFlat accepts, encoding/json reads alike
// (for inputs without duplicate names).
func FuzzDecodeFlat(f *testing.F) {
	for _, s := range []string{`{"a":"x","b":-12}`, `{"\u0061":"\ud83d\ude00"}`, `{}`, `{"a":1.5}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got := map[string]any{}
		dup := false
		err := decodeFlat(data, func(name []byte, v flatValue) error {
			if _, ok := got[string(name)]; ok {
				dup = true
			}
			if v.isString {
				got[string(name)] = string(v.str)
			} else {
				got[string(name)] = json.Number(fmt.Sprint(v.num))
			}
			return nil
		})
		if err != nil || dup {
			return
		}
		var want map[string]any
		if err := json.Unmarshal(data, &want); err != nil {
			t.Fatalf("decodeFlat accepted %q, encoding/json: %v", data, err)
		}
		if len(want) != len(got) {
			t.Fatalf("%q: %v vs %v", data, got, want)
		}
		for k, v := range want {
			g := got[k]
			if n, ok := g.(json.Number); ok {
				f, _ := n.Float64()
				if v != f {
					t.Fatalf("%q: %s = %v, encoding/json %v", data, k, g, v)
				}
				continue
			}
			if g != v {
				t.Fatalf("%q: %s = %v, encoding/json %v", data, k, g, v)
			}
		}
	})
}
