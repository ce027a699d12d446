// The real E2B SDK (`e2b` 2.51.0 from npm, unmodified) against a real daemon (PANDASTACKD,
// PANDASTACK_IMAGES): only the two environment variables change. Run: node --test e2b_test.mjs
// Traffic goes to the daemons on loopback only; sandboxes have no network but in the getHost test
// (their own namespaces, no DNS upstream: the guest reaches nothing outside).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import http from "node:http";
import net from "node:net";

let daemon, base, url, key, Sandbox, CommandExitError, FileNotFoundError, NotFoundError, ALL_TRAFFIC;

// A daemon of this test's own (the first: no sandbox networks), its URL and key.
async function startDaemon(dir, extra) {
  const proc = spawn(process.env.PANDASTACKD, [
    "--data", join(dir, "data"), "--state-dir", join(dir, "state"),
    "--images", process.env.PANDASTACK_IMAGES, "--listen", "127.0.0.1:0",
    "--rpc-listen", "127.0.0.1:0", "--accel", "tcg", ...extra,
  ], { stdio: ["ignore", "pipe", "ignore"] });
  let u, k;
  for await (const line of createInterface({ input: proc.stdout })) {
    const t = line.trim();
    if (t.startsWith("URL:")) u = t.split(/\s+/)[1];
    if (t.startsWith("API key:")) k = t.split(/\s+/)[2];
    if (t.startsWith("(key file")) break;
  }
  return { proc, url: u, key: k };
}

async function stopDaemon(proc) {
  const exited = new Promise((r) => proc.on("exit", r));
  proc.kill("SIGTERM");
  return exited;
}

before(async () => {
  base = mkdtempSync("/dev/shm/pst-e2b-");
  ({ proc: daemon, url, key } = await startDaemon(base, ["--network", "off", "--metrics-interval-ms", "300"]));
  // What a user sets, and nothing else.
  process.env.E2B_API_KEY = key;
  process.env.E2B_API_URL = url;
  process.env.E2B_SANDBOX_URL = url;
  ({ Sandbox, CommandExitError, FileNotFoundError, NotFoundError, ALL_TRAFFIC } = await import("e2b"));
});

after(async () => {
  assert.equal(await stopDaemon(daemon), 0);
  rmSync(base, { recursive: true, force: true });
});

test("commands: output, exit codes, envVars, background, kill, stdin", async () => {
  const sbx = await Sandbox.create({ envs: { FOO: "bar" }, metadata: { who: "e2b-test" } });
  assert.match(sbx.sandboxId, /^sbx_/);
  const r = await sbx.commands.run("echo hi; echo err >&2; echo $FOO");
  assert.equal(r.exitCode, 0);
  assert.equal(r.stdout, "hi\nbar\n");
  assert.equal(r.stderr, "err\n");
  // The request's envs win over the sandbox's.
  assert.equal((await sbx.commands.run("echo $FOO", { envs: { FOO: "baz" } })).stdout, "baz\n");
  assert.equal((await sbx.commands.run("pwd", { cwd: "/tmp" })).stdout, "/tmp\n");
  await assert.rejects(sbx.commands.run("echo out; exit 3"), (e) => {
    assert.ok(e instanceof CommandExitError, String(e));
    assert.equal(e.exitCode, 3);
    assert.equal(e.stdout, "out\n");
    return true;
  });
  // Streaming callbacks see output as it comes.
  const seen = [];
  await sbx.commands.run("echo one; echo two", { onStdout: (d) => seen.push(d) });
  assert.equal(seen.join(""), "one\ntwo\n");

  const bg = await sbx.commands.run("sleep 30", { background: true });
  assert.ok(bg.pid > 0);
  const listed = await sbx.commands.list();
  assert.ok(listed.some((p) => p.pid === bg.pid), JSON.stringify(listed));
  assert.equal(await sbx.commands.kill(bg.pid), true);
  await assert.rejects(bg.wait(), CommandExitError);
  assert.equal(await sbx.commands.kill(bg.pid), false);

  const cat = await sbx.commands.run("cat", { background: true, stdin: true });
  await sbx.commands.sendStdin(cat.pid, "round trip\n");
  await sbx.commands.closeStdin(cat.pid);
  const done = await cat.wait();
  assert.equal(done.stdout, "round trip\n");
  await sbx.kill();
});

// Security review 3, M5: envVars (typically API keys) reach every process but are kept in the
// guest only: not in the sandbox's metadata, events, audit log or native answers. A fork of the
// sandbox (no memory of it on the host yet) reads them back from its guest.
test("envVars are kept in the guest, never as metadata or events", async () => {
  const native = { "authorization": `Bearer ${key}`, "content-type": "application/json" };
  const value = "sk-probe-m5-" + Math.random().toString(36).slice(2);
  const token = "tok-" + Math.random().toString(36).slice(2);
  const sbx = await Sandbox.create({ envs: { OPENAI_API_KEY: value }, metadata: { api_token: token } });
  assert.equal((await sbx.commands.run("echo $OPENAI_API_KEY")).stdout, value + "\n");
  const get = async (path) => (await fetch(`${url}${path}`, { headers: native })).text();
  const answers = [
    await get(`/v1/sandboxes/${sbx.sandboxId}`),
    await get(`/v1/sandboxes/${sbx.sandboxId}/events`),
    await get(`/v1/audit?all=1&limit=1000`),
  ];
  for (const a of answers) assert.ok(!a.includes(value), a.slice(0, 400));
  // The metadata entry named like a credential is answered to its owner, redacted in the log.
  assert.match(answers[0], new RegExp(`"api_token":"${token}"`));
  for (const a of answers.slice(1)) assert.ok(!a.includes(token), a.slice(0, 400));
  assert.match(answers[1], /"api_token":"\[redacted\]"/);
  const mode = await sbx.commands.run("stat -c %a:%U /etc/pandastack/e2b-env.json", { user: "root" });
  assert.equal(mode.stdout, "600:root\n");
  // Too many, or a name with '=': refused before anything is made.
  await assert.rejects(Sandbox.create({ envs: { "A=B": "x" } }), /envVars name/);
  const forked = await (await fetch(`${url}/v1/sandboxes/${sbx.sandboxId}/fork`, {
    method: "POST", headers: native, body: "{}",
  })).json();
  assert.ok(forked.sandboxes?.[0]?.id, JSON.stringify(forked));
  const child = await Sandbox.connect(forked.sandboxes[0].id);
  assert.equal((await child.commands.run("echo $OPENAI_API_KEY")).stdout, value + "\n");
  await child.kill();
  await sbx.kill();
});

