// The AI SDK's MCP client (@ai-sdk/mcp), unmodified, against fcd's MCP
// front (front-driver.mjs says how it is driven): the bearer token in the
// http transport's headers; calls through the tool set a model is given
// (client.tools(), each tool's execute), what the model reads through the
// tool's toModelOutput. The library has no progress callback.
//
//   node front-aisdk.mjs FRONT_MCP_URL BEARER_TOKEN
import { createMCPClient } from "@ai-sdk/mcp";
import { serve, url, token, problemOf } from "./front-driver.mjs";

await serve(async () => {
  const client = await createMCPClient({
    transport: { type: "http", url, headers: { Authorization: `Bearer ${token}` } },
    clientName: "fcd-e2e-ai-sdk",
  });
  let tools;
  return {
    list: async () => {
      tools = await client.tools();
      return Object.entries(tools).map(([name, t]) => ({
        name, description: t.description ?? "",
        // The AI SDK closes the schema it gives the model (additionalProperties: false).
        inputSchema: t.inputSchema?.jsonSchema ?? null,
        readOnly: t.metadata?.annotations?.readOnlyHint ?? null,
      }));
    },
    call: async (name, args) => {
      tools ??= await client.tools();
      const tool = tools[name];
      if (!tool) return { error: `the tool set has no ${name}` };
      const toolCallId = `call-${Date.now()}`;
      const res = await tool.execute(args, { toolCallId, messages: [] });
      // The text is what the model reads of the result.
      const model = await tool.toModelOutput({ toolCallId, input: args, output: res });
      const text = model.type === "content" ? model.value.filter((p) => p.type === "text").map((p) => p.text).join("\n")
        : model.type === "text" ? model.value : JSON.stringify(model.value);
      return { isError: res.isError === true, text, problem: problemOf(res.structuredContent), progress: 0 };
    },
    close: () => client.close(),
  };
});
