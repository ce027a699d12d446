// `pandastack mcp` driven by the real MCP client (@modelcontextprotocol/sdk) over stdio, against a
// real daemon (PANDASTACKD, PANDASTACK_CLI, PANDASTACK_IMAGES). Run: node --test mcp_test.mjs
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

let daemon, base, url, key, client;

before(async () => {
  base = mkdtempSync("/dev/shm/pst-mcp-");
  daemon = spawn(process.env.PANDASTACKD, [
    "--data", join(base, "data"), "--state-dir", join(base, "state"),
    "--images", process.env.PANDASTACK_IMAGES, "--listen", "127.0.0.1:0",
    "--rpc-listen", "127.0.0.1:0", "--accel", "tcg", "--network", "off",
  ], { stdio: ["ignore", "pipe", "ignore"] });
  for await (const line of createInterface({ input: daemon.stdout })) {
    const t = line.trim();
    if (t.startsWith("URL:")) url = t.split(/\s+/)[1];
    if (t.startsWith("API key:")) key = t.split(/\s+/)[2];
    if (t.startsWith("(key file")) break;
  }
  client = new Client({ name: "pandastack-test", version: "1.0.0" });
  await client.connect(new StdioClientTransport({
    command: process.env.PANDASTACK_CLI,
    args: ["mcp"],
    env: { PANDASTACK_API_KEY: key, PANDASTACK_BASE_URL: url },
  }));
});

after(async () => {
  await client?.close();
  const exited = new Promise((r) => daemon.on("exit", r));
  daemon.kill("SIGTERM");
  assert.equal(await exited, 0);
  rmSync(base, { recursive: true, force: true });
});

const text = (r) => r.content.map((c) => c.text).join("");

test("lists the tools with schemas", async () => {
  const { tools } = await client.listTools();
  assert.deepEqual(tools.map((t) => t.name).sort(), [
    "create_database", "create_sandbox", "egress_log", "fork_sandbox", "kill_sandbox", "list_dir",
    "list_secrets", "preview_url", "read_file", "run_code", "run_command", "write_file",
  ]);
  for (const t of tools) {
    assert.ok(t.description.length > 20, t.name);
    assert.equal(t.inputSchema.type, "object");
  }
  const run = tools.find((t) => t.name === "run_command");
  assert.deepEqual(run.inputSchema.required, ["sandbox_id", "command"]);
});

test("create, run, write, read, list, fork, kill", async () => {
  const created = await client.callTool({ name: "create_sandbox", arguments: {} });
  assert.equal(created.isError, false);
  const id = text(created).match(/sandbox_id=(sbx_\w+)/)[1];
  const ran = await client.callTool({ name: "run_command", arguments: { sandbox_id: id, command: "echo hello; echo warn >&2; exit 3" } });
  assert.equal(text(ran), "exit_code=3\n--- stdout ---\nhello\n\n--- stderr ---\nwarn\n");
  const wrote = await client.callTool({ name: "write_file", arguments: { sandbox_id: id, path: "/tmp/m/notes.txt", content: "from mcp" } });
  assert.equal(wrote.isError, false);
  const read = await client.callTool({ name: "read_file", arguments: { sandbox_id: id, path: "/tmp/m/notes.txt" } });
  assert.equal(text(read), "from mcp");
  const listed = await client.callTool({ name: "list_dir", arguments: { sandbox_id: id, path: "/tmp/m" } });
  assert.equal(text(listed), "file\t8\tnotes.txt\n");
  // Without count: one copy, shaped like create_sandbox's answer; with count: one line each.
  const forked = await client.callTool({ name: "fork_sandbox", arguments: { sandbox_id: id } });
  assert.match(text(forked), /^sandbox_id=sbx_\w+ state=running$/);
  const kid = text(forked).match(/sandbox_id=(sbx_\w+)/)[1];
  const two = await client.callTool({ name: "fork_sandbox", arguments: { sandbox_id: id, count: 2 } });
  const twins = text(two).split("\n").map((l) => l.match(/^sandbox_id=(sbx_\w+) state=running$/)[1]);
  assert.equal(twins.length, 2);
  // Binary stays out of the JSON-RPC line: output decoded or labelled, files reported as binary.
  const bin = await client.callTool({ name: "run_command", arguments: { sandbox_id: id, command: "printf '\\377\\376'; echo; echo ok" } });
  assert.match(text(bin), /--- stdout ---\n\[binary: 6 bytes; the first 6 as base64 follow\]\n\/\/4Kb2sK/);
  const elf = await client.callTool({ name: "read_file", arguments: { sandbox_id: id, path: "/usr/bin/python3" } });
  assert.equal(elf.isError, false);
  assert.match(text(elf), /^\[binary: \d+ bytes; the first 12288 as base64 follow\]\n/);
  assert.ok(text(elf).length < 20000);
  // Python with state between calls: the last expression's value, then an error's traceback.
  await client.callTool({ name: "run_code", arguments: { sandbox_id: id, code: "import math\nx = 6 * 7\nprint('side')" } });
  const code = await client.callTool({ name: "run_code", arguments: { sandbox_id: id, code: "x + math.floor(0.5)" } });
  assert.equal(code.isError, false);
  assert.match(text(code), /^execution_count=2\n--- result ---\n42$/);
  const oops = await client.callTool({ name: "run_code", arguments: { sandbox_id: id, code: "1/0" } });
  assert.match(text(oops), /--- error ---\nZeroDivisionError: division by zero\n/);
  const nocmd = await client.callTool({ name: "run_command", arguments: { sandbox_id: id } });
  assert.equal(nocmd.isError, true);
  assert.match(text(nocmd), /^invalid_argument: command is required/);
  const kidRead = await client.callTool({ name: "read_file", arguments: { sandbox_id: kid, path: "/tmp/m/notes.txt" } });
  assert.equal(text(kidRead), "from mcp");
  for (const s of [...twins, kid, id]) {
    const killed = await client.callTool({ name: "kill_sandbox", arguments: { sandbox_id: s } });
    assert.equal(text(killed), `killed ${s}`);
  }
  const after = await client.callTool({ name: "run_command", arguments: { sandbox_id: id, command: "true" } });
  assert.equal(after.isError, true);
  assert.match(text(after), /^sandbox_stopped: /);
});