test("files: write, read, list, exists, makeDir, rename, remove, getInfo", async () => {
  const sbx = await Sandbox.create();
  const info = await sbx.files.write("/tmp/e2b/a.txt", "A");
  assert.equal(info.path, "/tmp/e2b/a.txt");
  assert.equal(await sbx.files.read("/tmp/e2b/a.txt"), "A");
  await sbx.files.write([
    { path: "/tmp/e2b/b.txt", data: "B" },
    { path: "/tmp/e2b/sub/c.txt", data: "C" },
  ]);
  assert.equal(await sbx.files.read("/tmp/e2b/sub/c.txt"), "C");
  const bytes = await sbx.files.read("/tmp/e2b/b.txt", { format: "bytes" });
  assert.deepEqual(Array.from(bytes), [66]);
  const entries = await sbx.files.list("/tmp/e2b");
  assert.deepEqual(entries.map((e) => `${e.name}:${e.type}`).sort(), ["a.txt:file", "b.txt:file", "sub:dir"]);
  assert.equal(await sbx.files.exists("/tmp/e2b/a.txt"), true);
  assert.equal(await sbx.files.exists("/tmp/e2b/nope"), false);
  assert.equal(await sbx.files.makeDir("/tmp/e2b/new/deep"), true);
  assert.equal(await sbx.files.makeDir("/tmp/e2b/new/deep"), false);
  const moved = await sbx.files.rename("/tmp/e2b/a.txt", "/tmp/e2b/moved.txt");
  assert.equal(moved.path, "/tmp/e2b/moved.txt");
  const st = await sbx.files.getInfo("/tmp/e2b/moved.txt");
  assert.equal(st.size, 1);
  assert.equal(st.type, "file");
  await sbx.files.remove("/tmp/e2b/sub");
  assert.equal(await sbx.files.exists("/tmp/e2b/sub/c.txt"), false);
  await sbx.files.remove("/tmp/e2b/sub");  // as on E2B: removing what is gone is fine
  await assert.rejects(sbx.files.read("/tmp/e2b/missing"), FileNotFoundError);
  await sbx.kill();
});

test("file metadata (envd 0.6.2): on write, getInfo, list, rename; an overwrite replaces it; gzip and stream uploads", async () => {
  const sbx = await Sandbox.create();
  const w = await sbx.files.write("/home/user/m/report.txt", "hello", { metadata: { Author: "alice", purpose: "demo" } });
  const want = { author: "alice", purpose: "demo" };  // keys lower-cased, as E2B's
  assert.deepEqual(w.metadata, want);
  assert.equal(w.size, 5);
  assert.deepEqual((await sbx.files.getInfo("/home/user/m/report.txt")).metadata, want);
  assert.deepEqual((await sbx.files.list("/home/user/m"))[0].metadata, want);
  // Kept as user.e2b.* extended attributes: seen and set in the guest too.
  const py = (code) => sbx.commands.run(`python3 -c '${code}'`);
  assert.equal((await py('import os; print(os.getxattr("/home/user/m/report.txt", "user.e2b.author").decode())')).stdout, "alice\n");
  await py('import os; os.setxattr("/home/user/m/report.txt", "user.e2b.extra", b"x"); os.setxattr("/home/user/m/report.txt", "user.other", b"y")');
  assert.deepEqual((await sbx.files.getInfo("/home/user/m/report.txt")).metadata, { ...want, extra: "x" });
  const moved = await sbx.files.rename("/home/user/m/report.txt", "/home/user/m/moved.txt");
  assert.equal(moved.metadata.author, "alice");
  // An upload replaces the file's metadata; one with none clears it (other attributes stay).
  assert.deepEqual((await sbx.files.write("/home/user/m/moved.txt", "v2", { metadata: { k: "1" } })).metadata, { k: "1" });
  const cleared = await sbx.files.write("/home/user/m/moved.txt", "v3");
  assert.equal(cleared.metadata, undefined);
  assert.equal((await sbx.files.getInfo("/home/user/m/moved.txt")).metadata, undefined);
  assert.equal((await py('import os; print(os.getxattr("/home/user/m/moved.txt", "user.other").decode())')).stdout, "y\n");
  // Several files in one upload: the same metadata on each.
  await sbx.files.write([{ path: "/home/user/m/a", data: "A" }, { path: "/home/user/m/b", data: "B" }], { metadata: { source: "import" } });
  for (const p of ["/home/user/m/a", "/home/user/m/b"]) assert.deepEqual((await sbx.files.getInfo(p)).metadata, { source: "import" });
  // /tmp is a tmpfs, which keeps no user attributes on this guest kernel (6.1): refused there.
  await assert.rejects(sbx.files.write("/tmp/meta.txt", "x", { metadata: { a: "b" } }), /no metadata/);
  assert.equal((await sbx.files.write("/tmp/meta.txt", "x")).metadata, undefined);
  // Past 4096 bytes: refused, and the file is as it was.
  await assert.rejects(sbx.files.write("/home/user/m/a", "new", { metadata: { big: "x".repeat(5000) } }), /4096/);
  assert.equal(await sbx.files.read("/home/user/m/a"), "A");
  // envd 0.5.7: a gzip'd upload, and a stream (both application/octet-stream).
  const text = "zipped ".repeat(5000);
  const gz = await sbx.files.write("/home/user/m/gz.txt", text, { gzip: true, metadata: { z: "1" } });
  assert.equal(gz.size, text.length);
  assert.deepEqual(gz.metadata, { z: "1" });
  assert.equal(await sbx.files.read("/home/user/m/gz.txt"), text);
  const stream = new ReadableStream({ start(c) { c.enqueue(new TextEncoder().encode("streamed")); c.close(); } });
  await sbx.files.write("/home/user/m/s.txt", stream);
  assert.equal(await sbx.files.read("/home/user/m/s.txt"), "streamed");
  await sbx.kill();
});

