package policy

import "errors"

// Errors returned when a policy set cannot be loaded. Callers match them
// with errors.Is; the wrapped message says which file and why.
var (
	// ErrInvalidPolicy: a policy file does not parse or compile, breaks the
	// contract of policies/README.md (a Rego package without allow sets, a
	// Cedar policy without @id, ...), or a language is missing from the set.
	ErrInvalidPolicy = errors.New("policy: invalid policy set")
	// ErrTestsFailed: the set compiles but one of its own tests (Rego
	// *_test.rego or Cedar *.cases.json) fails, so it is not used.
	ErrTestsFailed = errors.New("policy: policy tests failed")
	// ErrInvalidInput: an Input cannot be converted for the engines; the
	// decision is a deny.
	ErrInvalidInput = errors.New("policy: invalid input")
)
