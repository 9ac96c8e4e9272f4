package manifest

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MCP+ lint.
//
// Lint judges whether a manifest describes its tools well enough to be
// registered. Its rules come from the five MCP+ principles (semantic
// completeness, explicit action boundaries, failure modes, progressive
// disclosure, declared relationships) plus fcd's own execution identity
// (an epoch must name what runs by immutable identifiers). Errors block
// registration; warnings are advice. Rule ids are stable: tools, CI
// configurations and documentation may refer to them.
//
//	id                           severity  principle                   flags
//	---------------------------  --------  --------------------------  -------------------------------------------------------------
//	approval-required            error     explicit action boundaries  a write/delete tool without requiresApproval
//	annotation-conflict          error     explicit action boundaries  readOnlyHint true on a write/delete tool; destructiveHint
//	                                                                   false on a delete tool
//	duplicate-tool-name          error     execution identity          a tool name used more than once (each repeat is flagged)
//	unknown-dependency           error     declared relationships      requires/producesInputFor/exclusiveWith, or a failure
//	                                                                   mode's fallback, naming a tool not in the manifest
//	requires-cycle               error     declared relationships      a cycle of requires (self-require included), once per cycle
//	requires-exclusive-conflict  error     declared relationships      a tool that both requires and is exclusiveWith another
//	invalid-input-schema         error     semantic completeness       an inputSchema that does not compile (see CompileSchema)
//	input-schema-not-object      error     semantic completeness       an inputSchema whose top-level type is not "object"
//	secret-value                 error     execution identity          a secret given by value
//	secret-unversioned           error     execution identity          a secret without a version
//	secret-in-config             error     execution identity          a config value whose key looks like a secret holding a
//	                                                                   non-empty string (the value is never echoed)
//	summary-missing              warning   progressive disclosure      a tool without a summary
//	summary-too-long             warning   progressive disclosure      a summary longer than MaxSummaryLength characters
//	description-missing          warning   semantic completeness       a tool without a description
//	description-restates-name    warning   semantic completeness       a description that only restates the name or title
//	description-too-thin         warning   semantic completeness       a description of fewer than MinDescriptionWords words
//	parameter-undocumented       warning   semantic completeness       an inputSchema property (top-level or nested) without a
//	                                                                   description
//	recovery-missing             warning   failure modes               a failure mode without a recovery strategy, or a fallback
//	                                                                   strategy that names no fallback tool
//	artifact-not-pinned          warning   execution identity          an artifact not identified by a sha256 digest
//
// [Rules] returns the same table for documentation and the CLI.

// Severity is how much a finding matters: errors block registration.
type Severity string

// The severities of lint findings.
const (
	SeverityError   Severity = "error"
	SeverityWarning Severity = "warning"
)

// Finding is one lint result. It never contains a secret value.
type Finding struct {
	// Rule is the stable id of the rule that produced the finding.
	Rule     string   `json:"rule"`
	Severity Severity `json:"severity"`
	// Path is an RFC 6901 JSON Pointer into the manifest, e.g.
	// "/tools/2/requiresApproval" or "/config/values/db.password".
	Path    string `json:"path"`
	Message string `json:"message"`
}

func (f Finding) String() string {
	return fmt.Sprintf("%s %s %s: %s", f.Severity, f.Rule, f.Path, f.Message)
}

// The MCP+ principles (and fcd's execution identity) a rule enforces.
const (
	PrincipleSemanticCompleteness  = "semantic completeness"
	PrincipleActionBoundaries      = "explicit action boundaries"
	PrincipleFailureModes          = "failure modes"
	PrincipleProgressiveDisclosure = "progressive disclosure"
	PrincipleDeclaredRelationships = "declared relationships"
	PrincipleExecutionIdentity     = "execution identity"
)

// Lint rule ids. They are stable.
const (
	RuleApprovalRequired          = "approval-required"
	RuleAnnotationConflict        = "annotation-conflict"
	RuleDuplicateToolName         = "duplicate-tool-name"
	RuleUnknownDependency         = "unknown-dependency"
	RuleRequiresCycle             = "requires-cycle"
	RuleRequiresExclusiveConflict = "requires-exclusive-conflict"
	RuleInvalidInputSchema        = "invalid-input-schema"
	RuleInputSchemaNotObject      = "input-schema-not-object"
	RuleSecretValue               = "secret-value"
	RuleSecretUnversioned         = "secret-unversioned"
	RuleSecretInConfig            = "secret-in-config"
	RuleSummaryMissing            = "summary-missing"
	RuleSummaryTooLong            = "summary-too-long"
	RuleDescriptionMissing        = "description-missing"
	RuleDescriptionRestatesName   = "description-restates-name"
	RuleDescriptionTooThin        = "description-too-thin"
	RuleParameterUndocumented     = "parameter-undocumented"
	RuleRecoveryMissing           = "recovery-missing"
	RuleArtifactNotPinned         = "artifact-not-pinned"
)

