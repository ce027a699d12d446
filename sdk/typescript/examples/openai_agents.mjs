// An OpenAI Agents SDK agent with sandbox tools (@openai/agents or -core + @pandastack/sdk/tools).
// PANDASTACK_API_KEY must be set. Run from sdk/typescript: node examples/openai_agents.mjs
import { Agent, Runner, Usage } from "@openai/agents-core";
import { Toolkit } from "@pandastack/sdk/tools";
import { agentsModel } from "./scripted_models.mjs"; // a real one: the default OpenAI provider

const kit = new Toolkit({ tools: ["run_command", "run_python"] });
try {
  const agent = new Agent({ name: "calc", instructions: "Compute with the tools.", model: agentsModel(Usage), tools: await kit.openaiAgents() });
  const result = await new Runner({ tracingDisabled: true }).run(agent, "What is the sum of 0..100?");
  console.log(result.finalOutput);
} finally {
  await kit.close();
}
