// PandaStack SDK for Node.js (>= 18): ESM, no runtime dependencies (the platform's fetch).
// TypeScript, compiled by tsc to dist/ (ESM + declarations): `npm run build`.
//
//   import { Sandbox } from "@pandastack/sdk";
//   const sbx = await Sandbox.create();          // PANDASTACK_API_KEY, PANDASTACK_BASE_URL
//   console.log((await sbx.exec("echo hi")).stdout);
//   await sbx.kill();

// The API's JSON payloads (snake_case) before they are turned into the types below.
// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Json = any;

export interface ClientOptions {
  /** Defaults to the PANDASTACK_API_KEY environment variable (keys start with "pds_"). */
  apiKey?: string;
  /** Defaults to PANDASTACK_BASE_URL, then http://127.0.0.1:7070. */
  baseUrl?: string;
}

export interface CreateOptions extends ClientOptions {
  template?: string;
  ttlSeconds?: number;
  metadata?: Record<string, string>;
  persistent?: boolean;
  autoWake?: boolean;
  fromSnapshot?: string;
  /** false: no network at all (default: the daemon's setting). */
  network?: boolean;
  /** The egress policy (default: the daemon's); with only `allow`, an allowlist. */
  egress?: EgressMode;
  /** IPv4 addresses or CIDRs the sandbox may reach (allowlist). */
  allow?: string[];
  /** Seconds without a command, file or process call, stream or running background process
   * after which `onTimeout` happens (default: no idle timeout). */
  idleTimeoutSeconds?: number;
  /** What the TTL or the idle timeout does (default: "hibernate" when persistent, else "kill"). */
  onTimeout?: "kill" | "hibernate";
  /** Volumes to attach, mounted when create returns (at most 4). */
  volumes?: VolumeMount[];
  /** A sandbox has its template's shape (baked into its snapshot): asking for more memory or
   * vCPUs than that throws ExceedsTemplateError. */
  memoryMib?: number;
  vcpus?: number;
}

export interface VolumeMount {
  volume: string | Volume;
  mount: string;
  readOnly?: boolean;
}

export interface VolumeInfo {
  id: string;
  name: string;
  status: "available" | "deleted";
  sizeMib: number;
  createdAtMs: number;
  metadata: Record<string, string>;
  attachments: { sandbox: string; mount: string; readOnly: boolean }[];
  snapshots: VolumeSnapshotInfo[];
  /** "" (made empty), or what it is a copy of: "fork:<sandbox>:<volume>", "snapshot:<snapshot>:<volume>",
   * "volume-snapshot:<vsnap>:<volume>". */
  origin: string;
}

/** A point-in-time copy of a volume. */
export interface VolumeSnapshotInfo {
  id: string;
  volume: string;
  sizeMib: number;
  createdAtMs: number;
}

export interface VolumeCreateOptions extends ClientOptions {
  /** Required unless fromSnapshot is given (then: at least the snapshot's size; default its size). */
  sizeMib?: number;
  fromSnapshot?: string | VolumeSnapshotInfo;
  name?: string;
  metadata?: Record<string, string>;
}

/** A volume: data that outlives sandboxes, attached at a sandbox's create. */
export interface TemplateInfo {
  name: string;
  kind: "shipped" | "custom";
  status: "building" | "ready" | "failed";
  from: string;
  packages: string[];
  run: string[];
  env: Record<string, string>;
  buildMs: number;
  sizeBytes: number;
  error: string;
  logTail: string;
  /** its sandboxes' shape */
  memoryMib: number;
  vcpus: number;
}

export interface BuildProgress {
  stage: string;
  percent: number;
  /** a line of the build's log ("" for a stage change) */
  line: string;
}

export interface TemplateBuildOptions extends ClientOptions {
  from?: string;
  packages?: string[];
  files?: Record<string, string>;
  run?: string[];
  env?: Record<string, string>;
  network?: boolean;
  /** Every sandbox of it gets this shape (default: the host's). */
  memoryMib?: number;
  vcpus?: number;
  onProgress?: (p: BuildProgress) => void;
}

