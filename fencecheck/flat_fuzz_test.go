package fencecheck

import (
	"bytes"
	"encoding/json"
	"strconv"
	"testing"
	"unicode/utf8"
)

// FuzzDecodeFlat holds fencecheck's own JSON scanner for token headers and
// claims to encoding/json: whatever decodeFlat accepts is valid UTF-8 JSON
// that encoding/json decodes to the same members and values, and a flat
// object of strings and int64 integers that encoding/json accepts is
// accepted by decodeFlat too. A parser differential here would let a
// token say one thing to fencecheck and another to a library.
//
// go test -run '^$' -fuzz FuzzDecodeFlat ./fencecheck/
func FuzzDecodeFlat(f *testing.F) {
	for _, seed := range []string{
		`{}`, `{"alg":"EdDSA","kid":"k1","typ":"fcd-dispatch+jwt"}`, `{"exp":1796040000,"n":-0,"s":"\u00e9\"\\\/\n"}`,
		`{"a":"x","a":"y"}`, `{"a":1.5}`, `{"a":"\ud800"}`, `{"a":"\n\xff"}`, ` {"a" : 9223372036854775807 } `,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		type member struct {
			name string
			v    flatValue
		}
		var got []member
		err := decodeFlat(data, func(name []byte, v flatValue) error {
			v.str = bytes.Clone(v.str)
			got = append(got, member{string(name), v})
			return nil
		})
		var want map[string]json.RawMessage
		jerr := json.Unmarshal(data, &want)
		if err == nil {
			if !utf8.Valid(data) && !bytes.Contains(data, []byte(`\`)) {
				t.Fatalf("accepted invalid UTF-8: %q", data)
			}
			if jerr != nil {
				t.Fatalf("decodeFlat accepts %q, encoding/json does not: %v", data, jerr)
			}
			last := map[string]flatValue{}
			for _, m := range got {
				if !utf8.ValidString(m.name) || (m.v.isString && !utf8.Valid(m.v.str)) {
					t.Fatalf("decodeFlat yields invalid UTF-8 from %q: %q", data, m.name)
				}
				last[m.name] = m.v
			}
			if len(last) != len(want) {
				t.Fatalf("%q: %d members, encoding/json %d", data, len(last), len(want))
			}
			for name, v := range last {
				raw := want[name]
				if v.isString {
					var s string
					if json.Unmarshal(raw, &s) != nil || s != string(v.str) {
						t.Fatalf("%q: member %q is %q, encoding/json %s", data, name, v.str, raw)
					}
				} else if n, err := strconv.ParseInt(string(raw), 10, 64); err != nil || n != v.num {
					t.Fatalf("%q: member %q is %d, encoding/json %s", data, name, v.num, raw)
				}
			}
			return
		}
		// Refused: fine unless it is a flat object of strings and int64s in
		// valid UTF-8 without escapes that could hide a bad code point.
		if jerr != nil || !utf8.Valid(data) || bytes.Contains(data, []byte(`\`)) {
			return
		}
		for _, raw := range want {
			var s string
			if json.Unmarshal(raw, &s) == nil {
				continue
			}
			if _, err := strconv.ParseInt(string(raw), 10, 64); err != nil {
				return // a kind decodeFlat refuses by design
			}
		}
		t.Fatalf("decodeFlat refuses %q (%v), a flat object encoding/json accepts", data, err)
	})
}
