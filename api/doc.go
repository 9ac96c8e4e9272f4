// Package api is fcd's HTTP surface (see shared/API.md): the REST routes
// of registrars, hosts, approvers, operators and backends, health and
// readiness, and the OpenAPI document that describes them.
//
// Handlers are thin: decode, call one use case of package authz, encode.
// Errors become RFC 9457 problem+json in one place (problems.go) with a
// stable type per cause; raw store or engine errors never reach a client.
package api
