package manifest

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/fcd-authz/fcd/internal/public"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// schemaURL is the base URL every compiled schema is registered under. It
// is never fetched: relative references resolve against it and then fail
// to load, like every other non-local reference.
const schemaURL = "mem://fcd/schema.json"

// ErrSchemaRefused is wrapped by the error of CompileSchema when a schema
// refers to a resource outside itself (a remote or file URL, or a custom
// meta-schema). fcd never loads schema resources from anywhere.
var ErrSchemaRefused = public.New("manifest", "schema resource loading is disabled")

// noLoader refuses every URL. The compiler still resolves the standard
// meta-schemas of the JSON Schema drafts, which it embeds.
type noLoader struct{}

func (noLoader) Load(url string) (any, error) { return nil, ErrSchemaRefused }

// CompileSchema compiles a JSON Schema document. A schema without $schema
// is read as draft 2020-12. Nothing is ever loaded from outside the
// document: a $ref to a remote URL, a file or an unknown meta-schema makes
// compilation fail instead of fetching. The document must be I-JSON (RFC
// 7493): duplicate object members and invalid UTF-8 are refused.
//
// Formats are annotations, not assertions, as draft 2020-12 specifies;
// patterns use Go's RE2 engine, so matching time is linear.
//
// The result is safe for concurrent use by [ValidateArguments].
func CompileSchema(raw json.RawMessage) (*jsonschema.Schema, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return nil, fmt.Errorf("manifest: schema: empty document")
	}
	if !jsontext.Value(raw).IsValid() {
		return nil, fmt.Errorf("manifest: schema: not valid I-JSON (syntax, duplicate member or invalid UTF-8)")
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("manifest: schema: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(noLoader{})
	if err := c.AddResource(schemaURL, doc); err != nil {
		return nil, fmt.Errorf("manifest: schema: %w", err)
	}
	s, err := c.Compile(schemaURL)
	if err != nil {
		// The library's LoadURLError does not unwrap; name the cause.
		if lue := (*jsonschema.LoadURLError)(nil); errors.As(err, &lue) {
			return nil, fmt.Errorf("%w: the schema refers to %q", ErrSchemaRefused, lue.URL)
		}
		return nil, fmt.Errorf("manifest: schema: %w", err)
	}
	return s, nil
}

// Violation is one way a JSON value fails a schema.
type Violation struct {
	// InstancePath is the RFC 6901 JSON pointer of the offending value in
	// the validated document; "" is the document itself.
	InstancePath string `json:"instancePath"`
	Message      string `json:"message"`
}

// ArgumentError reports the leaf violations of a call's arguments against
// a schema, sorted by instance path and message.
type ArgumentError struct {
	Violations []Violation `json:"violations"`
}

func (e *ArgumentError) Error() string { return "manifest: " + e.Public() }

// Public is the sentence a client reads: each violation's instance path
// and message.
func (e *ArgumentError) Public() string {
	var sb strings.Builder
	sb.WriteString("arguments do not satisfy the schema")
	for i, v := range e.Violations {
		if i == 0 {
			sb.WriteString(": ")
		} else {
			sb.WriteString("; ")
		}
		fmt.Fprintf(&sb, "at %q: %s", v.InstancePath, v.Message)
	}
	return sb.String()
}

var schemaPrinter = message.NewPrinter(language.English)

// ValidateArguments validates a JSON document (a call's arguments, or
// anything else) against a schema compiled by [CompileSchema]. A document
// that is not I-JSON (bad syntax, duplicate members, invalid UTF-8) gives
// an error wrapping [ErrMalformed]; a document that does not satisfy the
// schema gives an error wrapping an [*ArgumentError] listing the leaf
// violations.
func ValidateArguments(s *jsonschema.Schema, args json.RawMessage) error {
	if s == nil {
		return errors.New("manifest: validate arguments: no schema")
	}
	args = bytes.TrimSpace(args)
	if len(args) == 0 || !jsontext.Value(args).IsValid() {
		return fmt.Errorf("%w: arguments are not valid I-JSON", ErrMalformed)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(args))
	if err != nil {
		return fmt.Errorf("%w: arguments: %v", ErrMalformed, err)
	}
	err = s.Validate(doc)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return fmt.Errorf("manifest: validate arguments: %w", err)
	}
	var vs []Violation
	collectViolations(ve, &vs)
	slices.SortFunc(vs, func(a, b Violation) int {
		return cmp.Or(cmp.Compare(a.InstancePath, b.InstancePath), cmp.Compare(a.Message, b.Message))
	})
	vs = slices.Compact(vs)
	return &ArgumentError{Violations: vs}
}

// collectViolations appends the leaves of the cause tree of e.
func collectViolations(e *jsonschema.ValidationError, out *[]Violation) {
	if len(e.Causes) > 0 {
		for _, c := range e.Causes {
			collectViolations(c, out)
		}
		return
	}
	msg := "validation failed"
	if e.ErrorKind != nil {
		msg = e.ErrorKind.LocalizedString(schemaPrinter)
	}
	if _, ok := e.ErrorKind.(*kind.FalseSchema); ok {
		msg = "no value is allowed here"
	}
	*out = append(*out, Violation{InstancePath: jsonPointer(e.InstanceLocation), Message: msg})
}

// jsonPointer encodes reference tokens as an RFC 6901 JSON pointer.
func jsonPointer(tokens []string) string {
	var sb strings.Builder
	r := strings.NewReplacer("~", "~0", "/", "~1")
	for _, t := range tokens {
		sb.WriteByte('/')
		sb.WriteString(r.Replace(t))
	}
	return sb.String()
}