test("user: commands and files as E2B's `user` (home /home/user), or as root when asked", async () => {
  const sbx = await Sandbox.create();
  const r = await sbx.commands.run("id -un; pwd; echo $HOME");
  assert.equal(r.stdout, "user\n/home/user\n/home/user\n");
  assert.equal((await sbx.commands.run("id -un; pwd", { user: "root" })).stdout, "root\n/root\n");
  await assert.rejects(sbx.commands.run("touch /root/nope"), CommandExitError);  // unprivileged
  // Relative paths are the user's home; what a write makes is the user's.
  const w = await sbx.files.write("notes/a.txt", "mine");
  assert.equal(w.path, "/home/user/notes/a.txt");
  const st = await sbx.files.getInfo("/home/user/notes/a.txt");
  assert.equal(st.owner, "user");
  assert.equal(st.group, "user");
  assert.equal((await sbx.files.getInfo("notes")).owner, "user");
  assert.equal((await sbx.commands.run("stat -c %U notes/a.txt && echo more >> notes/a.txt")).stdout, "user\n");
  await sbx.files.write("/tmp/rootfile", "r", { user: "root" });
  assert.equal((await sbx.files.getInfo("/tmp/rootfile")).owner, "root");
  // A symbolic link says where it points.
  await sbx.commands.run("ln -s /home/user/notes/a.txt link");
  const link = await sbx.files.getInfo("link");
  assert.equal(link.symlinkTarget, "/home/user/notes/a.txt");
  // E2B's user may become root: passwordless sudo.
  assert.equal((await sbx.commands.run("sudo -n id -un && sudo -n touch /root/yes")).stdout, "root\n");
  await sbx.kill();
});

