package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/fcd-authz/fcd/manifest"
	"github.com/gowebpki/jcs"
	"github.com/lestrrat-go/jwx/v2/jwk"
)

// Problem ids: what a failed check is, stable for scripts.
const (
	// ProblemLine: a line is not one canonical JSON object of the trail.
	ProblemLine = "chain.line"
	// ProblemHash: an event's hash is not the hash of its content.
	ProblemHash = "chain.hash"
	// ProblemLink: an event's prev is not the previous event's hash.
	ProblemLink = "chain.link"
	// ProblemGap: sequence numbers skip, repeat or do not start at 1.
	ProblemGap = "chain.gap"
	// ProblemReplica: an event names another replica than its chain's.
	ProblemReplica = "chain.replica"
	// ProblemSchema: an event's data is of a schema version this
	// verifier does not know (a newer authzd wrote it): the properties
	// could misread it.
	ProblemSchema = "chain.schema"
	// ProblemSignature: a checkpoint's signature does not verify against
	// the published keys (or its header is not a checkpoint's).
	ProblemSignature = "checkpoint.signature"
	// ProblemCheckpoint: a checkpoint does not sign the chain's head at
	// that point.
	ProblemCheckpoint = "checkpoint.head"
	// ProblemUnsigned: events after the chain's last checkpoint; their
	// integrity rests on the hashes alone (a writer that stopped before
	// signing them, or a chain cut short after its last checkpoint).
	ProblemUnsigned = "checkpoint.missing"
)

// Problem is one failed check, with where it failed.
type Problem struct {
	ID      string `json:"id"`
	Replica string `json:"replica"`
	File    string `json:"file,omitempty"`
	Line    int    `json:"line,omitempty"`
	Seq     uint64 `json:"seq,omitempty"`
	Detail  string `json:"detail"`
}

func (p Problem) String() string {
	where := p.Replica
	if p.File != "" {
		where = fmt.Sprintf("%s:%d", p.File, p.Line)
	}
	return fmt.Sprintf("%s: %s: %s", where, p.ID, p.Detail)
}

// ChainReport is what Verify found in one replica's chain.
type ChainReport struct {
	Replica     string `json:"replica"`
	Files       int    `json:"files"`
	Events      uint64 `json:"events"`
	Checkpoints int    `json:"checkpoints"`
	// Signed is the last sequence number a valid checkpoint covers.
	Signed uint64 `json:"signed"`
	Head   string `json:"head"`
}

// Report is Verify's answer.
type Report struct {
	OK       bool          `json:"ok"`
	Chains   []ChainReport `json:"chains"`
	Problems []Problem     `json:"problems"`
	// Checks names what was checked, for the reader of a clean report.
	Checks []string `json:"checks"`
}

// Checks is what Verify checks of every chain.
var checks = []string{
	ProblemLine + ": every line is one canonical (RFC 8785) event or checkpoint",
	ProblemHash + ": every event's hash is the SHA-256 of its content",
	ProblemLink + ": every event links to the hash of the one before it",
	ProblemGap + ": sequence numbers run from 1 without a gap, across files",
	ProblemReplica + ": every event is of its chain's replica",
	ProblemSchema + ": every event's data is of a schema version this verifier reads",
	ProblemSignature + ": every checkpoint verifies against the published keys",
	ProblemCheckpoint + ": every checkpoint signs the chain's head where it stands",
	ProblemUnsigned + ": a checkpoint covers the chain's last event",
}

// Verify checks every replica chain under root (one directory each)
// against keys, the published signing keys (authzd's JWKS), and fcd's
// properties over the merged history: VerifyConfig{Keys: keys}.Verify(root).
func Verify(root string, keys jwk.Set) (*Report, error) {
	return VerifyConfig{Keys: keys}.Verify(root)
}

