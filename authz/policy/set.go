package policy

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
)

// Policy file kinds, by name. Only the top level of a policy directory is
// read; names starting with "." (editor and VCS files) are skipped, and
// files with other extensions (README.md, *.go) are ignored.
const (
	suffixRego      = ".rego"
	suffixRegoTest  = "_test.rego"
	suffixCedar     = ".cedar"
	suffixCases     = ".cases.json"
	suffixOtherJSON = ".json"
)

// policyFiles is a policy set's files read into memory once (from a
// directory or a bundle), so that the digest names exactly the bytes that
// were compiled and tested, even if the source changes while it is
// loaded.
type policyFiles struct {
	rego, regoTests, cedar, cases map[string][]byte
	names                         []string
	digest                        string
	// revision is the bundle's revision (its .manifest's); empty for a
	// directory.
	revision string
}

// fileDigest is one entry of the policy digest's canonical list.
type fileDigest struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
}

func newPolicyFiles() *policyFiles {
	return &policyFiles{rego: map[string][]byte{}, regoTests: map[string][]byte{}, cedar: map[string][]byte{}, cases: map[string][]byte{}}
}

// kind is the map a file of that name goes to, nil for a name that is
// not a policy or test file.
func (pf *policyFiles) kind(name string) map[string][]byte {
	switch {
	case strings.HasSuffix(name, suffixRegoTest):
		return pf.regoTests
	case strings.HasSuffix(name, suffixRego):
		return pf.rego
	case strings.HasSuffix(name, suffixCedar):
		return pf.cedar
	case strings.HasSuffix(name, suffixCases):
		return pf.cases
	}
	return nil
}

// add adds a policy or test file; the kind comes from the name.
func (pf *policyFiles) add(into map[string][]byte, name string, data []byte) error {
	if _, dup := into[name]; dup {
		return fmt.Errorf("%w: %s: two files of that name", ErrInvalidPolicy, name)
	}
	into[name] = data
	pf.names = append(pf.names, name)
	return nil
}

// seal sorts the names and computes the digest: "sha256:" over the
// canonical JSON of the sorted list of {name, sha256} of every file.
func (pf *policyFiles) seal() error {
	slices.Sort(pf.names)
	list := []fileDigest{}
	for _, name := range pf.names {
		for _, m := range []map[string][]byte{pf.rego, pf.regoTests, pf.cedar, pf.cases} {
			if data, ok := m[name]; ok {
				list = append(list, fileDigest{Name: name, SHA256: manifest.DigestBytes(data)})
			}
		}
	}
	var err error
	if pf.digest, err = manifest.Digest(list); err != nil {
		return fmt.Errorf("policy: digest: %w", err)
	}
	return nil
}

func readPolicyFiles(fsys fs.FS) (*policyFiles, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("policy: read policy directory: %w", err)
	}
	pf := newPolicyFiles()
	for _, ent := range entries {
		name := ent.Name()
		if ent.IsDir() || strings.HasPrefix(name, ".") {
			continue
		}
		into := pf.kind(name)
		if into == nil {
			if strings.HasSuffix(name, suffixOtherJSON) {
				// A data file an operator expects OPA to load would otherwise be
				// silently ignored.
				return nil, fmt.Errorf("%w: %s: only *%s files (Cedar cases) are read; Rego data documents are not supported",
					ErrInvalidPolicy, name, suffixCases)
			}
			continue
		}
		data, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("policy: read %s: %w", name, err)
		}
		if err := pf.add(into, name, data); err != nil {
			return nil, err
		}
	}
	if err := pf.seal(); err != nil {
		return nil, err
	}
	return pf, nil
}

// Set is a loaded, validated policy set: a Rego and a Cedar engine, both
// required, and the digest of the files they came from. A Set is immutable
// and safe for concurrent use; reload builds a new one (see [Manager]).
type Set struct {
	digest   string
	revision string
	files    []string
	rego     *RegoEngine
	cedar    *CedarEngine
	engines  []Engine
	now      func() time.Time
}

// Load reads the policy files at the top level of fsys (*.rego, *.cedar,
// *_test.rego, *.cases.json), compiles both languages, checks the contract
// of policies/README.md and runs the set's own tests. It refuses the set
// with an error wrapping [ErrInvalidPolicy] or [ErrTestsFailed] if
// anything is wrong, so a set that Load returns has passed its tests.
func Load(ctx context.Context, fsys fs.FS) (*Set, error) {
	pf, err := readPolicyFiles(fsys)
	if err != nil {
		return nil, err
	}
	return loadFiles(ctx, pf)
}

