package fencecheck

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"slices"
	"strconv"

	"github.com/gowebpki/jcs"
)

// ErrArguments is returned for arguments that are not a JSON object, or
// that the digest cannot represent faithfully.
var ErrArguments = errors.New("fencecheck: arguments must be a JSON object")

// jsonSpace is the whitespace RFC 8259 allows around JSON values.
const jsonSpace = " \t\n\r"

// ArgumentDigest returns "sha256:<hex>" over the RFC 8785 canonical JSON of
// {"arguments": arguments, "tool": tool}, where tool is "server/tool" and
// arguments is the call's JSON object (empty or null means {}). Key order
// and insignificant whitespace do not change it; any value or member
// change does.
//
// RFC 8785 writes every number as the nearest IEEE 754 double, so two
// different numbers can share one canonical form (9007199254740993 and
// 9007199254740992; snowflake ids). A backend that reads the exact number
// would then run a call the token was not issued for. ArgumentDigest
// therefore refuses, with [ErrArguments], a number whose value is not the
// value of its canonical form; such values must travel as strings.
// Spelling alone (1.0, 1e2, 0.10) is fine: it does not change the value.
func ArgumentDigest(tool string, arguments json.RawMessage) (string, error) {
	return argumentDigest(tool, arguments, false)
}

// argumentDigest is ArgumentDigest; read says arguments come from
// ReadMessage (the params.arguments of a body it accepted), which proved
// them one valid JSON value without member names that fold alike, so
// those two checks are not run again on the verification path.
func argumentDigest(tool string, arguments json.RawMessage, read bool) (string, error) {
	// Only JSON's own whitespace (RFC 8259: space, tab, LF, CR) may
	// surround the object; bytes.TrimSpace would also drop \v, \f and
	// Unicode spaces, and so accept bytes that are not JSON.
	args := bytes.Trim(arguments, jsonSpace)
	if len(args) == 0 || bytes.Equal(args, []byte("null")) {
		args = []byte("{}")
	}
	// One JSON object and nothing else: the document below is built by
	// concatenation, so anything after the object would become members
	// of the digested document.
	if args[0] != '{' || (!read && !json.Valid(args)) {
		return "", ErrArguments
	}
	if err := checkNumbers(args); err != nil {
		return "", err
	}
	if !read {
		if err := checkFoldedNames(args); err != nil {
			return "", err
		}
	}
	name, err := json.Marshal(tool)
	if err != nil {
		return "", fmt.Errorf("fencecheck: tool name: %w", err)
	}
	doc := make([]byte, 0, len(args)+len(name)+26)
	doc = append(doc, `{"arguments":`...)
	doc = append(doc, args...)
	doc = append(doc, `,"tool":`...)
	doc = append(doc, name...)
	doc = append(doc, '}')
	canon, err := jcs.Transform(doc)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrArguments, err)
	}
	sum := sha256.Sum256(canon)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// checkFoldedNames refuses an object, at any depth, with two member names
// that differ only in letter case ({"name":"x","Name":"y"}). Canonical
// JSON keeps both, so the digest, the policy and the approver see one of
// them, while a backend decoding case-insensitively (Go's encoding/json
// into a struct) may run the other.
func checkFoldedNames(doc []byte) error {
	// doc is valid JSON (json.Valid): a string after '{' or after ',' in
	// an object is a member name; nothing else needs parsing.
	var stack []foldedNames // per open container (an array's stays empty)
	var inObject []bool
	name := false
	for i := 0; i < len(doc); i++ {
		switch doc[i] {
		case '{':
			stack, inObject, name = append(stack, foldedNames{}), append(inObject, true), true
		case '[':
			stack, inObject, name = append(stack, foldedNames{}), append(inObject, false), false
		case '}', ']':
			stack, inObject, name = stack[:len(stack)-1], inObject[:len(inObject)-1], false
		case ',':
			name = inObject[len(inObject)-1]
		case '"':
			start, escaped := i+1, false
			for i++; doc[i] != '"'; i++ {
				if doc[i] == '\\' {
					escaped = true
					i++
				}
			}
			if !name {
				continue
			}
			name = false
			n := string(doc[start:i])
			if escaped {
				_ = json.Unmarshal(doc[start-1:i+1], &n) // a valid JSON string
			}
			if !stack[len(stack)-1].add(FoldName(n)) {
				return fmt.Errorf("%w: member names that fold alike (%q)", ErrArguments, n)
			}
		}
	}
	return nil
}

