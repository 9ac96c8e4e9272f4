package fencecheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MetaFormation is the key of a tools/call's params._meta that carries its
// formation id, for gateways that forward the body.
const MetaFormation = "dev.fcd/formation"

// MethodCall is the JSON-RPC method of an MCP tool call.
const MethodCall = "tools/call"

// Message is what fcd reads of one MCP JSON-RPC request body. Gateways
// (authzd's ext_authz) and the fence read bodies with [ReadMessage] alone,
// so both sides decide on the same reading.
type Message struct {
	// Method is the JSON-RPC method; empty for a response or a batch.
	Method string
	// Call reports a single tools/call request: method exactly
	// "tools/call".
	Call bool
	// Batch reports a JSON-RPC batch (array). A batch that holds a
	// tools/call is refused, so a Batch message never holds one.
	Batch bool
	// ID is the request's id as written; nil for a notification.
	ID json.RawMessage
	// Name is params.name of a call.
	Name string
	// Arguments is params.arguments of a call exactly as written; nil
	// when absent.
	Arguments json.RawMessage
	// Formation is params._meta["dev.fcd/formation"] of a call, if any.
	Formation string
}

// Names fcd reads in a JSON-RPC request: a member whose name equals one of
// them only under case folding is refused, since a lenient parser could
// take it for the member fcd did not read.
var (
	topNames    = []string{"jsonrpc", "id", "method", "params"}
	paramNames  = []string{"name", "arguments", "_meta"}
	metaNames   = []string{MetaFormation}
	foldedCalls = FoldName(MethodCall)
)

// ReadMessage reads an MCP JSON-RPC request body strictly. It is the one
// reader of fcd: the rule it keeps is that what the backend parses is what
// was verified. The body is forwarded byte for byte, so ReadMessage
// accepts only bodies that every JSON parser in use reads the same way,
// and refuses with a [*RejectError] anything that could be read two ways:
//
//   - not JSON ([ReasonParse]), or JSON but not a request it can read
//     ([ReasonInvalidRequest]);
//   - invalid UTF-8, or a \u escape of a lone surrogate, which parsers
//     replace, keep or refuse differently ([ReasonEncoding]);
//   - an object, anywhere in the body, with a member name twice: parsers
//     keep the first, the last, or refuse ([ReasonDuplicateMember]);
//   - a member that equals a name fcd reads (jsonrpc, id, method, params;
//     in params: name, arguments, _meta; in _meta: dev.fcd/formation) only
//     under case folding ("Arguments", "ARGUMENTS", "argumentſ"), or a
//     method that equals "tools/call" only under folding: Go's
//     encoding/json would read it, the MCP Go SDK would not
//     ([ReasonMemberCase]);
//   - two member names in the arguments, at any depth, that fold alike
//     ("visibility", "viſibility"): the approver saw both, a backend
//     decoding into a struct runs one ([ReasonNameCollision]);
//   - a batch that holds a tools/call ([ReasonBatch]).
//
// Member names otherwise match exactly, as the MCP SDKs match them. An
// empty body (JSON whitespace only) is the zero Message.
func ReadMessage(body []byte) (Message, error) {
	m, rerr := readMessage(body)
	if rerr != nil {
		return Message{}, rerr
	}
	return m, nil
}

func readMessage(body []byte) (Message, *RejectError) {
	trimmed := bytes.Trim(body, jsonSpace)
	if len(trimmed) == 0 {
		return Message{}, nil
	}
	if !utf8.Valid(trimmed) {
		return Message{}, reject(ReasonEncoding, "the body is not valid UTF-8")
	}
	if !json.Valid(trimmed) {
		return Message{}, reject(ReasonParse, "the body is not JSON")
	}
	s := strictScanner{b: trimmed}
	root, rerr := s.value(0)
	if rerr != nil {
		return Message{}, rerr
	}
	switch trimmed[0] {
	case '[':
		for _, el := range root.elems {
			m, rerr := readObject(trimmed, el)
			if rerr != nil {
				return Message{}, rerr
			}
			if m.Call {
				return Message{}, reject(ReasonBatch, "a JSON-RPC batch holds a tools/call; send calls one per request")
			}
		}
		return Message{Batch: true}, nil
	case '{':
		return readObject(trimmed, root)
	}
	return Message{}, reject(ReasonInvalidRequest, "not a JSON-RPC message: neither an object nor a batch")
}

