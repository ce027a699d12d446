// PandaStack SDK for Node.js (>= 18): ESM, no runtime dependencies (the platform's fetch).
//
//   import { Sandbox } from "@pandastack/sdk";
//   const sbx = await Sandbox.create();          // PANDASTACK_API_KEY, PANDASTACK_BASE_URL
//   console.log((await sbx.exec("echo hi")).stdout);
//   await sbx.kill();

const DEFAULT_BASE_URL = "http://127.0.0.1:7070";

/** An error answered by the API: `code` is the API's machine-readable code. */
export class PandaStackError extends Error {
  constructor(message, code = "error", status = 0) {
    super(`${code}: ${message}`);
    this.name = "PandaStackError";
    this.code = code;
    this.status = status;
  }
}
export class SandboxNotFoundError extends PandaStackError {}
export class SandboxHibernatedError extends PandaStackError {}
export class SandboxStoppedError extends PandaStackError {}
export class FileNotFoundError extends PandaStackError {}
export class InvalidArgumentError extends PandaStackError {}
export class UnauthorizedError extends PandaStackError {}
export class RateLimitedError extends PandaStackError {}
export class TimeoutError extends PandaStackError {}
export class ConnectionError extends PandaStackError {}

const BY_CODE = {
  sandbox_not_found: SandboxNotFoundError,
  sandbox_hibernated: SandboxHibernatedError,
  sandbox_stopped: SandboxStoppedError,
  sandbox_failed: SandboxStoppedError,
  file_not_found: FileNotFoundError,
  invalid_json: InvalidArgumentError,
  invalid_argument: InvalidArgumentError,
  invalid_path: InvalidArgumentError,
  unauthorized: UnauthorizedError,
  too_many_execs: RateLimitedError,
  too_many_requests: RateLimitedError,
  timeout: TimeoutError,
  connection_error: ConnectionError,
};

function errorFor(code, message, status) {
  const Cls = BY_CODE[code] ?? PandaStackError;
  const e = new Cls(message, code, status);
  e.name = Cls.name;
  return e;
}

function config(opts = {}) {
  const apiKey = opts.apiKey ?? process.env.PANDASTACK_API_KEY ?? "";
  if (!apiKey) throw errorFor("unauthorized", "no API key: pass apiKey or set PANDASTACK_API_KEY", 0);
  const baseUrl = (opts.baseUrl ?? process.env.PANDASTACK_BASE_URL ?? DEFAULT_BASE_URL).replace(/\/+$/, "");
  return { apiKey, baseUrl };
}

class Http {
  constructor(opts) {
    const { apiKey, baseUrl } = config(opts);
    this.baseUrl = baseUrl;
    this.headers = { Authorization: `Bearer ${apiKey}`, "User-Agent": "pandastack-js/0.1" };
  }

  async call(method, path, { json, body, query, signal } = {}) {
    const url = new URL(this.baseUrl + path);
    for (const [k, v] of Object.entries(query ?? {})) url.searchParams.set(k, String(v));
    const headers = { ...this.headers };
    if (json !== undefined) headers["Content-Type"] = "application/json";
    let res;
    try {
      res = await fetch(url, {
        method,
        headers,
        body: json !== undefined ? JSON.stringify(json) : body,
        signal,
      });
    } catch (e) {
      if (e?.name === "AbortError") throw e;
      throw errorFor("connection_error", `cannot reach the PandaStack daemon: ${e?.cause?.message ?? e}`, 0);
    }
    if (res.status >= 300) {
      let code = "http_error";
      let message = `HTTP ${res.status}`;
      try {
        const err = (await res.json()).error;
        code = err.code;
        message = err.message;
      } catch {}
      throw errorFor(code, message, res.status);
    }
    return res;
  }

  async json(method, path, opts) {
    const res = await this.call(method, path, opts);
    return res.status === 204 ? null : res.json();
  }

