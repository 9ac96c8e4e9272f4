// Package mcpdiff holds the differential tests of fcd's one MCP request
// reader, fencecheck.ReadMessage, against the readers backends use.
//
// The fence forwards a tools/call body byte for byte once it has verified
// the dispatch token for the tool name and arguments it read. That is safe
// only if every backend reads the same body the same way: the rule fcd
// keeps is that what the backend parses is what was verified. A body the
// fence accepts but a backend reads differently — other arguments (the
// "Arguments" member the fence once read case-insensitively and the MCP Go
// SDK ignored), another tool, another method, a tools/call the fence did
// not see at all — lets a genuine token run a call nobody approved.
//
// The fuzz target FuzzBackendsReadWhatTheFenceRead decodes each body with
//
//   - fencecheck.ReadMessage, the fence's reader;
//   - the MCP Go SDK's own server (mcp.NewStreamableHTTPHandler, stateless,
//     served in process) with a receiving middleware and a tool that record
//     what the SDK dispatched, and a step-for-step replica of the SDK's
//     decoding (jsonrpc.DecodeMessage, then params into
//     mcp.CallToolParamsRaw with segmentio/encoding/json matching member
//     names exactly), which also covers batches whose dispatch the server
//     leaves to timing;
//   - encoding/json struct decoding (case-insensitive, last duplicate
//     wins), of the JSON-RPC envelope and of every argument name the
//     fence saw, one struct field at a time;
//
// and fails whenever the fence accepts a body that one of them reads
// differently. Refusals are never failures: a body the fence refuses runs
// nowhere. The seed corpus (the attack bodies of issue 10 among them) runs
// in every go test; a long run is
//
//	go test -run '^$' -fuzz FuzzBackendsReadWhatTheFenceRead -fuzztime 12m -parallel 1 ./internal/mcpdiff/
//
// The package has no code outside its tests.
package mcpdiff
