// Package host is what an MCP host needs to call tools behind fcd: an
// [http.RoundTripper] for the official MCP Go SDK's streamable client
// transport that forms each tools/call with authzd and sends it with its
// formation.
//
// A host shows its model a catalog snapshot (POST /v1/snapshots) and, for
// every tool call the model forms, records the call against that snapshot
// (POST /v1/formations); a gateway in front of the MCP server admits the
// call named by the request's Fcd-Formation header, and the server's
// fencecheck runs it once. [Transport] does the host's part:
//
//   - A POST whose JSON-RPC body is one tools/call is formed: the tool
//     (params.name, on the server [Config.Server]) is looked up in the
//     snapshot, and authzd records the call with its arguments exactly as
//     the body holds them, for [Config.Principal], in the session the
//     request's Mcp-Session-Id names (docs/hosts.md). A formation
//     that needs approval either makes RoundTrip wait until approvers
//     decide ([Config.WaitForApproval]) or ends the call with a
//     [*PendingError] that names the formation and the approval page. A
//     denied call ends with a [*DeniedError], one not approved in time
//     with an [*ExpiredError]. A ready call is sent with Fcd-Formation and
//     Mcp-Method: tools/call; its body is never changed (the fence checks
//     that the call it runs is byte for byte the call formed).
//   - Everything else — initialize, notifications, tools/list, the GET
//     event stream, DELETE — is sent untouched, without a formation, so a
//     forward-auth gateway that cannot read bodies never takes session
//     traffic for a call.
//   - A refusal of the call by the gateway or the fence (an answer with an
//     Fcd-Problem header) becomes a [*RefusedError] with its problem type,
//     detail and Retry-After. authzd's own refusals while snapshotting or
//     forming (a problem+json answer) are a *client.Problem of the typed
//     REST client (package github.com/fcd-authz/fcd/client) the transport
//     calls authzd with.
//
// The SDK hands a transport's errors to the tools/call's caller: match
// them with errors.As (and [ErrUnknownTool], [ErrAmbiguousTool],
// [ErrBatchedCall] with errors.Is). Such an error does not end the MCP
// session; the host may form the call again (with new arguments, after an
// approval, after Retry-After) on the same session.
//
// The transport reads each POST body with fencecheck.ReadMessage, the
// strict reader authzd's gateway check and the backend's fence read it
// with, so the call it forms is exactly the call they verify. A JSON-RPC
// batch that holds a tools/call is refused with [ErrBatchedCall] before
// anything is sent: one request carries one Fcd-Formation header, and the
// fence refuses batched calls anyway. The MCP SDKs send no batches
// (protocol 2025-06-18 removed them); a batch without a call passes
// untouched. Any other body that reader refuses — a member twice, a name
// fcd reads spelled in another case ("Method", "Arguments"), invalid
// UTF-8, argument names that fold alike — ends with its
// *fencecheck.RejectError (fencecheck.ReasonOf names the reason), and
// nothing is sent: the gateway and the fence would refuse it. A body that
// is not JSON at all holds no call and passes untouched.
//
// The transport never logs or prints the host credential ([Credential]
// prints as "[redacted]").
package host