// Thresholds of the progressive-disclosure and semantic-completeness rules.
const (
	// MaxSummaryLength is the longest summary, in characters, that does not
	// draw a summary-too-long warning.
	MaxSummaryLength = 200
	// MinDescriptionWords is the fewest words a description needs to tell
	// a model when to use the tool without a description-too-thin warning.
	MinDescriptionWords = 8
)

// RuleInfo documents one lint rule.
type RuleInfo struct {
	ID          string   `json:"id"`
	Severity    Severity `json:"severity"`
	Principle   string   `json:"principle"`
	Description string   `json:"description"`
}

var ruleTable = []RuleInfo{
	{RuleApprovalRequired, SeverityError, PrincipleActionBoundaries,
		"A tool with write or delete side effects must set requiresApproval."},
	{RuleAnnotationConflict, SeverityError, PrincipleActionBoundaries,
		"Annotations must not contradict the side effects: no readOnlyHint true on a write/delete tool, no destructiveHint false on a delete tool."},
	{RuleDuplicateToolName, SeverityError, PrincipleExecutionIdentity,
		"Tool names are unique within a manifest; every repeated name is flagged."},
	{RuleUnknownDependency, SeverityError, PrincipleDeclaredRelationships,
		"requires, producesInputFor, exclusiveWith and failure-mode fallbacks name tools of the same manifest."},
	{RuleRequiresCycle, SeverityError, PrincipleDeclaredRelationships,
		"requires relationships are acyclic (a tool may not require itself); each cycle is reported once."},
	{RuleRequiresExclusiveConflict, SeverityError, PrincipleDeclaredRelationships,
		"A tool may not both require a tool and be exclusive with it: it could never be admitted."},
	{RuleInvalidInputSchema, SeverityError, PrincipleSemanticCompleteness,
		"inputSchema must be a JSON Schema that compiles without loading anything from outside the document."},
	{RuleInputSchemaNotObject, SeverityError, PrincipleSemanticCompleteness,
		`inputSchema's top-level type must be "object".`},
	{RuleSecretValue, SeverityError, PrincipleExecutionIdentity,
		"A secret is named by its version, never given by value."},
	{RuleSecretUnversioned, SeverityError, PrincipleExecutionIdentity,
		"A secret needs an immutable version so that rotating it makes a new epoch."},
	{RuleSecretInConfig, SeverityError, PrincipleExecutionIdentity,
		"A config value whose key looks like a secret (secret, password, token, api key, private key, credential) must not hold a string; list the secret under secrets by version."},
	{RuleSummaryMissing, SeverityWarning, PrincipleProgressiveDisclosure,
		"Every tool has a short summary for the catalog's summary view."},
	{RuleSummaryTooLong, SeverityWarning, PrincipleProgressiveDisclosure,
		fmt.Sprintf("A summary has at most %d characters; details belong in the description.", MaxSummaryLength)},
	{RuleDescriptionMissing, SeverityWarning, PrincipleSemanticCompleteness,
		"Every tool has a description."},
	{RuleDescriptionRestatesName, SeverityWarning, PrincipleSemanticCompleteness,
		"A description says more than the tool's name or title."},
	{RuleDescriptionTooThin, SeverityWarning, PrincipleSemanticCompleteness,
		fmt.Sprintf("A description has at least %d words, enough to tell a model when to use the tool.", MinDescriptionWords)},
	{RuleParameterUndocumented, SeverityWarning, PrincipleSemanticCompleteness,
		"Every inputSchema property, top-level or nested, has a description."},
	{RuleRecoveryMissing, SeverityWarning, PrincipleFailureModes,
		"Every failure mode declares a recovery strategy; a fallback strategy names its fallback tool."},
	{RuleArtifactNotPinned, SeverityWarning, PrincipleExecutionIdentity,
		"The artifact is identified by a sha256 content digest, not only by a mutable image reference."},
}