test("pty: a terminal, input, resize, exit; watchDir: a folder's changes", async () => {
  const sbx = await Sandbox.create();
  const dec = new TextDecoder();
  let out = "";
  const term = await sbx.pty.create({ cols: 90, rows: 20, onData: (d) => (out += dec.decode(d, { stream: true })) });
  const enc = (s) => new TextEncoder().encode(s);
  const waitFor = async (s) => {
    for (let i = 0; i < 300 && !out.includes(s); i++) await new Promise((r) => setTimeout(r, 100));
    assert.ok(out.includes(s), out);
  };
  // The terminal echoes what is typed; only the output has the computed marker.
  await sbx.pty.sendInput(term.pid, enc("tty; stty size; echo m-$((6*7))\n"));
  await waitFor("m-42");
  assert.match(out, /\/dev\/pts\//);
  assert.match(out, /20 90/);
  await sbx.pty.resize(term.pid, { cols: 120, rows: 40 });
  await sbx.pty.sendInput(term.pid, enc("stty size; echo m-$((6*8))\n"));
  await waitFor("m-48");
  assert.match(out, /40 120/);
  await sbx.pty.sendInput(term.pid, enc("exit\n"));
  assert.equal((await term.wait()).exitCode, 0);

  await sbx.files.makeDir("/tmp/watched/sub");
  const events = [];
  const handle = await sbx.files.watchDir("/tmp/watched", (e) => events.push([e.type, e.name]), { recursive: true });
  await sbx.files.write("/tmp/watched/a.txt", "A");
  await sbx.commands.run("echo b > /tmp/watched/sub/b.txt; rm /tmp/watched/a.txt; touch /tmp/watched/done");
  for (let i = 0; i < 300 && !events.some(([, n]) => n === "done"); i++) await new Promise((r) => setTimeout(r, 100));
  await handle.stop();
  const want = [["create", "a.txt"], ["create", "sub/b.txt"], ["remove", "a.txt"], ["create", "done"]];
  const seen = events.map((e) => e.join(" "));
  let at = 0;
  for (const w of want) {
    at = seen.indexOf(w.join(" "), at);
    assert.ok(at >= 0, `${w} in order in ${seen}`);
  }
  await assert.rejects(sbx.files.watchDir("/tmp/not-there", () => {}));
  // envd 0.6.3: events with the entry they are about (none for what is gone).
  const withEntry = [];
  const h2 = await sbx.files.watchDir("/tmp/watched", (e) => withEntry.push(e), { includeEntry: true, allowNetworkMounts: true });
  await sbx.files.write("/tmp/watched/e.txt", "12345");
  await sbx.commands.run("rm /tmp/watched/e.txt; touch /tmp/watched/end");
  for (let i = 0; i < 300 && !withEntry.some((e) => e.name === "end"); i++) await new Promise((r) => setTimeout(r, 100));
  await h2.stop();
  const made = withEntry.find((e) => e.name === "e.txt" && e.entry && e.entry.size === 5);
  assert.ok(made, JSON.stringify(withEntry));
  assert.equal(made.entry.path, "/tmp/watched/e.txt");
  assert.equal(made.entry.type, "file");
  const gone = withEntry.find((e) => e.name === "e.txt" && e.type === "remove");
  assert.ok(gone && gone.entry === undefined, JSON.stringify(withEntry));
  await sbx.kill();
});

test("lifecycle: getInfo, list, setTimeout, metrics, isRunning, pause, connect, kill", async () => {
  const sbx = await Sandbox.create({ metadata: { suite: "lifecycle" }, timeoutMs: 120_000 });
  const info = await sbx.getInfo();
  assert.equal(info.sandboxId, sbx.sandboxId);
  assert.equal(info.templateId, "base");
  assert.deepEqual(info.metadata, { suite: "lifecycle" });
  assert.equal(info.state, "running");
  await sbx.setTimeout(600_000);
  const later = await sbx.getInfo();
  assert.ok(later.endAt.getTime() - Date.now() > 500_000, String(later.endAt));
  const page = await Sandbox.list({ query: { metadata: { suite: "lifecycle" } } }).nextItems();
  assert.deepEqual(page.map((s) => s.sandboxId), [sbx.sandboxId]);
  // Real figures, sampled every 300 ms on this daemon.
  await sbx.commands.run("timeout 1 sh -c 'while :; do :; done'; true");
  const metrics = await sbx.getMetrics();
  assert.ok(metrics.length >= 2, JSON.stringify(metrics));
  const m = metrics.at(-1);
  assert.ok(m.timestamp instanceof Date && m.timestamp.getTime() > Date.now() - 60e3, String(m.timestamp));
  assert.equal(m.cpuCount, 1);
  assert.equal(m.memTotal, 256 * 1024 * 1024);
  assert.ok(m.memUsed > 0 && m.diskTotal > m.diskUsed, JSON.stringify(m));
  assert.ok(metrics.some((x) => x.cpuUsedPct > 50), JSON.stringify(metrics.map((x) => x.cpuUsedPct)));
  assert.deepEqual(await sbx.getMetrics({ start: new Date(Date.now() + 3600e3) }), []);
  assert.equal(await sbx.isRunning(), true);
  // keepMemory: false, a filesystem-only pause: the disk is kept, a connect boots on it (what
  // ran and /tmp, a tmpfs, are gone).
  await sbx.commands.run("echo on-disk > disk.txt; echo in-ram > /tmp/ram.txt");
  assert.equal(await sbx.pause({ keepMemory: false }), true);
  assert.equal((await sbx.getInfo()).state, "paused");
  const booted = await Sandbox.connect(sbx.sandboxId);
  assert.equal((await booted.commands.run("cat disk.txt")).stdout, "on-disk\n");
  await assert.rejects(booted.commands.run("cat /tmp/ram.txt"), CommandExitError);
  // autoResume cannot follow a filesystem-only pause (the SDK says so; so does the server).
  await assert.rejects(Sandbox.create({ lifecycle: { onTimeout: { action: "pause", keepMemory: false }, autoResume: true } }));
  await sbx.commands.run("echo kept > /tmp/mark");
  assert.equal(await sbx.pause(), true);
  assert.equal((await sbx.getInfo()).state, "paused");
  assert.equal(await sbx.isRunning(), false);
  const again = await Sandbox.connect(sbx.sandboxId);
  assert.equal((await again.commands.run("cat /tmp/mark")).stdout, "kept\n");
  assert.equal(await again.kill(), true);
  assert.equal(await Sandbox.kill(sbx.sandboxId), false);
  await assert.rejects(again.commands.run("true"));
  await assert.rejects(Sandbox.connect(sbx.sandboxId));
});

test("a kill mid-command ends the command's stream as E2B's does: a TimeoutError, the sandbox was killed", async () => {
  const victim = await Sandbox.create();
  const long = await victim.commands.run("sleep 60", { background: true });
  const out = [];
  const streamed = await victim.commands.run("for i in 1 2 3 4 5 6 7 8 9; do echo $i; sleep 1; done",
    { background: true, onStdout: (d) => out.push(d) });
  for (let i = 0; i < 100 && out.length === 0; i++) await new Promise((r) => setTimeout(r, 100));
  await victim.kill();
  for (const h of [long, streamed])
    await assert.rejects(h.wait(), (e) => e.name === "TimeoutError" && /sandbox was killed/.test(e.message));
});

test("a wrong key or another tenant's token gets nothing", async () => {
  await assert.rejects(Sandbox.create({ apiKey: "pds_aaaaaaaaaaaa_" + "a".repeat(40) }));
  const sbx = await Sandbox.create();
  // The access token is per sandbox: another sandbox's token is refused for this one.
  const other = await Sandbox.create();
  const res = await fetch(`${url}/filesystem.Filesystem/Stat`, {
    method: "POST",
    headers: { "content-type": "application/json", "connect-protocol-version": "1",
               "e2b-sandbox-id": sbx.sandboxId, "x-access-token": other.envdAccessToken ?? "" },
    body: JSON.stringify({ path: "/tmp" }),
  });
  assert.equal(res.status, 401);
  assert.equal((await res.json()).code, "unauthenticated");
  // Without a token an upload is refused before its body is read.
  const up = await fetch(`${url}/files?path=/tmp/x`, {
    method: "POST", headers: { "e2b-sandbox-id": sbx.sandboxId, "content-type": "multipart/form-data; boundary=b" },
    body: "x".repeat(1 << 20),
  });
  assert.equal(up.status, 401);
  assert.equal((await up.json()).code, 401);
  await sbx.kill();
  await other.kill();
});

// Security review 3, M4: an access token names the key it was issued under and expires; once that
// key is revoked its tokens stop working (within the key cache's 2 s), whoever holds one.
test("an access token ends with the key it was issued under", async () => {
  const admin = { "authorization": `Bearer ${key}`, "content-type": "application/json" };
  const newKey = async () => (await fetch(`${url}/v1/keys`, {
    method: "POST", headers: admin, body: JSON.stringify({ tenant: "e2b-revoked" }),
  })).json();
  const made = await newKey(), kept = await newKey();
  const sbx = await Sandbox.create({ apiKey: made.key });
  assert.match(sbx.envdAccessToken, /^e2b2\./);
  assert.equal((await sbx.commands.run("echo live")).stdout, "live\n");
  const held = await Sandbox.connect(sbx.sandboxId, { apiKey: made.key });
  const revoked = await fetch(`${url}/v1/keys/${made.id}`, { method: "DELETE", headers: admin });
  assert.equal(revoked.status, 204);
  await new Promise((r) => setTimeout(r, 2500));
  for (const s of [sbx, held]) {
    await assert.rejects(s.commands.run("echo still"), (e) => /revoked/.test(String(e)));
    await assert.rejects(s.files.read("/etc/hostname"), (e) => /revoked/.test(String(e)));
  }
  // The tenant's other key is untouched: a token it asks for works.
  const again = await Sandbox.connect(sbx.sandboxId, { apiKey: kept.key });
  assert.equal((await again.commands.run("echo again")).stdout, "again\n");
  await again.kill();
});

test("Sandbox.list pages with nextToken: every sandbox once, in order", async () => {
  const made = [];
  for (let i = 0; i < 3; i++) made.push(await Sandbox.create({ metadata: { suite: "pages" } }));
  const pager = Sandbox.list({ query: { metadata: { suite: "pages" } }, limit: 2 });
  const first = await pager.nextItems();
  assert.equal(first.length, 2);
  assert.equal(pager.hasNext, true);
  const second = await pager.nextItems();
  assert.equal(second.length, 1);
  assert.equal(pager.hasNext, false);
  const ids = [...first, ...second].map((s) => s.sandboxId);
  assert.deepEqual([...ids].sort(), made.map((s) => s.sandboxId).sort());
  // Newest first, as E2B lists them.
  const started = [...first, ...second].map((s) => s.startedAt.getTime());
  assert.deepEqual(started, [...started].sort((a, b) => b - a));
  const bad = await fetch(`${url}/v2/sandboxes?nextToken=nonsense`, { headers: { "x-api-key": key } });
  assert.equal(bad.status, 400);
  for (const s of made) await s.kill();
});

test("no internet asked of a host without sandbox networking: a sandbox with no network", async () => {
  const sbx = await Sandbox.create({ allowInternetAccess: false });
  assert.equal((await sbx.commands.run("echo offline")).stdout, "offline\n");
  const info = await sbx.getInfo();
  assert.equal(info.allowInternetAccess, false);
  await sbx.kill();
});

test("a key's e2b_ form (what current SDKs accept) is the same key", async () => {
  const admin = { "authorization": `Bearer ${key}`, "content-type": "application/json" };
  const made = await (await fetch(`${url}/v1/keys`, {
    method: "POST", headers: admin, body: JSON.stringify({ tenant: "e2b-form" }),
  })).json();
  assert.match(made.e2b_key, /^e2b_[0-9a-f]+$/);
  const sbx = await Sandbox.create({ apiKey: made.e2b_key });
  assert.equal((await sbx.commands.run("echo form")).stdout, "form\n");
  // The same tenant's: its pds_ key lists it, another tenant's does not.
  const listed = await Sandbox.list({ apiKey: made.key }).nextItems();
  assert.ok(listed.some((s) => s.sandboxId === sbx.sandboxId));
  const theirs = await Sandbox.list({ apiKey: key }).nextItems();
  assert.ok(!theirs.some((s) => s.sandboxId === sbx.sandboxId));
  // A damaged one is refused like any wrong key.
  const bad = made.e2b_key.slice(0, -2) + (made.e2b_key.endsWith("00") ? "11" : "00");
  await assert.rejects(Sandbox.create({ apiKey: bad }), (e) => /401|nauthori|API key/i.test(String(e)));
  await sbx.kill();
});

test("Template builder: Template.build on ours (aptInstall, COPY, RUN, ENV, WORKDIR, USER, start and ready commands)",
  { skip: process.env.E2B_LONG ? false : "a full template build: ctest e2b_templates (make test-long)" }, async () => {
  const { Template } = await import("e2b");
  // COPY's files: the SDK tars each step's sources and uploads them (GET .../files/{hash},
  // then a PUT to the URL we answer); the build unpacks them in a builder microVM.
  const ctx = mkdtempSync(join(tmpdir(), "pst-e2b-ctx-"));
  mkdirSync(join(ctx, "site", "css"), { recursive: true });
  writeFileSync(join(ctx, "site", "about.html"), "about e2b\n");
  writeFileSync(join(ctx, "site", "css", "a.css"), "body{}\n");
  writeFileSync(join(ctx, "notes.txt"), "copied as user\n");
  const ready = "python3 -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:8080/')\"";
  const tpl = Template({ fileContextPath: ctx }).fromTemplate("base")
    .aptInstall(["jq"])  // (a Debian package fetched by the host, installed in the builder)
    .setEnvs({ GREETING: "hello e2b" })
    .setWorkdir("/srv/web")
    .copy("site", "/srv/web/")
    .copy("notes.txt", "/home/user/notes.txt", { user: "user", mode: 0o640 })
    .runCmd("echo \"$GREETING\" > index.html")
    .setUser("user")
    .runCmd("id -un > /home/user/who")
    .setStartCmd("python3 -m http.server 8080", ready);
  const logs = [];
  const built = await Template.build(tpl, "e2b-web", { onBuildLogs: (l) => logs.push(String(l.message ?? l)) });
  assert.equal(built.templateId, "e2b-web");
  assert.ok(logs.some((l) => /start: ready/.test(l)), logs.slice(-20).join("\n"));
  assert.equal(await Template.exists("e2b-web"), true);
  assert.equal(await Template.exists("e2b-none"), false);
  // Every sandbox of it has the web server running from its snapshot, as the last USER.
  const sbx = await Sandbox.create("e2b-web");
  const r = await sbx.commands.run("python3 -c \"import urllib.request as u; " +
    "print(u.urlopen('http://127.0.0.1:8080/index.html').read().decode(), end='')\"; " +
    "cat /home/user/who; echo $GREETING; jq -n 1+1; for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline " +
    "2>/dev/null | grep -q 'http[.]server 8080' && stat -c %U $p; done | sort -u; " +
    "cat /srv/web/about.html /srv/web/css/a.css /home/user/notes.txt; stat -c '%U %a' /home/user/notes.txt");
  assert.equal(r.stdout, "hello e2b\nuser\nhello e2b\n2\nuser\nabout e2b\nbody{}\ncopied as user\nuser 640\n");
  rmSync(ctx, { recursive: true, force: true });
  await sbx.kill();
  // fromImage: pulled by the build (here from a loopback port where no registry listens: the
  // build fails with the pull's reason); registry credentials are refused with why.
  await assert.rejects(Template.build(Template().fromImage("127.0.0.1:1/nothing:1"), "e2b-img"),
    /pull: 127\.0\.0\.1.*refused/);
  await assert.rejects(Template.build(Template().fromImage("127.0.0.1:1/private:1",
    { username: "u", password: "p" }), "e2b-img2"), /not served/);
  // Deleted like E2B's (by name).
  const del = await fetch(`${url}/templates/e2b-web`, { method: "DELETE", headers: { "X-API-KEY": key } });
  assert.equal(del.status, 204);
  assert.equal(await Template.exists("e2b-web"), false);
});

test("secrets: E2B's Secret API on ours (values never answered; used by network rules only)", async () => {
  const { Secret } = await import("e2b");
  const made = await Secret.create("OpenAI-Key", "sk-test-1");
  assert.equal(made.name, "openai-key");  // (lower-cased, as E2B's)
  assert.equal(made.secretId, "sec_openai-key");
  assert.equal(made.version, 1);
  assert.deepEqual(made.metadata, {});
  assert.ok(made.createdAt instanceof Date && !isNaN(made.createdAt));
  await Secret.create("second", "v");
  assert.equal(await Secret.exists("openai-key"), true);
  assert.equal(await Secret.exists("sec_openai-key"), true);
  assert.equal(await Secret.exists("nope"), false);
  // Pages of one, by name.
  const pages = Secret.list({ limit: 1 });
  const names = [];
  while (pages.hasNext) names.push(...(await pages.nextItems()).map((x) => x.name));
  assert.deepEqual(names, ["openai-key", "second"]);
  const rotated = await Secret.update("sec_openai-key", "sk-test-2");
  assert.equal(rotated.version, 2);
  assert.equal((await Secret.getInfo("openai-key")).version, 2);
  // The value is never answered, natively either; a native create's `secrets` refuses such a
  // secret (network rules use it: the getHost case).
  const native = await (await fetch(`${url}/v1/secrets`, { headers: { Authorization: `Bearer ${key}` } })).text();
  assert.ok(!native.includes("sk-test"), native);
  assert.match(native, /"name":"openai-key"/);
  const r = await fetch(`${url}/v1/sandboxes`, { method: "POST", headers: { Authorization: `Bearer ${key}` },
    body: JSON.stringify({ secrets: ["openai-key"] }) });
  const refused = await r.json();
  assert.equal(r.status, 400, JSON.stringify(refused));
  assert.match(refused.error.message, /made through E2B's API/);
  // What is not kept is refused; a bad name too.
  await assert.rejects(Secret.create("meta", "v", { metadata: { a: "b" } }), /metadata is not kept/);
  await assert.rejects(Secret.create("sec_x", "v"), /name/);
  assert.equal(await Secret.destroy("openai-key"), true);
  assert.equal(await Secret.destroy("openai-key"), false);
  assert.equal(await Secret.destroy("second"), true);
  await assert.rejects(Secret.getInfo("openai-key"), /not found/);
});

test("code interpreter: state across runs, results, charts, errors, contexts", async () => {
  const { Sandbox: CodeSandbox } = await import("@e2b/code-interpreter");
  const sbx = await CodeSandbox.create();
  const first = await sbx.runCode("x = 41\nprint('hello')\nx + 1");
  assert.deepEqual(first.logs.stdout, ["hello\n"]);
  assert.equal(first.text, "42");
  assert.equal(first.error, undefined);
  // Variables and imports persist between runs.
  assert.equal((await sbx.runCode("import math\nmath.floor(x / 2)")).text, "20");
  // As E2B's: the code runs as `user`, in its home.
  assert.equal((await sbx.runCode("import os, pwd\n(pwd.getpwuid(os.getuid()).pw_name, os.getcwd())")).text,
    "('user', '/home/user')");
  const seen = [];
  await sbx.runCode("for i in range(3): print(i)", { onStdout: (m) => seen.push(m.line) });
  assert.equal(seen.join(""), "0\n1\n2\n");
  const err = await sbx.runCode("1/0");
  assert.equal(err.error.name, "ZeroDivisionError");
  assert.match(err.error.traceback, /ZeroDivisionError/);
  assert.deepEqual((await sbx.runCode("{'a': [1, 2]}")).results[0].json, { a: [1, 2] });
  // A matplotlib chart comes back as a PNG.
  const chart = await sbx.runCode("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()");
  const png = chart.results.find((r) => r.png);
  assert.ok(png, JSON.stringify({ results: chart.results.map((r) => Object.keys(r)), error: chart.error, logs: chart.logs }));
  assert.equal(Buffer.from(png.png, "base64").subarray(1, 4).toString(), "PNG");
  // Contexts have their own variables.
  const ctx = await sbx.createCodeContext({ cwd: "/tmp" });
  assert.equal((await sbx.runCode("import os\nos.getcwd()", { context: ctx })).text, "'/tmp'");
  assert.equal((await sbx.runCode("'x' in globals()", { context: ctx })).text, "False");
  assert.ok((await sbx.listCodeContexts()).some((c) => c.id === ctx.id));
  await sbx.restartCodeContext(ctx);
  await sbx.removeCodeContext(ctx);
  assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id));
  // Per-run environment variables.
  assert.equal((await sbx.runCode("import os\nos.environ['GREETING']", { envs: { GREETING: "hi" } })).text, "'hi'");
  await sbx.kill();
});