  /** Server-sent events of an exec or process stream, as ExecEvents. */
  async *sse(method, path, opts) {
    const res = await this.call(method, path, opts);
    const decoder = new TextDecoder();
    let buf = "";
    let event = "";
    for await (const chunk of res.body) {
      buf += decoder.decode(chunk, { stream: true });
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).replace(/\r$/, "");
        buf = buf.slice(nl + 1);
        if (line.startsWith("event: ")) event = line.slice(7);
        else if (line.startsWith("data: ")) {
          yield toEvent(event, JSON.parse(line.slice(6)));
          event = "";
        }
      }
    }
  }
}

function decode(data, encoding) {
  return encoding === "base64" ? Buffer.from(data, "base64") : Buffer.from(data, "utf8");
}

function toEvent(kind, d) {
  if (kind === "stdout" || kind === "stderr") {
    const data = decode(d.data ?? "", d.encoding);
    return { kind, data, text: data.toString("utf8") };
  }
  if (kind === "exit") return { kind, exitCode: d.exit_code, timedOut: !!d.timed_out };
  return { kind: "error", code: d.code, message: d.message };
}

function execBody(cmd, o = {}) {
  const body = typeof cmd === "string" ? { cmd } : { argv: [...cmd] };
  if (o.timeoutSeconds !== undefined) body.timeout_seconds = o.timeoutSeconds;
  if (o.env) body.env = o.env;
  if (o.cwd) body.cwd = o.cwd;
  if (o.stdin !== undefined) body.stdin = String(o.stdin);
  return body;
}

function result(stdout, stderr, exitCode, timedOut, durationMs = 0) {
  return {
    stdout: stdout.toString("utf8"),
    stderr: stderr.toString("utf8"),
    stdoutBytes: stdout,
    stderrBytes: stderr,
    exitCode,
    timedOut,
    durationMs,
  };
}

