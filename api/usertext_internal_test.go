package api

import (
	"strings"
	"testing"

	"github.com/fcd-authz/fcd/internal/usertext"
)

// stripLayers is text without the package prefixes of Go errors, on one
// line: what detailOf may take a detail from.
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