test("snapshot names: E2B's TEAM/name:default, the newest wins, filters, create and delete by name", async () => {
  const sbx = await Sandbox.create();
  await sbx.files.write("/tmp/v.txt", "one");
  const first = await sbx.createSnapshot({ name: "my-snap" });
  assert.match(first.snapshotId, /^[^/]+\/my-snap:default$/);
  assert.deepEqual(first.names, [first.snapshotId]);
  await sbx.files.write("/tmp/v.txt", "two");
  const second = await sbx.createSnapshot({ name: "my-snap" });
  assert.equal(second.snapshotId, first.snapshotId);  // the name now stands for the newer one
  const unnamed = await sbx.createSnapshot();
  assert.match(unnamed.snapshotId, /^snap_/);
  assert.deepEqual(unnamed.names, []);
  const all = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems();
  assert.equal(all.length, 3);
  assert.deepEqual(all.filter((s) => s.names.length).map((s) => s.snapshotId), [first.snapshotId]);
  for (const name of ["my-snap", "my-snap:default", first.snapshotId]) {
    const found = await Sandbox.listSnapshots({ name }).nextItems();
    assert.deepEqual(found.map((s) => s.snapshotId), [first.snapshotId], name);
  }
  assert.deepEqual(await Sandbox.listSnapshots({ name: "nope" }).nextItems(), []);
  assert.deepEqual(await Sandbox.listSnapshots({ name: "my-snap", sandboxId: "sbx_other" }).nextItems(), []);
  // Pages: one at a time, each once.
  const pager = Sandbox.listSnapshots({ sandboxId: sbx.sandboxId, limit: 1 });
  const paged = [];
  while (pager.hasNext) paged.push(...(await pager.nextItems()));
  assert.equal(paged.length, 3);
  for (const ref of ["my-snap", first.snapshotId]) {
    const s = await Sandbox.create(ref);
    assert.equal(await s.files.read("/tmp/v.txt"), "two", ref);
    await s.kill();
  }
  await assert.rejects(sbx.createSnapshot({ name: "bad/name" }));
  // Deleting by name deletes every snapshot taken with it (as E2B deletes a template).
  assert.equal(await Sandbox.deleteSnapshot(first.snapshotId), true);
  assert.deepEqual(await Sandbox.listSnapshots({ name: "my-snap" }).nextItems(), []);
  assert.deepEqual((await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems()).map((s) => s.snapshotId), [unnamed.snapshotId]);
  await assert.rejects(Sandbox.create("my-snap"));
  assert.equal(await Sandbox.deleteSnapshot(unnamed.snapshotId), true);
  await sbx.kill();
});

