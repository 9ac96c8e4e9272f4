package authz

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
)

// Comparison is what an approver needs to see of a call whose danger is
// drift: the call's tool as each epoch it may meet declares it, side by
// side — the source it was formed on, the successor captured at
// formation, the server's epoch a new snapshot would show now — and the
// members in which they differ. It is read now, from the registry; the
// formation record itself never changes (P1).
type Comparison struct {
	Formation string          `json:"formation"`
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments"`
	// Omitted are the properties of the source's input schema the call
	// leaves out: what the handler fills in from its own defaults, which
	// the configuration may set differently in each epoch.
	Omitted []string `json:"omitted"`
	// Source is the epoch the call was formed on.
	Source ComparedEpoch `json:"source"`
	// Successor is the epoch captured at formation, nil without one.
	Successor *ComparedEpoch `json:"successor"`
	// Active is the server's ACTIVE epoch registered last (the one a new
	// snapshot shows) when it is neither the source nor the successor;
	// nil otherwise, or when the server has no ACTIVE epoch.
	Active *ComparedEpoch `json:"active"`
	// Differences are the members of Successor and Active that differ
	// from Source's, in column order and then pointer order.
	Differences []Difference `json:"differences"`
}

// ComparedEpoch is one column of a Comparison: an epoch, what its
// manifest registers that can change the call's meaning, and the tool's
// descriptor in it.
type ComparedEpoch struct {
	Epoch        string                 `json:"epoch"`
	Release      string                 `json:"release"`
	State        record.State           `json:"state"`
	Pool         string                 `json:"pool"`
	Artifact     manifest.Artifact      `json:"artifact"`
	Config       manifest.Config        `json:"config"`
	FeatureFlags *manifest.FeatureFlags `json:"featureFlags,omitempty"`
	Downstream   []manifest.Downstream  `json:"downstream,omitempty"`
	// Tool is the tool's descriptor in this epoch; nil when the epoch does
	// not declare it.
	Tool *ComparedTool `json:"tool"`
	// Certificate is the certificate the successor was captured through
	// (on the successor column only).
	Certificate *ComparedCertificate `json:"certificate,omitempty"`
}

// ComparedTool is a tool's descriptor as a Comparison shows it.
type ComparedTool struct {
	DescriptorDigest string                 `json:"descriptorDigest"`
	Title            string                 `json:"title,omitempty"`
	Description      string                 `json:"description,omitempty"`
	InputSchema      json.RawMessage        `json:"inputSchema"`
	SideEffects      manifest.SideEffect    `json:"sideEffects"`
	RequiresApproval bool                   `json:"requiresApproval"`
	FailureModes     []manifest.FailureMode `json:"failureModes,omitempty"`
	Dependencies     *manifest.Dependencies `json:"dependencies,omitempty"`
}

// ComparedCertificate is what a successor's certificate models of the
// call on its target.
type ComparedCertificate struct {
	ID        string              `json:"id"`
	Effects   map[string]any      `json:"effects"`
	Profile   manifest.ProfileRef `json:"profile"`
	ExpiresAt time.Time           `json:"expiresAt"`
	Revoked   bool                `json:"revoked"`
}

// Difference is one member in which a column differs from the source: a
// JSON Pointer into a ComparedEpoch ("/config/values/repository.defaultVisibility",
// "/tool/inputSchema/properties/private/default"), the column it is in
// (successor or active) and both values (absent where a side has none).
type Difference struct {
	Column  string          `json:"column"`
	Pointer string          `json:"pointer"`
	Source  json.RawMessage `json:"source,omitempty"`
	Other   json.RawMessage `json:"other,omitempty"`
}