test("errors are tool errors with the API's code", async () => {
  const missing = await client.callTool({ name: "read_file", arguments: { sandbox_id: "sbx_doesnotexist000000", path: "/tmp/x" } });
  assert.equal(missing.isError, true);
  assert.match(text(missing), /^sandbox_not_found: /);
  const bad = await client.callTool({ name: "run_command", arguments: { command: "true" } });
  assert.equal(bad.isError, true);
  await assert.rejects(client.callTool({ name: "no_such_tool", arguments: {} }));
});

test("create_sandbox mounts a volume made over REST", async () => {
  const r = await fetch(`${url}/v1/volumes`, {
    method: "POST", headers: { Authorization: `Bearer ${key}` }, body: JSON.stringify({ size_mib: 32 }),
  });
  assert.equal(r.status, 201);
  const vol = (await r.json()).id;
  const created = await client.callTool({ name: "create_sandbox", arguments: { volumes: [{ volume: vol, mount: "/data" }] } });
  assert.equal(created.isError, false, text(created));
  const id = text(created).match(/sandbox_id=(sbx_\w+)/)[1];
  const ran = await client.callTool({ name: "run_command", arguments: { sandbox_id: id, command: "echo v > /data/f && cat /data/f" } });
  assert.match(text(ran), /^exit_code=0\n--- stdout ---\nv\n/);
  const bad = await client.callTool({ name: "create_sandbox", arguments: { volumes: [{ volume: vol, mount: "/x" }] } });
  assert.equal(bad.isError, true);
  assert.match(text(bad), /volume_in_use/);
  await client.callTool({ name: "kill_sandbox", arguments: { sandbox_id: id } });
});

test("preview_url answers with the API's error on a daemon without networking", async () => {
  const created = await client.callTool({ name: "create_sandbox", arguments: {} });
  const id = text(created).match(/sandbox_id=(sbx_\w+)/)[1];
  const r = await client.callTool({ name: "preview_url", arguments: { sandbox_id: id, port: 8000 } });
  assert.equal(r.isError, true);
  assert.match(text(r), /^network_disabled: /);
  await client.callTool({ name: "kill_sandbox", arguments: { sandbox_id: id } });
});

test("egress_log answers with the API's error for a sandbox without a network", async () => {
  const created = await client.callTool({ name: "create_sandbox", arguments: {} });
  const id = text(created).match(/sandbox_id=(sbx_\w+)/)[1];
  const r = await client.callTool({ name: "egress_log", arguments: { sandbox_id: id } });
  assert.equal(r.isError, true);
  assert.match(text(r), /^network_disabled: /);
  await client.callTool({ name: "kill_sandbox", arguments: { sandbox_id: id } });
});

test("list_secrets shows names and hosts, never a value", async () => {
  assert.equal(text(await client.callTool({ name: "list_secrets", arguments: {} })), "(no secrets)");
  const value = "mcp-secret-" + Math.random().toString(36).slice(2);
  const made = await fetch(`${url}/v1/secrets`, {
    method: "POST", headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json" },
    body: JSON.stringify({ name: "MCP_TOKEN", value, hosts: ["api.example.test", "*.example.org"] }),
  });
  assert.equal(made.status, 201);
  const r = await client.callTool({ name: "list_secrets", arguments: {} });
  assert.equal(r.isError, false);
  assert.equal(text(r), "MCP_TOKEN hosts=*.example.org,api.example.test\n");  // (hosts sorted)
  assert.ok(!text(r).includes(value));
});

test("create_database answers with the API's error on a daemon without networking", async () => {
  const r = await client.callTool({ name: "create_database", arguments: { name: "shop" } });
  assert.equal(r.isError, true);
  assert.match(text(r), /^network_disabled: /);
  const bad = await client.callTool({ name: "create_database", arguments: { name: "Bad Name" } });
  assert.match(text(bad), /^invalid_argument: /);
});
