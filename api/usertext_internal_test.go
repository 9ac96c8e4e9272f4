package api

import (
	"regexp"
	"strings"
	"testing"

	"github.com/fcd-authz/fcd/internal/usertext"
)

// layerPrefix is a package's prefix on its errors' text ("authz: ",
// "lease: "), at the start of the text or of a wrapped part of it: what a
// problem's detail never shows.
var layerPrefix = regexp.MustCompile(`(^|: |; )(?:authz|lease|manifest|record|fencecheck|policy|api): `)

// stripLayers is text without the package prefixes of Go errors, on one
// line: what clientDetail may take a detail from.
func stripLayers(text string) string {
	for {
		next := layerPrefix.ReplaceAllString(text, "$1")
		if next == text {
			return strings.Join(strings.Fields(text), " ")
		}
		text = next
	}
}

// checkUserText fails t when text, meant for a person, shows Go internals
// or repeats a layer prefix.
func checkUserText(t testing.TB, text string) {
	t.Helper()
	if p := usertext.Problems(text); len(p) > 0 {
		t.Errorf("%q: %s", text, strings.Join(p, "; "))
	}
	if m := layerPrefix.FindString(text); m != "" {
		t.Errorf("%q: carries the layer prefix %q", text, m)
	}
}
