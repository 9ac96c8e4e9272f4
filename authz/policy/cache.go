package policy

import (
	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/fcd-authz/fcd/internal/bounded"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
)

// InputCache converts the parts of a decision input that do not change
// from call to call once: a tool's descriptor by its digest (a descriptor
// never changes under its digest) and an epoch by its id (the digest of
// its manifest) and state. Converting them was most of the cost of a
// decision. The inputs it returns share their slices, maps and converted
// values with every other caller: read them, never modify them. The zero
// value is ready to use; it is safe for concurrent use.
//
// Each part is kept in a bounded.Cache of bounded.DefaultMax entries: a
// forgotten entry is converted again on its next use, which is only
// slower.
type InputCache struct {
	tools    bounded.Cache[string, ToolInput]
	epochs   bounded.Cache[string, EpochInput]
	metadata bounded.Cache[string, convertedPart[record.Metadata]]
	sources  bounded.Cache[string, convertedPart[record.Target]]
}

// convertedPart is a part of a call and its conversion.
type convertedPart[T any] struct {
	part  T
	value ast.Value
}

// Formation is the formation member of an input for call (with its
// digest): the call's MCP+ metadata converted once per descriptor digest
// and its source target once per epoch — the parts that repeat from call
// to call and made up most of the call's converted bytes. A part is taken
// from the cache only when it equals the call's own (compared in full, by
// the part's Equal), so a call whose metadata or source differs is
// converted as it is.
func (c *InputCache) Formation(call record.Call, digest string) FormationInput {
	f := FormationInput{Call: call, Digest: digest}
	f.metadata = cachedPart(&c.metadata, call.DescriptorDigest, call.Metadata)
	f.source = cachedPart(&c.sources, call.Source.Epoch, call.Source)
	return f
}

// cachedPart returns the conversion of part, cached under key; nil when
// it cannot be converted (NewDocument then converts the whole call and
// reports why).
func cachedPart[T interface{ Equal(T) bool }](m *bounded.Cache[string, convertedPart[T]], key string, part T) ast.Value {
	if cp, ok := m.Get(key); ok && cp.part.Equal(part) {
		return cp.value
	}
	v, err := toAST(part)
	if err != nil {
		return nil
	}
	m.Put(key, convertedPart[T]{part: part, value: v})
	return v
}

// Tool is [NewToolInput] of t, which digest names (the descriptor digest
// its epoch records), converted once.
func (c *InputCache) Tool(digest, server string, t *manifest.Tool) ToolInput {
	key := digest + "\x00" + server
	if ti, ok := c.tools.Get(key); ok {
		return ti
	}
	ti := NewToolInput(server, t)
	v, err := toAST(ti)
	if err != nil {
		return ti // NewDocument converts it again and reports why
	}
	ti.value = v
	ct := cedarToolAttributes(&ti)
	ti.cedar = &ct
	c.tools.Put(key, ti)
	return ti
}

// Epoch is [NewEpochInput] of e, converted once per epoch id and state.
func (c *InputCache) Epoch(e *record.Epoch) EpochInput {
	key := e.ID + "\x00" + string(e.State)
	if e.Manifest == nil {
		key += "\x00-" // described without its manifest
	}
	if ei, ok := c.epochs.Get(key); ok {
		return ei
	}
	ei := NewEpochInput(e)
	v, err := toAST(ei)
	if err != nil {
		return ei
	}
	ei.value = v
	ce := cedarEpoch(&ei)
	ei.cedar = &ce
	c.epochs.Put(key, ei)
	return ei
}