// foldedNames is the set of one object's folded member names: a short
// list while the object is small, a map once it is not, so that an object
// of n members costs O(n), not O(n²) — the check runs before any token is
// read, on bodies an attacker chooses.
type foldedNames struct {
	list []string
	set  map[string]struct{}
}

// add records folded and reports whether it was new.
func (f *foldedNames) add(folded string) bool {
	if f.set != nil {
		if _, dup := f.set[folded]; dup {
			return false
		}
		f.set[folded] = struct{}{}
		return true
	}
	if slices.Contains(f.list, folded) {
		return false
	}
	if f.list = append(f.list, folded); len(f.list) > 16 {
		f.set = make(map[string]struct{}, 2*len(f.list))
		for _, n := range f.list {
			f.set[n] = struct{}{}
		}
		f.list = nil
	}
	return true
}

// checkNumbers refuses a number in doc (valid JSON) whose value differs
// from the value of the shortest double that round-trips it, which is
// what RFC 8785 writes.
func checkNumbers(doc []byte) error {
	inString := false
	for i := 0; i < len(doc); i++ {
		c := doc[i]
		if inString {
			switch c {
			case '\\':
				i++ // skip the escaped byte; \uXXXX digits are not quotes
			case '"':
				inString = false
			}
			continue
		}
		switch {
		case c == '"':
			inString = true
		case c == '-' || (c >= '0' && c <= '9'):
			j := i + 1
			for j < len(doc) && isNumberByte(doc[j]) {
				j++
			}
			if err := checkNumber(doc[i:j]); err != nil {
				return err
			}
			i = j - 1
		}
	}
	return nil
}

func isNumberByte(c byte) bool {
	return (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'
}

// checkNumber checks one number literal. Without an exponent, up to 15
// characters hold at most 15 significant digits, which a double always
// carries exactly through the shortest round-trip form; only longer
// literals or exponents need the exact comparison.
func checkNumber(lit []byte) error {
	if len(lit) <= 15 && bytes.IndexAny(lit, "eE") < 0 {
		return nil
	}
	// Bound the work of the exact comparison: big.Rat would expand an
	// exponent of a billion into a billion digits.
	if len(lit) > 64 {
		return fmt.Errorf("%w: number %.20s… is longer than 64 characters", ErrArguments, lit)
	}
	if e := bytes.IndexAny(lit, "eE"); e >= 0 {
		if x, err := strconv.Atoi(string(lit[e+1:])); err != nil || x > 400 || x < -400 {
			return fmt.Errorf("%w: number %s is out of range", ErrArguments, lit)
		}
	}
	f, err := strconv.ParseFloat(string(lit), 64)
	if err != nil || math.IsInf(f, 0) {
		return fmt.Errorf("%w: number %s is out of range", ErrArguments, lit)
	}
	want, ok := new(big.Rat).SetString(string(lit))
	if !ok {
		return fmt.Errorf("%w: number %s", ErrArguments, lit)
	}
	got, _ := new(big.Rat).SetString(strconv.FormatFloat(f, 'g', -1, 64))
	if want.Cmp(got) != 0 {
		return fmt.Errorf("%w: number %s cannot be digested exactly (canonical form %s); send it as a string",
			ErrArguments, lit, strconv.FormatFloat(f, 'g', -1, 64))
	}
	return nil
}
