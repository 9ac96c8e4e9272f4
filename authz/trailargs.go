package authz

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/fcd-authz/fcd/manifest"
)

// TrailArguments says what the audit trail keeps of a call's arguments
// (Config.TrailArguments). The trail always keeps their digest, which the
// token binds; the arguments themselves stay with the record in etcd and
// go when etcd collects it, unless the trail keeps them.
type TrailArguments string

// What the trail keeps of arguments.
const (
	// TrailArgumentsNone keeps none of them: the digest only (the
	// default).
	TrailArgumentsNone TrailArguments = "none"
	// TrailArgumentsRedacted keeps them, each sensitive member replaced
	// by the string "[redacted]".
	TrailArgumentsRedacted TrailArguments = "redacted"
	// TrailArgumentsDigested keeps them, each sensitive member replaced
	// by the digest of its canonical JSON ("sha256:…"): equal values can
	// be matched across calls, but a low-entropy secret (a PIN) can be
	// guessed from its digest.
	TrailArgumentsDigested TrailArguments = "digested"
	// TrailArgumentsAll keeps them as formed.
	TrailArgumentsAll TrailArguments = "all"
)

// ParseTrailArguments reads a TrailArguments setting.
func ParseTrailArguments(s string) (TrailArguments, error) {
	switch a := TrailArguments(s); a {
	case TrailArgumentsNone, TrailArgumentsRedacted, TrailArgumentsDigested, TrailArgumentsAll:
		return a, nil
	case "":
		return TrailArgumentsNone, nil
	}
	return "", fmt.Errorf("%w: audit arguments %q: want none, redacted, digested or all", ErrBadRequest, s)
}

// redactedValue replaces a sensitive member in redacted mode.
const redactedValue = "[redacted]"

// trailArguments returns what the trail keeps of args (canonical JSON)
// under mode, given the tool's input schema: nil for none. A member is
// sensitive when its schema says "writeOnly": true (JSON Schema's mark
// for a value sent but never shown back, such as a password), or when its
// name looks like a secret's (manifest.SecretName), at any depth.
func trailArguments(mode TrailArguments, args, schema json.RawMessage) (json.RawMessage, error) {
	switch mode {
	case TrailArgumentsNone, "":
		return nil, nil
	case TrailArgumentsAll:
		return args, nil
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.UseNumber() // numbers as formed, not rounded through float64
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("authz: trail arguments: %w", err)
	}
	var s any
	if len(schema) > 0 {
		if err := json.Unmarshal(schema, &s); err != nil {
			return nil, fmt.Errorf("authz: trail arguments: input schema: %w", err)
		}
	}
	m := masker{mode: mode}
	out, err := json.Marshal(m.mask(v, s))
	if err != nil {
		return nil, err
	}
	if m.err != nil {
		return nil, m.err
	}
	return out, nil
}

type masker struct {
	mode TrailArguments
	err  error
}

// mask returns v with its sensitive members masked; schema is v's schema
// (nil when unknown).
func (m *masker) mask(v, schema any) any {
	sch, _ := schema.(map[string]any)
	switch v := v.(type) {
	case map[string]any:
		props, _ := sch["properties"].(map[string]any)
		extra := sch["additionalProperties"]
		out := make(map[string]any, len(v))
		for k, e := range v {
			es, declared := props[k]
			if !declared {
				es = extra
			}
			if manifest.SecretName(k) || writeOnly(es) {
				out[k] = m.hide(e)
				continue
			}
			out[k] = m.mask(e, es)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = m.mask(e, sch["items"])
		}
		return out
	}
	return v
}

func (m *masker) hide(v any) any {
	if m.mode == TrailArgumentsRedacted {
		return redactedValue
	}
	d, err := manifest.Digest(v)
	if err != nil && m.err == nil {
		m.err = fmt.Errorf("authz: trail arguments: %w", err)
	}
	return d
}

func writeOnly(schema any) bool {
	s, _ := schema.(map[string]any)
	w, _ := s["writeOnly"].(bool)
	return w
}
