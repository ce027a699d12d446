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
import type { CreateOptions, Execution, ExecResult, FileInfo } from "./index.js";

export type ToolName = "run_python" | "run_command" | "read_file" | "write_file" | "list_files";

export interface JsonSchemaObject {
  type: "object";
  properties: Record<string, { type: string | string[]; description: string }>;
  required: string[];
  additionalProperties: false;
}

export interface ToolkitOptions extends Pick<CreateOptions, "network" | "allow" | "volumes" | "metadata" | "apiKey" | "baseUrl"> {
  /** The sandbox's template ("base"; "code-interpreter" for charts). */
  template?: string;
  /** The tools offered (default: all of TOOL_NAMES). */
  tools?: readonly ToolName[];
  /** A sandbox per call, killed after it (default: one per toolkit, made at the first call). */
  perCall?: boolean;
  /** The sandbox's TTL (default 3600; null: none). */
  ttlSeconds?: number | null;
  /** Each command's and run's timeout unless the model gives one (default 60). */
  timeoutSeconds?: number;
  /** Each stream's cut (head and tail kept; default 4000, at least 100). */
  maxOutputChars?: number;
}

/** What a tool call produced: `text` for the model, the PNG images it made. */
export interface ToolRun {
  text: string;
  images: Uint8Array[];
  isError: boolean;
}

export interface AnthropicTool { name: ToolName; description: string; input_schema: JsonSchemaObject }
export interface OpenAITool {
  type: "function";
  function: { name: ToolName; description: string; parameters: JsonSchemaObject; strict: true };
}
export type AnthropicContent =
  | { type: "text"; text: string }
  | { type: "image"; source: { type: "base64"; media_type: "image/png"; data: string } };
export interface AnthropicToolResult {
  type: "tool_result";
  tool_use_id: string;
  content: AnthropicContent[];
  is_error?: true;
}
type Args = Record<string, string | number | null>;

/** Every tool a toolkit can offer, in the order offered. */
export const TOOL_NAMES: readonly ToolName[] = ["run_python", "run_command", "read_file", "write_file", "list_files"];

const STR = { type: "string" as string | string[] };
const OPT_INT = { type: ["integer", "null"] as string | string[] };

