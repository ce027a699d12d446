// An AI SDK agent with sandbox tools (`ai` + @pandastack/sdk/tools). PANDASTACK_API_KEY must be set.
// Run from sdk/typescript (its node_modules has `ai`): node examples/ai_sdk_agent.mjs
import { generateText, stepCountIs } from "ai";
import { Toolkit } from "@pandastack/sdk/tools";
import { aiSdkModel } from "./scripted_models.mjs"; // a real one: anthropic("claude-...")

const kit = new Toolkit();
try {
  const { text } = await generateText({
    model: aiSdkModel(), tools: await kit.aiSdk(), stopWhen: stepCountIs(5),
    prompt: "What is the sum of 0..100? Compute it.",
  });
  console.log(text);
} finally {
  await kit.close();
}
