// Declarations for src/tools.js (@pandastack/sdk/tools). Framework adapters return the
// frameworks' own tool objects, typed loosely here so that no framework is a dependency.
import type { CreateOptions, Sandbox } from "./index.js";

export type ToolName = "run_python" | "run_command" | "read_file" | "write_file" | "list_files";
export declare const TOOL_NAMES: ToolName[];

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
  tools?: ToolName[];
  /** A sandbox per call, killed after it (default: one per toolkit, made at the first call). */
  perCall?: boolean;
  /** The sandbox's TTL (default 3600; null: none). */
  ttlSeconds?: number | null;
  /** Each command's and run's timeout unless the model gives one (default 60). */
  timeoutSeconds?: number;
  /** Each stream's cut (head and tail kept; default 4000, at least 100). */
  maxOutputChars?: number;
}

export interface ToolRun {
  text: string;
  /** PNG images the code interpreter made. */
  images: Uint8Array[];
  isError: boolean;
}

export interface AnthropicTool { name: ToolName; description: string; input_schema: JsonSchemaObject }
export interface OpenAITool {
  type: "function";
  function: { name: ToolName; description: string; parameters: JsonSchemaObject; strict: true };
}
export interface AnthropicToolResult {
  type: "tool_result";
  tool_use_id: string;
  content: Array<{ type: "text"; text: string } | { type: "image"; source: { type: "base64"; media_type: "image/png"; data: string } }>;
  is_error?: true;
}

/** `text` within `limit` characters: its head and tail, and how much was left out. */
export declare function clip(text: string, limit: number): string;

export declare class Toolkit {
  constructor(opts?: ToolkitOptions);
  readonly tools: ToolName[];
  /** `[{name, description, input_schema}]` for Anthropic's Messages API. */
  anthropic(): AnthropicTool[];
  /** Strict function tools for OpenAI's Chat Completions API. */
  openai(): OpenAITool[];
  /** The session's sandbox (made on first use). */
  sandbox(): Promise<Sandbox>;
  run(name: string, args: unknown): Promise<ToolRun>;
  /** The tool's text for the model; never rejects for the command's own failure. */
  call(name: string, args: unknown): Promise<string>;
  /** Runs the `tool_use` blocks of an assistant message's content. */
  callAnthropic(content: ReadonlyArray<{ type: string; id?: string; name?: string; input?: unknown }>): Promise<AnthropicToolResult[]>;
  /** Runs an assistant message's `tool_calls`: the `tool` messages. */
  callOpenai(toolCalls: ReadonlyArray<{ id: string; function: { name: string; arguments: string } }>): Promise<Array<{ role: "tool"; tool_call_id: string; content: string }>>;
  /** `{name: tool}` for the AI SDK's generateText/streamText (needs `ai`). */
  aiSdk(): Promise<Record<ToolName, any>>;
  /** LangChain tools (needs `@langchain/core`). */
  langchain(): Promise<any[]>;
  /** OpenAI Agents SDK tools (needs `@openai/agents` or `@openai/agents-core`). */
  openaiAgents(): Promise<any[]>;
  /** Kills the session's sandbox. */
  close(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}
