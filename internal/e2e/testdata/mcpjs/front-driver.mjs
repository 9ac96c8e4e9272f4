// The line protocol by which internal/e2e/frontclients_test.go drives one
// MCP client library, unmodified, against fcd's MCP front. Each
// front-LIBRARY.mjs script connects with its library's own options and
// hands serve() an adapter; serve() prints one JSON line per request read
// from standard input:
//
//   (connected)                  {"connected": true} or {"error": "…"} (then exits)
//   {"op": "list"}               {"tools": [{name, description, inputSchema?, readOnly?}]}
//   {"op": "call", "name", "args", "progress"}
//                                {isError, text, problem?, progress, error?}: what
//                                the library gave back (problem: structuredContent's
//                                fcd.problem where the library exposes it)
//   {"op": "close"}              {"closed": true}, then exits
import { createInterface } from "node:readline";

const print = (o) => process.stdout.write(JSON.stringify(o) + "\n");
const message = (e) => String(e?.message ?? e) + (e?.cause ? ` (cause: ${e.cause?.message ?? e.cause})` : "");

// The arguments every script takes: the front's MCP URL and the bearer token.
export const [url, token] = process.argv.slice(2);

// textOf joins a CallToolResult's text content.
export const textOf = (res) => (res?.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("\n");

// problemOf reads the refusal the front puts in structuredContent.
export const problemOf = (structured) => structured?.fcd?.problem ?? "";

/**
 * @param {() => Promise<{list: () => Promise<object[]>, call: (name: string, args: object, progress: boolean) => Promise<object>, close: () => Promise<void>}>} connect
 */
export async function serve(connect) {
  let adapter;
  try {
    adapter = await connect();
  } catch (e) {
    print({ error: message(e) });
    process.exit(0);
  }
  print({ connected: true });
  const lines = createInterface({ input: process.stdin });
  for await (const line of lines) {
    if (!line.trim()) continue;
    const req = JSON.parse(line);
    try {
      if (req.op === "list") {
        print({ tools: await adapter.list() });
      } else if (req.op === "call") {
        print(await adapter.call(req.name, req.args ?? {}, req.progress === true));
      } else if (req.op === "close") {
        await adapter.close();
        print({ closed: true });
        break;
      } else {
        print({ error: `unknown op ${req.op}` });
      }
    } catch (e) {
      print({ error: message(e) });
    }
  }
  process.exit(0);
}