class Files {
  constructor(sbx) { this.s = sbx; }
  #p(sub = "") { return `/v1/sandboxes/${this.s.id}/files${sub}`; }
  /** Writes a whole file (parents are created). */
  async write(path, data) {
    await this.s.http.call("PUT", this.#p(), { query: { path }, body: typeof data === "string" ? data : Buffer.from(data) });
  }
  /** Reads a whole file as bytes. */
  async read(path) {
    const res = await this.s.http.call("GET", this.#p(), { query: { path } });
    return Buffer.from(await res.arrayBuffer());
  }
  /** Reads a whole file as text. */
  async readText(path) { return (await this.read(path)).toString("utf8"); }
  /** The entries of a folder. */
  async list(path) { return (await this.s.http.json("GET", this.#p("/list"), { query: { path } })).entries.map(fileInfo); }
  /** One path's type, size, mode and modification time. */
  async stat(path) { return fileInfo(await this.s.http.json("GET", this.#p("/stat"), { query: { path } })); }
  /** Removes a file or (recursive) a folder. */
  async remove(path, { recursive = false } = {}) {
    await this.s.http.call("DELETE", this.#p(), { query: recursive ? { path, recursive: 1 } : { path } });
  }
  /** Makes a folder (with parents). */
  async mkdir(path, { parents = true } = {}) { await this.s.http.call("POST", this.#p("/mkdir"), { json: { path, parents } }); }
  /** Renames a path. */
  async rename(from, to) { await this.s.http.call("POST", this.#p("/rename"), { json: { from, to } }); }
}

function fileInfo(e) {
  return { name: e.name, type: e.type, size: e.size, mode: e.mode, mtimeMs: e.mtime_ms, isDir: e.type === "directory" };
}

class Processes {
  constructor(sbx) { this.s = sbx; }
  /** Starts a background command; resolves to its pid. */
  async start(cmd, opts = {}) {
    return (await this.s.http.json("POST", `/v1/sandboxes/${this.s.id}/processes`, { json: execBody(cmd, opts) })).pid;
  }
  /** Running and recently exited background processes. */
  async list() {
    const r = await this.s.http.json("GET", `/v1/sandboxes/${this.s.id}/processes`);
    return r.processes.map((p) => ({ pid: p.pid, command: p.command, running: p.running, exitCode: p.exit_code, startedAtMs: p.started_at_ms }));
  }
  /** Signals the process's group (default SIGKILL). */
  async kill(pid, signal) {
    await this.s.http.call("DELETE", `/v1/sandboxes/${this.s.id}/processes/${pid}`, { query: signal ? { signal } : {} });
  }
  /** Its output from the start, then live, then the exit event. */
  stream(pid, { signal } = {}) { return this.s.http.sse("GET", `/v1/sandboxes/${this.s.id}/processes/${pid}/stream`, { signal }); }
}

function info(b) {
  return {
    id: b.id, template: b.template, state: b.state, createdAtMs: b.created_at_ms, expiresAtMs: b.expires_at_ms,
    persistent: b.persistent, metadata: b.metadata ?? {}, parent: b.parent ?? null, snapshots: b.snapshots ?? [],
    network: !!b.network, egress: b.egress ?? null, autoWake: !!b.auto_wake, ttlSeconds: b.ttl_seconds ?? 0,
    idleTimeoutSeconds: b.idle_timeout_seconds ?? 0, onTimeout: b.on_timeout ?? "kill",
  };
}

function portInfo(p) {
  return { port: p.port, host: p.host, hostPort: p.host_port ?? null, address: p.address ?? null };
}

// {mode, cidrs}: an allowlist when only CIDRs are given.
function egressBody(mode, allow) {
  const cidrs = allow ?? [];
  return { mode: mode ?? (cidrs.length ? "allowlist" : "deny_all"), cidrs };
}

/** A PandaStack sandbox (a microVM), driven through the REST API. */
export class Sandbox {
  constructor(sandboxInfo, http) {
    this.info = sandboxInfo;
    this.http = http;
    this.files = new Files(this);
    this.filesystem = this.files;
    this.process = new Processes(this);
  }

  /** Creates a sandbox (restored from its template's snapshot) and resolves when it runs. */
  static async create(opts = {}) {
    const http = new Http(opts);
    const body = { template: opts.template ?? "base", persistent: !!opts.persistent, auto_wake: !!opts.autoWake };
    if (opts.ttlSeconds !== undefined) body.ttl_seconds = opts.ttlSeconds;
    if (opts.metadata) body.metadata = opts.metadata;
    if (opts.fromSnapshot) { body.from_snapshot = opts.fromSnapshot; delete body.template; }
    if (opts.network !== undefined) body.network = !!opts.network;
    if (opts.egress !== undefined || opts.allow) body.egress = egressBody(opts.egress, opts.allow);
    if (opts.idleTimeoutSeconds !== undefined) body.idle_timeout_seconds = opts.idleTimeoutSeconds;
    if (opts.onTimeout !== undefined) body.on_timeout = opts.onTimeout;
    return new Sandbox(info(await http.json("POST", "/v1/sandboxes", { json: body })), http);
  }
  /** An existing sandbox of this key's tenant. */
  static async get(id, opts = {}) {
    const http = new Http(opts);
    return new Sandbox(info(await http.json("GET", `/v1/sandboxes/${id}`)), http);
  }
  /** This tenant's sandboxes, filtered by state and metadata. */
  static async list(opts = {}) {
    const http = new Http(opts);
    const query = {};
    if (opts.state) query.state = opts.state;
    for (const [k, v] of Object.entries(opts.metadata ?? {})) query[`metadata.${k}`] = v;
    return (await http.json("GET", "/v1/sandboxes", { query })).sandboxes.map(info);
  }
  /** Deletes one of this tenant's snapshots: creates from it fail afterwards (code snapshot_not_found); sandboxes created from it run on. */
  static async deleteSnapshot(snapshotId, opts = {}) {
    const http = new Http(opts);
    await http.call("DELETE", `/v1/snapshots/${encodeURIComponent(snapshotId)}`);
  }

  get id() { return this.info.id; }
  get state() { return this.info.state; }

  async #post(action, json) { return this.http.json("POST", `/v1/sandboxes/${this.id}/${action}`, { json }); }

  /** Runs a command (shell string or argv array) to completion. `signal` aborts it: the
   * command is killed in the guest. */
  async exec(cmd, opts = {}) {
    if (!opts.signal) {
      const r = await this.#post("exec", execBody(cmd, opts));
      return result(decode(r.stdout, r.stdout_encoding), decode(r.stderr, r.stderr_encoding), r.exit_code, r.timed_out, r.duration_ms);
    }
    // With a signal: over the stream, whose hang-up kills the command.
    const out = [], err = [];
    for await (const ev of this.execStream(cmd, opts)) {
      if (ev.kind === "stdout") out.push(ev.data);
      else if (ev.kind === "stderr") err.push(ev.data);
      else if (ev.kind === "exit") return result(Buffer.concat(out), Buffer.concat(err), ev.exitCode, ev.timedOut);
      else throw errorFor(ev.code, ev.message, 0);
    }
    throw errorFor("internal", "the command's stream ended without an exit event", 0);
  }
  /** Runs a command; yields stdout/stderr events as they come, then the exit event. */
  execStream(cmd, opts = {}) {
    return this.http.sse("POST", `/v1/sandboxes/${this.id}/exec/stream`, { json: execBody(cmd, opts), signal: opts.signal });
  }

  /** Snapshots the running sandbox; resolves to the snapshot id. */
  async snapshot() { return (await this.#post("snapshots")).snapshot_id; }
  /** `count` copies of the running sandbox; it keeps running. */
  /** fork(): one copy of the running sandbox (a Sandbox); fork(count): a list of `count`. */
  async fork(count) {
    const kids = (await this.#post("fork", { count: count ?? 1 })).sandboxes.map((k) => new Sandbox(info(k), this.http));
    return count === undefined ? kids[0] : kids;
  }
  /** Saves the sandbox to disk and stops its VM. */
  async hibernate() { this.info = info(await this.#post("hibernate")); }
  /** Restores a hibernated sandbox. */
  async wake() { this.info = info(await this.#post("wake")); }
  /** Sets the time to live from now. */
  /** Forwards guest TCP `port` from the host: resolves to {port, host, hostPort, address}. */
  async exposePort(port) {
    return portInfo(await this.http.json("POST", `/v1/sandboxes/${this.id}/ports`, { json: { port } }));
  }
  /** Stops forwarding guest `port`. */
  async unexposePort(port) { await this.http.json("DELETE", `/v1/sandboxes/${this.id}/ports/${Number(port)}`); }
  /** Exposed guest ports and their host addresses (hostPort null while the sandbox is not running). */
  async ports() { return (await this.http.json("GET", `/v1/sandboxes/${this.id}/ports`)).ports.map(portInfo); }
  /** Replaces the egress policy: "deny_all", "allow_all", or an allowlist of IPv4 CIDRs. */
  async setEgress(mode, allow) {
    this.info = info(await this.http.json("PATCH", `/v1/sandboxes/${this.id}`, { json: { egress: egressBody(mode, allow) } }));
  }
  async setTtl(ttlSeconds) { this.info = info(await this.http.json("PATCH", `/v1/sandboxes/${this.id}`, { json: { ttl_seconds: ttlSeconds } })); }
  /** Stops the sandbox. */
  async kill() { this.info = info(await this.http.json("DELETE", `/v1/sandboxes/${this.id}`)); }
  /** The sandbox's audit events. */
  async events() { return (await this.http.json("GET", `/v1/sandboxes/${this.id}/events`)).events; }
  /** Reads the current info. */
  async refresh() { this.info = info(await this.http.json("GET", `/v1/sandboxes/${this.id}`)); return this.info; }

  /** `await using sbx = await Sandbox.create()` kills the sandbox at the end of the scope. */
  async [Symbol.asyncDispose ?? Symbol.for("Symbol.asyncDispose")]() {
    try { await this.kill(); } catch (e) { if (!(e instanceof PandaStackError)) throw e; }
  }
}
