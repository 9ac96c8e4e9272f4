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
//   problems       every refused answer is read as a host reads it, through
//                  the SDK's fetch option, into "refusals": its status, the
//                  Fcd-Problem, Retry-After and Fcd-Formation headers, and
//                  what the body names (a problem's "type", or a JSON-RPC
//                  error's data.type and data.formation)
//
// Each request waits REQUEST_TIMEOUT_MS for its answer, not the SDK's 60 s:
// a gateway that ends an SSE answer early (as Caddy 2.6 did without
// buffer_requests) leaves the SDK waiting for a response that never comes.
// Then "unanswered" names the request (initialize, tools/list, tools/call or
// DELETE) and "error" or "callError" says so; mcpjs_test.go fails on it.
import { existsSync, writeFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ErrorCode, McpError } from "@modelcontextprotocol/sdk/types.js";

const REQUEST_TIMEOUT_MS = 20000;

const [url, headerJSON, tool, args, optionList = ""] = process.argv.slice(2);
const options = new Map(optionList.split(",").filter(Boolean).map((o) => {
  const [k, ...v] = o.split("=");
  return [k, v.join("=")];
}));
const headers = JSON.parse(headerJSON);
const transportOptions = { requestInit: { headers } };
const out = {};
let send = fetch;
if (options.has("call-only")) {
  const formation = headers["Fcd-Formation"];
  delete headers["Fcd-Formation"];
  const next = send;
  send = (input, init = {}) => {
    if (init.method === "POST" && typeof init.body === "string" && init.body.includes('"tools/call"')) {
      const h = new Headers(init.headers);
      h.set("Fcd-Formation", formation);
      init = { ...init, headers: h };
    }
    return next(input, init);
  };
}
if (options.has("problems")) {
  out.refusals = [];
  const next = send;
  send = async (input, init = {}) => {
    const res = await next(input, init);
    if (!res.ok && res.status !== 404 && res.status !== 405) {
      const r = {
        method: init.method ?? "GET",
        status: res.status,
        problem: res.headers.get("Fcd-Problem") ?? "",
        retryAfter: res.headers.get("Retry-After") ?? "",
        formation: res.headers.get("Fcd-Formation") ?? "",
      };
      try {
        const body = JSON.parse(await res.clone().text());
        r.type = body.type ?? body.error?.data?.type ?? "";
        r.formation ||= body.formation ?? body.error?.data?.formation ?? "";
      } catch {
        r.type = "";
      }
      out.refusals.push(r);
    }
    return res;
  };
}
if (send !== fetch) {
  transportOptions.fetch = send;
}
const transport = new StreamableHTTPClientTransport(new URL(url), transportOptions);
const client = new Client({ name: "fcd-e2e-ts", version: "0" });
const requestOptions = { timeout: REQUEST_TIMEOUT_MS };
// why returns e's message, naming the request when it went unanswered.
const why = (request, e) => {
  if (e?.code === ErrorCode.RequestTimeout) {
    out.unanswered = request;
    return `${request}: no answer in ${REQUEST_TIMEOUT_MS / 1000} s (did the gateway end the answer early? see its log): ${e.message}`;
  }
  return String(e?.message ?? e);
};
let request = "initialize";
try {
  await client.connect(transport, requestOptions);
  out.session = transport.sessionId ?? "";
  request = "tools/list";
  out.tools = (await client.listTools(undefined, requestOptions)).tools.map((t) => t.name);
  if (options.has("wait")) {
    const file = options.get("wait");
    writeFileSync(file + ".ready", "");
    while (!existsSync(file)) {
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  try {
    out.progress = 0;
    const callOptions = { ...requestOptions };
    if (options.has("progress")) {
      callOptions.onprogress = () => { out.progress++; };
    }
    const res = await client.callTool({ name: tool, arguments: JSON.parse(args) }, undefined, callOptions);
    out.isError = res.isError === true;
    out.text = (res.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("\n");
  } catch (e) {
    out.callError = why("tools/call", e);
  }
  request = "DELETE";
  let timer;
  await Promise.race([
    transport.terminateSession(),
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new McpError(ErrorCode.RequestTimeout, "Request timed out")), REQUEST_TIMEOUT_MS);
    }),
  ]).finally(() => clearTimeout(timer));
  out.terminated = true;
} catch (e) {
  out.error = why(request, e);
}
await client.close().catch(() => {});
console.log(JSON.stringify(out));
