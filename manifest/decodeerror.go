package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// DecodeError explains why a JSON document did not decode, or why a
// member of a decoded document is not valid, in the document's own terms: the member at fault as an RFC 6901 JSON Pointer,
// the byte offset where it was found, and what the member takes — never
// the Go type it would have been decoded into. It is the one way fcd
// reports a JSON document it cannot read: request bodies, signed
// documents and the manifest lint.
type DecodeError struct {
	// Pointer is the RFC 6901 JSON Pointer of the member at fault, e.g.
	// "/tools/2/sideEffects"; "" is the whole document.
	Pointer string
	// Offset is the byte offset in the document where the fault was
	// found, or -1 when unknown.
	Offset int64
	// Reason says what is wrong, e.g. `is not a known member (did you mean
	// "arguments"?)`; it starts with a verb, so that the pointer and the
	// reason read as one sentence.
	Reason string
}

// Error is one sentence: "/arguments/0 must be a string, not a number
// (at byte 17)".
func (e *DecodeError) Error() string {
	var sb strings.Builder
	if e.Pointer == "" {
		sb.WriteString("the document ")
	} else {
		sb.WriteString(e.Pointer)
		sb.WriteByte(' ')
	}
	sb.WriteString(e.Reason)
	if e.Offset >= 0 {
		fmt.Fprintf(&sb, " (at byte %d)", e.Offset)
	}
	return sb.String()
}

// Unmarshal decodes the JSON document data into v strictly: unknown,
// duplicated or case-folded members and anything after the document are
// refused. A failure is a *DecodeError; an error of v itself (a nil
// pointer) is returned as it is.
func Unmarshal(data []byte, v any) error {
	err := jsonv2.Unmarshal(data, v, jsonv2.RejectUnknownMembers(true))
	if err == nil {
		return nil
	}
	if de := explainJSON(err, data); de != nil {
		return de
	}
	return err
}

// explainJSON turns an error of jsonv2.Unmarshal into a *DecodeError, or
// nil if it is neither a syntactic nor a semantic error.
func explainJSON(err error, data []byte) *DecodeError {
	var syn *jsontext.SyntacticError
	var sem *jsonv2.SemanticError
	switch {
	case errors.As(err, &syn):
		return explainSyntax(syn, data)
	case errors.As(err, &sem):
		return explainSemantic(sem)
	}
	return nil
}

func explainSyntax(e *jsontext.SyntacticError, data []byte) *DecodeError {
	de := &DecodeError{Pointer: string(e.JSONPointer), Offset: e.ByteOffset}
	switch {
	case errors.Is(e.Err, jsontext.ErrDuplicateName):
		de.Reason, de.Offset = "appears twice; a member may appear only once", e.ByteOffset
	case errors.Is(e.Err, io.ErrUnexpectedEOF) && len(bytes.TrimSpace(data)) == 0:
		de.Pointer, de.Offset = "", -1
		de.Reason = "is empty; a JSON value is required"
	case errors.Is(e.Err, io.ErrUnexpectedEOF):
		de.Reason = "is cut short: the JSON ends before the value is complete"
		if de.Pointer == "" {
			de.Reason = "is cut short: the JSON ends before the document is complete"
		}
	case e.Err != nil:
		de.Reason = "is not valid JSON: " + e.Err.Error()
	default:
		de.Reason = "is not valid JSON"
	}
	return de
}

func explainSemantic(e *jsonv2.SemanticError) *DecodeError {
	de := &DecodeError{Pointer: string(e.JSONPointer), Offset: e.ByteOffset}
	t := e.GoType
	switch {
	case errors.Is(e.Err, jsonv2.ErrUnknownName):
		de.Reason = "is not a known member"
		name := e.JSONPointer.LastToken()
		if t != nil {
			if near := NearestName(name, memberNames(t)); near != "" {
				de.Reason += fmt.Sprintf(" (did you mean %q?)", near)
			}
		}
		return de
	case t == nil:
		de.Reason = "has a value that cannot be used here"
		return de
	}
	want := takes(t)
	got := jsonKindName(e.JSONKind)
	switch {
	case e.Err == nil && got != "":
		de.Reason = fmt.Sprintf("must be %s, not %s", want, got)
	case errors.Is(e.Err, strconv.ErrRange):
		de.Reason = fmt.Sprintf("is out of range: it must be %s that fits", want)
		if v := string(e.JSONValue); v != "" {
			de.Reason = fmt.Sprintf("is out of range (%s): it must be %s that fits", v, want)
		}
	default:
		de.Reason = "must be " + want
		if got != "" && e.JSONValue != nil {
			de.Reason += ", not " + string(e.JSONValue)
		}
	}
	return de
}

