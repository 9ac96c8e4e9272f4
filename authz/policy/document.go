package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/fcd-authz/fcd/manifest"
)

// Document is an [Input] converted once per decision into the one value
// form both engines read: an OPA ast.Value of the Input's JSON document.
// Rego evaluates it as `input` as is; Cedar maps the free-form parts
// (arguments, principal attributes) from it and the fixed fields from the
// typed Input. Converting once, not once per engine, is what keeps the
// combined decision close to the cost of the engines themselves. A
// Document is immutable and safe for concurrent use (ast values are built
// for concurrent reads: OPA shares compiled terms across evaluations).
type Document struct {
	in    *Input
	value ast.Value
}

// NewDocument converts in. It fails with [ErrInvalidInput] when the input
// does not encode as JSON (invalid raw arguments, duplicate members,
// invalid UTF-8) or contradicts itself (the formation's side effects
// differ from the descriptor's; successor and formation.successor are not
// both present or both absent, or name different epochs or certificates):
// a decision over ambiguous or inconsistent facts must not allow anything.
func NewDocument(in *Input) (*Document, error) {
	if in == nil {
		return nil, fmt.Errorf("%w: nil input", ErrInvalidInput)
	}
	if fm, tm := in.Formation.Metadata.SideEffects, in.Tool.SideEffects; fm != "" && tm != "" && fm != tm {
		return nil, fmt.Errorf("%w: formation side effects %q differ from the descriptor's %q", ErrInvalidInput, fm, tm)
	}
	if err := consistentSuccessor(in); err != nil {
		return nil, err
	}
	v, err := convertInput(in)
	if err != nil {
		return nil, err
	}
	return &Document{in: in, value: v}, nil
}

// convertInput converts in member by member: the value its JSON encoding
// converts to, with the tool and epoch parts an [InputCache] converted
// once taken as they are (TestCachedDocumentMatches holds the two equal).
func convertInput(in *Input) (ast.Value, error) {
	formation, err := formationValue(&in.Formation)
	if err != nil {
		return nil, err
	}
	tool := in.Tool.value
	if tool == nil {
		if tool, err = toAST(in.Tool); err != nil {
			return nil, err
		}
	}
	epoch, err := epochValue(in.Epoch)
	if err != nil {
		return nil, err
	}
	session, err := toAST(in.Session)
	if err != nil {
		return nil, err
	}
	members := [][2]*ast.Term{
		{ast.StringTerm("phase"), ast.StringTerm(string(in.Phase))},
		{ast.StringTerm("formation"), ast.NewTerm(formation)},
		{ast.StringTerm("tool"), ast.NewTerm(tool)},
		{ast.StringTerm("epoch"), ast.NewTerm(epoch)},
		{ast.StringTerm("session"), ast.NewTerm(session)},
	}
	if s := in.Successor; s != nil {
		epoch, err := epochValue(s.Epoch)
		if err != nil {
			return nil, err
		}
		cert, err := toAST(s.Certificate)
		if err != nil {
			return nil, err
		}
		members = append(members, [2]*ast.Term{ast.StringTerm("successor"), ast.NewTerm(ast.NewObject(
			[2]*ast.Term{ast.StringTerm("epoch"), ast.NewTerm(epoch)},
			[2]*ast.Term{ast.StringTerm("certificate"), ast.NewTerm(cert)},
		))})
	}
	return ast.NewObject(members...), nil
}

func epochValue(e EpochInput) (ast.Value, error) {
	if e.value != nil {
		return e.value, nil
	}
	return toAST(e)
}

// toAST converts v's JSON encoding.
// formationValue converts the formation member as its JSON encoding
// would: field by field, its metadata and source as the InputCache
// converted them (TestCachedDocumentMatches holds the two ways equal).
func formationValue(f *FormationInput) (ast.Value, error) {
	if f.metadata == nil || f.source == nil {
		return toAST(f)
	}
	principal, err := toAST(f.Principal)
	if err != nil {
		return nil, err
	}
	var args ast.Value = ast.Null{}
	if len(f.Arguments) > 0 {
		if args, err = astFromJSON(f.Arguments); err != nil {
			return nil, fmt.Errorf("%w: arguments: %w", ErrInvalidInput, err)
		}
	}
	var successor ast.Value = ast.Null{}
	if f.Successor != nil {
		if successor, err = toAST(f.Successor); err != nil {
			return nil, err
		}
	}
	created, err := timeValue(f.CreatedAt)
	if err != nil {
		return nil, err
	}
	expires, err := timeValue(f.ExpiresAt)
	if err != nil {
		return nil, err
	}
	str := ast.StringTerm
	members := [][2]*ast.Term{
		{str("id"), str(f.ID)},
		{str("session"), str(f.Session)},
		{str("principal"), ast.NewTerm(principal)},
		{str("snapshot"), str(f.Snapshot)},
		{str("tool"), str(f.Tool)},
		{str("descriptorDigest"), str(f.DescriptorDigest)},
		{str("arguments"), ast.NewTerm(args)},
		{str("argumentDigest"), str(f.ArgumentDigest)},
		{str("source"), ast.NewTerm(f.source)},
		{str("successor"), ast.NewTerm(successor)},
		{str("metadata"), ast.NewTerm(f.metadata)},
		{str("createdAt"), ast.NewTerm(created)},
		{str("expiresAt"), ast.NewTerm(expires)},
		{str("digest"), str(f.Digest)},
	}
	if f.Recovery != nil {
		recovery, err := toAST(f.Recovery)
		if err != nil {
			return nil, err
		}
		members = append(members, [2]*ast.Term{str("recovery"), ast.NewTerm(recovery)})
	}
	return ast.NewObject(members...), nil
}

