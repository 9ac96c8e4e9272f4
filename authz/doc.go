// Package authz holds fcd's use cases: registering epochs, freezing
// catalogs, forming, deciding, approving, admitting and completing calls.
// Transports (package api, the CLI) decode a request, call one use case
// here and map its error; they hold no logic of their own.
//
// The records the use cases take and return, and the store's refusals,
// are package record's; the errors the use cases add are exported here.
// A transport matches both with errors.Is and errors.As.
package authz
