package fencecheck

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// flatValue is one member value of a flat JSON object: a string or an
// integer.
type flatValue struct {
	isString bool
	str      []byte // the unescaped string; may alias the input
	num      int64
}

// decodeFlat decodes data as one JSON object whose member values are
// strings or integers only (a JWS header, a claim set), calling member
// for each member in order. name and v.str may alias data and are valid
// only during the call (copy them to keep them). Anything else is an error: other value kinds
// (objects, arrays, true, false, null, fractions, exponents), invalid
// UTF-8, or data after the object. Member names are passed exactly as
// written (after unescaping); duplicates are for member to refuse.
//
// It exists because encoding/json cannot refuse duplicate members and
// matches names case-insensitively, and its token API costs hundreds of
// allocations per token.
func decodeFlat(data []byte, member func(name []byte, v flatValue) error) error {
	s := flatScanner{b: data}
	s.space()
	if !s.consume('{') {
		return errors.New("not a JSON object")
	}
	s.space()
	if s.consume('}') {
		return s.end()
	}
	for {
		s.space()
		name, err := s.string()
		if err != nil {
			return err
		}
		s.space()
		if !s.consume(':') {
			return errors.New("expected ':' after a member name")
		}
		s.space()
		v, err := s.value()
		if err != nil {
			return fmt.Errorf("member %q: %w", name, err)
		}
		if err := member(name, v); err != nil {
			return err
		}
		s.space()
		if s.consume(',') {
			continue
		}
		if s.consume('}') {
			return s.end()
		}
		return errors.New("expected ',' or '}'")
	}
}

type flatScanner struct {
	b []byte
	i int
}

func (s *flatScanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *flatScanner) consume(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

func (s *flatScanner) end() error {
	s.space()
	if s.i != len(s.b) {
		return errors.New("data after the object")
	}
	return nil
}

// string reads a JSON string. Without escapes the bytes are taken as they
// are (they must be valid UTF-8), without a copy; with escapes,
// encoding/json unquotes the literal, after the scan checked where it
// ends.
func (s *flatScanner) string() ([]byte, error) {
	if !s.consume('"') {
		return nil, errors.New("expected a string")
	}
	start, escaped := s.i, false
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			raw := s.b[start:s.i]
			s.i++
			if !escaped {
				if !utf8.Valid(raw) {
					return nil, errors.New("invalid UTF-8 in a string")
				}
				return raw, nil
			}
			var out string
			if err := json.Unmarshal(s.b[start-1:s.i], &out); err != nil {
				return nil, errors.New("invalid string escape")
			}
			return []byte(out), nil
		case c == '\\':
			escaped = true
			s.i += 2
		case c < 0x20:
			return nil, errors.New("control character in a string")
		default:
			s.i++
		}
	}
	return nil, errors.New("unterminated string")
}

// value reads a string or an integer: -?(0|[1-9][0-9]*), nothing more.
func (s *flatScanner) value() (flatValue, error) {
	if s.i >= len(s.b) {
		return flatValue{}, errors.New("missing value")
	}
	c := s.b[s.i]
	if c == '"' {
		str, err := s.string()
		return flatValue{isString: true, str: str}, err
	}
	if c != '-' && (c < '0' || c > '9') {
		return flatValue{}, errors.New("must be a string or an integer")
	}
	start := s.i
	s.consume('-')
	digits := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	if s.i == digits || (s.b[digits] == '0' && s.i-digits > 1) {
		return flatValue{}, errors.New("invalid number")
	}
	if s.i < len(s.b) && (s.b[s.i] == '.' || s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		return flatValue{}, errors.New("must be an integer")
	}
	n, err := strconv.ParseInt(string(s.b[start:s.i]), 10, 64)
	if err != nil {
		return flatValue{}, errors.New("integer out of range")
	}
	return flatValue{num: n}, nil
}
