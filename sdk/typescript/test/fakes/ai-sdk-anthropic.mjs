// A scripted stand-in for `@ai-sdk/anthropic` (no model here): `anthropic(id)` is the AI SDK's own
// mock model (examples/scripted_models.mjs), which first asks for the toolkit's `run_python` and
// then answers with the result the framework sent back (a loop that drops or mangles tool
// results fails its test).
import { aiSdkModel } from "../../examples/scripted_models.mjs";

const FIB = "a, b = 0, 1\nfor _ in range(20):\n    a, b = b, a + b\na";

export function anthropic(modelId) {
  return aiSdkModel({
    modelId, tool: "run_python", input: { code: FIB, timeout_seconds: null },
    answer: (text) => `The 20th Fibonacci number is ${text.includes("result:\n") ? text.split("result:\n")[1].split("\n")[0] : "?"}.`,
  });
}
