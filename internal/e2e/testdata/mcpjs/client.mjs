// One MCP host session with the official TypeScript SDK client, unmodified:
// it connects to URL with HEADERS (a JSON object) on every request — what an
// SDK's custom-header option does — lists the tools, calls TOOL with ARGS
// (JSON), closes the session (DELETE), and prints what happened as one JSON
// object. internal/e2e/mcpjs_test.go runs it.
//
//   node client.mjs URL HEADERS TOOL ARGS [OPTIONS]
//
// OPTIONS is a comma-separated list:
//   progress       the call asks for progress notifications (a progressToken
//                  in params._meta); those that arrive before the result are
//                  counted in "progress"
//   call-only      Fcd-Formation (from HEADERS) goes on the tools/call only,
//                  through the SDK's fetch option — what a host behind a
//                  forward-auth gateway does (docs/mcp-sessions.md)
//   wait=FILE      after listing the tools, create FILE.ready and wait for
//                  FILE to exist before the call
import { existsSync, writeFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, headerJSON, tool, args, optionList = ""] = process.argv.slice(2);
const options = new Map(optionList.split(",").filter(Boolean).map((o) => {
  const [k, ...v] = o.split("=");
  return [k, v.join("=")];
}));
const headers = JSON.parse(headerJSON);
const transportOptions = { requestInit: { headers } };
if (options.has("call-only")) {
  const formation = headers["Fcd-Formation"];
  delete headers["Fcd-Formation"];
  transportOptions.fetch = (input, init = {}) => {
    if (init.method === "POST" && typeof init.body === "string" && init.body.includes('"tools/call"')) {
      const h = new Headers(init.headers);
      h.set("Fcd-Formation", formation);
      init = { ...init, headers: h };
    }
    return fetch(input, init);
  };
}
const transport = new StreamableHTTPClientTransport(new URL(url), transportOptions);
const client = new Client({ name: "fcd-e2e-ts", version: "0" });
const out = {};
try {
  await client.connect(transport);
  out.session = transport.sessionId ?? "";
  out.tools = (await client.listTools()).tools.map((t) => t.name);
  if (options.has("wait")) {
    const file = options.get("wait");
    writeFileSync(file + ".ready", "");
    while (!existsSync(file)) {
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  try {
    out.progress = 0;
    const callOptions = options.has("progress") ? { onprogress: () => { out.progress++; } } : undefined;
    const res = await client.callTool({ name: tool, arguments: JSON.parse(args) }, undefined, callOptions);
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
