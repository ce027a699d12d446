// @pandastack/sdk against a real daemon (PANDASTACKD, PANDASTACK_IMAGES): `node --test test/`.
import { test } from "node:test";
import assert from "node:assert/strict";
import { rmSync } from "node:fs";
import { createHash } from "node:crypto";
import { join } from "node:path";
import { useDaemon } from "./daemon.mjs";
import {
  Sandbox, SandboxNotFoundError, SandboxHibernatedError, FileNotFoundError, InvalidArgumentError,
  UnauthorizedError, ConnectionError, SandboxStoppedError, Volume, VolumeInUseError,
  VolumeAttachedError, VolumeNotFoundError, Database, DatabaseNotFoundError, BackupNotFoundError, ConflictError,
  Secrets, Template, TemplateBuildFailedError, TemplateNotFoundError, ExceedsTemplateError,
} from "../dist/index.js";

useDaemon();

async function guestCount(sbx, marker) {
  const r = await sbx.exec(`cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c '[${marker[0]}]${marker.slice(1)}'`);
  return Number(r.stdout.trim() || 0);
}

test("commands, streams, files, processes", async () => {
  const sbx = await Sandbox.create({ metadata: { suite: "ts" } });
  try {
    const r = await sbx.exec("echo hi; echo err >&2; exit 4");
    assert.deepEqual([r.stdout, r.stderr, r.exitCode, r.timedOut], ["hi\n", "err\n", 4, false]);
    const a = await sbx.exec(["sh", "-c", "cat; echo $X; pwd"], { stdin: "in\n", env: { X: "y" }, cwd: "/tmp" });
    assert.equal(a.stdout, "in\ny\n/tmp\n");
    const kinds = [];
    for await (const ev of sbx.execStream("echo a; sleep 0.2; echo b >&2")) kinds.push(ev.kind === "exit" ? `exit:${ev.exitCode}` : `${ev.kind}:${ev.text}`);
    assert.deepEqual(kinds, ["stdout:a\n", "stderr:b\n", "exit:0"]);
    await sbx.files.write("/tmp/t/f.txt", "content");
    assert.equal(await sbx.files.readText("/tmp/t/f.txt"), "content");
    await sbx.files.rename("/tmp/t/f.txt", "/tmp/t/g.txt");
    assert.deepEqual((await sbx.files.list("/tmp/t")).map((e) => e.name), ["g.txt"]);
    assert.equal((await sbx.files.stat("/tmp/t/g.txt")).size, 7);
    const watch = await sbx.files.watch("/tmp/t", { recursive: true });
    await sbx.exec("mkdir /tmp/t/sub; echo x > /tmp/t/sub/w.txt");
    const changes = [];
    for await (const c of watch) {
      changes.push(`${c.type} ${c.name} ${c.isDir}`);
      if (c.name === "sub/w.txt") break;
    }
    watch.stop();
    assert.deepEqual(changes.slice(0, 2), ["create sub true", "create sub/w.txt false"]);
    await assert.rejects(sbx.files.watch("/tmp/no-folder"), FileNotFoundError);
    await sbx.files.remove("/tmp/t", { recursive: true });
    await assert.rejects(sbx.files.read("/tmp/t/g.txt"), FileNotFoundError);
    await assert.rejects(sbx.files.read("/tmp/../etc/passwd"), InvalidArgumentError);
    // Files over the server's 64 MiB per request go in and out in parts.
    const big = Buffer.alloc(80 * 1024 * 1024);
    for (let i = 0; i < big.length; i += 4096) big.writeUInt32LE(i, i);
    await sbx.files.write("/tmp/big.bin", big);
    assert.equal((await sbx.files.stat("/tmp/big.bin")).size, big.length);
    assert.ok((await sbx.files.read("/tmp/big.bin")).equals(big));
    await sbx.files.remove("/tmp/big.bin");
    const pid = await sbx.process.start("echo bg; sleep 0.2");
    assert.ok((await sbx.process.list()).some((p) => p.pid === pid));
    let out = "";
    for await (const ev of sbx.process.stream(pid)) if (ev.kind === "stdout") out += ev.text;
    assert.equal(out, "bg\n");
    assert.ok((await Sandbox.list({ metadata: { suite: "ts" } })).some((s) => s.id === sbx.id));
  } finally {
    await sbx.kill();
  }
});

