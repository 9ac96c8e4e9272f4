package policy

import (
	"sync"

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
type InputCache struct {
	mu     sync.Mutex
	tools  map[string]ToolInput
	epochs map[string]EpochInput
}

// maxInputCache bounds each map; a full map starts over (every entry is
// converted again on its next use, which is only slower).
const maxInputCache = 4096

// Tool is [NewToolInput] of t, which digest names (the descriptor digest
// its epoch records), converted once.
func (c *InputCache) Tool(digest, server string, t *manifest.Tool) ToolInput {
	key := digest + "\x00" + server
	c.mu.Lock()
	ti, ok := c.tools[key]
	c.mu.Unlock()
	if ok {
		return ti
	}
	ti = NewToolInput(server, t)
	v, err := toAST(ti)
	if err != nil {
		return ti // NewDocument converts it again and reports why
	}
	ti.value = v
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tools == nil || len(c.tools) >= maxInputCache {
		c.tools = map[string]ToolInput{}
	}
	c.tools[key] = ti
	return ti
}

// Epoch is [NewEpochInput] of e, converted once per epoch id and state.
func (c *InputCache) Epoch(e *record.Epoch) EpochInput {
	key := e.ID + "\x00" + string(e.State)
	if e.Manifest == nil {
		key += "\x00-" // described without its manifest
	}
	c.mu.Lock()
	ei, ok := c.epochs[key]
	c.mu.Unlock()
	if ok {
		return ei
	}
	ei = NewEpochInput(e)
	v, err := toAST(ei)
	if err != nil {
		return ei
	}
	ei.value = v
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.epochs == nil || len(c.epochs) >= maxInputCache {
		c.epochs = map[string]EpochInput{}
	}
	c.epochs[key] = ei
	return ei
}
