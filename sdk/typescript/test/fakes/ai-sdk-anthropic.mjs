// A scripted stand-in for `@ai-sdk/anthropic` (no model here): `anthropic(id)` is the AI SDK's
// own MockLanguageModelV3, which first asks for the toolkit's `run_python` and then answers with
// the result the framework sent back (a loop that drops or mangles tool results fails its test).
import { MockLanguageModelV3 } from "ai/test";

const usage = { inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 }, outputTokens: { total: 1, text: 1, reasoning: 0 } };
const FIB = "a, b = 0, 1\nfor _ in range(20):\n    a, b = b, a + b\na";

export function anthropic(modelId) {
  return new MockLanguageModelV3({
    modelId,
    doGenerate: async ({ prompt }) => {
      const results = prompt.flatMap((m) => (m.role === "tool" ? m.content : []));
      if (!results.length)
        return {
          content: [{ type: "tool-call", toolCallId: "call_1", toolName: "run_python", input: JSON.stringify({ code: FIB, timeout_seconds: null }) }],
          finishReason: { unified: "tool-calls", raw: "tool_use" }, usage, warnings: [],
        };
      const text = results[0].output.value[0].text;
      const value = text.includes("result:\n") ? text.split("result:\n")[1].split("\n")[0] : "?";
      return { content: [{ type: "text", text: `The 20th Fibonacci number is ${value}.` }], finishReason: { unified: "stop", raw: "end_turn" }, usage, warnings: [] };
    },
  });
}