// compileSet builds both engines and checks the parts of the contract an
// engine alone does not: both languages present, package fcd.authz with an
// allow set.
func compileSet(ctx context.Context, pf *policyFiles) (*Set, error) {
	if len(pf.rego) == 0 {
		return nil, fmt.Errorf("%w: no Rego policy (*%s other than *%s)", ErrInvalidPolicy, suffixRego, suffixRegoTest)
	}
	if len(pf.cedar) == 0 {
		return nil, fmt.Errorf("%w: no Cedar policy (*%s)", ErrInvalidPolicy, suffixCedar)
	}
	re, err := NewRegoEngine(ctx, pf.rego)
	if err != nil {
		return nil, err
	}
	if !re.defined[regoAllow] {
		return nil, fmt.Errorf("%w: Rego package %s defines no %q set (%s contains {...} if ...)",
			ErrInvalidPolicy, RegoPackage, regoAllow, regoAllow)
	}
	ce, err := NewCedarEngine(pf.cedar)
	if err != nil {
		return nil, err
	}
	return &Set{
		digest: pf.digest, revision: pf.revision, files: pf.names, rego: re, cedar: ce,
		engines: []Engine{re, ce}, now: time.Now,
	}, nil
}

// Digest returns "sha256:<hex>" over the canonical JSON of the sorted list
// of {name, sha256} of every policy and test file of the set. Decisions
// record it, so an auditor can tell which files decided.
func (s *Set) Digest() string { return s.digest }

// Revision is the revision of the bundle the set came from (its
// .manifest's revision), empty for a directory or the embedded set.
// Decisions carry it (record.Decision.PolicyRevision) for the decision
// logs' bundles.fcd.revision.
func (s *Set) Revision() string { return s.revision }

// Files returns the names of the set's policy and test files, sorted.
func (s *Set) Files() []string { return slices.Clone(s.files) }

// Engines returns the set's engines in decision order: rego, then cedar.
func (s *Set) Engines() []Engine { return slices.Clone(s.engines) }

// WithClock returns a copy of s, sharing its compiled engines, whose
// decisions are stamped by now instead of time.Now; nil means time.Now.
func (s *Set) WithClock(now func() time.Time) *Set {
	c := *s
	c.now = now
	if c.now == nil {
		c.now = time.Now
	}
	return &c
}

// Decide decides a formation with every engine of the set, combined
// deny-overrides: the verdict is allow only if every engine allows, any
// engine error denies, and the approval obligation is the largest of the
// engines' (zero when denied: a deny carries no obligation). It never
// fails; an input that cannot be converted denies with the error recorded
// on every engine. A nil or zero Set (no engines) denies everything.
//
// When the formation names a successor, the decision's Successor is the
// combined answer on it, deny-overrides too: allow only if every engine
// answered on it and allowed it. A refused successor never changes the
// verdict on the call: it only means the call has no successor.
func (s *Set) Decide(ctx context.Context, in *Input) record.Decision {
	succ := successorDecision(in)
	if s == nil || len(s.engines) == 0 {
		if succ != nil {
			succ.Verdict = record.VerdictDeny
		}
		return record.Decision{
			Verdict: record.VerdictDeny, Engines: []record.EngineDecision{},
			Successor: succ, DecidedAt: time.Now().UTC(),
		}
	}
	d := record.Decision{Verdict: record.VerdictAllow, PolicyDigest: s.digest, PolicyRevision: s.revision, Engines: make([]record.EngineDecision, len(s.engines))}
	doc, err := NewDocument(in)
	for i, e := range s.engines {
		if err != nil {
			d.Engines[i] = errorDecision(e.Name(), err)
			if succ != nil {
				d.Engines[i].Successor = successorError(err)
			}
		} else {
			d.Engines[i] = e.Decide(ctx, doc)
		}
		ed := &d.Engines[i]
		if ed.Verdict != record.VerdictAllow || ed.Error != "" {
			d.Verdict = record.VerdictDeny
		}
		d.Approvals = max(d.Approvals, ed.Approvals)
		if succ != nil {
			if es := ed.Successor; es == nil || es.Verdict != record.VerdictAllow || es.Error != "" {
				succ.Verdict = record.VerdictDeny
			}
		}
	}
	if d.Verdict != record.VerdictAllow {
		d.Approvals = 0
	}
	d.Successor = succ
	d.DecidedAt = s.now().UTC()
	return d
}

// successorDecision starts the combined answer on the successor the
// formation names, allowed until an engine refuses it; nil without one.
func successorDecision(in *Input) *record.SuccessorDecision {
	if in == nil || in.Formation.Successor == nil {
		return nil
	}
	fs := in.Formation.Successor
	return &record.SuccessorDecision{Certificate: fs.Certificate, Epoch: fs.Epoch, Verdict: record.VerdictAllow}
}

// engineFiles returns the names of one engine's source files, sorted.
func engineFiles(m map[string][]byte) []string { return slices.Sorted(maps.Keys(m)) }
