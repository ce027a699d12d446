// The agent toolkit (@pandastack/sdk/tools) against a real daemon, driven through the real
// frameworks from npm: the AI SDK's own mock model, LangChain's tool calls, the OpenAI Agents
// SDK's runner with a scripted model. Each model's tool call runs in a sandbox and the framework
// gets the answer back.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { useDaemon } from "./daemon.mjs";
import { Sandbox } from "../dist/index.js";
import { Toolkit, TOOL_NAMES } from "../dist/tools.js";

useDaemon();
const here = dirname(fileURLToPath(import.meta.url));

test("schemas: strict, and the same as the Python SDK's", () => {
  const kit = new Toolkit();
  const anthropic = kit.anthropic();
  assert.deepEqual(anthropic.map((t) => t.name), TOOL_NAMES);
  for (const t of kit.openai()) {
    const p = t.function.parameters;
    assert.equal(t.function.strict, true);
    assert.equal(p.additionalProperties, false);
    assert.deepEqual([...p.required].sort(), Object.keys(p.properties).sort());
  }
  const py = execFileSync("/usr/bin/python3", ["-c",
    "import json; from pandastack.tools import Toolkit; k = Toolkit(); " +
    "print(json.dumps([k.anthropic(), k.openai()]))"],
  { env: { ...process.env, PYTHONPATH: join(here, "../../python") } }).toString();
  assert.deepEqual([anthropic, kit.openai()], JSON.parse(py));
  assert.throws(() => new Toolkit({ tools: ["rm_rf"] }), /unknown tool/);
});

test("a session: answers are text, mistakes are answers", async () => {
  const kit = new Toolkit({ maxOutputChars: 300 });
  try {
    assert.equal(await kit.call("run_command", { command: "echo hi; echo oops >&2; exit 3", timeout_seconds: null }),
      "exit_code=3\nstdout:\nhi\n\nstderr:\noops\n");
    assert.equal(await kit.call("write_file", '{"path": "/tmp/a/n.txt", "content": "42\\n"}'), "wrote 3 bytes to /tmp/a/n.txt");
    assert.equal(await kit.call("read_file", { path: "/tmp/a/n.txt" }), "42\n");
    assert.equal(await kit.call("list_files", { path: "/tmp/a" }), "n.txt (3 bytes)");
    assert.equal(await kit.call("run_python", { code: "x = 6 * 7" }), "status=ok");
    assert.equal(await kit.call("run_python", { code: "print('p'); x", timeout_seconds: 30 }), "status=ok\nresult:\n42\nstdout:\np\n");
    const long = await kit.call("run_command", { command: "seq 1 5000", timeout_seconds: null });
    assert.match(long, /\[\.\.\. \d+ characters omitted \.\.\.\]/);
    assert.equal(long, await kit.call("run_command", { command: "seq 1 5000", timeout_seconds: null }));
    assert.match(await kit.call("nope", {}), /^error=unknown_tool:/);
    for (const bad of [{ command: 1 }, { timeout_seconds: 3 }, { command: "x", shell: "sh" }, { command: "x", timeout_seconds: 0.5 }, "{x", [1]])
      assert.match(await kit.call("run_command", bad), /^error=invalid_arguments:/, JSON.stringify(bad));
    assert.match(await kit.call("read_file", { path: "/nope" }), /^error=file_not_found/);
  } finally {
    await kit.close();
  }
  assert.deepEqual(await Sandbox.list({ state: "running", metadata: { "pandastack.toolkit": "1" } }), []);
});

test("the AI SDK: a mock model's tool call runs in the sandbox", async () => {
  const { generateText, stepCountIs } = await import("ai");
  const { MockLanguageModelV3 } = await import("ai/test");
  const usage = { inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 }, outputTokens: { total: 1, text: 1, reasoning: 0 } };
  let seen;
  const model = new MockLanguageModelV3({
    doGenerate: async ({ prompt, tools }) => {
      const results = prompt.flatMap((m) => (m.role === "tool" ? m.content : []));
      if (!results.length) {
        assert.deepEqual(tools.map((t) => t.name), TOOL_NAMES);
        return {
          content: [{ type: "tool-call", toolCallId: "call_1", toolName: "run_command", input: JSON.stringify({ command: "echo $((6*7))", timeout_seconds: null }) }],
          finishReason: { unified: "tool-calls", raw: "tool_calls" }, usage, warnings: [],
        };
      }
      seen = results[0].output;
      return { content: [{ type: "text", text: "done" }], finishReason: { unified: "stop", raw: "stop" }, usage, warnings: [] };
    },
  });
  const kit = new Toolkit();
  try {
    const r = await generateText({ model, tools: await kit.aiSdk(), stopWhen: stepCountIs(3), prompt: "What is 6*7?" });
    assert.equal(r.text, "done");
    assert.equal(r.steps[0].toolResults[0].output.text, "exit_code=0\nstdout:\n42\n\nstderr:\n");
    assert.deepEqual(seen, { type: "content", value: [{ type: "text", text: "exit_code=0\nstdout:\n42\n\nstderr:\n" }] });
  } finally {
    await kit.close();
  }
});

test("LangChain: a tool call gives a ToolMessage; bad input is refused by its validator", async () => {
  const kit = new Toolkit({ tools: ["run_command"] });
  try {
    const [cmd] = await kit.langchain();
    assert.equal(cmd.name, "run_command");
    const msg = await cmd.invoke({ name: "run_command", args: { command: "echo hi", timeout_seconds: null }, id: "call_7", type: "tool_call" });
    assert.equal(msg.tool_call_id, "call_7");
    assert.equal(msg.content, "exit_code=0\nstdout:\nhi\n\nstderr:\n");
    await assert.rejects(cmd.invoke({ command: 5, timeout_seconds: null }));
  } finally {
    await kit.close();
  }
});

