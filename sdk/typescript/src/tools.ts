// Sandbox tools for LLM agents: one object that owns a sandbox and hands a model its tools.
//
//   import { Toolkit } from "@pandastack/sdk/tools";
//   const kit = new Toolkit();                       // a sandbox is made at the first call
//   const tools = kit.anthropic();                   // or kit.openai(), await kit.aiSdk(), ...
//   const text = await kit.call(name, args);         // a string for the model, never a throw
//   await kit.close();
//
// The same tools, schemas and answers as the Python SDK's pandastack.tools: each answer is
// deterministic text, the exit status (or the error) first, each stream cut to maxOutputChars
// (head and tail kept, the cut counted). Framework adapters import their framework lazily.

import { PandaStackError, Sandbox } from "./index.js";

/** Every tool a toolkit can offer, in the order offered. */
export const TOOL_NAMES = ["run_python", "run_command", "read_file", "write_file", "list_files"];

const STR = { type: "string" };
const OPT_INT = { type: ["integer", "null"] };

// Strict schemas: every property required (OpenAI's strict mode), optional ones nullable.
const SPECS = {
  run_python: [
    "Run Python code in a persistent interpreter inside an isolated Linux sandbox. Variables, " +
      "imports and the working folder persist between calls. The value of the last expression " +
      "is returned, with stdout, stderr and any exception's traceback; matplotlib figures come " +
      "back as images. Use it for calculations, data analysis and plots.",
    {
      code: { ...STR, description: "Python source to run" },
      timeout_seconds: { ...OPT_INT, description: "Stop the run after this many seconds (null: the toolkit's default)" },
    },
  ],
  run_command: [
    "Run a shell command (bash -c) in an isolated Linux sandbox (Debian, as root, no " +
      "network unless configured). Returns the exit code first, then stdout and stderr, " +
      "long output cut in the middle. Files persist between calls.",
    {
      command: { ...STR, description: "The shell command line" },
      timeout_seconds: { ...OPT_INT, description: "Kill it after this many seconds (null: the toolkit's default)" },
    },
  ],
  read_file: [
    "Read a text file from the sandbox. Returns its contents (long files cut in the middle).",
    { path: { ...STR, description: "Absolute path of the file" } },
  ],
  write_file: [
    "Write a text file in the sandbox (parent folders are made; an existing file is replaced).",
    { path: { ...STR, description: "Absolute path of the file" }, content: { ...STR, description: "The whole new contents" } },
  ],
  list_files: [
    "List a folder in the sandbox: one entry per line, folders ending in '/', with sizes.",
    { path: { ...STR, description: "Absolute path of the folder" } },
  ],
};

function schema(props) {
  return { type: "object", properties: structuredClone(props), required: Object.keys(props), additionalProperties: false };
}

/** `text` within `limit` characters: its head and tail, and how much was left out. */
export function clip(text, limit) {
  if (text.length <= limit) return text;
  const head = Math.floor((limit * 2) / 3);
  const tail = limit - head;
  return `${text.slice(0, head)}\n[... ${text.length - limit} characters omitted ...]\n${tail ? text.slice(-tail) : ""}`;
}

// The arguments as an object, or why they do not fit the tool's schema (for the model).
function checkArgs(name, args) {
  if (typeof args === "string") {
    try {
      args = JSON.parse(args || "{}");
    } catch (e) {
      return `arguments are not JSON: ${e.message}`;
    }
  }
  if (args === null || args === undefined) args = {};
  if (typeof args !== "object" || Array.isArray(args)) return "arguments must be a JSON object";
  const props = SPECS[name][1];
  const extra = Object.keys(args).filter((k) => !(k in props)).sort();
  if (extra.length) return `unknown argument(s): ${extra.join(", ")}`;
  const out = {};
  for (const [key, spec] of Object.entries(props)) {
    const v = args[key] ?? null; // a nullable argument left out is null
    if (spec.type === "string") {
      if (typeof v !== "string") return `argument '${key}' must be a string`;
    } else if (v !== null && !(Number.isInteger(v) && v > 0)) {
      return `argument '${key}' must be a positive integer or null`;
    }
    out[key] = v;
  }
  return out;
}

function execText(r, limit) {
  const head = `exit_code=${r.exitCode}` + (r.timedOut ? " (timed out)" : "");
  return `${head}\nstdout:\n${clip(r.stdout, limit)}\nstderr:\n${clip(r.stderr, limit)}`;
}

