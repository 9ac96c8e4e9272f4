// Package front is fcd's MCP front: an MCP server that unmodified MCP
// clients (an IDE, a chat app, any SDK's client) connect to, and that is
// fcd's trusted host for them.
//
// A host that embeds fcd's logic (package host) keeps the catalog its
// model saw, forms each call with authzd and sends it with its formation.
// A stock client does none of that, and is shown a server's live
// tools/list rather than the snapshot its calls are formed against. The
// front does the host's part for it, so that the property holds without
// the client's cooperation:
//
//   - Each client session opens one catalog snapshot of the servers the
//     front fronts (POST /v1/snapshots); tools/list is answered from it,
//     so the descriptors the model sees are the ones its calls are formed
//     against. MCP+ side effects are shown as MCP tool annotations, the
//     summary first in the description, the rest of the MCP+ metadata in
//     the tool's _meta. A relisting (a release registered or retired) is a
//     new snapshot announced with notifications/tools/list_changed; a call
//     is formed against the snapshot the session was last shown.
//   - Each tools/call is formed for the authenticated user in the client's
//     session. A call that needs approval keeps the request open, sending
//     notifications/progress (approvals given of those required) when the
//     client asked for progress, for up to Config.ApprovalWait. Then it is
//     admitted (the front holds the gateway role: front → fence) and sent
//     to the pool it was admitted to with its dispatch token, or sent
//     through a gateway with its formation (front → gateway → fence); the
//     server's result and progress come back unchanged.
//   - A refusal — denied by policy or approver, not approved in time, a
//     stale or draining source, an unmet dependency, a recovery refused,
//     a fence's reason, authzd or the backend unreachable — is a tool
//     result with isError set, whose text tells the model what happened
//     and what it may do, and whose structuredContent carries the problem
//     for programs. Nothing is ever sent upstream without a formation and
//     an admission (fail closed).
//   - A call of a tool that failed in the session with a declared failure
//     mode is formed as the recovery of that call (POST
//     /v1/formations/{id}/recover), linked to it, as the tool's recovery
//     rules allow.
//
// The front authenticates its clients as MCP's authorization
// specification says a protected resource does: bearer tokens (JWTs
// checked against an issuer's JWKS, audience included), with the
// protected resource metadata of RFC 9728 so that clients can discover the
// authorization server; static tokens for development. The principal and
// its attributes are taken from the token's claims. docs/front.md
// describes the configuration and the deployment shapes.
package front
