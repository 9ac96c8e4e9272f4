package manifest

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestUnmarshalExplains: each way a JSON document can fail to decode is
// one *DecodeError naming the member by JSON Pointer, the byte where it
// was found, and what the member takes — never a Go type.
func TestUnmarshalExplains(t *testing.T) {
	type inner struct {
		When  time.Time `json:"when"`
		Count uint8     `json:"count"`
	}
	type doc struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
		Items     []inner         `json:"items"`
		Tags      map[string]int  `json:"tags"`
		Flag      bool            `json:"flag"`
		Odd       string          `json:"a/b~c"`
	}
	for _, tc := range []struct {
		in      string
		pointer string
		offset  int64
		reason  string
	}{
		{`{"argument":{}}`, "/argument", 1, `is not a known member (did you mean "arguments"?)`},
		{`{"NAME":"x"}`, "/NAME", 1, `is not a known member (did you mean "name"?)`},
		{`{"zzzzzz":1}`, "/zzzzzz", 1, "is not a known member"},
		{`{"items":[{"cont":1}]}`, "/items/0/cont", 11, `(did you mean "count"?)`},
		{`{"a/b~d":""}`, "/a~1b~0d", 1, `(did you mean "a/b~c"?)`},
		{`{"name":1}`, "/name", 8, "must be a string, not a number"},
		{`{"items":{}}`, "/items", 9, "must be a list of objects, not an object"},
		{`{"items":[{"when":"soon"}]}`, "/items/0/when", 18, `must be a time in RFC 3339 form, like "2026-01-02T15:04:05Z"`},
		{`{"items":[{"count":300}]}`, "/items/0/count", 19, "is out of range (300): it must be a whole number, zero or more that fits"},
		{`{"items":[{"count":1.5}]}`, "/items/0/count", 19, "must be a whole number, zero or more"},
		{`{"tags":{"a":"b"}}`, "/tags/a", 13, "must be a whole number, not a string"},
		{`{"flag":"true"}`, "/flag", 8, "must be true or false, not a string"},
		{`{"name":"a","name":"b"}`, "/name", 12, "appears twice"},
		{`{"name":"a"} x`, "", 13, "is not valid JSON: invalid character 'x' after top-level value"},
		{`{"name":`, "/name", 8, "is cut short"},
		{`[]`, "", 0, "must be an object, not a list"},
		{``, "", -1, "is empty"},
	} {
		var d doc
		err := Unmarshal([]byte(tc.in), &d)
		var de *DecodeError
		if !errors.As(err, &de) {
			t.Errorf("%s: %v, want a *DecodeError", tc.in, err)
			continue
		}
		if de.Pointer != tc.pointer || de.Offset != tc.offset || !strings.Contains(de.Reason, tc.reason) {
			t.Errorf("%s: %q at %d: %q, want %q at %d: %q", tc.in, de.Pointer, de.Offset, de.Reason, tc.pointer, tc.offset, tc.reason)
		}
		for _, leak := range []string{"Go ", "manifest.", "uint8", "[]", "map[", "json:", "jsontext", "unmarshal"} {
			if strings.Contains(err.Error(), leak) {
				t.Errorf("%s: %q shows %q", tc.in, err, leak)
			}
		}
	}
}

// TestDecodeStrictWraps: DecodeStrict's failures are ErrMalformed and
// carry the *DecodeError; Validate's violations are ErrInvalid and carry
// one *DecodeError each, on one line.
func TestDecodeStrictWraps(t *testing.T) {
	var m Manifest
	err := DecodeStrict([]byte(`{"pool":"p","tols":[]}`), &m)
	var de *DecodeError
	if !errors.Is(err, ErrMalformed) || !errors.As(err, &de) || de.Pointer != "/tols" || !strings.Contains(err.Error(), `did you mean "tools"?`) {
		t.Fatalf("DecodeStrict = %v", err)
	}
	err = (&Manifest{}).Validate()
	var pointers []string
	var walk func(error)
	walk = func(err error) {
		if d, ok := err.(*DecodeError); ok {
			pointers = append(pointers, d.Pointer)
		}
		if u, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range u.Unwrap() {
				walk(e)
			}
		}
	}
	walk(err)
	if !errors.Is(err, ErrInvalid) || len(pointers) < 3 || pointers[0] != "/server/name" || strings.Contains(err.Error(), "\n") {
		t.Fatalf("Validate = %q, pointers %v", err, pointers)
	}
}

// TestDecodeErrors: every member at fault is found however the errors are
// wrapped and joined, in order; an error naming no member gives none.
func TestDecodeErrors(t *testing.T) {
	a := &DecodeError{Pointer: "/tools/0/name", Offset: 12, Reason: "is missing"}
	b := &DecodeError{Pointer: "/pool", Offset: -1, Reason: "must be a string"}
	err := fmt.Errorf("register: %w", errors.Join(fmt.Errorf("decode: %w", a), errors.New("other"), b))
	got := DecodeErrors(err)
	if len(got) != 2 || got[0] != a || got[1] != b {
		t.Fatalf("DecodeErrors = %v, want [%v %v]", got, a, b)
	}
	if got := DecodeErrors(errors.New("plain")); got != nil {
		t.Fatalf("a plain error gave %v", got)
	}
}
