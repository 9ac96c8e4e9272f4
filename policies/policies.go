// Package policies holds fcd's default policy set, embedded: Rego and
// Cedar policies with the same rules under the same names, and their
// tests. authzd decides with it when no policy directory is given; an
// operator starts from a copy of this folder. README.md documents the
// input document, the Rego contract and the Cedar mapping.
package policies

import "embed"

// FS is the default policy set: *.rego (with *_test.rego), *.cedar and
// *.cases.json. Pass it to policy.Load or as policy.Source{FS: policies.FS}.
//
//go:embed *.rego *.cedar *.json
var FS embed.FS
