// Package authz holds fcd's use cases: registering epochs and
// compatibility certificates, freezing catalogs, forming, deciding,
// approving and admitting calls, claiming, completing, resolving and
// sweeping their leases, and the gateway's decision. Transports (package
// api, the CLI) decode a request, call one use case here and map its
// error; they hold no logic of their own.
//
// The records the use cases take and return, and the store's refusals,
// are package record's; the errors the use cases add are exported here.
// A transport matches both with errors.Is and errors.As.
package authz
