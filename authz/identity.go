package authz

import (
	"strings"

	"golang.org/x/text/unicode/norm"

	"github.com/fcd-authz/fcd/fencecheck"
)

// NormalizeIdentity is the one form in which fcd compares the ids of
// principals, approvers and gateway callers: trimmed of surrounding
// whitespace, in Unicode NFC, and case-folded with fencecheck's fold rule.
// "Alice ", "alice" and "ALICE" are one person; so are a precomposed and a
// decomposed "José". Without it, self-approval and the distinct-approver
// count were exact string compares that a trailing space defeated.
func NormalizeIdentity(id string) string {
	return fencecheck.FoldName(norm.NFC.String(strings.TrimSpace(id)))
}

// SameIdentity reports whether two ids name the same identity after
// NormalizeIdentity. An empty id is nobody: it matches nothing.
func SameIdentity(a, b string) bool {
	na := NormalizeIdentity(a)
	return na != "" && na == NormalizeIdentity(b)
}