var ruleSeverity = func() map[string]Severity {
	m := make(map[string]Severity, len(ruleTable))
	for _, r := range ruleTable {
		m[r.ID] = r.Severity
	}
	return m
}()

// Rules returns the lint rules, errors first, in documentation order.
func Rules() []RuleInfo { return slices.Clone(ruleTable) }

// HasErrors reports whether any finding is an error.
func HasErrors(fs []Finding) bool {
	return slices.ContainsFunc(fs, func(f Finding) bool { return f.Severity == SeverityError })
}

// LintError is returned by callers that refuse a manifest because lint
// reported errors. Findings holds all findings, warnings included.
type LintError struct {
	Findings []Finding
}

func (e *LintError) Error() string { return "manifest: " + e.Public() }

// Public is the sentence a client reads: how many errors and warnings,
// and each error's rule, member and message.
func (e *LintError) Public() string {
	var errs []Finding
	for _, f := range e.Findings {
		if f.Severity == SeverityError {
			errs = append(errs, f)
		}
	}
	warnings := len(e.Findings) - len(errs)
	var sb strings.Builder
	fmt.Fprintf(&sb, "MCP+ lint found %d error(s)", len(errs))
	if warnings > 0 {
		fmt.Fprintf(&sb, ", %d warning(s)", warnings)
	}
	for i, f := range errs {
		if i == 0 {
			sb.WriteString(": ")
		} else {
			sb.WriteString("; ")
		}
		fmt.Fprintf(&sb, "%s at %s: %s", f.Rule, f.Path, f.Message)
	}
	return sb.String()
}

// linter collects findings.
type linter struct {
	m        *Manifest
	findings []Finding
	index    map[string]int // tool name → index of its first descriptor
}

func (l *linter) add(rule, path, format string, args ...any) {
	sev, ok := ruleSeverity[rule]
	if !ok {
		panic("manifest: lint rule not in the table: " + rule)
	}
	l.findings = append(l.findings, Finding{Rule: rule, Severity: sev, Path: path, Message: fmt.Sprintf(format, args...)})
}

// Lint applies the MCP+ lint rules to m. The findings are ordered by path
// (numbers in indexes compare numerically), then rule. Lint does not
// require m to be valid (see [Manifest.Validate]) and never panics on a
// partial manifest.
func Lint(m *Manifest) []Finding {
	if m == nil {
		return nil
	}
	l := &linter{m: m, index: make(map[string]int, len(m.Tools))}
	l.lintArtifact()
	l.lintSecrets()
	l.lintConfig()
	for i := range m.Tools {
		name := m.Tools[i].Name
		if first, dup := l.index[name]; dup {
			l.add(RuleDuplicateToolName, fmt.Sprintf("/tools/%d/name", i),
				"tool name %q is already used by /tools/%d", name, first)
			continue
		}
		l.index[name] = i
	}
	for i := range m.Tools {
		l.lintTool(i)
	}
	l.lintCycles()
	slices.SortFunc(l.findings, func(a, b Finding) int {
		return cmp.Or(naturalCompare(a.Path, b.Path), cmp.Compare(a.Rule, b.Rule), cmp.Compare(a.Message, b.Message))
	})
	return l.findings
}

func (l *linter) lintArtifact() {
	if !l.m.Artifact.Pinned() {
		l.add(RuleArtifactNotPinned, "/artifact/digest",
			"the artifact is not pinned by a sha256 digest; the same image reference may run different code")
	}
}

func (l *linter) lintSecrets() {
	for i, s := range l.m.Secrets {
		p := fmt.Sprintf("/secrets/%d", i)
		if s.Value != "" {
			l.add(RuleSecretValue, p+"/value",
				"secret %q is given by value; name its version instead and remove the value", s.Name)
		}
		if s.Version == "" {
			l.add(RuleSecretUnversioned, p+"/version",
				"secret %q has no version; an epoch must name the exact version it reads", s.Name)
		}
	}
}

var secretKeyPattern = regexp.MustCompile(`(?i)secret|password|passwd|token|api[_-]?key|private[_-]?key|credential`)

// SecretName reports whether a member name looks like it holds a secret
// (secret, password, token, API key, private key, credential): the rule
// the lint applies to config values, and the audit trail to arguments.
func SecretName(name string) bool { return secretKeyPattern.MatchString(name) }

