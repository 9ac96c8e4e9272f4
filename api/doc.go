// Package api is fcd's network surface (api/openapi.yaml): the REST
// routes of registrars, hosts, approvers, operators and backends; the
// external-authorizer routes gateways call (forward_auth for nginx, Caddy
// and Traefik; Envoy ext_authz over HTTP, and over gRPC through
// [NewCheckServer]); the JWKS of dispatch-token keys; health, readiness and
// the OpenAPI document that describes every route.
//
// Handlers are thin: decode, call one use case of package authz, encode.
// Errors become RFC 9457 problem+json in one place (problems.go) with a
// stable type per cause; raw store or engine errors never reach a client.
package api