test("the OpenAI Agents SDK: a scripted model's function call runs in the sandbox", async () => {
  const { Agent, Runner, Usage } = await import("@openai/agents-core");
  const model = {
    turns: 0,
    async getResponse(request) {
      this.turns++;
      const out = request.input.find?.((i) => i.type === "function_call_result");
      if (!out) {
        assert.deepEqual(request.tools.map((t) => t.name), TOOL_NAMES);
        assert.ok(request.tools.every((t) => t.strict));
        return { usage: new Usage(), responseId: "r1", output: [{ type: "function_call", id: "fc_1", callId: "call_1", name: "run_command", status: "completed", arguments: JSON.stringify({ command: "echo $((2+3))", timeout_seconds: null }) }] };
      }
      const text = typeof out.output === "string" ? out.output : out.output.text;
      return { usage: new Usage(), responseId: "r2", output: [{ type: "message", id: "m1", role: "assistant", status: "completed", content: [{ type: "output_text", text: `tool said: ${text}` }] }] };
    },
    async *getStreamedResponse() { throw new Error("not used"); },
  };
  const kit = new Toolkit();
  try {
    const agent = new Agent({ name: "calc", instructions: "Use the tools.", model, tools: await kit.openaiAgents() });
    const result = await new Runner({ tracingDisabled: true }).run(agent, "What is 2+3?");
    assert.equal(result.finalOutput, "tool said: exit_code=0\nstdout:\n5\n\nstderr:\n");
    assert.equal(model.turns, 2);
  } finally {
    await kit.close();
  }
});

test("the README's AI SDK agent runs as written (a scripted @ai-sdk/anthropic)", async () => {
  const { readFileSync } = await import("node:fs");
  const { spawnSync } = await import("node:child_process");
  const doc = readFileSync(join(here, "../../../README.md"), "utf8");
  const block = doc.split("<!-- ai-sdk-agent -->\n")[1].split("<!-- /ai-sdk-agent -->")[0].split("```js\n")[1].split("```")[0];
  const code = block.replace('"@ai-sdk/anthropic"', JSON.stringify(new URL("./fakes/ai-sdk-anthropic.mjs", import.meta.url).href));
  assert.notEqual(code, block);
  // From the package's folder: `ai` from its node_modules, `@pandastack/sdk/tools` by its name.
  const r = spawnSync(process.execPath, ["--input-type=module", "-e", code], { cwd: join(here, ".."), encoding: "utf8", timeout: 600_000 });
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.stdout, "The 20th Fibonacci number is 6765.\n");
});

test("npm pack: the package installs and imports in a fresh folder (offline: no dependencies)", async () => {
  const { mkdtempSync, writeFileSync, readdirSync, rmSync } = await import("node:fs");
  const { execFileSync: run } = await import("node:child_process");
  const dir = mkdtempSync("/var/tmp/pst-npm-");
  try {
    const npm = (args, cwd) => run("npm", [...args, "--no-audit", "--no-fund", "--loglevel=error"], { cwd, encoding: "utf8" });
    npm(["pack", "--pack-destination", dir], join(here, ".."));
    const tgz = readdirSync(dir).find((f) => f.endsWith(".tgz"));
    assert.match(tgz, /^pandastack-sdk-\d+\.\d+\.\d+\.tgz$/);
    const app = join(dir, "app");
    run("mkdir", [app]);
    writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", private: true, type: "module" }));
    npm(["install", "--offline", join(dir, tgz)], app);
    const out = run(process.execPath, ["--input-type=module", "-e",
      "const sdk = await import('@pandastack/sdk'); const tools = await import('@pandastack/sdk/tools');" +
      "const kit = new tools.Toolkit(); console.log(typeof sdk.Sandbox.create, kit.anthropic().length, tools.TOOL_NAMES.join(','));"],
    { cwd: app, encoding: "utf8" });
    assert.equal(out, "function 5 run_python,run_command,read_file,write_file,list_files\n");
    const files = run("tar", ["tzf", join(dir, tgz)], { encoding: "utf8" }).split("\n").filter(Boolean).sort();
    const modules = ["error_codes", "errors", "http", "index", "resources", "sandbox", "tools", "types"];
    assert.deepEqual(files, ["package/CHANGELOG.md", "package/README.md",
      ...modules.flatMap((m) => [`package/dist/${m}.d.ts`, `package/dist/${m}.js`]), "package/package.json"]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("the framework examples run against the daemon (sdk/typescript/examples)", async () => {
  const { spawnSync } = await import("node:child_process");
  const expected = "exit_code=0\nstdout:\n5050\n\nstderr:\n";
  for (const [file, out] of [
    ["ai_sdk_agent.mjs", `The tool said:\n${expected}\n`],
    ["langchain_tools.mjs", `call_1: ${expected}\n`],
    ["openai_agents.mjs", `The tool said:\n${expected}\n`],
  ]) {
    const r = spawnSync(process.execPath, [join("examples", file)], { cwd: join(here, ".."), encoding: "utf8", timeout: 300_000 });
    assert.equal(r.status, 0, `${file}: ${r.stderr}`);
    assert.equal(r.stdout, out, file);
  }
});
