// A sandbox: commands, streams, files, processes, code, snapshots, forks, hibernation, ports,
// previews (and its files and processes as `sbx.files`, `sbx.process`).
import { errorFor } from "./error_codes.js";
import { NotFoundError, PandaStackError, PayloadTooLargeError } from "./errors.js";
import { decode, Http, MAX_OUTPUT, type Json } from "./http.js";
import { Template, templateInfo, volumeBody } from "./resources.js";
import type {
  ClientOptions, CodeResult, CreateOptions, EgressMode, ExecEvent, ExecOptions, ExecResult, Execution,
  FileChange, FileInfo, FileWatch, ListOptions, MetricSample, EgressEntry, EgressLogPage, PortInfo, PreviewInfo, ProcessInfo,
  RunCodeOptions, SandboxInfo, SandboxState, SnapshotInfo,
} from "./types.js";

function execBody(cmd: string | readonly string[], o: Omit<ExecOptions, "signal"> = {}): Json {
  const body: Json = typeof cmd === "string" ? { cmd } : { argv: [...cmd] };
  // Whole seconds (the API's unit): a fraction rounds up, so a command gets at least its time.
  if (o.timeoutSeconds !== undefined) body.timeout_seconds = Math.ceil(o.timeoutSeconds);
  if (o.env) body.env = o.env;
  if (o.cwd) body.cwd = o.cwd;
  if (o.stdin !== undefined) {
    if (typeof o.stdin === "string") body.stdin = o.stdin;
    else {  // bytes (Uint8Array, Buffer): sent as they are, base64
      body.stdin = Buffer.from(o.stdin).toString("base64");
      body.stdin_encoding = "base64";
    }
  }
  return body;
}

function result(stdout: Buffer, stderr: Buffer, exitCode: number, timedOut: boolean, durationMs = 0,
                stdoutTruncated = false, stderrTruncated = false): ExecResult {
  return {
    stdout: stdout.toString("utf8"),
    stderr: stderr.toString("utf8"),
    stdoutBytes: stdout,
    stderrBytes: stderr,
    exitCode,
    timedOut,
    durationMs,
    stdoutTruncated,
    stderrTruncated,
  };
}

// Collects a stream's output as the API would buffer it (16 MiB per stream, then truncated).
class OutputCap {
  out: Buffer[] = [];
  err: Buffer[] = [];
  sizes = { stdout: 0, stderr: 0 };
  truncated = { stdout: false, stderr: false };
  add(kind: "stdout" | "stderr", data: Buffer): void {
    const room = MAX_OUTPUT - this.sizes[kind];
    if (data.length > room) { this.truncated[kind] = true; data = data.subarray(0, Math.max(room, 0)); }
    this.sizes[kind] += data.length;
    (kind === "stdout" ? this.out : this.err).push(data);
  }
}

// A sandbox id for a URL path: never empty, escaped.
export function sid(id: unknown): string {
  if (typeof id !== "string" || id === "") throw errorFor("invalid_argument", "a sandbox id is a non-empty string (sbx_...)", 400);
  return encodeURIComponent(id);
}

// The server's file limit per request; larger files go in parts (?offset=).
const FILE_LIMIT = 64 * 1024 * 1024;
const FILE_PART = 32 * 1024 * 1024;