test("runCode keeps state between runs", async () => {
  const sbx = await Sandbox.create();
  try {
    const r = await sbx.runCode("x = 41\nprint('hi')\nx + 1");
    assert.equal(r.stdout, "hi\n");
    assert.equal(r.text, "42");
    assert.equal(r.error, undefined);
    assert.equal((await sbx.runCode("x")).text, "41");
    assert.equal((await sbx.runCode("1/0")).error.name, "ZeroDivisionError");
    const ctx = await sbx.createCodeContext({ cwd: "/tmp" });
    assert.equal((await sbx.runCode("'x' in globals()", { context: ctx })).text, "False");
    assert.ok((await sbx.codeContexts()).includes(ctx));
    await sbx.deleteCodeContext(ctx);
  } finally {
    await sbx.kill();
  }
});

test("aborting an exec kills the command in the guest", async () => {
  const sbx = await Sandbox.create();
  try {
    const ac = new AbortController();
    const running = sbx.exec("echo up; exec sleep 308", { signal: ac.signal });
    for (let i = 0; i < 50 && (await guestCount(sbx, "sleep.308")) === 0; i++) await new Promise((r) => setTimeout(r, 200));
    assert.equal(await guestCount(sbx, "sleep.308"), 1);
    ac.abort();
    await assert.rejects(running, (e) => e.name === "AbortError");
    for (let i = 0; i < 50 && (await guestCount(sbx, "sleep.308")) > 0; i++) await new Promise((r) => setTimeout(r, 300));
    assert.equal(await guestCount(sbx, "sleep.308"), 0);
  } finally {
    await sbx.kill();
  }
});

test("lifecycle, disposal and typed errors", async () => {
  const sbx = await Sandbox.create({ persistent: true });
  await sbx.exec("echo 7 > /tmp/n");
  const [kid] = await sbx.fork(1);
  assert.equal((await kid.exec("cat /tmp/n")).stdout, "7\n");
  const single = await sbx.fork();  // no count: one Sandbox, not a list
  assert.ok(single instanceof Sandbox);
  assert.equal((await single.exec("cat /tmp/n")).stdout, "7\n");
  await single.kill();
  await kid[Symbol.asyncDispose ?? Symbol.for("Symbol.asyncDispose")]();  // what `await using` calls
  assert.equal((await Sandbox.get(kid.id)).state, "stopped");
  const snap = await sbx.snapshot();
  const copy = await Sandbox.create({ fromSnapshot: snap });
  assert.equal((await copy.exec("cat /tmp/n")).stdout, "7\n");
  await copy.kill();
  await Sandbox.deleteSnapshot(snap);
  await assert.rejects(Sandbox.create({ fromSnapshot: snap }), (e) => e.code === "snapshot_not_found");
  await sbx.hibernate();
  await assert.rejects(sbx.exec("true"), SandboxHibernatedError);
  await sbx.wake();
  assert.equal((await sbx.exec("cat /tmp/n")).stdout, "7\n");
  // A name stands for the newest snapshot taken with it.
  const named = await sbx.snapshot("nightly");
  const byName = await Sandbox.create({ fromSnapshot: "nightly" });
  assert.equal((await byName.exec("cat /tmp/n")).stdout, "7\n");
  await byName.kill();
  await Sandbox.deleteSnapshot(named);
  // Only the disk: the wake boots afresh on it (/tmp, a tmpfs, is gone).
  await sbx.exec("echo d > /root/d");
  await sbx.hibernate({ memory: false });
  assert.equal(sbx.info.state, "hibernated");
  await sbx.wake();
  assert.equal((await sbx.exec("cat /root/d; test -e /tmp/n || echo gone")).stdout, "d\ngone\n");
  await sbx.setTtl(600);
  assert.ok((await sbx.events()).length >= 8);
  await sbx.kill();
  await assert.rejects(sbx.exec("true"), SandboxStoppedError);
  await assert.rejects(Sandbox.get("sbx_doesnotexist000000"), (e) => e instanceof SandboxNotFoundError && e.status === 404 && e.code === "sandbox_not_found");
  await assert.rejects(Sandbox.list({ apiKey: "pds_wrong" }), UnauthorizedError);
  await assert.rejects(Sandbox.list({ baseUrl: "http://127.0.0.1:9" }), ConnectionError);
});

