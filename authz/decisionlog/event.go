package decisionlog

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DefaultPath is the decision path fcd's events carry: the Rego package
// both engines' combined decision answers for (data.fcd.authz), written
// as OPA writes a path, without the leading slash. The phase of the
// decision (formation or admission) is in input.phase.
const DefaultPath = "fcd/authz"

// BundleName is the bundle under which an event carries the revision of
// the policy set that decided it: bundles.fcd.revision, where OPA puts a
// bundle's revision, so consumers that group decisions by policy
// revision read fcd's unchanged (an OPA bundle's revision, or the policy
// set digest).
const BundleName = "fcd"

// Event is one policy decision as fcd made it. Log copies what it needs
// before it returns: the caller may reuse Input and Result afterwards.
type Event struct {
	// DecisionID identifies the decision; empty means Log makes a random
	// (UUID v4) one, as OPA does.
	DecisionID string
	// Path is the decision path; empty means DefaultPath.
	Path string
	// Input is the document the policies decided over, encoded with
	// encoding/json; nil leaves input out.
	Input any
	// Result is the decision, encoded with encoding/json; nil leaves
	// result out.
	Result any
	// Revision is the revision of the policy set that decided (the OPA
	// bundle's revision, else fcd's policy set digest), written as
	// bundles.<BundleName>.revision.
	Revision string
	// Timestamp is when the decision was made; zero means when Log is
	// called.
	Timestamp time.Time
	// Custom holds what fcd adds beyond OPA's fields, under OPA's
	// "custom" member (where OPA itself puts request metadata): consumers
	// that know only OPA's fields pass it through or ignore it. Masks do
	// not apply to it, as in OPA.
	Custom map[string]any
	// Metrics, if any, are written as OPA's metrics member.
	Metrics map[string]any
}

// wireEvent is an event as OPA's decision_logs plugin writes it: the JSON
// of github.com/open-policy-agent/opa/v1/plugins/logs.EventV1, of which
// fcd fills the members below (the tests decode what the receiver gets
// strictly into EventV1).
type wireEvent struct {
	Labels     map[string]string     `json:"labels"`
	DecisionID string                `json:"decision_id"`
	Bundles    map[string]bundleInfo `json:"bundles,omitempty"`
	Path       string                `json:"path,omitempty"`
	Input      json.RawMessage       `json:"input,omitempty"`
	Result     json.RawMessage       `json:"result,omitempty"`
	Erased     []string              `json:"erased,omitempty"`
	Timestamp  time.Time             `json:"timestamp"`
	Metrics    map[string]any        `json:"metrics,omitempty"`
	Custom     map[string]any        `json:"custom,omitempty"`
}

type bundleInfo struct {
	Revision string `json:"revision,omitempty"`
}

// encode makes the wire form of e: labels, defaults, masks applied. It
// returns the event's JSON and its decision id.
func (x *Exporter) encode(e Event) ([]byte, string, error) {
	w := wireEvent{
		Labels: x.labels, DecisionID: e.DecisionID, Path: e.Path,
		Timestamp: e.Timestamp.UTC(), Metrics: e.Metrics, Custom: e.Custom,
	}
	if w.DecisionID == "" {
		w.DecisionID = newUUID()
	}
	if w.Path == "" {
		w.Path = DefaultPath
	}
	if e.Timestamp.IsZero() {
		w.Timestamp = time.Now().UTC()
	}
	if e.Revision != "" {
		w.Bundles = map[string]bundleInfo{BundleName: {Revision: e.Revision}}
	}
	var err error
	if w.Input, err = x.document(e.Input, partInput, &w.Erased); err != nil {
		return nil, w.DecisionID, fmt.Errorf("decisionlog: input: %w", err)
	}
	if w.Result, err = x.document(e.Result, partResult, &w.Erased); err != nil {
		return nil, w.DecisionID, fmt.Errorf("decisionlog: result: %w", err)
	}
	data, err := json.Marshal(w)
	if err != nil {
		return nil, w.DecisionID, fmt.Errorf("decisionlog: event: %w", err)
	}
	return data, w.DecisionID, nil
}

// document encodes v, one of the event's documents (input or result), and
// erases what the masks rooted at part point to, noting each erased
// pointer in erased.
func (x *Exporter) document(v any, part string, erased *[]string) (json.RawMessage, error) {
	if v == nil {
		return nil, nil
	}
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var masks []pointer
	for _, m := range x.masks {
		if m.parts[0] == part {
			masks = append(masks, m)
		}
	}
	if len(masks) == 0 {
		return data, nil
	}
	// Masking works on the decoded document, as OPA's does; numbers stay
	// exactly as they were (json.Number).
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, err
	}
	for _, m := range masks {
		if len(m.parts) == 1 {
			*erased = append(*erased, m.raw)
			return nil, nil // the whole document is erased
		}
		var ok bool
		if doc, ok = erase(doc, m.parts[1:]); ok {
			*erased = append(*erased, m.raw)
		}
	}
	return json.Marshal(doc)
}

const (
	partInput  = "input"
	partResult = "result"
)

// pointer is a parsed mask: a JSON Pointer (RFC 6901) into the event,
// rooted at /input or /result as OPA's erase masks are.
type pointer struct {
	raw   string
	parts []string
}

func parsePointer(s string) (pointer, error) {
	if !strings.HasPrefix(s, "/") {
		return pointer{}, fmt.Errorf("mask %q: a JSON pointer starts with /", s)
	}
	parts := strings.Split(s[1:], "/")
	for i, p := range parts {
		parts[i] = strings.ReplaceAll(strings.ReplaceAll(p, "~1", "/"), "~0", "~")
	}
	if parts[0] != partInput && parts[0] != partResult {
		return pointer{}, fmt.Errorf("mask %q: only /input and /result may be erased", s)
	}
	return pointer{raw: s, parts: parts}, nil
}

// erase removes the member or array element path points to inside doc
// and returns the document, and whether there was such a member or
// element (OPA lists only what it erased).
func erase(doc any, path []string) (any, bool) {
	key := path[0]
	switch v := doc.(type) {
	case map[string]any:
		child, ok := v[key]
		if !ok {
			return doc, false
		}
		if len(path) == 1 {
			delete(v, key)
			return v, true
		}
		child, ok = erase(child, path[1:])
		v[key] = child
		return v, ok
	case []any:
		i, err := strconv.Atoi(key)
		if err != nil || i < 0 || i >= len(v) {
			return doc, false
		}
		if len(path) == 1 {
			return slices.Delete(v, i, i+1), true
		}
		var ok bool
		v[i], ok = erase(v[i], path[1:])
		return v, ok
	}
	return doc, false
}

// newUUID returns a random (version 4) UUID, the form of OPA's decision
// and instance ids.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// errOversize: one event alone is larger, compressed, than the upload
// size limit; it can never be sent and is dropped, as OPA drops it.
var errOversize = errors.New("decisionlog: event larger than the upload size limit")
