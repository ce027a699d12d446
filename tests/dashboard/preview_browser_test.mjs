// A preview URL in a real browser (Debian's headless chromium, playwright-core): a web app in a
// sandbox (tests/previews/guest_app.py) opened at its host-based URL (*.localhost resolves to
// this machine in chromium): the token is traded for a cookie, the page renders, and its
// WebSocket back to its own origin round-trips through the daemon's proxy. Without the token the
// browser gets 401. Traffic: loopback and the test's own sandbox network namespace only.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { chromium } from "playwright-core";

let daemon, base, url, key, browser;

async function call(method, path, body, raw) {
  const res = await fetch(url + path, {
    method, headers: { Authorization: `Bearer ${key}` },
    body: raw ?? (body === undefined ? undefined : JSON.stringify(body)),
  });
  const text = await res.text();
  assert.ok(res.ok, `${method} ${path}: ${res.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

before(async () => {
  base = mkdtempSync("/dev/shm/pst-preview-browser-");
  daemon = spawn(process.env.PANDASTACKD, [
    "--data", join(base, "data"), "--state-dir", join(base, "state"),
    "--images", process.env.PANDASTACK_IMAGES, "--listen", "127.0.0.1:0",
    "--rpc-listen", "127.0.0.1:0", "--accel", "tcg", "--pool-size", "1", "--spare-pool-size", "0",
    "--network-prefix", "ptbrw", "--subnet-pool", "10.252.0.0/22", "--dns-upstream", "off",
  ], { stdio: ["ignore", "pipe", "ignore"] });
  for await (const line of createInterface({ input: daemon.stdout })) {
    const t = line.trim();
    if (t.startsWith("URL:")) url = t.split(/\s+/)[1];
    if (t.startsWith("API key:")) key = t.split(/\s+/)[2];
    if (t.startsWith("(key file")) break;
  }
  browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
});

after(async () => {
  await browser?.close();
  const exited = new Promise((r) => daemon.on("exit", r));
  daemon.kill("SIGTERM");
  assert.equal(await exited, 0);
  rmSync(base, { recursive: true, force: true });
});

test("a sandbox's page and its WebSocket through the preview URL", async () => {
  const sbx = await call("POST", "/v1/sandboxes", { network: true });
  const app = readFileSync(new URL("../previews/guest_app.py", import.meta.url));
  await call("PUT", `/v1/sandboxes/${sbx.id}/files?path=/tmp/app.py`, undefined, app);
  await call("POST", `/v1/sandboxes/${sbx.id}/processes`, { argv: ["python3", "/tmp/app.py", "8000"] });
  const preview = await call("POST", `/v1/sandboxes/${sbx.id}/previews`, { port: 8000 });
  assert.match(preview.url, /^http:\/\/8000-sbx_\w+\.localhost:\d+\/\?token=/);
  const page = await (await browser.newContext()).newPage();
  const problems = [];
  page.on("pageerror", (e) => problems.push(e.message));
  // The app needs a moment to listen: 502 until then.
  let res;
  for (let i = 0; i < 100; i++) {
    res = await page.goto(preview.url);
    if (res.status() === 200) break;
    await new Promise((r) => setTimeout(r, 300));
  }
  assert.equal(res.status(), 200);
  assert.equal(new URL(page.url()).search, "");  // (the token left the address bar)
  assert.equal(await page.textContent("#title"), "hello from the sandbox");
  await page.waitForFunction(() => document.getElementById("ws").textContent !== "waiting", null, { timeout: 30000 });
  assert.equal(await page.textContent("#ws"), "echo:ping-from-browser");
  assert.deepEqual(problems, []);
  // A fresh browser without the token: refused.
  const stranger = await (await browser.newContext()).newPage();
  const refused = await stranger.goto(preview.url.split("?")[0]);
  assert.equal(refused.status(), 401);
  await call("DELETE", `/v1/sandboxes/${sbx.id}`);
});

// The sandbox's page shows its egress log: a connection the sandbox's rules refused (the
// metadata address: refused inside the sandbox's own namespace, nothing leaves the host) appears
// with its verdict and reason, without a reload.
test("a networked sandbox's page shows what it reached and was refused", async () => {
  const sbx = await call("POST", "/v1/sandboxes", { network: true });
  const page = await (await browser.newContext()).newPage();
  const problems = [];
  page.on("pageerror", (e) => problems.push(e.message));
  await page.goto(url + "/");
  await page.getByLabel("API key").fill(key);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.waitForURL(/#\/sandboxes$/);
  // Straight to its address while the list may still be loading (the list's late answers must
  // not replace the page: the router drops a left view's failures).
  await page.goto(`${url}/#/sandboxes/${sbx.id}`);
  await page.getByRole("heading", { name: "Egress" }).waitFor();
  await page.getByText("Nothing reached or refused yet.").waitFor();
  const probe = "import socket\ntry:\n socket.create_connection(('169.254.169.254', 80), 2)\nexcept OSError as e:\n print(e)";
  await call("POST", `/v1/sandboxes/${sbx.id}/exec`, { argv: ["python3", "-c", probe] });
  const log = page.getByRole("table", { name: "Egress log" });
  await log.getByText("169.254.169.254:80").waitFor({ timeout: 20000 });
  const row = log.locator("tr", { hasText: "169.254.169.254:80" }).first();
  assert.match(await row.textContent(), /connection\s*denied\s*internal/);
  assert.deepEqual(problems, []);
  await call("DELETE", `/v1/sandboxes/${sbx.id}`);
});