// Compare returns the comparison of formation id's call. It reads the
// formation (Formations.Get), its epochs (Registry.Epoch, Registry.Epochs)
// and the successor's certificate (Registry.Certificates.Get); an epoch
// or certificate the store no longer holds leaves its column out.
func (u *UseCases) Compare(ctx context.Context, id string) (*Comparison, error) {
	f, err := u.Formations.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	_, toolName, _ := strings.Cut(f.Tool, "/")
	column := func(epochID string) (*ComparedEpoch, error) {
		ep, err := u.Registry.Epoch(ctx, epochID)
		if errors.Is(err, record.ErrEpochNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("authz: compare %s: %w", id, err)
		}
		return comparedEpoch(ep, toolName), nil
	}
	src, err := column(f.Source.Epoch)
	if err != nil {
		return nil, err
	}
	if src == nil {
		return nil, fmt.Errorf("authz: compare %s: source %s: %w", id, f.Source.Epoch, record.ErrEpochNotFound)
	}
	cmp := &Comparison{Formation: f.ID, Tool: f.Tool, Arguments: f.Arguments, Source: *src, Omitted: omitted(src.Tool, f.Arguments)}
	if s := f.Successor; s != nil {
		if cmp.Successor, err = column(s.Epoch); err != nil {
			return nil, err
		}
		if cmp.Successor != nil {
			c := &ComparedCertificate{ID: s.Certificate, Effects: s.Effects, Profile: s.Profile, ExpiresAt: s.ExpiresAt}
			switch rec, err := u.Registry.Certificates.Get(ctx, s.Certificate); {
			case err == nil:
				c.Revoked = rec.Revoked
			case !errors.Is(err, record.ErrCertificateNotFound):
				return nil, fmt.Errorf("authz: compare %s: %w", id, err)
			}
			cmp.Successor.Certificate = c
		}
	}
	active, err := u.Registry.Epochs(ctx, record.EpochFilter{Server: f.Source.Server, State: record.StateActive})
	if err != nil {
		return nil, fmt.Errorf("authz: compare %s: %w", id, err)
	}
	if n := len(active); n > 0 { // registration order: the last is what a snapshot shows
		if a := active[n-1].ID; a != f.Source.Epoch && (f.Successor == nil || a != f.Successor.Epoch) {
			if cmp.Active, err = column(a); err != nil {
				return nil, err
			}
		}
	}
	cmp.Differences = []Difference{}
	for _, c := range []struct {
		name string
		col  *ComparedEpoch
	}{{"successor", cmp.Successor}, {"active", cmp.Active}} {
		if c.col != nil {
			cmp.Differences = append(cmp.Differences, differences(c.name, &cmp.Source, c.col)...)
		}
	}
	return cmp, nil
}

func comparedEpoch(ep *record.Epoch, tool string) *ComparedEpoch {
	c := &ComparedEpoch{Epoch: ep.ID, Release: ep.Release, State: ep.State, Pool: ep.Pool, Artifact: ep.Artifact,
		Config: manifest.Config{Digest: ep.ConfigDigest}}
	if m := ep.Manifest; m != nil {
		c.Config, c.FeatureFlags, c.Downstream = m.Config, m.FeatureFlags, m.Downstream
		if d := m.Tool(tool); d != nil {
			t := &ComparedTool{Title: d.Title, Description: d.Description, InputSchema: d.InputSchema, SideEffects: d.SideEffects,
				RequiresApproval: d.RequiresApproval, FailureModes: d.FailureModes, Dependencies: d.Dependencies}
			if i := slices.IndexFunc(ep.Tools, func(et record.EpochTool) bool { return et.Name == tool }); i >= 0 {
				t.DescriptorDigest = ep.Tools[i].Digest
			}
			c.Tool = t
		}
	}
	return c
}

// omitted are the top-level properties tool's input schema declares that
// args does not carry, sorted.
func omitted(tool *ComparedTool, args json.RawMessage) []string {
	out := []string{}
	if tool == nil {
		return out
	}
	var schema struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	var given map[string]json.RawMessage
	if json.Unmarshal(tool.InputSchema, &schema) != nil || json.Unmarshal(args, &given) != nil {
		return out
	}
	for p := range schema.Properties {
		if _, ok := given[p]; !ok {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// differences are the leaves in which other differs from src, by JSON
// Pointer: objects are compared member by member, anything else (arrays
// too) as a whole.
func differences(column string, src, other *ComparedEpoch) []Difference {
	var a, b any
	if decode(src, &a) != nil || decode(other, &b) != nil {
		return nil
	}
	var out []Difference
	var walk func(ptr string, x, y any)
	walk = func(ptr string, x, y any) {
		mx, okx := x.(map[string]any)
		my, oky := y.(map[string]any)
		if okx && oky {
			keys := make([]string, 0, len(mx)+len(my))
			for k := range mx {
				keys = append(keys, k)
			}
			for k := range my {
				if _, ok := mx[k]; !ok {
					keys = append(keys, k)
				}
			}
			slices.Sort(keys)
			for _, k := range keys {
				if ptr == "" && k == "certificate" {
					continue // the successor's alone: not a difference of the epochs
				}
				vx, inx := mx[k]
				vy, iny := my[k]
				p := ptr + "/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(k)
				switch {
				case inx && iny:
					walk(p, vx, vy)
				default:
					out = append(out, Difference{Column: column, Pointer: p, Source: rawIf(inx, vx), Other: rawIf(iny, vy)})
				}
			}
			return
		}
		jx, _ := json.Marshal(x)
		jy, _ := json.Marshal(y)
		if !bytes.Equal(jx, jy) {
			out = append(out, Difference{Column: column, Pointer: ptr, Source: jx, Other: jy})
		}
	}
	walk("", a, b)
	return out
}

func decode(v any, into *any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	return d.Decode(into)
}

func rawIf(ok bool, v any) json.RawMessage {
	if !ok {
		return nil
	}
	data, _ := json.Marshal(v)
	return data
}
