// The resources beside sandboxes: templates, volumes, managed databases, secrets.
import { PandaStackError, TemplateBuildFailedError } from "./errors.js";
import { Http, type Json } from "./http.js";
import { sid } from "./sandbox.js";
import type {
  ClientOptions, DatabaseBackup, DatabaseInfo, SecretInfo, TemplateBuildOptions, TemplateImageOptions, TemplateInfo, BuildProgress, VolumeCreateOptions,
  VolumeInfo, VolumeMount, VolumeSnapshotInfo,
} from "./types.js";

function volumeInfo(b: Json): VolumeInfo {
  return {
    id: b.id, name: b.name ?? "", status: b.status, sizeMib: b.size_mib, createdAtMs: b.created_at_ms,
    metadata: b.metadata ?? {},
    attachments: (b.attachments ?? []).map((a: Json) => ({ sandbox: a.sandbox, mount: a.mount, readOnly: !!a.read_only })),
    snapshots: (b.snapshots ?? []).map(volumeSnapshotInfo),
    origin: b.origin ?? "",
    ...(b.durable ? { durable: b.durable } : {}),
  };
}

function volumeSnapshotInfo(s: Json): VolumeSnapshotInfo {
  return { id: s.id, volume: s.volume, sizeMib: s.size_mib, createdAtMs: s.created_at_ms };
}

// {volume, mount, read_only} from {volume: id | Volume, mount, readOnly}.
export function volumeBody(v: VolumeMount): Json {
  const id = typeof v.volume === "string" ? v.volume : v.volume?.id;
  const out: Json = { volume: id, mount: v.mount };
  if (v.readOnly !== undefined) out.read_only = !!v.readOnly;
  return out;
}

export function templateInfo(t: Json): TemplateInfo {
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
    const body: Json = { name, packages: opts.packages ?? [], network: opts.network ?? true };
    if (opts.dockerfile !== undefined) {
      Object.assign(body, {
        dockerfile: opts.dockerfile, context: opts.context ?? {}, build_args: opts.buildArgs ?? {},
      });
    } else {
      Object.assign(body, {
        from: opts.from ?? "base", files: opts.files ?? {}, run: opts.run ?? [], env: opts.env ?? {},
      });
    }
    if (opts.memoryMib !== undefined) body.memory_mib = opts.memoryMib;
    if (opts.vcpus !== undefined) body.vcpus = opts.vcpus;
    await http.json("POST", "/v1/templates", { json: body });
    return Template.follow(http, name, opts.onProgress);
  }
  /** Uploads a Dockerfile build's context: a tar's bytes (plain or gzip). Its key
   * ("sha256:..."), for build({dockerfile, context}); kept for your builds (the least recently
   * used go first). */
  static async uploadContext(archive: Uint8Array, opts: ClientOptions = {}): Promise<string> {
    const http = new Http(opts);
    const r = await http.json("POST", "/v1/build-contexts", { body: archive });
    return r.context as string;
  }
  /** Pulls `image` ("python:3.12-slim", "ghcr.io/org/app:1", ...) from its registry and
   * imports it as template `name`, waiting for it. */
  static async pull(name: string, image: string, opts: TemplateImageOptions = {}): Promise<Template> {
    const http = new Http(opts);
    const body: Json = { name, image, network: opts.network ?? true, start: opts.start === false ? "none" : "auto" };
    if (opts.memoryMib !== undefined) body.memory_mib = opts.memoryMib;
    if (opts.vcpus !== undefined) body.vcpus = opts.vcpus;
    if (opts.diskMib !== undefined) body.disk_mib = opts.diskMib;
    if (opts.registrySecret !== undefined) body.registry_secret = opts.registrySecret;
    await http.json("POST", "/v1/templates", { json: body });
    return Template.follow(http, name, opts.onProgress);
  }
  /** Imports an image archive (`docker save IMAGE`, or an OCI image layout tar: its bytes) as
   * template `name`, waiting for it. */
  static async importImage(name: string, archive: Uint8Array, opts: TemplateImageOptions = {}): Promise<Template> {
    const http = new Http(opts);
    const query: Record<string, string | number> = {
      network: String(opts.network ?? true), start: String(opts.start ?? true),
    };
    if (opts.memoryMib !== undefined) query.memory_mib = opts.memoryMib;
    if (opts.vcpus !== undefined) query.vcpus = opts.vcpus;
    if (opts.diskMib !== undefined) query.disk_mib = opts.diskMib;
    await http.json("PUT", `/v1/templates/${sid(name)}/image`, { body: archive, query });
    return Template.follow(http, name, opts.onProgress);
  }
  /** @internal A build's (or import's) progress until it ends. */
  static async follow(http: Http, name: string, onProgress?: (p: BuildProgress) => void): Promise<Template> {
    const opts = { onProgress };
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

function secretInfo(b: Json): SecretInfo {
  return {
    name: b.name, hosts: b.hosts ?? [], version: b.version, createdAtMs: b.created_at_ms,
    updatedAtMs: b.updated_at_ms, expiresAtMs: b.expires_at_ms ?? null,
    injectInto: b.inject_into ?? ["headers"], allowPlainHttp: b.allow_plain_http ?? false,
  };
}

/** Tenant secrets: a value and the hosts it may be sent to. The value goes in and never comes
 * back. A sandbox created with `secrets: [name]` holds a placeholder; its egress proxy puts the
 * value into HTTPS request headers to the hosts (opted in: `injectInto: ["headers", "query",
 * "body"]`, `allowPlainHttp`). */
export class Secrets {
  static async create(name: string, value: string, hosts: string[], opts: ClientOptions & { ttlSeconds?: number; injectInto?: string[]; allowPlainHttp?: boolean } = {}): Promise<SecretInfo> {
    const json: Json = { name, value, hosts };
    if (opts.ttlSeconds !== undefined) json.ttl_seconds = opts.ttlSeconds;
    if (opts.injectInto !== undefined) json.inject_into = opts.injectInto;
    if (opts.allowPlainHttp !== undefined) json.allow_plain_http = opts.allowPlainHttp;
    return secretInfo(await new Http(opts).json("POST", "/v1/secrets", { json }));
  }
  static async list(opts: ClientOptions = {}): Promise<SecretInfo[]> {
    return (await new Http(opts).json("GET", "/v1/secrets")).secrets.map(secretInfo);
  }
  static async get(name: string, opts: ClientOptions = {}): Promise<SecretInfo> {
    return secretInfo(await new Http(opts).json("GET", `/v1/secrets/${encodeURIComponent(name)}`));
  }
  /** Rotates the value (version + 1) and/or replaces hosts or the expiry. */
  static async update(name: string, change: { value?: string; hosts?: string[]; ttlSeconds?: number; injectInto?: string[]; allowPlainHttp?: boolean }, opts: ClientOptions = {}): Promise<SecretInfo> {
    const json: Json = {};
    if (change.injectInto !== undefined) json.inject_into = change.injectInto;
    if (change.allowPlainHttp !== undefined) json.allow_plain_http = change.allowPlainHttp;
    if (change.value !== undefined) json.value = change.value;
    if (change.hosts !== undefined) json.hosts = change.hosts;
    if (change.ttlSeconds !== undefined) json.ttl_seconds = change.ttlSeconds;
    return secretInfo(await new Http(opts).json("PATCH", `/v1/secrets/${encodeURIComponent(name)}`, { json }));
  }
  static async delete(name: string, opts: ClientOptions = {}): Promise<void> {
    await new Http(opts).call("DELETE", `/v1/secrets/${encodeURIComponent(name)}`);
  }
}
