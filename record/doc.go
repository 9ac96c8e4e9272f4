// Package record is fcd's domain vocabulary: the records every layer
// speaks of — formations (the call, its decision, its approvals), epochs,
// snapshots, leases and their claims, registered certificates — and the
// refusals a caller tells apart (errors.Is, errors.As).
//
// The store (package lease) persists these records, the use cases
// (package authz) and the policy engines (package authz/policy) read and
// write them, and the transports render them through types of their own:
// the REST representation of a formation, an epoch or a lease is package
// api's (api/wire.go, as the OpenAPI document describes it), and the
// audit trail's events are authz's (authz/trail.go, versioned), each
// converted from these records, so a field renamed or added here changes
// neither until it is mapped there. The package holds data and the rules that belong to the data alone (which
// statuses expire, which states are valid, a call's digest); it imports no
// store, engine or transport, so that evaluating a policy does not pull in
// etcd, and it sits at the bottom of the server's import graph, above only
// the documents of package manifest.
//
// The errors' texts keep the "lease:" prefix of the store that reports
// most of them: they reach clients in problem details, which did not
// change when the vocabulary moved here.
package record