func (l *linter) lintConfig() {
	var walk func(v any, path string, secretKey bool)
	walk = func(v any, path string, secretKey bool) {
		switch v := v.(type) {
		case map[string]any:
			for _, k := range sortedKeys(v) {
				walk(v[k], path+pathKey(k), secretKeyPattern.MatchString(k))
			}
		case map[string]string:
			for _, k := range sortedKeys(v) {
				walk(v[k], path+pathKey(k), secretKeyPattern.MatchString(k))
			}
		case []any:
			for i, e := range v {
				walk(e, fmt.Sprintf("%s/%d", path, i), secretKey)
			}
		case []string:
			for i, e := range v {
				walk(e, fmt.Sprintf("%s/%d", path, i), secretKey)
			}
		case string:
			if secretKey && v != "" {
				// Never echo v.
				l.add(RuleSecretInConfig, path,
					"this config key looks like a secret and holds a string; list the secret under /secrets by version and keep its value out of the manifest")
			}
		}
	}
	for _, k := range sortedKeys(l.m.Config.Values) {
		walk(l.m.Config.Values[k], "/config/values"+pathKey(k), secretKeyPattern.MatchString(k))
	}
}

func (l *linter) lintTool(i int) {
	t := &l.m.Tools[i]
	p := fmt.Sprintf("/tools/%d", i)

	// Explicit action boundaries.
	if t.SideEffects.Mutating() && !t.RequiresApproval {
		l.add(RuleApprovalRequired, p+"/requiresApproval",
			"tool %q has %s side effects but does not require approval", t.Name, t.SideEffects)
	}
	if a := t.Annotations; a != nil {
		if a.ReadOnlyHint != nil && *a.ReadOnlyHint && t.SideEffects.Mutating() {
			l.add(RuleAnnotationConflict, p+"/annotations/readOnlyHint",
				"readOnlyHint is true but the tool has %s side effects", t.SideEffects)
		}
		if a.DestructiveHint != nil && !*a.DestructiveHint && t.SideEffects == SideEffectDelete {
			l.add(RuleAnnotationConflict, p+"/annotations/destructiveHint",
				"destructiveHint is false but the tool has delete side effects")
		}
	}

	// Progressive disclosure.
	summary := strings.TrimSpace(t.Summary)
	if summary == "" {
		l.add(RuleSummaryMissing, p+"/summary", "tool %q has no summary for the catalog's summary view", t.Name)
	} else if n := utf8.RuneCountInString(summary); n > MaxSummaryLength {
		l.add(RuleSummaryTooLong, p+"/summary",
			"the summary has %d characters (at most %d); move details into the description", n, MaxSummaryLength)
	}

	// Semantic completeness.
	desc := strings.TrimSpace(t.Description)
	switch nd := normalizeText(desc); {
	case desc == "":
		l.add(RuleDescriptionMissing, p+"/description", "tool %q has no description", t.Name)
	case nd == "" || nd == normalizeText(t.Name) || (t.Title != "" && nd == normalizeText(t.Title)):
		l.add(RuleDescriptionRestatesName, p+"/description",
			"the description of %q only restates its name; say what it does, on what, and when to use it", t.Name)
	case len(strings.Fields(desc)) < MinDescriptionWords:
		l.add(RuleDescriptionTooThin, p+"/description",
			"the description of %q has %d words (at least %d); say what it does and when to use it",
			t.Name, len(strings.Fields(desc)), MinDescriptionWords)
	}
	l.lintInputSchema(p+"/inputSchema", t.InputSchema)

	// Failure modes.
	for j, f := range t.FailureModes {
		fp := fmt.Sprintf("%s/failureModes/%d", p, j)
		switch {
		case f.Recovery == "":
			l.add(RuleRecoveryMissing, fp+"/recovery", "failure mode %q has no recovery strategy", f.Error)
		case f.Recovery == RecoveryFallback && f.Fallback == "":
			l.add(RuleRecoveryMissing, fp+"/fallback", "failure mode %q falls back but names no fallback tool", f.Error)
		}
		if f.Fallback != "" {
			l.checkToolRef(fp+"/fallback", f.Fallback, "fallback")
		}
	}

	// Declared relationships.
	if d := t.Dependencies; d != nil {
		for j, n := range d.Requires {
			l.checkToolRef(fmt.Sprintf("%s/dependencies/requires/%d", p, j), n, "requires")
		}
		for j, n := range d.ProducesInputFor {
			l.checkToolRef(fmt.Sprintf("%s/dependencies/producesInputFor/%d", p, j), n, "producesInputFor")
		}
		for j, n := range d.ExclusiveWith {
			ep := fmt.Sprintf("%s/dependencies/exclusiveWith/%d", p, j)
			l.checkToolRef(ep, n, "exclusiveWith")
			if slices.Contains(d.Requires, n) {
				l.add(RuleRequiresExclusiveConflict, ep,
					"tool %q both requires and is exclusive with %q, so it could never be admitted", t.Name, n)
			}
		}
	}
}