export type EgressMode = "deny_all" | "allow_all" | "allowlist";

/** An exposed guest port; hostPort/address are null while the sandbox is not running. */
export interface PortInfo {
  port: number;
  host: string;
  hostPort: number | null;
  address: string | null;
}

/** One sample of a sandbox's resource use (the host's view of its VM). */
export interface MetricSample {
  timestampMs: number;
  /** Of its vCPUs, over the interval before the sample. */
  cpuUsedPct: number;
  cpuCount: number;
  /** The VM's resident memory on the host (the guest RAM it touched). */
  memUsedBytes: number;
  memTotalBytes: number;
  /** What its writable disk layer holds on the host (its writes). */
  diskUsedBytes: number;
  diskTotalBytes: number;
}

/** A guest port served at a preview URL of the daemon. */
export interface PreviewInfo {
  port: number;
  /** Host-based: http://PORT-ID.DOMAIN/?token=... (no token when public). */
  url: string;
  /** Path-based, at the API's own address: .../v1/sandboxes/ID/previews/PORT/?token=... */
  pathUrl: string;
  token: string | null;
  public: boolean;
  createdAtMs: number;
  expiresAtMs: number;
}

export interface Egress {
  mode: EgressMode;
  cidrs: string[];
  domains: string[];
}

export interface ListOptions extends ClientOptions {
  state?: SandboxState;
  metadata?: Record<string, string>;
}

export type SandboxState =
  | "creating" | "running" | "snapshotting" | "forking" | "hibernating" | "hibernated"
  | "waking" | "stopped" | "failed";

export interface SandboxInfo {
  id: string;
  template: string;
  state: SandboxState;
  createdAtMs: number;
  expiresAtMs: number;
  persistent: boolean;
  metadata: Record<string, string>;
  parent: string | null;
  snapshots: string[];
  network: boolean;
  egress: Egress | null;
  autoWake: boolean;
  ttlSeconds: number;
  idleTimeoutSeconds: number;
  onTimeout: "kill" | "hibernate";
  volumes: { volume: string; mount: string; readOnly: boolean }[];
  /** its guest's shape: its template's */
  memoryMib: number;
  vcpus: number;
}

export interface ExecOptions {
  timeoutSeconds?: number;
  env?: Record<string, string>;
  cwd?: string;
  /** Text, or bytes (sent as base64: binary stdin arrives unchanged). */
  stdin?: string | Uint8Array;
  /** Aborting kills the command in the guest. */
  signal?: AbortSignal;
}

export interface ExecResult {
  stdout: string;
  stderr: string;
  stdoutBytes: Buffer;
  stderrBytes: Buffer;
  exitCode: number;
  timedOut: boolean;
  durationMs: number;
  /** More output than the 16 MiB kept of each stream. */
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
}

export type ExecEvent =
  | { kind: "stdout" | "stderr"; data: Buffer; text: string }
  | { kind: "exit"; exitCode: number; timedOut: boolean; durationMs: number }
  | { kind: "error"; code: string; message: string };

export interface FileInfo {
  name: string;
  type: "file" | "directory" | "symlink" | "other";
  size: number;
  mode: number;
  mtimeMs: number;
  isDir: boolean;
}

export interface ProcessInfo {
  pid: number;
  command: string;
  running: boolean;
  exitCode: number;
  startedAtMs: number;
}

export interface FileChange {
  type: "create" | "write" | "remove" | "rename" | "chmod" | "overflow";
  /** Relative to the watched folder ("" for overflow). */
  name: string;
  path: string;
  isDir: boolean;
}

export interface FileWatch extends AsyncIterable<FileChange> {
  stop(): void;
}

export interface CodeResult {
  /** The value's repr. */
  text: string;
  /** For a dict or list. */
  json?: unknown;
  /** A matplotlib figure (PNG bytes). */
  png?: Buffer;
  /** The last expression's value (figures are not). */
  isMainResult: boolean;
}

export interface Execution {
  stdout: string;
  stderr: string;
  results: CodeResult[];
  /** The main result's text. */
  text?: string;
  /** The exception the code raised (the context lives on). */
  error?: { name: string; value: string; traceback: string };
  executionCount: number;
  timedOut: boolean;
}

