// Package authz holds fcd's use cases: registering epochs and
// compatibility certificates, freezing catalogs, forming, deciding,
// approving and admitting calls, claiming, completing, resolving and
// sweeping their leases, and the gateway's decision. Transports (package
// api, the CLI) decode a request, call one use case here and map its
// error; they hold no logic of their own.
//
// The errors a caller must tell apart are exported here, so that a
// transport depends on this package alone.
package authz