// VerifyConfig is what a verification checks a trail against.
type VerifyConfig struct {
	// Keys are the published signing keys (authzd's JWKS) the
	// checkpoints verify against. Required.
	Keys jwk.Set
	// OperatorKeys, if set, are the operator keys (serve
	// --operator-keys): every resolution the trail records must keep a
	// signed document that verifies against them and states what the
	// event records. Give them for a deployment that required signed
	// resolutions; without them resolutions are not checked.
	OperatorKeys jwk.Set
}

// Verify checks every replica chain under root (one directory each):
// hashes, links, sequence, checkpoints against c.Keys; the properties
// over the history merged by etcd revision; and, with c.OperatorKeys,
// every resolution's signed document.
func (c VerifyConfig) Verify(root string) (*Report, error) {
	keys := c.Keys
	if keys == nil {
		return nil, errors.New("audit: verify needs the published keys")
	}
	verifier, err := manifest.NewVerifier(keys)
	if err != nil {
		return nil, fmt.Errorf("audit: the published keys: %w", err)
	}
	var operators *manifest.Verifier
	if c.OperatorKeys != nil {
		if operators, err = manifest.NewVerifier(c.OperatorKeys); err != nil {
			return nil, fmt.Errorf("audit: the operator keys: %w", err)
		}
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	r := &Report{Checks: slices.Concat(checks, propertyChecks), Chains: []ChainReport{}, Problems: []Problem{}}
	if operators != nil {
		r.Checks = append(r.Checks, resolutionChecks...)
	}
	var history []placed
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		c, events, problems, err := verifyChain(filepath.Join(root, e.Name()), e.Name(), verifier)
		if err != nil {
			return nil, err
		}
		r.Chains = append(r.Chains, c)
		r.Problems = append(r.Problems, problems...)
		history = append(history, events...)
	}
	if len(r.Chains) == 0 {
		return nil, fmt.Errorf("audit: no replica chain under %s", root)
	}
	if operators != nil {
		r.Problems = append(r.Problems, checkResolutions(history, operators)...)
	}
	r.Problems = append(r.Problems, checkProperties(history)...)
	r.OK = len(r.Problems) == 0
	return r, nil
}

// propertyKinds are the event kinds the property checks read; only those
// are kept in memory.
var propertyKinds = map[string]bool{
	"formation": true, "approval": true, "admission": true, "claim": true, "outcome": true,
	"resolution": true, "drain": true, "retire": true, "certificate": true, "revocation": true, "policy": true,
	"readmission": true, "gap": true,
}

func verifyChain(dir, replica string, keys *manifest.Verifier) (ChainReport, []placed, []Problem, error) {
	c := ChainReport{Replica: replica}
	var problems []Problem
	var events []placed
	files, err := trailFiles(dir)
	if err != nil {
		return c, nil, nil, err
	}
	c.Files = len(files)
	var seq uint64
	head := ""
	for fi, path := range files {
		lines, complete, err := readLines(path)
		if err != nil {
			return c, nil, nil, err
		}
		name := filepath.Join(replica, filepath.Base(path))
		bad := func(n int, s uint64, id, format string, args ...any) {
			problems = append(problems, Problem{ID: id, Replica: replica, File: name, Line: n, Seq: s, Detail: fmt.Sprintf(format, args...)})
		}
		if !complete && fi != len(files)-1 {
			bad(len(lines), 0, ProblemLine, "the file's last line is cut short, and a later file follows")
		}
		for i, line := range lines {
			n := i + 1
			kind, ev, cp, err := parseLine(line)
			if err != nil {
				bad(n, seq+1, ProblemLine, "%v", err)
				continue
			}
			if kind == "checkpoint" {
				c.Checkpoints++
				p, err := verifyCheckpoint(cp, keys)
				switch {
				case err != nil:
					bad(n, seq, ProblemSignature, "%v", err)
				case p.Replica != replica || p.Seq != seq || p.Head != head:
					bad(n, seq, ProblemCheckpoint, "the checkpoint signs %s event %d (head %.12s…), the chain stands at %s event %d (head %.12s…)",
						p.Replica, p.Seq, p.Head, replica, seq, head)
				default:
					c.Signed = seq
				}
				continue
			}
			if ev.Replica != replica {
				bad(n, ev.Seq, ProblemReplica, "the event is of replica %q, in %q's chain", ev.Replica, replica)
			}
			if v := SchemaOf(*ev); v < SchemaV1 || v > LatestSchema {
				bad(n, ev.Seq, ProblemSchema, "the event's data is of schema %d; this verifier reads %d to %d (a newer authzd reads it)",
					v, SchemaV1, LatestSchema)
			}
			if ev.Seq != seq+1 {
				bad(n, ev.Seq, ProblemGap, "event %d follows event %d", ev.Seq, seq)
			}
			if ev.Prev != head {
				bad(n, ev.Seq, ProblemLink, "prev %.12s… is not the previous event's hash %.12s…", ev.Prev, head)
			}
			if h, err := lineHash(line); err != nil || h != ev.Hash {
				bad(n, ev.Seq, ProblemHash, "the event's content hashes to %.12s…, it says %.12s…", h, ev.Hash)
			}
			seq, head = ev.Seq, ev.Hash
			c.Events++
			if propertyKinds[ev.Kind] {
				events = append(events, placed{Event: *ev, file: name, line: n})
			}
		}
	}
	c.Head = head
	if seq > c.Signed {
		problems = append(problems, Problem{ID: ProblemUnsigned, Replica: replica, Seq: seq,
			Detail: fmt.Sprintf("events %d to %d follow the last valid checkpoint", c.Signed+1, seq)})
	}
	return c, events, problems, nil
}

