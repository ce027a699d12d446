// The SDK's public types: options, and what the API's answers become (camelCase).
import type { Volume } from "./resources.js";

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
  /** Names of your secrets: its processes get placeholders; its egress proxy puts the values
   * into HTTPS requests to each secret's hosts only (the value never enters the sandbox). */
  secrets?: string[];
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
  /** "remote": its file, detached, is in the host's object store too (the loss of the data disk keeps it); "local": while a sandbox holds it or before that upload (absent: deleted). */
  durable?: "local" | "remote";
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
  /** A Dockerfile instead of from/files/run/env, with its context and build arguments. The
   * context: relative path -> text, or the key of an archive Template.uploadContext answered
   * ("sha256:...": a tar of any files, its .dockerignore applied by the build). */
  dockerfile?: string;
  context?: Record<string, string> | string;
  buildArgs?: Record<string, string>;
  onProgress?: (p: BuildProgress) => void;
}

/** An image imported (Template.importImage) or pulled (Template.pull) as a template. */
export interface TemplateImageOptions extends ClientOptions {
  network?: boolean;
  memoryMib?: number;
  vcpus?: number;
  /** Its root disk (default: 4x the archive + 1 GiB, at least 2 GiB). */
  diskMib?: number;
  /** false: the image's Entrypoint/Cmd never runs (by default it does when it exposes a port). */
  start?: boolean;
  /** A pull's credentials: a secret of yours ("user:password" or a token) naming the registry. */
  registrySecret?: string;
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
/** A tenant secret as answered: never its value. */
export interface SecretInfo {
  name: string;
  hosts: string[];
  /** Bumped by each rotation of the value. */
  version: number;
  createdAtMs: number;
  updatedAtMs: number;
  expiresAtMs: number | null;
  /** Where the value may go: "headers", and opted in "query", "body". */
  injectInto: string[];
  allowPlainHttp: boolean;
}

/** One entry of a sandbox's egress log (`Sandbox.egressLog`). */
export interface EgressEntry {
  seq: number;
  timestampMs: number;
  kind: "dns" | "connection";
  verdict: "allowed" | "denied";
  /** Why it was denied: policy, reserved, internal; DNS also rate_limit, unique_names, malformed. */
  reason: string | null;
  /** DNS: the question; a connection: the name the sandbox's resolver answered with its address. */
  name: string | null;
  /** DNS: the query type (A, AAAA, ...). */
  type: string | null;
  /** DNS: the IPv4 addresses answered. */
  answers: string[];
  protocol: string | null;
  destination: string | null;
  port: number | null;
  /** An allowed connection's bytes each way, once it ended (endedMs). */
  bytesOut: number | null;
  bytesIn: number | null;
  endedMs: number | null;
}

export interface EgressLogPage {
  entries: EgressEntry[];
  /** The cursor for the next page (`after`). */
  nextAfter: number;
  /** Entries evicted (the daemon keeps the newest 1,000 per sandbox). */
  dropped: number;
  /** Events the host's kernel dropped before the daemon read them. */
  lost: number;
}

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
  /** While hibernated: "local" once a synced copy is on the host's data disk (it survives a
   * reboot), "remote" once it is in the host's object store too (it survives the loss of that
   * disk), "none" before. */
  durable?: "none" | "local" | "remote";
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
  /** The name it was taken with (absent: none); current: the newest with that name (what the name stands for). */
  name?: string;
  current: boolean;
  /** "remote": also in the host's object store (it survives the loss of the host's disk); "local": a synced copy is on the host's data disk (it survives a reboot); "none": on tmpfs only, until that copy is made in the background. */
  durable: "none" | "local" | "remote";
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
