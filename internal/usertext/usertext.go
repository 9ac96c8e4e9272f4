// Package usertext checks text meant for people — problem details, CLI
// errors, startup logs — for what must never reach them: Go type names,
// decoder vocabulary, and the package prefixes Go errors carry repeated
// by each layer. Tests of every user-facing message share it, so that the
// rule is one list.
package usertext

import (
	"regexp"
	"strings"
)

// goWords are signs of Go internals in a message: a package-qualified
// type (exported, or camel-cased like api.formationRequest — a file name
// like manifest.json is not one), Go's composite type syntax, the
// decoders' own words.
var goWords = regexp.MustCompile(`\b(api|authz|lease|record|manifest|main|json|jsontext|jsonv2|http|time|reflect)\.([A-Z]\w*|[a-z]+[A-Z]\w*)|` +
	`Go (struct|type|value)|\bmap\[|\[\]|(?:^|[\s(])json: |(?:^|[\s(])jsontext: |\bunmarshal|\bUnmarshal|\*[a-z]+\.[A-Z]|` +
	`struct \{|interface \{|\bint64\b|\bfloat64\b|json\.RawMessage|error converting YAML`)

// layerPrefix is a package's prefix on an error's text.
var layerPrefix = regexp.MustCompile(`\b(authz|lease|manifest|record|fencecheck|policy|api): `)

// Problems lists what is wrong with s as text for people: each Go word it
// contains, a layer prefix that appears twice, a line break. Empty when s
// is fine.
func Problems(s string) []string {
	var out []string
	for _, m := range goWords.FindAllString(s, -1) {
		out = append(out, "Go internals: "+m)
	}
	seen := map[string]int{}
	for _, m := range layerPrefix.FindAllString(s, -1) {
		seen[m]++
		if seen[m] == 2 {
			out = append(out, "repeated layer prefix: "+strings.TrimSpace(m))
		}
	}
	if strings.ContainsAny(s, "\n\r") {
		out = append(out, "more than one line")
	}
	return out
}