// jsonKindName names a JSON kind as a person would; "" when unknown.
func jsonKindName(k jsontext.Kind) string {
	switch k {
	case 'n':
		return "null"
	case 't', 'f':
		return "true or false"
	case '"':
		return "a string"
	case '0':
		return "a number"
	case '{':
		return "an object"
	case '[':
		return "a list"
	}
	return ""
}

var (
	timeType    = reflect.TypeFor[time.Time]()
	rawType     = reflect.TypeFor[json.RawMessage]()
	valueType   = reflect.TypeFor[jsontext.Value]()
	durationTyp = reflect.TypeFor[time.Duration]()
)

// takes says what a member decoded into t takes, from its kind: "a
// string", "a list of objects", never the Go type's name.
func takes(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == timeType:
		return "a time in RFC 3339 form, like " + strconv.Quote("2026-01-02T15:04:05Z")
	case t == durationTyp:
		return "a whole number of nanoseconds"
	case t == rawType || t == valueType || t.Kind() == reflect.Interface:
		return "a JSON value"
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8:
		return "a base64 string"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "a whole number"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number, zero or more"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		elem := takes(t.Elem())
		switch {
		case elem == "a JSON value":
			return "a list"
		case strings.HasPrefix(elem, "a list"), strings.HasPrefix(elem, "a time"), strings.Contains(elem, ","):
			return "a list, each " + elem
		}
		e := strings.TrimPrefix(strings.TrimPrefix(elem, "an "), "a ")
		return "a list of " + e + "s"
	}
	return "a JSON value"
}

// memberNames are the JSON member names a struct type t takes, as
// jsonv2 reads them: the json tag's name or else the field's, embedded
// structs without a name inlined, unexported and "-" fields skipped.
func memberNames(t reflect.Type) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	var names []string
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" && opts == "" {
			continue
		}
		if f.Anonymous && name == "" || strings.Contains(","+opts+",", ",inline,") {
			names = append(names, memberNames(f.Type)...)
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		names = append(names, name)
	}
	return names
}

// NearestName is the name among names closest to name: a case-insensitive
// match or prefix either way first, else the smallest edit distance of at
// most a third of name's length; "" when none is near. It suggests "did
// you mean …?" for a misspelt member or setting.
func NearestName(name string, names []string) string {
	a := strings.ToLower(name)
	for _, n := range names {
		if strings.EqualFold(a, n) {
			return n
		}
	}
	best, bestD := "", len(name)/3+1
	for _, n := range names {
		b := strings.ToLower(n)
		if a != "" && (strings.HasPrefix(a, b) || strings.HasPrefix(b, a)) {
			return n
		}
		if d := editDistance(a, b); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// invalidError is a document's structural violations, each a
// *DecodeError, as one error wrapping [ErrInvalid] and each violation.
type invalidError struct{ errs []error }

func invalid(errs []error) error { return &invalidError{errs: errs} }

// Error is one line: "manifest: invalid document: /pool is required;
// /tools/0/name must match …".
func (e *invalidError) Error() string {
	parts := make([]string, len(e.errs))
	for i, err := range e.errs {
		parts[i] = err.Error()
	}
	return ErrInvalid.Error() + ": " + strings.Join(parts, "; ")
}

func (e *invalidError) Unwrap() []error { return append([]error{ErrInvalid}, e.errs...) }

// DecodeErrors returns every *DecodeError in err's tree (through
// Unwrap() error and Unwrap() []error, depth first, in order): each member
// at fault of a document that did not decode or validate, for a caller
// that reports them one by one. Nil when err names no member.
func DecodeErrors(err error) []*DecodeError {
	var out []*DecodeError
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case *DecodeError:
			out = append(out, e)
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				walk(inner)
			}
		case interface{ Unwrap() error }:
			walk(e.Unwrap())
		}
	}
	walk(err)
	return out
}