function codeResult(e, limit) {
  const lines = [e.timedOut ? "status=timed_out" : e.error ? `status=error ${e.error.name}: ${e.error.value}` : "status=ok"];
  const images = e.results.filter((r) => r.png).map((r) => r.png);
  if (e.text !== undefined && e.text !== null) lines.push("result:\n" + clip(e.text, limit));
  if (e.stdout) lines.push("stdout:\n" + clip(e.stdout, limit));
  if (e.stderr) lines.push("stderr:\n" + clip(e.stderr, limit));
  if (e.error?.traceback) lines.push("traceback:\n" + clip(e.error.traceback, limit));
  if (images.length) lines.push(`images: ${images.length} (PNG)`);
  return { text: lines.join("\n"), images, isError: !!e.error || e.timedOut };
}

function listText(entries, limit) {
  const rows = [...entries].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  const text = rows.map((f) => (f.isDir ? `${f.name}/` : `${f.name} (${f.size} bytes)`)).join("\n");
  return clip(text || "(empty)", limit);
}

function readText(buf, limit) {
  try {
    return clip(new TextDecoder("utf-8", { fatal: true }).decode(buf), limit);
  } catch {
    return `(binary file: ${buf.length} bytes, not shown)`;
  }
}

/**
 * Sandbox tools for a model. Options: template ("base"), tools (all of TOOL_NAMES), perCall (a
 * sandbox per call, killed after it), ttlSeconds (3600), timeoutSeconds (60, per command),
 * maxOutputChars (4000), network, allow, volumes, metadata, apiKey, baseUrl.
 */
export class Toolkit {
  #sbx = null;
  #creating = null;

  constructor(opts = {}) {
    const tools = opts.tools ?? TOOL_NAMES;
    const unknown = tools.filter((t) => !(t in SPECS));
    if (unknown.length) throw new Error(`unknown tool(s) ${unknown.join(", ")}; there are ${TOOL_NAMES.join(", ")}`);
    if ((opts.maxOutputChars ?? 4000) < 100) throw new Error("maxOutputChars must be at least 100");
    this.tools = TOOL_NAMES.filter((t) => tools.includes(t));
    this.perCall = !!opts.perCall;
    this.timeoutSeconds = opts.timeoutSeconds ?? 60;
    this.maxOutputChars = opts.maxOutputChars ?? 4000;
    this.createOptions = {
      template: opts.template ?? "base",
      ttlSeconds: opts.ttlSeconds === undefined ? 3600 : opts.ttlSeconds ?? undefined,
      network: opts.network, allow: opts.allow, volumes: opts.volumes,
      metadata: opts.metadata ?? { "pandastack.toolkit": "1" },
      apiKey: opts.apiKey, baseUrl: opts.baseUrl,
    };
  }

  /** The tools for Anthropic's Messages API: `[{name, description, input_schema}]`. */
  anthropic() {
    return this.tools.map((n) => ({ name: n, description: SPECS[n][0], input_schema: schema(SPECS[n][1]) }));
  }

  /** The tools for OpenAI's Chat Completions API (strict function schemas). */
  openai() {
    return this.tools.map((n) => ({
      type: "function",
      function: { name: n, description: SPECS[n][0], parameters: schema(SPECS[n][1]), strict: true },
    }));
  }

