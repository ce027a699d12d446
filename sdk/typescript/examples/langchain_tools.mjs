// LangChain tools backed by a sandbox (@langchain/core + @pandastack/sdk/tools): a model's tool
// call, as LangChain carries it, becomes a ToolMessage. PANDASTACK_API_KEY must be set.
// Run from sdk/typescript: node examples/langchain_tools.mjs
import { AIMessage } from "@langchain/core/messages";
import { Toolkit } from "@pandastack/sdk/tools";
import { COMMAND } from "./scripted_models.mjs";

const kit = new Toolkit({ tools: ["run_command", "read_file"] });
try {
  const tools = Object.fromEntries((await kit.langchain()).map((t) => [t.name, t]));
  // What a chat model bound to these tools (model.bindTools(Object.values(tools))) answers:
  const reply = new AIMessage({ content: "", tool_calls: [{ id: "call_1", name: "run_command", args: { command: COMMAND, timeout_seconds: null } }] });
  for (const call of reply.tool_calls) {
    const message = await tools[call.name].invoke({ ...call, type: "tool_call" });
    console.log(`${message.tool_call_id}: ${message.content}`);
  }
} finally {
  await kit.close();
}
