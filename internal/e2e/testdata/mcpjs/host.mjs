// Runs the TypeScript host recipe (fcd-host.mjs) with the official MCP
// TypeScript SDK client, unmodified, through a gateway: three sessions, the
// first not waiting for approvals, the second waiting, the third forming
// its call for another user than the gateway authenticates. It prints what
// happened as one JSON object. internal/e2e/hostjs_test.go runs it and
// approves the waiting call as an approver.
//
//   node host.mjs GATEWAY_MCP_URL AUTHZD_URL HOST_CREDENTIAL SNAPSHOT GATEWAY_AUTHORIZATION
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { fcdFetch, FcdError } from "./fcd-host.mjs";

const [url, authzdURL, credential, snapshot, authorization] = process.argv.slice(2);
const out = { requests: [] };

// Every request to the gateway, as it leaves the recipe's fetch.
const observed = (input, init = {}) => {
  if (String(input).startsWith(url)) {
    const h = new Headers(init.headers);
    let rpc = "";
    try { rpc = JSON.parse(init.body).method ?? ""; } catch {}
    out.requests.push({ method: init.method ?? "GET", rpc, formation: h.get("fcd-formation") ?? "", mcpMethod: h.get("mcp-method") ?? "" });
  }
  return fetch(input, init);
};

const session = async (waitForApproval, work, principal = { id: "alice", attributes: { groups: ["dev"] } }) => {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: authorization } },
    fetch: fcdFetch({
      authzdURL, credential, snapshot, server: "github", principal,
      waitForApproval, pollMs: 50, fetch: observed,
      onPending: (p) => { out.announced = p.formation; },
    }),
  });
  const client = new Client({ name: "fcd-e2e-ts-host", version: "0" });
  await client.connect(transport);
  await client.listTools();
  await work(client);
  await transport.terminateSession();
  await client.close();
};

const outcome = async (client, name, args) => {
  try {
    const res = await client.callTool({ name, arguments: args }, undefined, { timeout: 120000 });
    return { isError: res.isError === true, text: (res.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("\n") };
  } catch (e) {
    if (e instanceof FcdError) return { kind: e.kind, message: e.message, formation: e.formation, reasons: e.reasons, problem: e.problem, fence: e.fence };
    return { error: String(e?.message ?? e) };
  }
};

try {
  await session(false, async (client) => {
    out.read = await outcome(client, "get_repository", { owner: "octo-org", repo: "hello-world" });
    out.pending = await outcome(client, "create_repository", { name: "ts-pending" });
    out.denied = await outcome(client, "delete_repository", { owner: "octo-org", repo: "hello-world" });
    out.unknown = await outcome(client, "transfer_repository", { owner: "octo-org", repo: "hello-world" });
  });
  await session(true, async (client) => {
    out.waited = await outcome(client, "create_repository", { name: "ts-waited" });
  });
  // Formed for bob, sent by alice: the gateway refuses it.
  await session(false, async (client) => {
    out.refused = await outcome(client, "get_repository", { owner: "octo-org", repo: "hello-world" });
  }, { id: "bob" });
  out.done = true;
} catch (e) {
  out.error = String(e?.stack ?? e);
}
console.log(JSON.stringify(out));