export interface RunCodeOptions {
  /** A context id from createCodeContext (default: "default"). */
  context?: string;
  /** Environment variables for this run only. */
  env?: Record<string, string>;
  timeoutSeconds?: number;
}

export interface SnapshotInfo {
  id: string;
  sandbox: string;
  template: string;
  createdAtMs: number;
  /** Host storage it holds (RAM file and disk layers); memoryBytes of it is host RAM. */
  sizeBytes: number;
  memoryBytes: number;
}

export interface DatabaseInfo {
  id: string;
  name: string;
  /** Its sandbox's real state (failed: failureReason / failure_reason says why). */
  status: "running" | "hibernated" | "starting" | "failed" | "deleted";
  failureReason: string;
  /** Where it listens on the host while it runs ("" / 0 while hibernated). */
  host: string;
  port: number;
  user: string;
  database: string;
  /** postgresql://user[:password]@host:port/database: the password only after create and rotatePassword. */
  connectionUri: string;
  password: string;
  sandbox: string;
  volume: string;
  createdAtMs: number;
  metadata: Record<string, string>;
  backups: DatabaseBackup[];
  /** create with fromBackup: the backup restored. */
  restoredFrom: string;
}

/** A backup of a database: pg_dump (custom format) kept on the host, deleted with the database. */
export interface DatabaseBackup {
  id: string;
  database: string;
  bytes: number;
  createdAtMs: number;
}

const DEFAULT_BASE_URL = "http://127.0.0.1:7070";

/** An error answered by the API: `code` is the API's machine-readable code. */
export class PandaStackError extends Error {
  readonly code: string;
  readonly status: number;
  constructor(message: string, code = "error", status = 0) {
    super(`${code}: ${message}`);
    this.name = "PandaStackError";
    this.code = code;
    this.status = status;
  }
}
export class InvalidArgumentError extends PandaStackError {}
export class InvalidCwdError extends InvalidArgumentError {}
export class ExceedsTemplateError extends InvalidArgumentError {}
export class CommandNotFoundError extends InvalidArgumentError {}
export class UnauthorizedError extends PandaStackError {}
export class ForbiddenError extends PandaStackError {}
export class PermissionDeniedError extends ForbiddenError {}
export class NotFoundError extends PandaStackError {}
export class SandboxNotFoundError extends NotFoundError {}
export class FileNotFoundError extends NotFoundError {}
export class TemplateNotFoundError extends NotFoundError {}
export class SnapshotNotFoundError extends NotFoundError {}
export class VolumeNotFoundError extends NotFoundError {}
export class ConflictError extends PandaStackError {}
export class SandboxHibernatedError extends ConflictError {}
export class SandboxStoppedError extends ConflictError {}
export class SandboxFailedError extends SandboxStoppedError {}
export class SandboxBusyError extends ConflictError {}
export class VolumeInUseError extends ConflictError {}
export class VolumeAttachedError extends ConflictError {}
export class TemplateInUseError extends ConflictError {}
/** A template build that ended in failure: `logTail` has the end of its log. */
export class TemplateBuildFailedError extends PandaStackError {
  readonly logTail: string;
  constructor(message: string, logTail: string) { super(message, "template_build_failed", 0); this.logTail = logTail; }
}
export class DatabaseNotFoundError extends NotFoundError {}
export class DatabaseHibernatedError extends ConflictError {}
export class DatabaseFailedError extends ConflictError {}
export class ManagedByDatabaseError extends ConflictError {}
export class BackupNotFoundError extends NotFoundError {}
export class IsADirectoryError extends ConflictError {}
export class NotADirectoryError extends ConflictError {}
export class FileExistsError extends ConflictError {}
export class DirectoryNotEmptyError extends ConflictError {}
export class PayloadTooLargeError extends PandaStackError {}
export class RateLimitedError extends PandaStackError {}
export class NoSpaceError extends PandaStackError {}
export class GuestIOError extends PandaStackError {}
export class TransitionFailedError extends PandaStackError {}
export class StartFailedError extends PandaStackError {}
export class ExecFailedError extends PandaStackError {}
export class NotImplementedError extends PandaStackError {}
export class TimeoutError extends PandaStackError {}
export class ConnectionError extends PandaStackError {}
export class QuotaExceededError extends PandaStackError {}
export class HostFullError extends PandaStackError {}