/** A sandbox's files (`sbx.files`). */
export class Files {
  /** @internal */
  readonly s: Sandbox;
  /** @internal */
  constructor(sbx: Sandbox) { this.s = sbx; }
  #p(sub = ""): string { return `/v1/sandboxes/${sid(this.s.id)}/files${sub}`; }
  /** Writes a whole file (parents are created). `mode` (e.g. 0o755) sets its permissions. A file
   * over the server's 64 MiB per request goes in parts of 32 MiB (`?offset=`). */
  async write(path: string, data: string | Uint8Array, { mode }: { mode?: number } = {}): Promise<void> {
    const query: Record<string, string | number> = mode === undefined ? { path } : { path, mode: mode.toString(8) };
    const body = typeof data === "string" ? Buffer.from(data) : Buffer.from(data);
    if (body.length <= FILE_LIMIT) {
      await this.s.http.call("PUT", this.#p(), { query, body });
      return;
    }
    for (let off = 0; off < body.length; off += FILE_PART)
      await this.s.http.call("PUT", this.#p(), {
        query: off ? { ...query, offset: off } : query, body: body.subarray(off, off + FILE_PART),
      });
  }
  /** True when the path exists. */
  async exists(path: string): Promise<boolean> {
    try { await this.stat(path); return true; } catch (e) { if (e instanceof NotFoundError) return false; throw e; }
  }
  /** Copies a local file into the sandbox. */
  async upload(localPath: string, remotePath: string): Promise<void> {
    const { readFile } = await import("node:fs/promises");
    await this.write(remotePath, await readFile(localPath));
  }
  /** Copies a file from the sandbox to a local path. */
  async download(remotePath: string, localPath: string): Promise<void> {
    const { writeFile } = await import("node:fs/promises");
    await writeFile(localPath, await this.read(remotePath));
  }
  /** Reads a whole file as bytes (one over 64 MiB in parts of 32 MiB). */
  async read(path: string): Promise<Buffer> {
    try {
      const res = await this.s.http.call("GET", this.#p(), { query: { path } });
      return Buffer.from(await res.arrayBuffer());
    } catch (e) {
      if (!(e instanceof PayloadTooLargeError)) throw e;
    }
    const { size } = await this.stat(path);
    const parts: Buffer[] = [];
    for (let off = 0; off < size; off += FILE_PART) {
      const res = await this.s.http.call("GET", this.#p(), { query: { path, offset: off, length: FILE_PART } });
      parts.push(Buffer.from(await res.arrayBuffer()));
    }
    return Buffer.concat(parts);
  }
  /** Reads a whole file as text. */
  async readText(path: string): Promise<string> { return (await this.read(path)).toString("utf8"); }
  /** The entries of a folder. */
  async list(path: string): Promise<FileInfo[]> { return (await this.s.http.json("GET", this.#p("/list"), { query: { path } })).entries.map(fileInfo); }
  /** One path's type, size, mode and modification time. */
  async stat(path: string): Promise<FileInfo> { return fileInfo(await this.s.http.json("GET", this.#p("/stat"), { query: { path } })); }
  /** Removes a file or (recursive) a folder. */
  async remove(path: string, { recursive = false }: { recursive?: boolean } = {}): Promise<void> {
    await this.s.http.call("DELETE", this.#p(), { query: recursive ? { path, recursive: 1 } : { path } });
  }
  /** Makes a folder (with parents). */
  async mkdir(path: string, { parents = true }: { parents?: boolean } = {}): Promise<void> {
    await this.s.http.call("POST", this.#p("/mkdir"), { json: { path, parents } });
  }
  /** Renames a path. */
  async rename(from: string, to: string): Promise<void> { await this.s.http.call("POST", this.#p("/rename"), { json: { from, to } }); }
  /** Watches the folder `path` (with `recursive`, its subfolders too, those made later included).
   * Resolves once the watch is in place (every later change is reported) to an async iterable of
   * changes {type: "create"|"write"|"remove"|"rename"|"chmod"|"overflow", name (relative to the
   * folder), path, isDir}; it ends when the folder goes or after `stop()`. */
  async watch(path: string, { recursive = false }: { recursive?: boolean } = {}): Promise<FileWatch> {
    const ac = new AbortController();
    const query: Record<string, string | number> = recursive ? { path, recursive: 1 } : { path };
    const events = this.s.http.sse("GET", this.#p("/watch"), { query, signal: ac.signal });
    const first = await events.next();
    if (first.done || first.value.kind !== "ready") throw new PandaStackError("the watch ended before it started", "internal", 0);
    async function* changes(): AsyncGenerator<FileChange> {
      try {
        for await (const ev of events) if (ev.kind === "change") yield ev.change;
      } catch (e) {
        if (!ac.signal.aborted) throw e;
      }
    }
    const it = changes();
    return { [Symbol.asyncIterator]: () => it, stop: () => ac.abort() };
  }
}

function fileInfo(e: Json): FileInfo {
  return { name: e.name, type: e.type, size: e.size, mode: e.mode, mtimeMs: e.mtime_ms, isDir: e.type === "directory" };
}

/** A sandbox's background processes (`sbx.process`). */
export class Processes {
  /** @internal */
  readonly s: Sandbox;
  /** @internal */
  constructor(sbx: Sandbox) { this.s = sbx; }
  /** Starts a background command; resolves to its pid. */
  async start(cmd: string | string[], opts: Omit<ExecOptions, "stdin" | "signal"> = {}): Promise<number> {
    return (await this.s.http.json("POST", `/v1/sandboxes/${sid(this.s.id)}/processes`, { json: execBody(cmd, opts) })).pid;
  }
  /** Running and recently exited background processes. */
  async list(): Promise<ProcessInfo[]> {
    const r = await this.s.http.json("GET", `/v1/sandboxes/${sid(this.s.id)}/processes`);
    return r.processes.map((p: Json) => ({ pid: p.pid, command: p.command, running: p.running, exitCode: p.exit_code, startedAtMs: p.started_at_ms }));
  }
  /** Signals the process's group (default SIGKILL; signals are 1..64). */
  async kill(pid: number, signal?: number): Promise<void> {
    await this.s.http.call("DELETE", `/v1/sandboxes/${sid(this.s.id)}/processes/${pid}`, { query: signal !== undefined ? { signal } : {} });
  }
  /** Its output from the start, then live, then the exit event. */
  stream(pid: number, { signal }: { signal?: AbortSignal } = {}): AsyncIterable<ExecEvent> {
    return this.s.http.sse("GET", `/v1/sandboxes/${sid(this.s.id)}/processes/${pid}/stream`, { signal }) as AsyncIterable<ExecEvent>;
  }
}

function info(b: Json): SandboxInfo {
  return {
    id: b.id, template: b.template, state: b.state, createdAtMs: b.created_at_ms, expiresAtMs: b.expires_at_ms,
    persistent: b.persistent, metadata: b.metadata ?? {}, parent: b.parent ?? null, snapshots: b.snapshots ?? [],
    network: !!b.network, egress: b.egress ?? null, autoWake: !!b.auto_wake, ttlSeconds: b.ttl_seconds ?? 0,
    idleTimeoutSeconds: b.idle_timeout_seconds ?? 0, onTimeout: b.on_timeout ?? "kill",
    volumes: (b.volumes ?? []).map((v: Json) => ({ volume: v.volume, mount: v.mount, readOnly: !!v.read_only })),
    memoryMib: b.memory_mib ?? 0, vcpus: b.vcpus ?? 0,
    ...(b.durable ? { durable: b.durable } : {}),
  };
}

function previewInfo(p: Json): PreviewInfo {
  return { port: p.port, url: p.url, pathUrl: p.path_url, token: p.token ?? null, public: p.public,
           createdAtMs: p.created_at_ms, expiresAtMs: p.expires_at_ms };
}

function portInfo(p: Json): PortInfo {
  return { port: p.port, host: p.host, hostPort: p.host_port ?? null, address: p.address ?? null };
}

// {mode, cidrs}: an allowlist when only CIDRs are given.
function egressBody(mode?: EgressMode, allow?: string[]): Json {
  const cidrs = allow ?? [];
  return { mode: mode ?? (cidrs.length ? "allowlist" : "deny_all"), cidrs };
}

/** A PandaStack sandbox (a microVM), driven through the REST API. */
export class Sandbox {
  info: SandboxInfo;
  /** @internal */
  readonly http: Http;
  readonly files: Files;
  readonly filesystem: Files;
  readonly process: Processes;

  /** @internal */
  constructor(sandboxInfo: SandboxInfo, http: Http) {
    this.info = sandboxInfo;
    this.http = http;
    this.files = new Files(this);
    this.filesystem = this.files;
    this.process = new Processes(this);
  }

  /** Creates a sandbox (restored from its template's snapshot) and resolves when it runs. */
  static async create(opts: CreateOptions = {}): Promise<Sandbox> {
    const http = new Http(opts);
    const body: Json = { template: opts.template ?? "base", persistent: !!opts.persistent, auto_wake: !!opts.autoWake };
    if (opts.ttlSeconds !== undefined) body.ttl_seconds = opts.ttlSeconds;
    if (opts.metadata) body.metadata = opts.metadata;
    if (opts.fromSnapshot) { body.from_snapshot = opts.fromSnapshot; delete body.template; }
    if (opts.network !== undefined) body.network = !!opts.network;
    if (opts.egress !== undefined || opts.allow) body.egress = egressBody(opts.egress, opts.allow);
    if (opts.idleTimeoutSeconds !== undefined) body.idle_timeout_seconds = opts.idleTimeoutSeconds;
    if (opts.onTimeout !== undefined) body.on_timeout = opts.onTimeout;
    if (opts.volumes?.length) body.volumes = opts.volumes.map(volumeBody);
    if (opts.memoryMib !== undefined) body.memory_mib = opts.memoryMib;
    if (opts.vcpus !== undefined) body.vcpus = opts.vcpus;
    if (opts.secrets !== undefined) body.secrets = opts.secrets;
    return new Sandbox(info(await http.json("POST", "/v1/sandboxes", { json: body })), http);
  }
  /** An existing sandbox of this key's tenant. */
  static async get(id: string, opts: ClientOptions = {}): Promise<Sandbox> {
    const http = new Http(opts);
    return new Sandbox(info(await http.json("GET", `/v1/sandboxes/${sid(id)}`)), http);
  }
  /** This tenant's sandboxes, filtered by state and metadata. */
  static async list(opts: ListOptions = {}): Promise<SandboxInfo[]> {
    const http = new Http(opts);
    const query: Record<string, string> = {};
    if (opts.state) query.state = opts.state;
    for (const [k, v] of Object.entries(opts.metadata ?? {})) query[`metadata.${k}`] = v;
    return (await http.json("GET", "/v1/sandboxes", { query })).sandboxes.map(info);
  }
  /** This tenant's snapshots: {id, sandbox, template, name, current, createdAtMs, sizeBytes, memoryBytes, durable}. */
  static async listSnapshots(opts: ClientOptions = {}): Promise<SnapshotInfo[]> {
    const http = new Http(opts);
    return (await http.json("GET", "/v1/snapshots")).snapshots.map((x: Json) => ({
      id: x.id, sandbox: x.sandbox, template: x.template, createdAtMs: x.created_at_ms, sizeBytes: x.size_bytes, memoryBytes: x.memory_bytes,
      name: x.name, current: x.current, durable: x.durable,
    }));
  }
  /** Deletes one of this tenant's snapshots: creates from it fail afterwards (code snapshot_not_found); sandboxes created from it run on. */
  static async deleteSnapshot(snapshotId: string, opts: ClientOptions = {}): Promise<void> {
    const http = new Http(opts);
    await http.call("DELETE", `/v1/snapshots/${encodeURIComponent(snapshotId)}`);
  }

  get id(): string { return this.info.id; }
  get state(): SandboxState { return this.info.state; }

  async #post(action: string, json?: unknown): Promise<Json> { return this.http.json("POST", `/v1/sandboxes/${sid(this.id)}/${action}`, { json }); }

  /** Runs a command (shell string or argv array) to completion. `signal` aborts it: the
   * command is killed in the guest. Commands with a timeout of more than 240 s run over the
   * stream (the HTTP client's 300 s header timeout would end a plain request first). */
  async exec(cmd: string | string[], opts: ExecOptions = {}): Promise<ExecResult> {
    if (!opts.signal && (opts.timeoutSeconds ?? 60) <= 240) {
      const r = await this.#post("exec", execBody(cmd, opts));
      return result(decode(r.stdout, r.stdout_encoding), decode(r.stderr, r.stderr_encoding), r.exit_code, r.timed_out,
        r.duration_ms, !!r.stdout_truncated, !!r.stderr_truncated);
    }
    // Over the stream, whose hang-up kills the command; output kept as the API would keep it.
    const cap = new OutputCap();
    for await (const ev of this.execStream(cmd, opts)) {
      if (ev.kind === "stdout" || ev.kind === "stderr") cap.add(ev.kind, ev.data);
      else if (ev.kind === "exit")
        return result(Buffer.concat(cap.out), Buffer.concat(cap.err), ev.exitCode, ev.timedOut, ev.durationMs,
          cap.truncated.stdout, cap.truncated.stderr);
    }
    throw errorFor("internal", "the command's stream ended without an exit event", 0);
  }
  /** Runs a command; yields stdout/stderr events as they come, then the exit event. A stream the
   * server ends with an error (the sandbox stopped meanwhile) throws it. */
  execStream(cmd: string | string[], opts: ExecOptions = {}): AsyncIterable<ExecEvent> {
    const { signal, ...rest } = opts;
    return this.http.sse("POST", `/v1/sandboxes/${sid(this.id)}/exec/stream`, { json: execBody(cmd, rest), signal }) as AsyncIterable<ExecEvent>;
  }

  /** Runs Python in a context that keeps its variables between runs ("default" unless `context`
   * names one from createCodeContext). Resolves to {stdout, stderr, results, error, text,
   * executionCount, timedOut}: `text` is the last expression's value, `error` an exception the
   * code raised (not thrown); a run past `timeoutSeconds` is interrupted and the context lives on. */
  async runCode(code: string, opts: RunCodeOptions = {}): Promise<Execution> {
    const body: Json = { code };
    if (opts.context) body.context = opts.context;
    if (opts.env) body.env = opts.env;
    if (opts.timeoutSeconds !== undefined) body.timeout_seconds = opts.timeoutSeconds;
    const r = await this.#post("code", body);
    const results: CodeResult[] = r.results.map((x: Json) => ({
      text: x.text, json: x.json, isMainResult: !!x.is_main_result,
      png: x.png ? Buffer.from(x.png, "base64") : undefined,
    }));
    const main = results.find((x) => x.isMainResult);
    return {
      stdout: r.stdout, stderr: r.stderr, results, text: main ? main.text : undefined,
      error: r.error ? { name: r.error.name, value: r.error.value, traceback: r.error.traceback } : undefined,
      executionCount: r.execution_count, timedOut: !!r.timed_out,
    };
  }
  /** A new code context (its own variables; `cwd` its working folder): resolves to its id. */
  async createCodeContext(opts: { cwd?: string } = {}): Promise<string> {
    return (await this.#post("code/contexts", opts.cwd ? { cwd: opts.cwd } : {})).id;
  }
  /** The ids of the code contexts running in the sandbox. */
  async codeContexts(): Promise<string[]> {
    return (await this.http.json("GET", `/v1/sandboxes/${sid(this.id)}/code/contexts`)).contexts.map((c: Json) => c.id);
  }
  /** Ends a code context; its variables go. */
  async deleteCodeContext(id: string): Promise<void> {
    await this.http.json("DELETE", `/v1/sandboxes/${sid(this.id)}/code/contexts/${encodeURIComponent(id)}`);
  }

  /** Snapshots the running sandbox; resolves to the snapshot id (`name`: it then stands for this
   *  newest snapshot taken with it, wherever a snapshot is named). */
  async snapshot(name?: string): Promise<string> { return (await this.#post("snapshots", name ? { name } : undefined)).snapshot_id; }
  /** A copy of the running sandbox (memory, processes, disk); it keeps running. */
  fork(opts?: { inheritSecrets?: boolean }): Promise<Sandbox>;
  /** `count` copies (1..16). `inheritSecrets`: the children's requests carry this sandbox's
   *  secrets too. */
  fork(count: number, opts?: { inheritSecrets?: boolean }): Promise<Sandbox[]>;
  async fork(a?: number | { inheritSecrets?: boolean }, b: { inheritSecrets?: boolean } = {}): Promise<Sandbox | Sandbox[]> {
    const count = typeof a === "number" ? a : undefined;
    const opts = typeof a === "object" ? a : b;
    const body: Json = { count: count ?? 1 };
    if (opts.inheritSecrets) body.inherit_secrets = true;
    const kids = (await this.#post("fork", body)).sandboxes.map((k: Json) => new Sandbox(info(k), this.http));
    return count === undefined ? kids[0] : kids;
  }
  /** Saves the sandbox and stops its VM; `{memory: false}` keeps only its disk (the wake boots
   *  the guest afresh on it: files stay, processes do not). */
  async hibernate(opts: { memory?: boolean } = {}): Promise<void> {
    this.info = info(await this.#post("hibernate", opts.memory === false ? { memory: false } : undefined));
  }
  /** Restores a hibernated sandbox. */
  async wake(): Promise<void> { this.info = info(await this.#post("wake")); }
  /** Forwards guest TCP `port` from the host: resolves to {port, host, hostPort, address}. */
  async exposePort(port: number): Promise<PortInfo> {
    return portInfo(await this.http.json("POST", `/v1/sandboxes/${sid(this.id)}/ports`, { json: { port } }));
  }
  /** Stops forwarding guest `port`. */
  async unexposePort(port: number): Promise<void> { await this.http.json("DELETE", `/v1/sandboxes/${sid(this.id)}/ports/${Number(port)}`); }
  /** Makes this running sandbox (its disk and memory, now) a template of yours. */
  async publishTemplate(name: string): Promise<Template> {
    const t = await this.http.json("POST", `/v1/sandboxes/${sid(this.id)}/template`, { json: { name } });
    return new Template(templateInfo(t), this.http);
  }

  /** Exposed guest ports and their host addresses (hostPort null while the sandbox is not running). */
  async ports(): Promise<PortInfo[]> { return (await this.http.json("GET", `/v1/sandboxes/${sid(this.id)}/ports`)).ports.map(portInfo); }
  /** CPU, memory and disk use over time: [{timestampMs, cpuUsedPct, cpuCount, memUsedBytes,
   * memTotalBytes, diskUsedBytes, diskTotalBytes}] (`fromMs`/`toMs` bound the range). */
  async metrics(opts: { fromMs?: number; toMs?: number } = {}): Promise<MetricSample[]> {
    const q = new URLSearchParams();
    if (opts.fromMs !== undefined) q.set("from_ms", String(opts.fromMs));
    if (opts.toMs !== undefined) q.set("to_ms", String(opts.toMs));
    const qs = q.toString();
    const r = await this.http.json("GET", `/v1/sandboxes/${sid(this.id)}/metrics${qs ? "?" + qs : ""}`);
    return r.metrics.map((m: Json) => ({
      timestampMs: m.timestamp_ms, cpuUsedPct: m.cpu_used_pct, cpuCount: m.cpu_count,
      memUsedBytes: m.mem_used_bytes, memTotalBytes: m.mem_total_bytes,
      diskUsedBytes: m.disk_used_bytes, diskTotalBytes: m.disk_total_bytes,
    }));
  }
  /** What the sandbox's network answered, let out and refused, oldest first: {entries, nextAfter,
   * dropped, lost}; pass `nextAfter` as `after` for the next page. */
  async egressLog(opts: { after?: number; limit?: number; kind?: "dns" | "connection"; verdict?: "allowed" | "denied" } = {}): Promise<EgressLogPage> {
    const q = new URLSearchParams({ after: String(opts.after ?? 0), limit: String(opts.limit ?? 100) });
    if (opts.kind) q.set("kind", opts.kind);
    if (opts.verdict) q.set("verdict", opts.verdict);
    const r = await this.http.json("GET", `/v1/sandboxes/${sid(this.id)}/egress?${q}`);
    return {
      entries: r.entries.map((e: Json): EgressEntry => ({
        seq: e.seq, timestampMs: e.timestamp_ms, kind: e.kind, verdict: e.verdict, reason: e.reason ?? null,
        name: e.name ?? null, type: e.type ?? null, answers: e.answers ?? [],
        protocol: e.protocol ?? null, destination: e.destination ?? null, port: e.port ?? null,
        bytesOut: e.bytes_out ?? null, bytesIn: e.bytes_in ?? null, endedMs: e.ended_ms ?? null,
      })),
      nextAfter: r.next_after, dropped: r.dropped, lost: r.lost,
    };
  }
  /** Serves guest `port` at a preview URL of the daemon: {port, url (with its token), pathUrl,
   * token, public, createdAtMs, expiresAtMs}. Again for the same port: a new URL, the old revoked. */
  async preview(port: number, opts: { ttlSeconds?: number; public?: boolean } = {}): Promise<PreviewInfo> {
    const json: Json = { port, public: opts.public ?? false };
    if (opts.ttlSeconds !== undefined) json.ttl_seconds = opts.ttlSeconds;
    return previewInfo(await this.http.json("POST", `/v1/sandboxes/${sid(this.id)}/previews`, { json }));
  }
  /** The sandbox's preview URLs. */
  async previews(): Promise<PreviewInfo[]> {
    return (await this.http.json("GET", `/v1/sandboxes/${sid(this.id)}/previews`)).previews.map(previewInfo);
  }
  /** Revokes the preview URL of `port` (its next request is refused). */
  async closePreview(port: number): Promise<void> { await this.http.json("DELETE", `/v1/sandboxes/${sid(this.id)}/previews/${Number(port)}`); }
  /** Replaces the egress policy: "deny_all", "allow_all", or an allowlist of IPv4 CIDRs. */
  async setEgress(mode?: EgressMode, allow?: string[]): Promise<void> {
    this.info = info(await this.http.json("PATCH", `/v1/sandboxes/${sid(this.id)}`, { json: { egress: egressBody(mode, allow) } }));
  }
  /** Replaces the sandbox's metadata. */
  async setMetadata(metadata: Record<string, string>): Promise<void> {
    this.info = info(await this.http.json("PATCH", `/v1/sandboxes/${sid(this.id)}`, { json: { metadata } }));
  }
  /** Sets the time to live from now. */
  async setTtl(ttlSeconds: number): Promise<void> {
    this.info = info(await this.http.json("PATCH", `/v1/sandboxes/${sid(this.id)}`, { json: { ttl_seconds: ttlSeconds } }));
  }
  /** Stops the sandbox. */
  async kill(): Promise<void> { this.info = info(await this.http.json("DELETE", `/v1/sandboxes/${sid(this.id)}`)); }
  /** The sandbox's audit events. */
  async events(): Promise<unknown[]> { return (await this.http.json("GET", `/v1/sandboxes/${sid(this.id)}/events`)).events; }
  /** Reads the current info. */
  async refresh(): Promise<SandboxInfo> { this.info = info(await this.http.json("GET", `/v1/sandboxes/${sid(this.id)}`)); return this.info; }

  /** `await using sbx = await Sandbox.create()` kills the sandbox at the end of the scope. */
  async [Symbol.asyncDispose](): Promise<void> {
    try { await this.kill(); } catch (e) { if (!(e instanceof PandaStackError)) throw e; }
  }
}