  /** The session's sandbox (made on first use; concurrent calls share one). */
  async sandbox() {
    if (this.#sbx) return this.#sbx;
    this.#creating ??= Sandbox.create(this.createOptions).then(
      (s) => (this.#sbx = s),
      (e) => { this.#creating = null; throw e; });
    return this.#creating;
  }

  /** Runs tool `name` with `args` (an object or its JSON text): `{text, images, isError}`. */
  async run(name, args) {
    if (!this.tools.includes(name))
      return { text: `error=unknown_tool: no tool '${name}' (there are ${this.tools.join(", ")})`, images: [], isError: true };
    const a = checkArgs(name, args);
    if (typeof a === "string") return { text: `error=invalid_arguments: ${a}`, images: [], isError: true };
    let own = null;
    try {
      own = this.perCall ? await Sandbox.create(this.createOptions) : null;
      return await this.#run(own ?? (await this.sandbox()), name, a);
    } catch (e) {
      if (e instanceof PandaStackError) return { text: `error=${e.code}: ${e.message}`, images: [], isError: true };
      throw e;
    } finally {
      if (own) await own.kill().catch(() => {});
    }
  }

  async #run(sbx, name, a) {
    const limit = this.maxOutputChars;
    const timeoutSeconds = a.timeout_seconds ?? this.timeoutSeconds;
    switch (name) {
      case "run_python":
        return codeResult(await sbx.runCode(a.code, { timeoutSeconds }), limit);
      case "run_command": {
        const r = await sbx.exec(["bash", "-c", a.command], { timeoutSeconds });
        return { text: execText(r, limit), images: [], isError: r.exitCode !== 0 };
      }
      case "read_file":
        return { text: readText(await sbx.files.read(a.path), limit), images: [], isError: false };
      case "write_file":
        await sbx.files.write(a.path, a.content);
        return { text: `wrote ${Buffer.byteLength(a.content)} bytes to ${a.path}`, images: [], isError: false };
      default:
        return { text: listText(await sbx.files.list(a.path), limit), images: [], isError: false };
    }
  }

  /** Runs a tool; its text for the model (never throws for the command's own failure). */
  async call(name, args) {
    return (await this.run(name, args)).text;
  }

  /** Runs every `tool_use` block of an assistant message's content: the `tool_result` blocks
   * for the next user message, images as Anthropic image blocks. */
  async callAnthropic(content) {
    const out = [];
    for (const b of content ?? []) {
      if (b.type !== "tool_use") continue;
      const r = await this.run(b.name, b.input);
      const blocks = [{ type: "text", text: r.text }];
      for (const png of r.images)
        blocks.push({ type: "image", source: { type: "base64", media_type: "image/png", data: Buffer.from(png).toString("base64") } });
      out.push({ type: "tool_result", tool_use_id: b.id, content: blocks, ...(r.isError ? { is_error: true } : {}) });
    }
    return out;
  }

  /** Runs an assistant message's `tool_calls` (Chat Completions): the `tool` messages. */
  async callOpenai(toolCalls) {
    const out = [];
    for (const tc of toolCalls ?? [])
      out.push({ role: "tool", tool_call_id: tc.id, content: await this.call(tc.function.name, tc.function.arguments) });
    return out;
  }

  /** The tools for the Vercel AI SDK (`ai`): `{name: tool(...)}` for generateText/streamText;
   * images reach the model as image content. */
  async aiSdk() {
    const { tool, jsonSchema } = await importFramework("ai", "aiSdk()");
    const out = {};
    for (const n of this.tools)
      out[n] = tool({
        description: SPECS[n][0],
        inputSchema: jsonSchema(schema(SPECS[n][1])),
        execute: async (input) => {
          const r = await this.run(n, input);
          return { text: r.text, images: r.images.map((p) => Buffer.from(p).toString("base64")) };
        },
        toModelOutput: ({ output }) => ({
          type: "content",
          value: [{ type: "text", text: output.text },
            ...output.images.map((data) => ({ type: "image-data", data, mediaType: "image/png" }))],
        }),
      });
    return out;
  }

  /** The tools as LangChain tools (`@langchain/core`). */
  async langchain() {
    const { tool } = await importFramework("@langchain/core/tools", "langchain()");
    return this.tools.map((n) =>
      tool(async (input) => this.call(n, input), { name: n, description: SPECS[n][0], schema: schema(SPECS[n][1]) }));
  }

  /** The tools for the OpenAI Agents SDK (`@openai/agents`, or `@openai/agents-core`). */
  async openaiAgents() {
    let mod;
    try {
      mod = await import("@openai/agents");
    } catch {
      mod = await importFramework("@openai/agents-core", "openaiAgents()");
    }
    return this.tools.map((n) =>
      mod.tool({
        name: n, description: SPECS[n][0], parameters: schema(SPECS[n][1]), strict: true,
        execute: async (input) => this.call(n, input),
      }));
  }

  /** Kills the session's sandbox (if one was made). */
  async close() {
    const sbx = this.#sbx ?? (this.#creating ? await this.#creating.catch(() => null) : null);
    this.#sbx = null;
    this.#creating = null;
    if (sbx) await sbx.kill().catch(() => {});
  }

  async [Symbol.asyncDispose]() {
    await this.close();
  }
}

async function importFramework(name, method) {
  try {
    return await import(name);
  } catch (e) {
    throw new Error(`Toolkit.${method} needs the '${name}' package installed (${e.message})`);
  }
}