// code -> [class, HTTP status] (a stream's error event has no status of its own).
const BY_CODE: Record<string, [typeof PandaStackError, number]> = {
  invalid_json: [InvalidArgumentError, 400],
  invalid_argument: [InvalidArgumentError, 400],
  invalid_path: [InvalidArgumentError, 400],
  invalid_cwd: [InvalidCwdError, 400],
  exceeds_template: [ExceedsTemplateError, 400],
  command_not_found: [CommandNotFoundError, 400],
  unauthorized: [UnauthorizedError, 401],
  forbidden: [ForbiddenError, 403],
  permission_denied: [PermissionDeniedError, 403],
  sandbox_not_found: [SandboxNotFoundError, 404],
  file_not_found: [FileNotFoundError, 404],
  template_not_found: [TemplateNotFoundError, 404],
  snapshot_not_found: [SnapshotNotFoundError, 404],
  volume_not_found: [VolumeNotFoundError, 404],
  volume_in_use: [VolumeInUseError, 409],
  volume_attached: [VolumeAttachedError, 409],
  template_in_use: [TemplateInUseError, 409],
  database_not_found: [DatabaseNotFoundError, 404],
  database_hibernated: [DatabaseHibernatedError, 409],
  database_failed: [DatabaseFailedError, 409],
  managed_by_database: [ManagedByDatabaseError, 409],
  backup_not_found: [BackupNotFoundError, 404],
  backup_too_large: [PayloadTooLargeError, 413],
  backup_failed: [TransitionFailedError, 500],
  restore_failed: [TransitionFailedError, 500],
  network_disabled: [ConflictError, 409],
  sandbox_hibernated: [SandboxHibernatedError, 409],
  sandbox_stopped: [SandboxStoppedError, 409],
  sandbox_failed: [SandboxFailedError, 409],
  sandbox_busy: [SandboxBusyError, 409],
  cancelled: [ConflictError, 409],
  is_a_directory: [IsADirectoryError, 409],
  not_a_directory: [NotADirectoryError, 409],
  file_exists: [FileExistsError, 409],
  directory_not_empty: [DirectoryNotEmptyError, 409],
  body_too_large: [PayloadTooLargeError, 413],
  file_too_large: [PayloadTooLargeError, 413],
  io_error: [GuestIOError, 422],
  too_many_execs: [RateLimitedError, 429],
  too_many_requests: [RateLimitedError, 429],
  too_many_processes: [RateLimitedError, 429],
  too_many_ports: [RateLimitedError, 429],
  quota_exceeded: [QuotaExceededError, 429],
  client_too_slow: [ConflictError, 409],
  request_timeout: [TimeoutError, 408],
  host_full: [HostFullError, 503],
  snapshot_failed: [TransitionFailedError, 500],
  fork_failed: [TransitionFailedError, 500],
  hibernate_failed: [TransitionFailedError, 500],
  wake_failed: [TransitionFailedError, 500],
  start_failed: [StartFailedError, 500],
  not_implemented: [NotImplementedError, 501],
  exec_failed: [ExecFailedError, 503],
  timeout: [TimeoutError, 504],
  no_space: [NoSpaceError, 507],
  connection_error: [ConnectionError, 0],
};

function errorFor(code: string, message: string, status: number): PandaStackError {
  const [Cls, known] = BY_CODE[code] ?? [PandaStackError, 0];
  const e = new Cls(message, code, status || known);
  e.name = Cls.name;
  return e;
}

// What the API keeps of a non-streamed command's output, per stream; the SDK keeps the same when
// it runs a command over the stream.
const MAX_OUTPUT = 16 << 20;
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
type StreamEvent =
  | ExecEvent
  | { kind: "ready" | "end" }
  | { kind: "change"; change: FileChange };

