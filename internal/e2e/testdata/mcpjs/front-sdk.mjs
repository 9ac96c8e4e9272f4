// The official MCP TypeScript SDK's client, unmodified, against fcd's MCP
// front (front-driver.mjs says how it is driven): the bearer token in
// requestInit's headers, progress through callTool's onprogress.
//
//   node front-sdk.mjs FRONT_MCP_URL BEARER_TOKEN
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { serve, url, token, textOf, problemOf } from "./front-driver.mjs";

await serve(async () => {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  const client = new Client({ name: "fcd-e2e-ts-sdk", version: "0" });
  await client.connect(transport);
  return {
    list: async () => (await client.listTools()).tools.map((t) => ({
      name: t.name, description: t.description ?? "", inputSchema: t.inputSchema,
      readOnly: t.annotations?.readOnlyHint ?? null,
    })),
    call: async (name, args, progress) => {
      let seen = 0;
      const options = progress ? { onprogress: () => { seen++; } } : undefined;
      const res = await client.callTool({ name, arguments: args }, undefined, options);
      return { isError: res.isError === true, text: textOf(res), problem: problemOf(res.structuredContent), progress: seen };
    },
    close: async () => {
      await transport.terminateSession();
      await client.close();
    },
  };
});