// Strict schemas: every property required (OpenAI's strict mode), optional ones nullable.
const SPECS: Record<ToolName, [string, JsonSchemaObject["properties"]]> = {
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

function schema(props: JsonSchemaObject["properties"]): JsonSchemaObject {
  return { type: "object", properties: structuredClone(props), required: Object.keys(props), additionalProperties: false };
}

/** `text` within `limit` characters: its head and tail, and how much was left out. */
export function clip(text: string, limit: number): string {
  if (text.length <= limit) return text;
  const head = Math.floor((limit * 2) / 3);
  const tail = limit - head;
  return `${text.slice(0, head)}\n[... ${text.length - limit} characters omitted ...]\n${tail ? text.slice(-tail) : ""}`;
}

// The arguments as an object, or why they do not fit the tool's schema (for the model).
function checkArgs(name: ToolName, args: unknown): Args | string {
  if (typeof args === "string") {
    try {
      args = JSON.parse(args || "{}");
    } catch (e) {
      return `arguments are not JSON: ${(e as Error).message}`;
    }
  }
  if (args === null || args === undefined) args = {};
  if (typeof args !== "object" || Array.isArray(args)) return "arguments must be a JSON object";
  const props = SPECS[name][1];
  const given = args as Record<string, unknown>;
  const extra = Object.keys(given).filter((k) => !(k in props)).sort();
  if (extra.length) return `unknown argument(s): ${extra.join(", ")}`;
  const out: Args = {};
  for (const [key, spec] of Object.entries(props)) {
    const v = given[key] ?? null; // a nullable argument left out is null
    if (spec.type === "string") {
      if (typeof v !== "string") return `argument '${key}' must be a string`;
    } else if (v !== null && !(typeof v === "number" && Number.isInteger(v) && v > 0)) {
      return `argument '${key}' must be a positive integer or null`;
    }
    out[key] = v as string | number | null;
  }
  return out;
}

function execText(r: ExecResult, limit: number): string {
  const head = `exit_code=${r.exitCode}` + (r.timedOut ? " (timed out)" : "");
  return `${head}\nstdout:\n${clip(r.stdout, limit)}\nstderr:\n${clip(r.stderr, limit)}`;
}

function codeResult(e: Execution, limit: number): ToolRun {
  const lines = [e.timedOut ? "status=timed_out" : e.error ? `status=error ${e.error.name}: ${e.error.value}` : "status=ok"];
  const images: Uint8Array[] = e.results.flatMap((r) => (r.png ? [r.png] : []));
  if (e.text !== undefined && e.text !== null) lines.push("result:\n" + clip(e.text, limit));
  if (e.stdout) lines.push("stdout:\n" + clip(e.stdout, limit));
  if (e.stderr) lines.push("stderr:\n" + clip(e.stderr, limit));
  if (e.error?.traceback) lines.push("traceback:\n" + clip(e.error.traceback, limit));
  if (images.length) lines.push(`images: ${images.length} (PNG)`);
  return { text: lines.join("\n"), images, isError: !!e.error || e.timedOut };
}

function listText(entries: FileInfo[], limit: number): string {
  const rows = [...entries].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  const text = rows.map((f) => (f.isDir ? `${f.name}/` : `${f.name} (${f.size} bytes)`)).join("\n");
  return clip(text || "(empty)", limit);
}

function readText(buf: Uint8Array, limit: number): string {
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
  #sbx: Sandbox | null = null;
  #creating: Promise<Sandbox> | null = null;
  readonly tools: ToolName[];
  readonly perCall: boolean;
  readonly timeoutSeconds: number;
  readonly maxOutputChars: number;
  readonly createOptions: CreateOptions;

  constructor(opts: ToolkitOptions = {}) {
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
      ttlSeconds: opts.ttlSeconds === undefined ? 3600 : (opts.ttlSeconds ?? undefined),
      network: opts.network, allow: opts.allow, volumes: opts.volumes,
      metadata: opts.metadata ?? { "pandastack.toolkit": "1" },
      apiKey: opts.apiKey, baseUrl: opts.baseUrl,
    };
  }

  /** The tools for Anthropic's Messages API: `[{name, description, input_schema}]`. */
  anthropic(): AnthropicTool[] {
    return this.tools.map((n) => ({ name: n, description: SPECS[n][0], input_schema: schema(SPECS[n][1]) }));
  }

  /** The tools for OpenAI's Chat Completions API (strict function schemas). */
  openai(): OpenAITool[] {
    return this.tools.map((n) => ({
      type: "function" as const,
      function: { name: n, description: SPECS[n][0], parameters: schema(SPECS[n][1]), strict: true as const },
    }));
  }

  /** The session's sandbox (made on first use; concurrent calls share one). */
  async sandbox(): Promise<Sandbox> {
    if (this.#sbx) return this.#sbx;
    this.#creating ??= Sandbox.create(this.createOptions).then(
      (s) => (this.#sbx = s),
      (e: unknown) => { this.#creating = null; throw e; });
    return this.#creating;
  }

  /** Runs tool `name` with `args` (an object or its JSON text): `{text, images, isError}`. */
  async run(name: string, args?: unknown): Promise<ToolRun> {
    if (!this.tools.includes(name as ToolName))
      return { text: `error=unknown_tool: no tool '${name}' (there are ${this.tools.join(", ")})`, images: [], isError: true };
    const tool = name as ToolName;
    const a = checkArgs(tool, args);
    if (typeof a === "string") return { text: `error=invalid_arguments: ${a}`, images: [], isError: true };
    let own: Sandbox | null = null;
    try {
      own = this.perCall ? await Sandbox.create(this.createOptions) : null;
      return await this.#run(own ?? (await this.sandbox()), tool, a);
    } catch (e) {
      if (e instanceof PandaStackError) return { text: `error=${e.code}: ${e.message}`, images: [], isError: true };
      throw e;
    } finally {
      if (own) await own.kill().catch(() => {});
    }
  }

  async #run(sbx: Sandbox, name: ToolName, a: Args): Promise<ToolRun> {
    const limit = this.maxOutputChars;
    const timeoutSeconds = (a.timeout_seconds as number | null) ?? this.timeoutSeconds;
    switch (name) {
      case "run_python":
        return codeResult(await sbx.runCode(a.code as string, { timeoutSeconds }), limit);
      case "run_command": {
        const r = await sbx.exec(["bash", "-c", a.command as string], { timeoutSeconds });
        return { text: execText(r, limit), images: [], isError: r.exitCode !== 0 };
      }
      case "read_file":
        return { text: readText(await sbx.files.read(a.path as string), limit), images: [], isError: false };
      case "write_file":
        await sbx.files.write(a.path as string, a.content as string);
        return { text: `wrote ${Buffer.byteLength(a.content as string)} bytes to ${a.path}`, images: [], isError: false };
      default:
        return { text: listText(await sbx.files.list(a.path as string), limit), images: [], isError: false };
    }
  }

  /** Runs a tool; its text for the model (never throws for the command's own failure). */
  async call(name: string, args?: unknown): Promise<string> {
    return (await this.run(name, args)).text;
  }

  /** Runs every `tool_use` block of an assistant message's content: the `tool_result` blocks
   * for the next user message, images as Anthropic image blocks. */
  async callAnthropic(content: ReadonlyArray<{ type: string; id?: string; name?: string; input?: unknown }>): Promise<AnthropicToolResult[]> {
    const out: AnthropicToolResult[] = [];
    for (const b of content ?? []) {
      if (b.type !== "tool_use") continue;
      const r = await this.run(b.name ?? "", b.input);
      const blocks: AnthropicContent[] = [{ type: "text", text: r.text }];
      for (const png of r.images)
        blocks.push({ type: "image", source: { type: "base64", media_type: "image/png", data: Buffer.from(png).toString("base64") } });
      out.push({ type: "tool_result", tool_use_id: b.id ?? "", content: blocks, ...(r.isError ? { is_error: true as const } : {}) });
    }
    return out;
  }

  /** Runs an assistant message's `tool_calls` (Chat Completions): the `tool` messages. */
  async callOpenai(toolCalls: ReadonlyArray<{ id: string; function: { name: string; arguments: string } }>): Promise<Array<{ role: "tool"; tool_call_id: string; content: string }>> {
    const out: Array<{ role: "tool"; tool_call_id: string; content: string }> = [];
    for (const tc of toolCalls ?? [])
      out.push({ role: "tool", tool_call_id: tc.id, content: await this.call(tc.function.name, tc.function.arguments) });
    return out;
  }

  /** The tools for the Vercel AI SDK (`ai`): `{name: tool(...)}` for generateText/streamText;
   * images reach the model as image content. */
  // The frameworks' own tool objects (typed loosely: no framework is a dependency of the SDK).
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  async aiSdk(): Promise<Record<string, any>> {
    const { tool, jsonSchema } = await importFramework("ai", "aiSdk()");
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    const out: Record<string, any> = {};
    for (const n of this.tools)
      out[n] = tool({
        description: SPECS[n][0],
        inputSchema: jsonSchema(schema(SPECS[n][1])),
        execute: async (input: unknown) => {
          const r = await this.run(n, input);
          return { text: r.text, images: r.images.map((p) => Buffer.from(p).toString("base64")) };
        },
        toModelOutput: ({ output }: { output: { text: string; images: string[] } }) => ({
          type: "content",
          value: [{ type: "text", text: output.text },
            ...output.images.map((data: string) => ({ type: "image-data", data, mediaType: "image/png" }))],
        }),
      });
    return out;
  }

  /** The tools as LangChain tools (`@langchain/core`). */
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  async langchain(): Promise<any[]> {
    const { tool } = await importFramework("@langchain/core/tools", "langchain()");
    return this.tools.map((n) =>
      tool(async (input: unknown) => this.call(n, input), { name: n, description: SPECS[n][0], schema: schema(SPECS[n][1]) }));
  }

  /** The tools for the OpenAI Agents SDK (`@openai/agents`, or `@openai/agents-core`). */
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  async openaiAgents(): Promise<any[]> {
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    let mod: any;
    try {
      mod = await import(OPENAI_AGENTS);
    } catch {
      mod = await importFramework("@openai/agents-core", "openaiAgents()");
    }
    return this.tools.map((n) =>
      mod.tool({
        name: n, description: SPECS[n][0], parameters: schema(SPECS[n][1]), strict: true,
        execute: async (input: unknown) => this.call(n, input),
      }));
  }

  /** Kills the session's sandbox (if one was made). */
  async close(): Promise<void> {
    const sbx = this.#sbx ?? (this.#creating ? await this.#creating.catch(() => null) : null);
    this.#sbx = null;
    this.#creating = null;
    if (sbx) await sbx.kill().catch(() => {});
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

// (Names in variables: tsc does not resolve them, and none is a dependency of the SDK.)
const OPENAI_AGENTS: string = "@openai/agents";

// eslint-disable-next-line @typescript-eslint/no-explicit-any
async function importFramework(name: string, method: string): Promise<any> {
  try {
    return await import(name);
  } catch (e) {
    throw new Error(`Toolkit.${method} needs the '${name}' package installed (${(e as Error).message})`);
  }
}
