// Package client is the typed Go client of authzd's REST API, generated
// from the OpenAPI document the server serves (api/openapi.yaml) by
// oapi-codegen, the version pinned as a tool in go.mod.
//
// Everything in client.gen.go is generated: one method per operation of
// the document (named after its operationId), one type per schema. Run
// `go generate ./client/...` after changing api/openapi.yaml;
// TestGeneratedIsCurrent fails while the committed code differs from what
// the document generates, so the document, the server (checked against
// it by api/openapi_test.go) and this client cannot drift apart.
//
// The hand-written part is small. [New] returns a client that sends a
// bearer credential with every request and turns every problem answer
// (status 400 or more) into a [*Problem] error, which callers match with
// errors.As and tell apart by [Problem.Slug]; other answers are decoded
// into the JSONnnn fields of each operation's response (JSON201 of
// CreateFormationWithResponse, and JSON403 for a formation the policy
// denied, which the document answers with its record).
//
// The generated names follow the document: operations by operationId
// (CreateFormationWithResponse), schemas by name (FormationRequest),
// inline objects by their place (FormationRequest_Principal), enum values
// prefixed by their type (FormationStatusReady). The Problem schema is
// generated as [ProblemDetails] (client/overlay.yaml renames it), the
// body of a [*Problem].
//
// The package imports no server package of fcd and no store or policy
// engine: hosts and backends embed it.
package client
