// One MCP host session with the official TypeScript SDK client, unmodified:
// it connects to URL with HEADERS (a JSON object) on every request — what an
// SDK's custom-header option does — lists the tools, calls TOOL with ARGS
// (JSON), closes the session (DELETE), and prints what happened as one JSON
// object. internal/e2e/mcpjs_test.go runs it.
//
//   node client.mjs URL HEADERS TOOL ARGS [progress]
//
// With "progress" the call asks for progress notifications (a progressToken
// in params._meta) and counts those that arrive before the result.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, headers, tool, args, progress] = process.argv.slice(2);
const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: JSON.parse(headers) } });
const client = new Client({ name: "fcd-e2e-ts", version: "0" });
const out = {};
try {
  await client.connect(transport);
  out.session = transport.sessionId ?? "";
  out.tools = (await client.listTools()).tools.map((t) => t.name);
  try {
    out.progress = 0;
    const options = progress === "progress" ? { onprogress: () => { out.progress++; } } : undefined;
    const res = await client.callTool({ name: tool, arguments: JSON.parse(args) }, undefined, options);
    out.isError = res.isError === true;
    out.text = (res.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("\n");
  } catch (e) {
    out.callError = String(e?.message ?? e);
  }
  await transport.terminateSession();
  out.terminated = true;
} catch (e) {
  out.error = String(e?.message ?? e);
}
await client.close().catch(() => {});
console.log(JSON.stringify(out));