test("snapshots and forks", async () => {
  const sbx = await Sandbox.create();
  await sbx.files.write("/tmp/state.txt", "from the parent");
  const snap = await sbx.createSnapshot();
  assert.match(snap.snapshotId, /^snap_/);
  const listed = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems();
  assert.deepEqual(listed.map((s) => s.snapshotId), [snap.snapshotId]);
  const restored = await Sandbox.create(snap.snapshotId);
  assert.equal(await restored.files.read("/tmp/state.txt"), "from the parent");
  const kids = await Sandbox.fork(sbx.sandboxId, { count: 2 });
  assert.equal(kids.length, 2);
  for (const k of kids) assert.equal(await k.files.read("/tmp/state.txt"), "from the parent");
  for (const k of [restored, ...kids, sbx]) await k.kill();
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true);
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false);
});

// GET through the daemon at `daemonUrl` with a preview host name (Node resolves no *.localhost).
function getVia(daemonUrl, host, path, headers = {}) {
  const u = new URL(daemonUrl);
  return new Promise((resolve, reject) => {
    const req = http.request({ host: u.hostname, port: u.port, path, headers: { Host: host, ...headers } },
      (res) => {
        let body = "";
        res.on("data", (d) => (body += d));
        res.on("end", () => resolve({ status: res.statusCode, body }));
      });
    req.on("error", reject);
    req.end();
  });
}