test("bytes in, exact errors, files helpers, long commands", async () => {
  const { mkdtempSync: mk, writeFileSync, readFileSync } = await import("node:fs");
  const {
    TemplateNotFoundError, SnapshotNotFoundError, IsADirectoryError, CommandNotFoundError,
    InvalidCwdError,
  } = await import("../dist/index.js");
  const sbx = await Sandbox.create();
  try {
    // Binary stdin arrives unchanged; a fractional timeout rounds up.
    const od = await sbx.exec("od -An -tx1 | tr -d ' \\n'", { stdin: new Uint8Array([1, 2, 255]), timeoutSeconds: 1.5 });
    assert.equal(od.stdout, "0102ff");
    // Signal 0 is not "no signal": the API refuses it, nothing is killed.
    const pid = await sbx.process.start("sleep 30");
    await assert.rejects(sbx.process.kill(pid, 0), InvalidArgumentError);
    assert.ok((await sbx.process.list()).find((p) => p.pid === pid).running);
    // The caller's mistakes have their own classes.
    await assert.rejects(sbx.exec(["/no/such/binary"]), CommandNotFoundError);
    await assert.rejects(sbx.exec("pwd", { cwd: "/nope" }), InvalidCwdError);
    await assert.rejects(sbx.files.read("/workspace"), IsADirectoryError);
    await assert.rejects(Sandbox.create({ template: "no-such-template" }), TemplateNotFoundError);
    await assert.rejects(Sandbox.create({ fromSnapshot: "snap_nope" }), SnapshotNotFoundError);
    await assert.rejects(Sandbox.get(""), InvalidArgumentError);
    // Files: mode, exists, upload, download; metadata.
    await sbx.files.write("/workspace/run.sh", "#!/bin/sh\necho ran\n", { mode: 0o755 });
    assert.equal((await sbx.exec("/workspace/run.sh")).stdout, "ran\n");
    assert.equal(await sbx.files.exists("/workspace/run.sh"), true);
    assert.equal(await sbx.files.exists("/workspace/none"), false);
    const dir = mk("/dev/shm/pst-ts-files-");
    writeFileSync(join(dir, "up.bin"), Buffer.from([0, 1, 2, 3]));
    await sbx.files.upload(join(dir, "up.bin"), "/workspace/up.bin");
    await sbx.files.download("/workspace/up.bin", join(dir, "down.bin"));
    assert.deepEqual([...readFileSync(join(dir, "down.bin"))], [0, 1, 2, 3]);
    rmSync(dir, { recursive: true, force: true });
    await sbx.setMetadata({ stage: "two" });
    assert.deepEqual(sbx.info.metadata, { stage: "two" });
    // Output past 16 MiB says so; a long timeout goes over the stream and still answers.
    const big = await sbx.exec("head -c 17000000 /dev/zero | tr '\\0' a");
    assert.equal(big.stdout.length, 16 << 20);
    assert.equal(big.stdoutTruncated, true);
    const long = await sbx.exec("echo long", { timeoutSeconds: 400 });
    assert.deepEqual([long.stdout, long.exitCode, long.stdoutTruncated], ["long\n", 0, false]);
    // Snapshots are listed.
    const snap = await sbx.snapshot();
    const listed = (await Sandbox.listSnapshots()).find((x) => x.id === snap);
    assert.equal(listed.sandbox, sbx.id);
    assert.ok(listed.memoryBytes > 0);
    assert.ok(["none", "local"].includes(listed.durable), listed.durable);  // copied in the background
    await Sandbox.deleteSnapshot(snap);
    // A stream the sandbox's kill ends throws, not a quiet end.
    const stream = sbx.execStream("echo started; sleep 30");
    const killer = setTimeout(() => sbx.kill(), 1500);
    await assert.rejects((async () => { for await (const ev of stream) void ev; })(), SandboxStoppedError);
    clearTimeout(killer);
  } finally {
    await sbx.kill().catch(() => {});
  }
});

test("volumes outlive sandboxes; read-write is exclusive", async () => {
  const vol = await Volume.create({ sizeMib: 32, name: "ts", metadata: { suite: "ts" } });
  assert.equal(vol.info.sizeMib, 32);
  assert.ok((await Volume.list({ metadata: { suite: "ts" } })).some((v) => v.id === vol.id));
  const a = await Sandbox.create({ volumes: [{ volume: vol, mount: "/data" }] });
  assert.deepEqual(a.info.volumes, [{ volume: vol.id, mount: "/data", readOnly: false }]);
  await a.exec("echo ts > /data/f && sync");
  await assert.rejects(Sandbox.create({ volumes: [{ volume: vol.id, mount: "/x", readOnly: true }] }), VolumeInUseError);
  await assert.rejects(vol.delete(), VolumeAttachedError);
  await a.kill();
  const b = await Sandbox.create({ volumes: [{ volume: vol.id, mount: "/ro", readOnly: true }] });
  assert.equal((await b.exec("cat /ro/f")).stdout, "ts\n");
  await b.kill();
  assert.equal((await vol.update({ sizeMib: 40 })).sizeMib, 40);
  const snap = await vol.snapshot();
  assert.deepEqual((await vol.snapshots()).map((s) => s.id), [snap.id]);
  const copy = await Volume.create({ fromSnapshot: snap });
  assert.equal(copy.info.origin, `volume-snapshot:${snap.id}:${vol.id}`);
  assert.equal(copy.info.sizeMib, 40);
  await copy.delete();
  await vol.deleteSnapshot(snap);
  await vol.delete();
  await assert.rejects(Volume.get(vol.id), VolumeNotFoundError);
});