function decode(data: string, encoding?: string): Buffer {
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
function sid(id: unknown): string {
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
  };
}

function volumeInfo(b: Json): VolumeInfo {
  return {
    id: b.id, name: b.name ?? "", status: b.status, sizeMib: b.size_mib, createdAtMs: b.created_at_ms,
    metadata: b.metadata ?? {},
    attachments: (b.attachments ?? []).map((a: Json) => ({ sandbox: a.sandbox, mount: a.mount, readOnly: !!a.read_only })),
    snapshots: (b.snapshots ?? []).map(volumeSnapshotInfo),
    origin: b.origin ?? "",
  };
}

function volumeSnapshotInfo(s: Json): VolumeSnapshotInfo {
  return { id: s.id, volume: s.volume, sizeMib: s.size_mib, createdAtMs: s.created_at_ms };
}

// {volume, mount, read_only} from {volume: id | Volume, mount, readOnly}.
function volumeBody(v: VolumeMount): Json {
  const id = typeof v.volume === "string" ? v.volume : v.volume?.id;
  const out: Json = { volume: id, mount: v.mount };
  if (v.readOnly !== undefined) out.read_only = !!v.readOnly;
  return out;
}

function templateInfo(t: Json): TemplateInfo {
  return {
    name: t.name, kind: t.kind ?? "custom", status: t.status ?? "ready", from: t.from ?? "",
    packages: t.packages ?? [], run: t.run ?? [], env: t.env ?? {}, buildMs: t.build_ms ?? 0,
    sizeBytes: t.size_bytes ?? 0, error: t.error ?? "", logTail: t.log_tail ?? "",
    memoryMib: t.memory_mib ?? 0, vcpus: t.vcpus ?? 0,
  };
}

/** Templates: the shipped ones and your own (a shipped one plus Debian packages, files,
 * environment and commands run as root in its guest, baked once). */
export class Template {
  readonly info: TemplateInfo;
  /** @internal */
  readonly http: Http;
  /** @internal */
  constructor(inf: TemplateInfo, http: Http) { this.info = inf; this.http = http; }
  get name(): string { return this.info.name; }
  /** Builds template `name` and waits for it; `onProgress({stage, percent, line})` gets each
   * stage change (line "") and each log line. Throws TemplateBuildFailedError when it fails. */
  static async build(name: string, opts: TemplateBuildOptions = {}): Promise<Template> {
    const http = new Http(opts);
    const body: Json = {
      name, from: opts.from ?? "base", packages: opts.packages ?? [], files: opts.files ?? {},
      run: opts.run ?? [], env: opts.env ?? {}, network: opts.network ?? true,
    };
    if (opts.memoryMib !== undefined) body.memory_mib = opts.memoryMib;
    if (opts.vcpus !== undefined) body.vcpus = opts.vcpus;
    await http.json("POST", "/v1/templates", { json: body });
    let stage = "queued", percent = 0, end: Json = null;
    for await (const { event, data } of http.events("GET", `/v1/templates/${sid(name)}/build`)) {
      if (event === "stage") {
        stage = data.stage; percent = data.percent;
        opts.onProgress?.({ stage, percent, line: "" });
      } else if (event === "log") {
        opts.onProgress?.({ stage, percent, line: data.line });
      } else if (event === "end") {
        end = data;
      }
    }
    if (!end) throw new PandaStackError("the build's progress stream ended early", "stream_ended", 0);
    const inf = templateInfo(end);
    if (inf.status !== "ready") throw new TemplateBuildFailedError(inf.error || "the build failed", inf.logTail);
    return new Template(inf, http);
  }
  static async get(name: string, opts: ClientOptions = {}): Promise<Template> {
    const http = new Http(opts);
    return new Template(templateInfo(await http.json("GET", `/v1/templates/${sid(name)}`)), http);
  }
  static async list(opts: ClientOptions = {}): Promise<TemplateInfo[]> {
    const http = new Http(opts);
    return (await http.json("GET", "/v1/templates")).templates.map(templateInfo);
  }
  /** Deletes it (TemplateInUseError while sandboxes of it have not ended). */
  async delete(): Promise<void> { await this.http.call("DELETE", `/v1/templates/${sid(this.name)}`); }
}