test("list startedAfter; updateNetwork on a sandbox without a network", async () => {
  const before = new Date(Date.now() - 1000);
  const sbx = await Sandbox.create();
  const ids = async (q) => (await Sandbox.list({ query: q }).nextItems()).map((s) => s.sandboxId);
  assert.ok((await ids({ startedAfter: before })).includes(sbx.sandboxId));
  assert.ok(!(await ids({ startedAfter: new Date(Date.now() + 3600e3) })).includes(sbx.sandboxId));
  // No network: no internet already; anything else it cannot have.
  await sbx.updateNetwork({ allowInternetAccess: false });
  await assert.rejects(sbx.updateNetwork({ allowInternetAccess: true }), /network/);
  await sbx.kill();
});

test("getHost: a port's preview host, public by default, or behind the traffic token", async () => {
  // A daemon with sandbox networks (their namespaces only: the guest reaches nothing outside).
  const dir = mkdtempSync("/dev/shm/pst-e2b-net-");
  const d = await startDaemon(dir, ["--network-prefix", "pte2b", "--subnet-pool", "10.253.0.0/22",
                                    "--dns-upstream", "off"]);
  const opts = { apiKey: d.key, apiUrl: d.url, sandboxUrl: d.url };
  try {
    for (const allowPublicTraffic of [true, false]) {
      const sbx = await Sandbox.create({ ...opts, network: { allowPublicTraffic } });
      await sbx.files.write("/tmp/www/index.html", "hello from e2b\n");
      await sbx.commands.run("python3 -m http.server 8000 --directory /tmp/www", { background: true });
      const host = sbx.getHost(8000);
      assert.equal(host, `8000-${sbx.sandboxId}.${new URL(d.url).host.replace("127.0.0.1", "localhost")}`);
      let r;
      for (let i = 0; i < 100; i++) {
        r = await getVia(d.url, host, "/", allowPublicTraffic ? {} : { "e2b-traffic-access-token": sbx.trafficAccessToken });
        if (r.status === 200) break;
        await new Promise((ok) => setTimeout(ok, 300));
      }
      assert.equal(r.status, 200, r.body);
      assert.equal(r.body, "hello from e2b\n");
      if (allowPublicTraffic) {
        // updateNetwork: an allowlist (deny all, allow some), all again, none; a denylist refused.
        const egress = async () => (await (await fetch(`${d.url}/v1/sandboxes/${sbx.sandboxId}`,
          { headers: { Authorization: `Bearer ${d.key}` } })).json()).egress;
        await sbx.updateNetwork({ denyOut: [ALL_TRAFFIC], allowOut: ["192.0.2.0/24"] });
        assert.deepEqual(await egress(), { mode: "allowlist", cidrs: ["192.0.2.0/24"], domains: [] });
        await sbx.updateNetwork({ allowInternetAccess: true });
        assert.equal((await egress()).mode, "allow_all");
        await sbx.updateNetwork({ allowInternetAccess: false });
        assert.equal((await egress()).mode, "deny_all");
        await assert.rejects(sbx.updateNetwork({ denyOut: ["10.0.0.0/8"] }), /allowlists/);
        // Header transforms (network.rules) with Secret.fill markers, set by the sandbox's egress
        // proxy (tests/api/egress_test.py follows requests through it): given at create or by
        // updateNetwork; a secret that does not exist is refused (nothing made).
        const { Secret } = await import("e2b");
        const rules = (name) => ({ "api.example.com": [{ transform: { headers: {
          Authorization: `Bearer ${Secret.fill(name)}` } } }] });
        await assert.rejects(sbx.updateNetwork({ rules: rules("nope") }), /no secret nope/);
        await assert.rejects(Sandbox.create({ ...opts, network: { rules: rules("nope") } }),
          /no secret nope/);
        await Secret.create("rules-key", "sk-rules", opts);
        await sbx.updateNetwork({ rules: rules("rules-key") });
        await sbx.updateNetwork({});  // (omitted: the rules are cleared)
        const ruled = await Sandbox.create({ ...opts, network: { rules: rules("rules-key") } });
        assert.equal((await ruled.commands.run("echo ok")).stdout, "ok\n");
        await ruled.kill();
        assert.equal(await Secret.destroy("rules-key", opts), true);
      }
      if (!allowPublicTraffic) {
        assert.equal((await getVia(d.url, host, "/")).status, 401);
        assert.equal((await getVia(d.url, host, "/", { "e2b-traffic-access-token": "e2b2.x.y.1.z" })).status, 401);
      }
      await sbx.kill();
    }
  } finally {
    assert.equal(await stopDaemon(d.proc), 0);
    rmSync(dir, { recursive: true, force: true });
  }
});