test("databases: typed errors (this daemon runs without networking; psycopg2 covers the rest)", async () => {
  await assert.rejects(Database.get("db_aaaaaaaaaaaaaaaa"), DatabaseNotFoundError);
  await assert.rejects(Database.create({ name: "copy", fromBackup: "bk_aaaaaaaaaaaaaaaa" }), BackupNotFoundError);
  await assert.rejects(Database.create({ name: "shop" }), (e) => e instanceof ConflictError && e.code === "network_disabled");
  assert.deepEqual(await Database.list(), []);
});

test("previews and the egress log: refused without a network, listed empty, a missing one typed", async () => {
  const sbx = await Sandbox.create();
  await assert.rejects(sbx.preview(8000, { ttlSeconds: 60 }), (e) => e instanceof ConflictError && e.code === "network_disabled");
  assert.deepEqual(await sbx.previews(), []);
  await assert.rejects(sbx.closePreview(8000), (e) => e.code === "preview_not_found" && e.status === 404);
  assert.ok(Array.isArray(await sbx.metrics({ fromMs: 0 })));
  await assert.rejects(sbx.egressLog({ kind: "dns" }), (e) => e instanceof ConflictError && e.code === "network_disabled");
  await sbx.kill();
});

test("secrets: stored, rotated, deleted; the value never answered", async () => {
  const made = await Secrets.create("TS_TOKEN", "ts-value-123", ["api.example.com"]);
  assert.deepEqual([made.name, made.version, made.hosts, made.expiresAtMs], ["TS_TOKEN", 1, ["api.example.com"], null]);
  assert.ok(!("value" in made));
  assert.ok((await Secrets.list()).some((s) => s.name === "TS_TOKEN"));
  assert.equal((await Secrets.update("TS_TOKEN", { value: "v2" })).version, 2);
  await Secrets.delete("TS_TOKEN");
  await assert.rejects(Secrets.get("TS_TOKEN"), (e) => e.code === "secret_not_found" && e.status === 404);
});

test("templates: a failed build throws with its log; progress as it goes", async () => {
  const all = await Template.list();
  assert.equal(all.find((t) => t.name === "base")?.kind, "shipped");
  const seen = [];
  await assert.rejects(
    Template.build("ts-bad", { packages: ["no-such-package-pandastack"], onProgress: (p) => seen.push(p) }),
    (e) => e instanceof TemplateBuildFailedError && e.message.includes("Unable to locate package"));
  const stages = seen.filter((p) => p.line === "").map((p) => p.stage);
  assert.ok(stages.includes("packages"), JSON.stringify(stages));
  assert.equal(stages.at(-1), "failed");
  const t = await Template.get("ts-bad");
  assert.equal(t.info.status, "failed");
  await t.delete();
  await assert.rejects(Template.get("ts-bad"), TemplateNotFoundError);
  // A build context uploaded: kept by its bytes' sha256 (never opened on the host); a build
  // naming an unknown one is refused before it starts.
  const bytes = new TextEncoder().encode("a tar's bytes, opaque to the host");
  const key = await Template.uploadContext(bytes);
  assert.equal(key, "sha256:" + createHash("sha256").update(bytes).digest("hex"));
  await assert.rejects(Template.build("ts-ctx", { dockerfile: "FROM base\nCOPY . /x/\n",
    context: "sha256:" + "0".repeat(64) }), (e) => e.status === 404 && e.code === "context_not_found");
});

test("templates: a running sandbox published as a template", async () => {
  const src = await Sandbox.create();
  await src.exec("echo by-hand > /opt/marker");
  const t = await src.publishTemplate("ts-published");
  await src.kill();
  assert.equal(t.info.status, "ready");
  assert.ok(src.info.memoryMib > 0);
  assert.deepEqual([t.info.memoryMib, t.info.vcpus], [src.info.memoryMib, src.info.vcpus]);
  await assert.rejects(Sandbox.create({ template: "ts-published", vcpus: t.info.vcpus + 1 }),
    ExceedsTemplateError);
  const sbx = await Sandbox.create({ template: "ts-published" });
  assert.equal((await sbx.exec("cat /opt/marker")).stdout, "by-hand\n");
  await sbx.kill();
  await t.delete();
});
