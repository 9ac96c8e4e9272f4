// LangChain's MCP adapters (@langchain/mcp-adapters), unmodified, against
// fcd's MCP front (front-driver.mjs says how it is driven): a
// MultiServerMCPClient with the bearer token in the server's headers and
// an onProgress callback; calls run as a LangGraph agent runs them, a
// ToolNode turning the model's tool call into the ToolMessage the model
// reads (status "error" for a tool error).
//
//   node front-langchain.mjs FRONT_MCP_URL BEARER_TOKEN
import { MultiServerMCPClient, loadMcpTools } from "@langchain/mcp-adapters";
import { ToolNode } from "@langchain/langgraph/prebuilt";
import { AIMessage } from "@langchain/core/messages";
import { serve, url, token, problemOf } from "./front-driver.mjs";

let progress = 0;
await serve(async () => {
  const onProgress = () => { progress++; };
  const client = new MultiServerMCPClient({
    mcpServers: { fcd: { transport: "http", url, headers: { Authorization: `Bearer ${token}` }, automaticSSEFallback: false } },
    onProgress,
  });
  // The client loads the tools once, when it connects (getTools() returns
  // them cached); listing again is loadMcpTools on the same session.
  let tools = await client.getTools();
  let listed = 0;
  let seq = 0;
  return {
    list: async () => {
      if (listed++ > 0) {
        tools = await loadMcpTools("fcd", await client.getClient("fcd"), { onProgress });
      }
      return tools.map((t) => ({
        name: t.name, description: t.description ?? "", inputSchema: t.schema ?? null,
        readOnly: t.metadata?.annotations?.readOnlyHint ?? null,
      }));
    },
    call: async (name, args) => {
      const before = progress;
      const id = `call-${++seq}`;
      const node = new ToolNode(tools, { handleToolErrors: true });
      const out = await node.invoke({ messages: [new AIMessage({ content: "", tool_calls: [{ id, name, args, type: "tool_call" }] })] });
      const msg = out.messages[0];
      const text = typeof msg.content === "string" ? msg.content
        : msg.content.filter((c) => c.type === "text").map((c) => c.text).join("\n");
      const structured = (msg.artifact ?? []).find?.((a) => a.type === "mcp_structured_content")?.data;
      return { isError: msg.status === "error", text, problem: problemOf(structured), progress: progress - before };
    },
    close: () => client.close(),
  };
});