// readObject reads one JSON-RPC message.
func readObject(b []byte, v *node) (Message, *RejectError) {
	if v.kind != '{' {
		return Message{}, reject(ReasonInvalidRequest, "a batch element is not an object")
	}
	top, rerr := v.protected(topNames, "")
	if rerr != nil {
		return Message{}, rerr
	}
	var m Message
	if mv := top["method"]; mv != nil {
		if mv.kind != '"' {
			return Message{}, reject(ReasonInvalidRequest, "method is not a string")
		}
		_ = json.Unmarshal(mv.raw(b), &m.Method) // valid JSON string
		if m.Method != MethodCall && FoldName(m.Method) == foldedCalls {
			return Message{}, reject(ReasonMemberCase, "method %q is tools/call only under case folding", m.Method)
		}
		m.Call = m.Method == MethodCall
	}
	if id := top["id"]; id != nil {
		m.ID = id.raw(b)
	}
	if !m.Call {
		return m, nil
	}
	p := top["params"]
	if p == nil || p.kind != '{' {
		return Message{}, reject(ReasonInvalidRequest, "a tools/call needs params as an object")
	}
	params, rerr := p.protected(paramNames, "params.")
	if rerr != nil {
		return Message{}, rerr
	}
	if n := params["name"]; n == nil || n.kind != '"' {
		return Message{}, reject(ReasonInvalidRequest, "params.name of a tools/call must be a string")
	} else {
		_ = json.Unmarshal(n.raw(b), &m.Name)
	}
	if a := params["arguments"]; a != nil {
		if a.kind != '{' && a.kind != 'n' {
			return Message{}, reject(ReasonInvalidRequest, "params.arguments must be an object")
		}
		m.Arguments = a.raw(b)
		if err := checkFoldedNames(m.Arguments); err != nil {
			return Message{}, reject(ReasonNameCollision, "params.arguments: %v", err)
		}
	}
	if mt := params["_meta"]; mt != nil && mt.kind != 'n' {
		if mt.kind != '{' {
			return Message{}, reject(ReasonInvalidRequest, "params._meta must be an object")
		}
		meta, rerr := mt.protected(metaNames, "params._meta.")
		if rerr != nil {
			return Message{}, rerr
		}
		if f := meta[MetaFormation]; f != nil {
			if f.kind != '"' {
				return Message{}, reject(ReasonInvalidRequest, "params._meta[%q] must be a string", MetaFormation)
			}
			_ = json.Unmarshal(f.raw(b), &m.Formation)
		}
	}
	return m, nil
}

// protected returns the members of object v whose names are in names,
// refusing a member whose name equals one of them only under case folding.
func (v *node) protected(names []string, path string) (map[string]*node, *RejectError) {
	out := make(map[string]*node, len(names))
	for i := range v.names {
		name := v.names[i]
		for _, want := range names {
			switch {
			case name == want:
				out[want] = v.elems[i]
			case strings.EqualFold(name, want):
				return nil, reject(ReasonMemberCase, "member %q is %s%s only under case folding", name, path, want)
			}
		}
	}
	return out, nil
}

// node is one JSON value of a body, by its span; objects keep their
// members' names (unescaped) and values, arrays their elements.
type node struct {
	kind       byte // '{', '[', '"', 'n' (null), 't'/'f', '0' (number)
	start, end int
	names      []string
	elems      []*node
}

func (v *node) raw(b []byte) json.RawMessage { return json.RawMessage(b[v.start:v.end]) }

// maxDepth bounds nesting, as the MCP Go SDK does (1000); deeper bodies
// are refused as invalid rather than walked.
const maxDepth = 1000

// strictScanner walks a body that json.Valid accepted: it records the
// structure, refuses duplicate member names in any object and \u escapes
// of lone surrogates in any string.
type strictScanner struct {
	b []byte
	i int
}

func (s *strictScanner) space() {
	for s.i < len(s.b) && strings.IndexByte(jsonSpace, s.b[s.i]) >= 0 {
		s.i++
	}
}

