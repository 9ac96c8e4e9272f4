// Package authz holds fcd's use cases: registering epochs, freezing
// catalogs, and (as they land) forming, deciding, approving, admitting and
// completing calls. Transports (package api, the CLI) decode a request,
// call one use case here and map its error; they hold no logic of their
// own.
//
// The errors a caller must tell apart are exported here, so that a
// transport depends on this package alone.
package authz