func (l *linter) checkToolRef(path, name, relation string) {
	if _, ok := l.index[name]; !ok {
		l.add(RuleUnknownDependency, path, "%s names %q, which is not a tool of this manifest", relation, name)
	}
}

func (l *linter) lintInputSchema(p string, raw json.RawMessage) {
	if _, err := CompileSchema(raw); err != nil {
		l.add(RuleInvalidInputSchema, p, "%s", oneLine(err.Error()))
		return
	}
	var doc any
	if err := json.Unmarshal(raw, &doc); err != nil { // cannot happen after CompileSchema
		l.add(RuleInvalidInputSchema, p, "%s", oneLine(err.Error()))
		return
	}
	root, ok := doc.(map[string]any)
	if !ok {
		l.add(RuleInputSchemaNotObject, p, `inputSchema must be a schema object with type "object"`)
		return
	}
	switch typ, present := root["type"]; {
	case !present:
		l.add(RuleInputSchemaNotObject, p+"/type", `inputSchema has no top-level type; it must be "object"`)
	case typ != "object":
		l.add(RuleInputSchemaNotObject, p+"/type", `inputSchema's top-level type is %s; it must be "object"`, oneLine(compactJSON(typ)))
	}
	l.lintProperties(root, root, p)
}

// lintProperties flags undocumented properties of sch and, recursively,
// of nested object schemas (properties and array items).
func (l *linter) lintProperties(root, sch map[string]any, p string) {
	props, _ := sch["properties"].(map[string]any)
	for _, name := range sortedKeys(props) {
		pp := p + "/properties" + pathKey(name)
		ps, _ := props[name].(map[string]any)
		if !documented(root, ps) {
			l.add(RuleParameterUndocumented, pp+"/description", "parameter %q has no description", name)
		}
		if ps == nil {
			continue
		}
		l.lintProperties(root, ps, pp)
		if items, ok := ps["items"].(map[string]any); ok {
			l.lintProperties(root, items, pp+"/items")
		}
	}
}

// documented reports whether a property schema has a description, either
// itself or through a local $ref ("#/...") to a schema that has one.
func documented(root, ps map[string]any) bool {
	for range 8 { // follow at most a few local references
		if ps == nil {
			return false
		}
		if d, ok := ps["description"].(string); ok && strings.TrimSpace(d) != "" {
			return true
		}
		ref, ok := ps["$ref"].(string)
		if !ok || !strings.HasPrefix(ref, "#/") {
			return false
		}
		ptr, err := url.PathUnescape(ref[1:]) // a $ref fragment is URI-encoded
		if err != nil {
			return false
		}
		ps, _ = resolvePointer(root, ptr).(map[string]any)
	}
	return false
}

// resolvePointer resolves an RFC 6901 pointer in doc, or returns nil.
func resolvePointer(doc any, ptr string) any {
	if ptr == "" {
		return doc
	}
	r := strings.NewReplacer("~1", "/", "~0", "~")
	for _, tok := range strings.Split(ptr[1:], "/") {
		obj, ok := doc.(map[string]any)
		if !ok {
			return nil
		}
		if doc, ok = obj[r.Replace(tok)]; !ok {
			return nil
		}
	}
	return doc
}