// E2B's own deployment shape: E2B_DOMAIN names the daemon, and every URL the SDK makes is
// https://{api,PORT-ID}.DOMAIN (no E2B_SANDBOX_URL): the daemon serves TLS (--tls-cert) and the
// sandbox plane by host name, which is what makes signed file URLs (uploadUrl/downloadUrl)
// routable. run.sh makes the certificate (*.sbx.localhost, under a CA of its own that Node is
// told to trust); a CONNECT proxy of this test's own stands in for wildcard DNS: every name it is
// asked for is the daemon on loopback.
test("E2B_DOMAIN alone: HTTPS, the sandbox plane by host name, signed file URLs", async () => {
  const tls = process.env.E2B_TEST_TLS_DIR;
  assert.ok(tls, "run through run.sh (it makes the test's TLS certificate)");
  const dir = mkdtempSync("/dev/shm/pst-e2b-tls-");
  const d = await startDaemon(dir, ["--network", "off", "--tls-cert", join(tls, "cert.pem"),
                                    "--tls-key", join(tls, "key.pem"), "--preview-domain", "sbx.localhost"]);
  assert.match(d.url, /^https:\/\//);
  const port = Number(new URL(d.url).port);
  const tunnels = [];
  const proxy = http.createServer((_, res) => res.writeHead(405).end());
  proxy.on("connect", (req, sock, head) => {
    const host = req.url.split(":")[0];
    tunnels.push(host);
    if (host !== "sbx.localhost" && !host.endsWith(".sbx.localhost")) return sock.end("HTTP/1.1 403 Forbidden\r\n\r\n");
    const up = net.connect(port, "127.0.0.1", () => {
      sock.write("HTTP/1.1 200 Connection Established\r\n\r\n");
      up.write(head);
      up.pipe(sock);
      sock.pipe(up);
    });
    up.on("error", () => sock.destroy());
    sock.on("error", () => up.destroy());
  });
  await new Promise((ok) => proxy.listen(0, "127.0.0.1", ok));
  const proxyUrl = `http://127.0.0.1:${proxy.address().port}`;
  const { fetch: ufetch, ProxyAgent, FormData } = await import("undici");
  const agent = new ProxyAgent({ uri: proxyUrl, proxyTunnel: true });
  const saved = { api: process.env.E2B_API_URL, sandbox: process.env.E2B_SANDBOX_URL };
  delete process.env.E2B_API_URL;
  delete process.env.E2B_SANDBOX_URL;
  try {
    const opts = { apiKey: d.key, domain: "sbx.localhost", proxy: proxyUrl };
    const sbx = await Sandbox.create(opts);
    const host = `49983-${sbx.sandboxId}.sbx.localhost`;
    assert.equal(sbx.getHost(49983), host);
    // The whole SDK over the host names: commands, files.
    assert.equal((await sbx.commands.run("echo hi")).stdout, "hi\n");
    await sbx.files.write("/tmp/plain.txt", "plain");
    assert.equal(await sbx.files.read("/tmp/plain.txt"), "plain");
    assert.ok(tunnels.includes("api.sbx.localhost") && tunnels.includes(host), tunnels.join(" "));

    // uploadUrl: a multipart POST with nothing but the URL.
    const up = await sbx.uploadUrl("/tmp/up.txt");
    assert.match(up, new RegExp(`^https://${host}/files\\?.*signature=v1_`));
    const form = new FormData();
    form.append("file", new Blob(["uploaded by URL"]), "up.txt");
    let r = await ufetch(up, { method: "POST", body: form, dispatcher: agent });
    assert.equal(r.status, 200, await r.clone().text());
    assert.equal(await sbx.files.read("/tmp/up.txt"), "uploaded by URL");
    // downloadUrl: a GET; with an expiry that has not passed too.
    for (const o of [{}, { useSignatureExpiration: 60 }]) {
      r = await ufetch(await sbx.downloadUrl("/tmp/up.txt", o), { dispatcher: agent });
      assert.equal(r.status, 200);
      assert.equal(await r.text(), "uploaded by URL");
    }
    // E2B's refusals: expired, another path, another operation, another sandbox's host.
    const refused = async (u, init, message) => {
      const res = await ufetch(u, { ...init, dispatcher: agent });
      assert.equal(res.status, 401, u);
      assert.equal((await res.json()).message, message);
    };
    await refused(await sbx.downloadUrl("/tmp/up.txt", { useSignatureExpiration: -10 }), {}, "signature is already expired");
    const other = new URL(await sbx.downloadUrl("/tmp/up.txt"));
    other.searchParams.set("path", "/etc/shadow");
    await refused(other, {}, "invalid signature");
    await refused(await sbx.downloadUrl("/tmp/up.txt"), { method: "POST", body: form }, "invalid signature");
    const sbx2 = await Sandbox.create(opts);
    await refused((await sbx.downloadUrl("/tmp/up.txt")).replace(sbx.sandboxId, sbx2.sandboxId), {}, "invalid signature");
    // Without a signature or a token: nothing.
    r = await ufetch(`https://${host}/files?path=/tmp/up.txt`, { dispatcher: agent });
    assert.equal(r.status, 401);
    // A host name's sandbox is the one served: a header naming another is refused.
    r = await ufetch(`https://${host}/health`, { dispatcher: agent,
      headers: { "X-Access-Token": sbx2.envdAccessToken, "E2b-Sandbox-Id": sbx2.sandboxId } });
    assert.equal(r.status, 400);
    // The API's routes are not on a sandbox's host name.
    r = await ufetch(`https://${host}/v1/sandboxes`, { dispatcher: agent, headers: { Authorization: `Bearer ${d.key}` } });
    assert.equal(r.status, 404);
    await sbx2.kill();
    await sbx.kill();
  } finally {
    process.env.E2B_API_URL = saved.api;
    process.env.E2B_SANDBOX_URL = saved.sandbox;
    await agent.close();
    proxy.close();
    assert.equal(await stopDaemon(d.proc), 0);
    rmSync(dir, { recursive: true, force: true });
  }
});