// parseLine reads one line: an event or a checkpoint, in canonical form.
func parseLine(line []byte) (kind string, ev *Event, checkpoint string, err error) {
	canon, err := jcs.Transform(line)
	if err != nil {
		return "", nil, "", fmt.Errorf("not JSON: %v", err)
	}
	if !bytes.Equal(canon, line) {
		return "", nil, "", errors.New("not in canonical form (RFC 8785): the line was edited")
	}
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(line, &probe); err != nil {
		return "", nil, "", fmt.Errorf("not a JSON object: %v", err)
	}
	if cp, ok := probe["checkpoint"]; ok {
		if len(probe) != 1 {
			return "", nil, "", errors.New("a checkpoint line holds other members")
		}
		var s string
		if err := json.Unmarshal(cp, &s); err != nil {
			return "", nil, "", errors.New("a checkpoint is not a string")
		}
		return "checkpoint", nil, s, nil
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	var e Event
	if err := dec.Decode(&e); err != nil {
		return "", nil, "", fmt.Errorf("not an event: %v", err)
	}
	return "event", &e, "", nil
}

// lineHash is the hash of an event line's content without "hash".
func lineHash(line []byte) (string, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(line, &m); err != nil {
		return "", err
	}
	delete(m, "hash")
	return hashCanonical(m)
}

// verifyCheckpoint checks a checkpoint's JWS with the published keys:
// one signature, its typ, an allowed algorithm fitting a known kid's key.
func verifyCheckpoint(compact string, keys *manifest.Verifier) (*Checkpoint, error) {
	v, err := keys.Verify([]byte(compact), CheckpointType)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(v.Payload))
	dec.DisallowUnknownFields()
	var p Checkpoint
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("payload: %v", err)
	}
	return &p, nil
}

// Summary is a report in lines for a person.
func (r *Report) Summary() string {
	var b strings.Builder
	for _, c := range r.Chains {
		fmt.Fprintf(&b, "chain %s: %d events in %d files, %d checkpoints, signed through event %d\n",
			c.Replica, c.Events, c.Files, c.Checkpoints, c.Signed)
	}
	for _, p := range r.Problems {
		fmt.Fprintln(&b, "FAIL", p)
	}
	if r.OK {
		b.WriteString("ok: ")
	} else {
		b.WriteString("checked: ")
	}
	b.WriteString(strings.Join(r.Checks, "; "))
	b.WriteString("\n")
	return b.String()
}
