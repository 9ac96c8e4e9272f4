// Package policy evaluates operators' policies as code: Rego through OPA's
// v1 Go API with prepared queries, and Cedar through cedar-go, over one
// documented [Input]. Decisions combine deny-overrides: any engine's deny,
// any evaluation error, an undefined Rego result or a Cedar diagnostic
// error denies. Both engines also answer on a call's candidate successor
// (Rego deny_successor, a Cedar forbid of Action::"substitute"); refusing
// it never changes the verdict on the call. A loaded policy set is
// immutable and swapped atomically on reload; a set that fails to parse,
// compile or pass its own tests never replaces the working one.
//
// The pieces, from the bottom up:
//
//   - [Document]: an Input converted once per decision into the value form
//     both engines read.
//   - [Engine]: one language's compiled policies ([RegoEngine],
//     [CedarEngine]); Decide never fails, it denies with the error
//     recorded.
//   - [Set]: both engines plus the digest of the files they came from;
//     [Load] refuses a set whose own tests fail, [RunTests] reports them.
//   - [Manager]: the set in force behind an atomic pointer, reloaded on
//     demand (SIGHUP) or by polling a directory or an OPA bundle
//     ([Manager.Watch], [BundleSource]: a file or a URL, verified with
//     OPA's bundle reader), with a [Status] for /readyz.
//
// The input document, the Rego contract and the Cedar mapping are
// documented for operators in policies/README.md; the default set lives in
// package policies.
package policy
