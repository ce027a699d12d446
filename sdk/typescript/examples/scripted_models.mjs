// Scripted stand-ins for a model, in each framework's own shapes, for the examples beside this
// file (no model is reachable here): each first asks for `run_command` with `COMMAND`, then
// answers with the tool's result as it got it back. Replace them with a real model.
import { MockLanguageModelV3 } from "ai/test";

export const COMMAND = "python3 -c 'print(sum(range(101)))'";
const usage = { inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 }, outputTokens: { total: 1, text: 1, reasoning: 0 } };

/** The AI SDK's own mock model: it calls `tool` with `input`, then answers `answer(text)` with
 * the text the tool's result reached it as. */
export function aiSdkModel({ tool = "run_command", input = { command: COMMAND, timeout_seconds: null },
  answer = (text) => `The tool said:\n${text}`, modelId } = {}) {
  return new MockLanguageModelV3({
    modelId,
    doGenerate: async ({ prompt }) => {
      const results = prompt.flatMap((m) => (m.role === "tool" ? m.content : []));
      if (!results.length)
        return {
          content: [{ type: "tool-call", toolCallId: "call_1", toolName: tool, input: JSON.stringify(input) }],
          finishReason: { unified: "tool-calls", raw: "tool_calls" }, usage, warnings: [],
        };
      return { content: [{ type: "text", text: answer(results[0].output.value[0].text) }], finishReason: { unified: "stop", raw: "stop" }, usage, warnings: [] };
    },
  });
}

/** A model for the OpenAI Agents SDK (its Model interface: getResponse). */
export function agentsModel(Usage) {
  return {
    async getResponse(request) {
      const out = request.input.find?.((i) => i.type === "function_call_result");
      if (!out)
        return { usage: new Usage(), responseId: "r1", output: [{ type: "function_call", id: "fc_1", callId: "call_1", name: "run_command", status: "completed", arguments: JSON.stringify({ command: COMMAND, timeout_seconds: null }) }] };
      const text = typeof out.output === "string" ? out.output : out.output.text;
      return { usage: new Usage(), responseId: "r2", output: [{ type: "message", id: "m1", role: "assistant", status: "completed", content: [{ type: "output_text", text: `The tool said:\n${text}` }] }] };
    },
    async *getStreamedResponse() { throw new Error("not used"); },
  };
}