/** A volume: data that outlives sandboxes (ext4 on the host's disk), attached at create:
 * read-write in one sandbox at a time, read-only in any number. */
export class Volume {
  info: VolumeInfo;
  /** @internal */
  readonly http: Http;
  /** @internal */
  constructor(inf: VolumeInfo, http: Http) { this.info = inf; this.http = http; }
  get id(): string { return this.info.id; }
  static async create(opts: VolumeCreateOptions = {}): Promise<Volume> {
    const http = new Http(opts);
    const body: Json = { name: opts.name ?? "" };
    if (opts.sizeMib !== undefined) body.size_mib = opts.sizeMib;
    if (opts.fromSnapshot !== undefined)
      body.from_snapshot = typeof opts.fromSnapshot === "string" ? opts.fromSnapshot : opts.fromSnapshot.id;
    if (opts.metadata) body.metadata = opts.metadata;
    return new Volume(volumeInfo(await http.json("POST", "/v1/volumes", { json: body })), http);
  }
  static async get(id: string, opts: ClientOptions = {}): Promise<Volume> {
    const http = new Http(opts);
    return new Volume(volumeInfo(await http.json("GET", `/v1/volumes/${encodeURIComponent(id)}`)), http);
  }
  static async list(opts: ClientOptions & { metadata?: Record<string, string> } = {}): Promise<VolumeInfo[]> {
    const http = new Http(opts);
    const query: Record<string, string> = {};
    for (const [k, v] of Object.entries(opts.metadata ?? {})) query[`metadata.${k}`] = v;
    return (await http.json("GET", "/v1/volumes", { query })).volumes.map(volumeInfo);
  }
  /** Grows it (only larger, while detached) and/or replaces its metadata. */
  async update({ sizeMib, metadata }: { sizeMib?: number; metadata?: Record<string, string> } = {}): Promise<VolumeInfo> {
    const body: Json = {};
    if (sizeMib !== undefined) body.size_mib = sizeMib;
    if (metadata !== undefined) body.metadata = metadata;
    this.info = volumeInfo(await this.http.json("PATCH", `/v1/volumes/${encodeURIComponent(this.id)}`, { json: body }));
    return this.info;
  }
  /** Deletes it, its data and its snapshots (VolumeAttachedError while a sandbox holds it). */
  async delete(): Promise<void> {
    await this.http.call("DELETE", `/v1/volumes/${encodeURIComponent(this.id)}`);
  }
  /** A point-in-time copy (held read-write by a running sandbox: its file system is frozen for it). */
  async snapshot(): Promise<VolumeSnapshotInfo> {
    return volumeSnapshotInfo(await this.http.json("POST", `/v1/volumes/${encodeURIComponent(this.id)}/snapshots`, { json: {} }));
  }
  async snapshots(): Promise<VolumeSnapshotInfo[]> {
    return (await this.http.json("GET", `/v1/volumes/${encodeURIComponent(this.id)}/snapshots`)).snapshots.map(volumeSnapshotInfo);
  }
  async deleteSnapshot(snapshot: string | VolumeSnapshotInfo): Promise<void> {
    const id = typeof snapshot === "string" ? snapshot : snapshot.id;
    await this.http.call("DELETE", `/v1/volumes/${encodeURIComponent(this.id)}/snapshots/${encodeURIComponent(id)}`);
  }
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
  /** This tenant's snapshots: {id, sandbox, template, createdAtMs, sizeBytes, memoryBytes}. */
  static async listSnapshots(opts: ClientOptions = {}): Promise<SnapshotInfo[]> {
    const http = new Http(opts);
    return (await http.json("GET", "/v1/snapshots")).snapshots.map((x: Json) => ({
      id: x.id, sandbox: x.sandbox, template: x.template, createdAtMs: x.created_at_ms, sizeBytes: x.size_bytes, memoryBytes: x.memory_bytes,
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
  fork(): Promise<Sandbox>;
  /** `count` copies (1..16). */
  fork(count: number): Promise<Sandbox[]>;
  async fork(count?: number): Promise<Sandbox | Sandbox[]> {
    const kids = (await this.#post("fork", { count: count ?? 1 })).sandboxes.map((k: Json) => new Sandbox(info(k), this.http));
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

function databaseInfo(b: Json): DatabaseInfo {
  return {
    id: b.id, name: b.name, status: b.status, host: b.host ?? "", port: b.port ?? 0, user: b.user,
    database: b.database, connectionUri: b.connection_uri ?? "", password: b.password ?? "",
    sandbox: b.sandbox ?? "", volume: b.volume ?? "", createdAtMs: b.created_at_ms,
    metadata: b.metadata ?? {}, backups: (b.backups ?? []).map(backupInfo),
    restoredFrom: b.restored_from ?? "", failureReason: b.failure_reason ?? "",
  };
}

function backupInfo(b: Json): DatabaseBackup {
  return { id: b.id, database: b.database, bytes: b.bytes, createdAtMs: b.created_at_ms };
}

/** A managed PostgreSQL database (a restore of the postgres template). The password is in
 * `info.password` / `connectionUri` only after create and rotatePassword: it is stored nowhere. */
export class Database {
  info: DatabaseInfo;
  /** @internal */
  readonly http: Http;
  /** @internal */
  constructor(inf: DatabaseInfo, http: Http) { this.info = inf; this.http = http; }
  get id(): string { return this.info.id; }
  get connectionUri(): string { return this.info.connectionUri; }
  /** fromBackup: a bk_... id of one of your databases' backups, restored into the new one. */
  static async create(opts: ClientOptions & { name: string; metadata?: Record<string, string>; fromBackup?: string }): Promise<Database> {
    const http = new Http(opts);
    const body: Json = { name: opts.name };
    if (opts.metadata) body.metadata = opts.metadata;
    if (opts.fromBackup) body.from_backup = opts.fromBackup;
    return new Database(databaseInfo(await http.json("POST", "/v1/databases", { json: body })), http);
  }
  static async get(id: string, opts: ClientOptions = {}): Promise<Database> {
    const http = new Http(opts);
    return new Database(databaseInfo(await http.json("GET", `/v1/databases/${encodeURIComponent(id)}`)), http);
  }
  static async list(opts: ClientOptions = {}): Promise<DatabaseInfo[]> {
    const http = new Http(opts);
    return (await http.json("GET", "/v1/databases")).databases.map(databaseInfo);
  }
  async #action(what: string): Promise<DatabaseInfo> {
    this.info = databaseInfo(await this.http.json("POST", `/v1/databases/${encodeURIComponent(this.id)}/${what}`, { json: {} }));
    return this.info;
  }
  hibernate(): Promise<DatabaseInfo> { return this.#action("hibernate"); }
  /** The same credentials work again, maybe on another host port (info.port). */
  wake(): Promise<DatabaseInfo> { return this.#action("wake"); }
  /** A new password (the old one stops working): info.password, once. */
  rotatePassword(): Promise<DatabaseInfo> { return this.#action("rotate-password"); }
  /** A logical backup (pg_dump) of the running database, kept on the host. */
  async backup(): Promise<DatabaseBackup> {
    return backupInfo(await this.http.json("POST", `/v1/databases/${encodeURIComponent(this.id)}/backups`, { json: {} }));
  }
  async backups(): Promise<DatabaseBackup[]> {
    return (await this.http.json("GET", `/v1/databases/${encodeURIComponent(this.id)}/backups`)).backups.map(backupInfo);
  }
  async deleteBackup(backupId: string): Promise<void> {
    await this.http.call("DELETE", `/v1/databases/${encodeURIComponent(this.id)}/backups/${encodeURIComponent(backupId)}`);
  }
  async logs(lines = 200): Promise<string> {
    return (await this.http.json("GET", `/v1/databases/${encodeURIComponent(this.id)}/logs`, { query: { lines: String(lines) } })).log;
  }
  async delete(): Promise<void> {
    await this.http.call("DELETE", `/v1/databases/${encodeURIComponent(this.id)}`);
  }
}