// timeValue is t as encoding/json writes it.
func timeValue(t time.Time) (ast.Value, error) {
	b, err := t.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("%w: encode: %w", ErrInvalidInput, err)
	}
	return ast.String(b[1 : len(b)-1]), nil
}

func toAST(v any) (ast.Value, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%w: encode: %w", ErrInvalidInput, err)
	}
	a, err := astFromJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: decode: %w", ErrInvalidInput, err)
	}
	return a, nil
}

// consistentSuccessor checks that the successor member describes exactly
// the successor the formation record names: a policy must not approve one
// candidate while the record carries another.
func consistentSuccessor(in *Input) error {
	s, fs := in.Successor, in.Formation.Successor
	switch {
	case s == nil && fs == nil:
		return nil
	case s == nil:
		return fmt.Errorf("%w: formation.successor is set but successor is absent", ErrInvalidInput)
	case fs == nil:
		return fmt.Errorf("%w: successor is set but formation.successor is absent", ErrInvalidInput)
	case s.Epoch.ID != fs.Epoch:
		return fmt.Errorf("%w: successor epoch %q differs from formation.successor's %q", ErrInvalidInput, s.Epoch.ID, fs.Epoch)
	case s.Certificate.ID != fs.Certificate:
		return fmt.Errorf("%w: successor certificate %q differs from formation.successor's %q", ErrInvalidInput, s.Certificate.ID, fs.Certificate)
	}
	return nil
}

// Input returns the input the document was made from. Callers must not
// modify it.
func (d *Document) Input() *Input { return d.in }

// DecodeInput strictly decodes an Input document (the JSON form documented
// in policies/README.md, as `authzd policy eval --input` and Cedar cases
// supply it): unknown or duplicated members are errors, so a misspelt
// field in a test case cannot silently test nothing.
func DecodeInput(data []byte) (*Input, error) {
	var in Input
	if err := manifest.DecodeStrict(data, &in); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidInput, err)
	}
	return &in, nil
}

// astFromJSON parses one JSON document straight into an ast.Value with a
// streaming tokenizer: no intermediate map[string]any, numbers kept as
// their exact literal. It is the same value ast.InterfaceToValue gives for
// the document decoded with UseNumber, at a fraction of the cost.
func astFromJSON(raw []byte) (ast.Value, error) {
	b := astBuilder{dec: jsontext.NewDecoder(bytes.NewReader(raw))}
	v, err := b.value()
	if err != nil {
		return nil, err
	}
	if k := b.dec.PeekKind(); k != 0 {
		return nil, fmt.Errorf("data after the JSON document")
	}
	return v, nil
}

// astBuilder holds the tokenizer and two allocation pools: terms are cut
// from chunks (a document's terms live and die together), and object
// members are staged on one stack, since ast.NewObject copies them.
type astBuilder struct {
	dec     *jsontext.Decoder
	terms   []ast.Term
	members [][2]*ast.Term
}

func (b *astBuilder) term(v ast.Value) *ast.Term {
	if len(b.terms) == 0 {
		b.terms = make([]ast.Term, 128)
	}
	t := &b.terms[0]
	b.terms = b.terms[1:]
	t.Value = v
	return t
}

func (b *astBuilder) value() (ast.Value, error) {
	tok, err := b.dec.ReadToken()
	if err != nil {
		return nil, err
	}
	switch tok.Kind() {
	case '{':
		base := len(b.members)
		for b.dec.PeekKind() != '}' {
			k, err := b.dec.ReadToken()
			if err != nil {
				return nil, err
			}
			key := b.term(ast.String(k.String())) // before the token is voided by the next read
			v, err := b.value()
			if err != nil {
				return nil, err
			}
			b.members = append(b.members, [2]*ast.Term{key, b.term(v)})
		}
		if _, err := b.dec.ReadToken(); err != nil {
			return nil, err
		}
		obj := ast.NewObject(b.members[base:]...)
		clear(b.members[base:])
		b.members = b.members[:base]
		return obj, nil
	case '[':
		var elems []*ast.Term
		for b.dec.PeekKind() != ']' {
			v, err := b.value()
			if err != nil {
				return nil, err
			}
			elems = append(elems, b.term(v))
		}
		if _, err := b.dec.ReadToken(); err != nil {
			return nil, err
		}
		return ast.NewArray(elems...), nil
	case '"':
		return ast.String(tok.String()), nil
	case '0':
		return ast.Number(tok.String()), nil
	case 't', 'f':
		return ast.Boolean(tok.Bool()), nil
	case 'n':
		return ast.NullValue, nil
	}
	return nil, fmt.Errorf("unexpected JSON token %v", tok)
}

// lookup walks the document's objects along keys and returns the value
// there, or nil.
func lookup(v ast.Value, keys ...string) ast.Value {
	for _, k := range keys {
		obj, ok := v.(ast.Object)
		if !ok {
			return nil
		}
		t := obj.Get(ast.StringTerm(k))
		if t == nil {
			return nil
		}
		v = t.Value
	}
	return v
}
