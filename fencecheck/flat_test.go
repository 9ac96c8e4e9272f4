package fencecheck

import (
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