// lintCycles reports each cycle of requires once: every self-require, and
// one concrete cycle per strongly connected component of two or more
// tools, at the requires entry of its lowest-indexed tool.
func (l *linter) lintCycles() {
	tools := l.m.Tools
	n := len(tools)
	// succ[i] lists (target index, requires index) in declaration order.
	type edge struct{ to, j int }
	succ := make([][]edge, n)
	for i := range tools {
		if first := l.index[tools[i].Name]; first != i || tools[i].Dependencies == nil {
			continue // repeated descriptors are already errors; ignore them here
		}
		for j, name := range tools[i].Dependencies.Requires {
			if to, ok := l.index[name]; ok {
				succ[i] = append(succ[i], edge{to, j})
			}
		}
	}
	reqPath := func(i, j int) string { return fmt.Sprintf("/tools/%d/dependencies/requires/%d", i, j) }

	// Self-requires.
	for i := range n {
		for _, e := range succ[i] {
			if e.to == i {
				l.add(RuleRequiresCycle, reqPath(i, e.j), "tool %q requires itself", tools[i].Name)
				break
			}
		}
	}

	// Tarjan's strongly connected components, iterating in index order.
	idx := make([]int, n)
	low := make([]int, n)
	on := make([]bool, n)
	for i := range idx {
		idx[i] = -1
	}
	var stack []int
	var sccs [][]int
	counter := 0
	var strong func(v int)
	strong = func(v int) {
		idx[v], low[v] = counter, counter
		counter++
		stack = append(stack, v)
		on[v] = true
		for _, e := range succ[v] {
			switch {
			case idx[e.to] < 0:
				strong(e.to)
				low[v] = min(low[v], low[e.to])
			case on[e.to]:
				low[v] = min(low[v], idx[e.to])
			}
		}
		if low[v] == idx[v] {
			var scc []int
			for {
				w := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				on[w] = false
				scc = append(scc, w)
				if w == v {
					break
				}
			}
			sccs = append(sccs, scc)
		}
	}
	for v := range n {
		if idx[v] < 0 {
			strong(v)
		}
	}

	for _, scc := range sccs {
		if len(scc) < 2 {
			continue
		}
		in := make(map[int]bool, len(scc))
		for _, v := range scc {
			in[v] = true
		}
		start := slices.Min(scc)
		// Shortest cycle through start, by breadth-first search inside the
		// component; ties break by declaration order.
		prev := map[int]int{}
		queue := []int{}
		var firstEdge = map[int]int{} // node → requires index of start's edge leading to it
		for _, e := range succ[start] {
			if in[e.to] && e.to != start {
				if _, seen := prev[e.to]; !seen {
					prev[e.to] = start
					firstEdge[e.to] = e.j
					queue = append(queue, e.to)
				}
			}
		}
		last := -1
		for len(queue) > 0 && last < 0 {
			v := queue[0]
			queue = queue[1:]
			for _, e := range succ[v] {
				if e.to == start {
					last = v
					break
				}
				if _, seen := prev[e.to]; !seen && in[e.to] {
					prev[e.to] = v
					firstEdge[e.to] = firstEdge[v]
					queue = append(queue, e.to)
				}
			}
		}
		if last < 0 {
			continue // cannot happen in a strongly connected component
		}
		names := []string{tools[start].Name}
		for v := last; v != start; v = prev[v] {
			names = append(names, tools[v].Name)
		}
		slices.Reverse(names[1:])
		names = append(names, tools[start].Name)
		l.add(RuleRequiresCycle, reqPath(start, firstEdge[last]),
			"requires cycle: %s", strings.Join(names, " → "))
	}
}

// normalizeText lowercases s, reads '_' and '-' as spaces, drops other
// punctuation and symbols, and collapses white space.
func normalizeText(s string) string {
	var sb strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r == '_' || r == '-':
			sb.WriteRune(' ')
		case unicode.IsPunct(r) || unicode.IsSymbol(r):
		default:
			sb.WriteRune(r)
		}
	}
	return strings.Join(strings.Fields(sb.String()), " ")
}

// pathKey renders an object member name as a JSON Pointer reference
// token (RFC 6901: "~" is "~0", "/" is "~1").
func pathKey(k string) string {
	return "/" + pointerEscaper.Replace(k)
}

var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

func compactJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%v", v)
	}
	return string(b)
}

// naturalCompare compares strings, reading runs of ASCII digits as
// numbers, so that "/tools/2" sorts before "/tools/10".
func naturalCompare(a, b string) int {
	for a != "" && b != "" {
		if isDigit(a[0]) && isDigit(b[0]) {
			da, db := digitRun(a), digitRun(b)
			na, nb := strings.TrimLeft(a[:da], "0"), strings.TrimLeft(b[:db], "0")
			if c := cmp.Or(cmp.Compare(len(na), len(nb)), cmp.Compare(na, nb), cmp.Compare(da, db)); c != 0 {
				return c
			}
			a, b = a[da:], b[db:]
			continue
		}
		if a[0] != b[0] {
			return cmp.Compare(a[0], b[0])
		}
		a, b = a[1:], b[1:]
	}
	return cmp.Compare(len(a), len(b))
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func digitRun(s string) int {
	i := 0
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	return i
}
