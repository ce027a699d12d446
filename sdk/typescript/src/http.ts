// The daemon's REST API: the key and base URL, retries of what the server refuses for now,
// typed errors, server-sent events.
import { errorFor } from "./error_codes.js";
import type { ClientOptions, ExecEvent, FileChange } from "./types.js";

// The API's JSON payloads (snake_case) before they are turned into the public types.
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Json = any;

const DEFAULT_BASE_URL = "http://127.0.0.1:7070";
// What the API keeps of a non-streamed command's output, per stream; the SDK keeps the same when
// it runs a command over the stream.
export const MAX_OUTPUT = 16 << 20;
// Requests the server refused for now (429, 503) are retried this many times after Retry-After.
const RETRIES = 3;
// How long a command waits, retrying, while its sandbox runs its most commands at once.
const EXEC_QUEUE_MS = 120000;
function config(opts: ClientOptions = {}): { apiKey: string; baseUrl: string } {
  const apiKey = opts.apiKey ?? process.env.PANDASTACK_API_KEY ?? "";
  if (!apiKey) throw errorFor("unauthorized", "no API key: pass apiKey or set PANDASTACK_API_KEY", 0);
  const baseUrl = (opts.baseUrl ?? process.env.PANDASTACK_BASE_URL ?? DEFAULT_BASE_URL).replace(/\/+$/, "");
  return { apiKey, baseUrl };
}

/** @internal What a request carries. */
export interface CallOptions {
  json?: unknown;
  body?: BodyInit;
  query?: Record<string, string | number>;
  signal?: AbortSignal;
}

/** @internal The daemon's REST API: requests with the key, retries, typed errors, events. */
export class Http {
  readonly baseUrl: string;
  readonly headers: Record<string, string>;
  constructor(opts: ClientOptions) {
    const { apiKey, baseUrl } = config(opts);
    this.baseUrl = baseUrl;
    this.headers = { Authorization: `Bearer ${apiKey}`, "User-Agent": "pandastack-js/0.2" };
  }

  async call(method: string, path: string, { json, body, query, signal }: CallOptions = {}): Promise<Response> {
    const url = new URL(this.baseUrl + path);
    for (const [k, v] of Object.entries(query ?? {})) url.searchParams.set(k, String(v));
    const headers = { ...this.headers };
    if (json !== undefined) headers["Content-Type"] = "application/json";
    let res: Response;
    let waited = 0;
    for (let attempt = 0; ; ++attempt) {
      try {
        res = await fetch(url, {
          method,
          headers,
          body: json !== undefined ? JSON.stringify(json) : body,
          signal,
        });
      } catch (e) {
        const err = e as { name?: string; cause?: { message?: string } };
        if (err?.name === "AbortError") throw e;
        throw errorFor("connection_error", `cannot reach the PandaStack daemon: ${err?.cause?.message ?? e}`, 0);
      }
      // Refused for now (busy): nothing was done; wait as told and try again.
      // Only what the server says to retry (Retry-After): a quota refusal stands until use drops.
      if ((res.status !== 429 && res.status !== 503) || !res.headers.has("retry-after")) break;
      // A sandbox running its most commands at once: a burst of calls queues here (jittered)
      // for up to EXEC_QUEUE_MS rather than failing.
      let busy = false;
      if (res.status === 429 && waited < EXEC_QUEUE_MS) {
        try { busy = ((await res.clone().json()) as Json).error?.code === "too_many_execs"; } catch {}
      }
      if (!busy && attempt >= RETRIES) break;
      const wait = busy ? 0.1 + Math.random() * 0.5 : Math.min(Number(res.headers.get("retry-after") ?? "1") || 1, 5);
      waited += wait * 1000;
      await res.arrayBuffer();
      await new Promise((r) => setTimeout(r, wait * 1000));
    }
    if (res.status >= 300) {
      let code = "http_error";
      let message = `HTTP ${res.status}`;
      try {
        const err = ((await res.json()) as Json).error;
        code = err.code;
        message = err.message;
      } catch {}
      throw errorFor(code, message, res.status);
    }
    return res;
  }

  async json(method: string, path: string, opts?: CallOptions): Promise<Json> {
    const res = await this.call(method, path, opts);
    return res.status === 204 ? null : res.json();
  }

  /** Server-sent events as they come: {event, data} (data parsed). */
  async *events(method: string, path: string, opts?: CallOptions): AsyncGenerator<{ event: string; data: Json }> {
    const res = await this.call(method, path, opts);
    const decoder = new TextDecoder();
    let buf = "";
    let event = "";
    if (!res.body) return;
    for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
      buf += decoder.decode(chunk, { stream: true });
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).replace(/\r$/, "");
        buf = buf.slice(nl + 1);
        if (line.startsWith("event: ")) event = line.slice(7);
        else if (line.startsWith("data: ")) {
          const data = JSON.parse(line.slice(6));
          const kind = event;
          event = "";
          yield { event: kind, data };
        }
      }
    }
  }

  /** Server-sent events of an exec or process stream, as ExecEvents; an error event (the sandbox
   * stopped or hibernated meanwhile) throws its typed error. */
  async *sse(method: string, path: string, opts?: CallOptions): AsyncGenerator<StreamEvent> {
    for await (const { event, data } of this.events(method, path, opts)) {
      const ev = toEvent(event, data);
      if (ev.kind === "error") throw errorFor(ev.code, ev.message, 0);
      yield ev;
    }
  }
}

// An exec stream's events, and a folder watch's (ready, change, end).
export type StreamEvent =
  | ExecEvent
  | { kind: "ready" | "end" }
  | { kind: "change"; change: FileChange };

export function decode(data: string, encoding?: string): Buffer {
  return encoding === "base64" ? Buffer.from(data, "base64") : Buffer.from(data, "utf8");
}

function toEvent(kind: string, d: Json): StreamEvent {
  if (kind === "stdout" || kind === "stderr") {
    const data = decode(d.data ?? "", d.encoding);
    return { kind, data, text: data.toString("utf8") };
  }
  if (kind === "exit") return { kind, exitCode: d.exit_code, timedOut: !!d.timed_out, durationMs: d.duration_ms ?? 0 };
  if (kind === "ready" || kind === "end") return { kind };  // a folder watch's start and end
  if (kind === "change") return { kind, change: { type: d.type, name: d.name, path: d.path, isDir: !!d.is_dir } };
  return { kind: "error", code: d.code, message: d.message };
}
