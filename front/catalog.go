package front

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/fcd-authz/fcd/client"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MetaKey is the _meta member of a listed tool that carries its MCP+
// metadata, and of a refused call's result that carries the refusal.
const MetaKey = "io.github.fcd-authz/fcd"

// catalog is one snapshot as the front lists it: every tool under the
// name its clients call it by. It never changes once built.
type catalog struct {
	snapshot string
	tools    map[string]*entry // by listed name
}

// entry is one tool of a catalog.
type entry struct {
	// name is the name clients list and call: the tool's own name, or
	// "server.tool" when two fronted servers have a tool of that name.
	name string
	// tool is the snapshot's name, "server/tool"; server and upstream are
	// its parts (upstream is what the backend calls it).
	tool, server, upstream string
	listed                 *mcp.Tool
	sideEffects            string
	failureModes           []failureMode
	hasOutputSchema        bool
}

// failureMode is a declared failure and its recovery.
type failureMode struct {
	Error    string `json:"error"`
	Recovery string `json:"recovery,omitempty"`
	Fallback string `json:"fallback,omitempty"`
}

// fullSnapshot is GET /v1/snapshots/{id}?view=full, with the schemas kept
// as authzd sent them (decoded into maps and encoded again, a schema could
// change its spelling).
type fullSnapshot struct {
	ID    string `json:"id"`
	Tools []struct {
		Name       string     `json:"name"`
		Epoch      string     `json:"epoch"`
		Descriptor descriptor `json:"descriptor"`
	} `json:"tools"`
}

type descriptor struct {
	Name             string               `json:"name"`
	Title            string               `json:"title,omitempty"`
	Description      string               `json:"description,omitempty"`
	Summary          string               `json:"summary,omitempty"`
	InputSchema      json.RawMessage      `json:"inputSchema"`
	OutputSchema     json.RawMessage      `json:"outputSchema,omitempty"`
	Annotations      *mcp.ToolAnnotations `json:"annotations,omitempty"`
	SideEffects      string               `json:"sideEffects"`
	RequiresApproval bool                 `json:"requiresApproval"`
	FailureModes     []failureMode        `json:"failureModes,omitempty"`
	Dependencies     json.RawMessage      `json:"dependencies,omitempty"`
}

// takeCatalog snapshots the fronted servers and builds the catalog. A
// snapshot's id is its content's digest, so the same catalog is built
// once.
func (f *Front) takeCatalog(ctx context.Context) (*catalog, error) {
	req := client.SnapshotRequest{}
	if len(f.cfg.Servers) > 0 {
		servers := slices.Clone(f.cfg.Servers)
		req.Servers = &servers
	}
	resp, err := f.api.CreateSnapshotWithResponse(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("take a snapshot: %w", err)
	}
	if resp.JSON201 == nil {
		return nil, fmt.Errorf("take a snapshot: authzd answered %d", resp.StatusCode())
	}
	id := resp.JSON201.Id
	if c, ok := f.catalogs.Get(id); ok {
		return c, nil
	}
	view := client.GetSnapshotParamsViewFull
	full, err := f.api.GetSnapshotWithResponse(ctx, id, &client.GetSnapshotParams{View: &view})
	if err != nil {
		return nil, fmt.Errorf("read snapshot %s: %w", id, err)
	}
	if full.StatusCode() != 200 {
		return nil, fmt.Errorf("read snapshot %s: authzd answered %d", id, full.StatusCode())
	}
	var snap fullSnapshot
	if err := json.Unmarshal(full.Body, &snap); err != nil {
		return nil, fmt.Errorf("read snapshot %s: %w", id, err)
	}
	c, err := buildCatalog(id, snap)
	if err != nil {
		return nil, err
	}
	f.catalogs.Put(id, c)
	return c, nil
}

// buildCatalog lists a snapshot's tools for MCP clients.
func buildCatalog(id string, snap fullSnapshot) (*catalog, error) {
	count := map[string]int{}
	for _, t := range snap.Tools {
		_, name, _ := strings.Cut(t.Name, "/")
		count[name]++
	}
	c := &catalog{snapshot: id, tools: make(map[string]*entry, len(snap.Tools))}
	for _, t := range snap.Tools {
		server, name, ok := strings.Cut(t.Name, "/")
		if !ok {
			return nil, fmt.Errorf("snapshot %s lists %q, not server/tool", id, t.Name)
		}
		listed := name
		if count[name] > 1 {
			listed = server + "." + name
		}
		d := t.Descriptor
		e := &entry{name: listed, tool: t.Name, server: server, upstream: name, sideEffects: d.SideEffects,
			failureModes: d.FailureModes, hasOutputSchema: len(d.OutputSchema) > 0 && string(d.OutputSchema) != "null"}
		e.listed = listedTool(listed, t.Name, d)
		c.tools[listed] = e
	}
	return c, nil
}

// listedTool is a descriptor as a stock MCP client reads it. The side
// effects are the annotations' hints, overriding the server's own where
// they disagree (the registered MCP+ metadata is what fcd decides on);
// the summary opens the description, for clients that show its first
// line; the rest of the MCP+ metadata is under _meta[MetaKey].
func listedTool(name, tool string, d descriptor) *mcp.Tool {
	t := &mcp.Tool{Name: name, Title: d.Title, InputSchema: d.InputSchema}
	if len(d.OutputSchema) > 0 && string(d.OutputSchema) != "null" {
		t.OutputSchema = d.OutputSchema
	}
	switch {
	case d.Summary != "" && d.Description != "" && !strings.HasPrefix(d.Description, d.Summary):
		t.Description = d.Summary + "\n\n" + d.Description
	case d.Description != "":
		t.Description = d.Description
	default:
		t.Description = d.Summary
	}
	a := &mcp.ToolAnnotations{}
	if d.Annotations != nil {
		*a = *d.Annotations
	}
	if a.Title == "" {
		a.Title = d.Title
	}
	yes, no := true, false
	switch d.SideEffects {
	case "none", "read":
		a.ReadOnlyHint, a.DestructiveHint = true, &no
		if a.IdempotentHint == false {
			a.IdempotentHint = true
		}
	case "write":
		a.ReadOnlyHint = false
		if a.DestructiveHint == nil {
			a.DestructiveHint = &no
		}
	case "delete":
		a.ReadOnlyHint, a.DestructiveHint = false, &yes
	}
	t.Annotations = a
	meta := map[string]any{"tool": tool, "sideEffects": d.SideEffects, "requiresApproval": d.RequiresApproval || d.SideEffects == "write" || d.SideEffects == "delete"}
	if d.Summary != "" {
		meta["summary"] = d.Summary
	}
	if len(d.FailureModes) > 0 {
		meta["failureModes"] = d.FailureModes
	}
	if len(d.Dependencies) > 0 && string(d.Dependencies) != "null" {
		meta["dependencies"] = d.Dependencies
	}
	t.Meta = mcp.Meta{MetaKey: meta}
	return t
}

// mode says whether the tool declares a failure mode recovered so.
func (e *entry) mode(recovery string) bool {
	for _, m := range e.failureModes {
		if m.Recovery == recovery {
			return true
		}
	}
	return false
}

// names returns the catalog's listed names, sorted.
func (c *catalog) names() []string {
	return slices.Sorted(maps.Keys(c.tools))
}