func (s *strictScanner) value(depth int) (*node, *RejectError) {
	if depth > maxDepth {
		return nil, reject(ReasonInvalidRequest, "nested deeper than %d", maxDepth)
	}
	s.space()
	v := &node{start: s.i}
	switch c := s.b[s.i]; c {
	case '{':
		v.kind = '{'
		s.i++
		seen := map[string]bool{}
		for {
			s.space()
			if s.b[s.i] == '}' {
				s.i++
				break
			}
			if s.b[s.i] == ',' {
				s.i++
				s.space()
			}
			name, rerr := s.name()
			if rerr != nil {
				return nil, rerr
			}
			if seen[name] {
				return nil, reject(ReasonDuplicateMember, "member %q appears twice in one object", name)
			}
			seen[name] = true
			s.space()
			s.i++ // ':'
			el, rerr := s.value(depth + 1)
			if rerr != nil {
				return nil, rerr
			}
			v.names = append(v.names, name)
			v.elems = append(v.elems, el)
			s.space()
		}
	case '[':
		v.kind = '['
		s.i++
		for {
			s.space()
			if s.b[s.i] == ']' {
				s.i++
				break
			}
			if s.b[s.i] == ',' {
				s.i++
			}
			el, rerr := s.value(depth + 1)
			if rerr != nil {
				return nil, rerr
			}
			v.elems = append(v.elems, el)
		}
	case '"':
		v.kind = '"'
		if _, rerr := s.str(); rerr != nil {
			return nil, rerr
		}
	case 'n', 't', 'f':
		v.kind = c
		for s.i < len(s.b) && s.b[s.i] >= 'a' && s.b[s.i] <= 'z' {
			s.i++
		}
	default:
		v.kind = '0'
		for s.i < len(s.b) && isNumberByte(s.b[s.i]) {
			s.i++
		}
	}
	v.end = s.i
	return v, nil
}

// name reads a member name and returns it unescaped.
func (s *strictScanner) name() (string, *RejectError) {
	start := s.i
	escaped, rerr := s.str()
	if rerr != nil {
		return "", rerr
	}
	lit := s.b[start:s.i]
	if !escaped {
		return string(lit[1 : len(lit)-1]), nil
	}
	var name string
	_ = json.Unmarshal(lit, &name) // a valid JSON string without lone surrogates
	return name, nil
}

// str skips a string at s.i, reporting whether it has escapes and refusing
// a \u escape of a lone surrogate.
func (s *strictScanner) str() (escaped bool, rerr *RejectError) {
	s.i++ // '"'
	for {
		switch s.b[s.i] {
		case '"':
			s.i++
			return escaped, nil
		case '\\':
			escaped = true
			if s.b[s.i+1] != 'u' {
				s.i += 2
				continue
			}
			r := hex4(s.b[s.i+2 : s.i+6])
			s.i += 6
			switch {
			case r >= 0xDC00 && r <= 0xDFFF:
				return escaped, reject(ReasonEncoding, "a \\u escape of a lone low surrogate")
			case r >= 0xD800 && r <= 0xDBFF:
				if s.i+6 > len(s.b) || s.b[s.i] != '\\' || s.b[s.i+1] != 'u' {
					return escaped, reject(ReasonEncoding, "a \\u escape of a lone high surrogate")
				}
				if lo := hex4(s.b[s.i+2 : s.i+6]); lo < 0xDC00 || lo > 0xDFFF {
					return escaped, reject(ReasonEncoding, "a \\u escape of a lone high surrogate")
				}
				s.i += 6
			}
		default:
			s.i++
		}
	}
}

// hex4 decodes four hex digits (valid JSON guarantees them).
func hex4(h []byte) rune {
	var r rune
	for _, c := range h {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		}
	}
	return r
}

// FoldName maps s to one representative of its Unicode simple case-folding
// class: each rune becomes the smallest rune of its folding orbit. Two
// names fold alike exactly when strings.EqualFold holds for them
// ("Method", "METHOD" and "method"; "viſibility" and "visibility"; the
// Kelvin sign and k) — which is also when Go's encoding/json matches a
// member to a struct field. It is fcd's one fold rule for member names.
func FoldName(s string) string {
	if isASCII(s) {
		// The orbit of an ASCII letter is its two cases plus, for k and s,
		// a non-ASCII rune (the Kelvin sign, ſ) above both: the least is
		// the upper case.
		return strings.ToUpper(s)
	}
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		if r == utf8.RuneError {
			b.WriteRune(r)
			continue
		}
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		b.WriteRune(least)
	}
	return b.String()
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// String formats a Message for logs.
func (m Message) String() string {
	if m.Call {
		return fmt.Sprintf("tools/call %q", m.Name)
	}
	return m.Method
}
