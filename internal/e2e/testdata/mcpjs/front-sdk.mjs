// The official MCP TypeScript SDK's client, unmodified, against fcd's MCP
// front (front-driver.mjs says how it is driven): over streamable HTTP
// with the bearer token in requestInit's headers, or launching the front
// as a command (StdioClientTransport), as a desktop client does, with the
// environment given; progress through callTool's onprogress.
//
//   node front-sdk.mjs FRONT_MCP_URL BEARER_TOKEN
//   node front-sdk.mjs --stdio COMMAND ARGS_JSON ENV_JSON
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { StdioClientTransport, getDefaultEnvironment } from "@modelcontextprotocol/sdk/client/stdio.js";
import { serve, url, token, textOf, problemOf } from "./front-driver.mjs";

const stdio = url === "--stdio";

await serve(async () => {
  let transport;
  if (stdio) {
    const [command, args, env] = process.argv.slice(3);
    transport = new StdioClientTransport({ command, args: JSON.parse(args),
      env: { ...getDefaultEnvironment(), ...JSON.parse(env) }, stderr: "inherit" });
  } else {
    transport = new StreamableHTTPClientTransport(new URL(url), {
      requestInit: { headers: { Authorization: `Bearer ${token}` } },
    });
  }
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
      if (!stdio) await transport.terminateSession();
      await client.close();
    },
  };
});
