// The dashboard (gateway/dashboard/) in a real browser: Debian's headless chromium, driven by
// playwright-core, against a real daemon (PANDASTACKD, PANDASTACK_IMAGES) and real VMs. Sign in
// (a wrong key shows an error), create a sandbox, run a command and watch its output stream,
// upload and download a file, hibernate and wake, follow a template build; every page without a
// console error, every form field labelled; a screenshot of each page in DASHBOARD_ARTIFACTS.
// Traffic: the browser talks to the daemon on loopback only; the sandboxes have no network.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, mkdirSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { chromium } from "playwright-core";

let daemon, base, url, key, browser, page;
const problems = [];  // console errors and uncaught exceptions, from any page
const shots = process.env.DASHBOARD_ARTIFACTS;

before(async () => {
  base = mkdtempSync("/dev/shm/pst-dash-");
  daemon = spawn(process.env.PANDASTACKD, [
    "--data", join(base, "data"), "--state-dir", join(base, "state"),
    "--images", process.env.PANDASTACK_IMAGES, "--listen", "127.0.0.1:0",
    "--rpc-listen", "127.0.0.1:0", "--accel", "tcg", "--network", "off",
    "--pool-size", "1", "--spare-pool-size", "0", "--metrics-interval-ms", "500",
  ], { stdio: ["ignore", "pipe", "ignore"] });
  for await (const line of createInterface({ input: daemon.stdout })) {
    const t = line.trim();
    if (t.startsWith("URL:")) url = t.split(/\s+/)[1];
    if (t.startsWith("API key:")) key = t.split(/\s+/)[2];
    if (t.startsWith("(key file")) break;
  }
  mkdirSync(shots, { recursive: true });
  browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    // (root in CI: chromium's own sandbox needs an unprivileged user)
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  const context = await browser.newContext({ viewport: { width: 1366, height: 860 }, acceptDownloads: true });
  page = await context.newPage();
  // (The browser also logs the API's refusals the page shows: the wrong key's 401, a lone
  // daemon's 409 for /v1/hosts. Those are answers, not errors of the page.)
  const expected = /^Failed to load resource: the server responded with a status of (401|409)/;
  page.on("console", (m) => {
    if (m.type() === "error" && !expected.test(m.text())) problems.push(`console: ${m.text()}`);
  });
  page.on("pageerror", (e) => problems.push(`page: ${e.message}`));
});

after(async () => {
  await browser?.close();
  const exited = new Promise((r) => daemon.on("exit", r));
  daemon.kill("SIGTERM");
  assert.equal(await exited, 0);
  rmSync(base, { recursive: true, force: true });
});

// Waits until `locator`'s text matches `re` (polled: the page changes it as events arrive).
async function text(locator, re, ms = 60000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const t = (await locator.textContent()) ?? "";
    if (re.test(t)) return t;
    if (Date.now() > deadline) throw new Error(`no ${re} in ${JSON.stringify(t.slice(-500))}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const shot = (name) => page.screenshot({ path: join(shots, `${name}.png`), fullPage: true });

// Every form field has a label (its own <label>, or aria-label).
async function unlabelled() {
  return page.$$eval("input, select, textarea", (els) => els
    .filter((e) => e.type !== "hidden" && !e.closest("label") && !e.getAttribute("aria-label") &&
      !(e.id && document.querySelector(`label[for="${e.id}"]`)))
    .map((e) => e.outerHTML));
}

test("a wrong key shows an error, not a blank page", async () => {
  await page.goto(url + "/");
  await page.getByLabel("API key").fill("pds_wrong_wrong_wrong");
  await page.getByRole("button", { name: "Sign in" }).click();
  const alert = page.getByRole("alert");
  await alert.waitFor();
  assert.match(await alert.textContent(), /The key was refused \(unauthorized/);
  assert.deepEqual(await unlabelled(), []);
  await shot("sign-in-refused");
  // The key is in the tab's session storage only, never in a URL.
  assert.equal(await page.evaluate(() => sessionStorage.getItem("pandastack.key")), null);
});

test("sign in, create a sandbox, stream a command's output", async () => {
  await page.getByLabel("API key").fill(key);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("heading", { name: "Sandboxes" }).waitFor();
  assert.ok(!page.url().includes(key));
  await shot("sandboxes-empty");
  await page.getByRole("button", { name: "New sandbox" }).click();
  await page.waitForURL(/#\/sandboxes\/sbx_/);
  await page.locator("#state").getByText("running").waitFor();
  assert.deepEqual(await unlabelled(), []);
  // The output arrives while the command runs: "one" before "two" exists.
  await page.getByLabel("Command", { exact: true }).fill("echo one; sleep 2; echo two");
  await page.getByRole("button", { name: "Run" }).click();
  const out = page.locator("#output");
  const first = await text(out, /\none\n/);
  // (its first line is the command itself)
  assert.ok(!first.split("\n").slice(1).join("\n").includes("two"), "the output came all at once");
  assert.match(await text(out, /\[exit 0\]/), /one\ntwo\n/);
  await page.getByLabel("Command", { exact: true }).fill("echo oops >&2; exit 3");
  await page.getByRole("button", { name: "Run" }).click();
  assert.match(await text(out, /\[exit 3\]/), /oops/);
  await shot("sandbox");
});

test("upload and download a file", async () => {
  await page.getByLabel("Upload a file").setInputFiles({
    name: "notes.txt", mimeType: "text/plain", buffer: Buffer.from("from the browser\n"),
  });
  await page.getByRole("button", { name: "Upload", exact: true }).click();
  const download = page.waitForEvent("download");
  await page.getByRole("button", { name: "Download notes.txt" }).click();
  const d = await download;
  assert.equal(d.suggestedFilename(), "notes.txt");
  assert.equal(readFileSync(await d.path(), "utf8"), "from the browser\n");
  // The guest has it too.
  await page.getByLabel("Command", { exact: true }).fill("cat /workspace/notes.txt");
  await page.getByRole("button", { name: "Run" }).click();
  await text(page.locator("#output"), /from the browser/);
});

test("hibernate and wake show as they happen, with their events", async () => {
  await page.getByRole("button", { name: "Hibernate" }).click();
  await page.locator("#state").getByText("hibernated").waitFor({ timeout: 60000 });
  await page.getByRole("button", { name: "Wake" }).click();
  await page.locator("#state").getByText("running").waitFor({ timeout: 60000 });
  const events = page.locator("#events");
  await events.getByText("hibernated", { exact: true }).waitFor();
  await events.getByText("woke", { exact: true }).waitFor();
  // Its resources over time: a CPU, memory and disk chart each, with a line of samples.
  const use = page.getByRole("img", { name: "CPU" });
  await use.waitFor();
  assert.equal(await page.locator("#use svg.chart").count(), 3);
  await page.locator("#use svg.chart path.line").first().waitFor({ timeout: 30000 });
  await shot("sandbox-resources");
  // A fork shows in its fork tree (and the child's page shows its parent).
  await page.getByRole("button", { name: "Fork" }).click();
  const tree = page.getByLabel("Fork tree");
  const child = tree.getByRole("link");
  await child.first().waitFor({ timeout: 60000 });
  const childId = (await child.first().textContent()).trim();
  assert.match(childId, /^sbx_/);
  const parentId = page.url().split("/").pop();
  await child.first().click();
  await page.waitForURL(new RegExp(childId));
  await page.getByLabel("Fork tree").getByRole("link", { name: parentId }).waitFor();
  await shot("fork-tree");
  // The list page shows it, live.
  await page.getByRole("link", { name: "Sandboxes" }).first().click();
  await page.getByRole("cell", { name: "running" }).first().waitFor();
  await shot("sandboxes");
});

test("a template build's progress, live", async () => {
  await page.getByRole("link", { name: "Templates" }).click();
  await page.getByRole("heading", { name: "Templates" }).waitFor();
  await page.getByRole("cell", { name: "base", exact: true }).waitFor();
  assert.deepEqual(await unlabelled(), []);
  await page.getByLabel("Name").fill("from-browser");
  await page.getByLabel("Commands run as root in the guest (one per line)")
    .fill("echo step-one\nsleep 4\nexit 3");
  await page.getByRole("button", { name: "Build" }).click();
  const log = page.locator("#log");
  const early = await text(log, /\+ echo step-one/, 120000);
  assert.ok(!early.includes("Failed:"), "the log came all at once");
  await text(log, /Failed: the template's commands failed \(exit 3\)/, 300000);
  assert.equal(await page.locator("#stage").textContent(), "failed");
  await page.getByRole("cell", { name: "failed" }).waitFor();
  await shot("templates");
});

// The daemon's API, from the test (not the page).
async function api(method, path, body) {
  const r = await fetch(url + path, {
    method, headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json" },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await r.text();
  assert.ok(r.ok, `${method} ${path}: ${r.status} ${text}`);
  return text ? JSON.parse(text) : {};
}

test("volumes, databases, hosts and metrics pages", async () => {
  for (const [link, heading] of [["Volumes", "Volumes"], ["Databases", "Databases"], ["Hosts", "Hosts"],
                                 ["Metrics", "Metrics"]]) {
    await page.getByRole("link", { name: link }).click();
    await page.getByRole("heading", { name: heading }).waitFor();
    if (link === "Hosts") await page.getByText("This daemon runs on its own").waitFor();
    if (link === "Metrics") {
      const states = page.getByRole("img", { name: "Sandboxes by state" });
      await states.waitFor();
      // Every state's whole name, no two labels overlapping.
      const labels = states.locator("text.label");
      const names = await labels.allTextContents();
      for (const n of ["running", "snapshotting", "forking", "hibernating", "hibernated"]) assert.ok(names.includes(n), names.join());
      const boxes = [];
      for (let i = 0; i < await labels.count(); i++) boxes.push(await labels.nth(i).boundingBox());
      for (let i = 0; i < boxes.length; i++)
        for (let j = i + 1; j < boxes.length; j++) {
          const [a, b] = [boxes[i], boxes[j]];
          const apart = a.x + a.width <= b.x || b.x + b.width <= a.x || a.y + a.height <= b.y || b.y + b.height <= a.y;
          assert.ok(apart, `${names[i]} and ${names[j]} overlap`);
        }
      // Rates and percentiles over time: lines once two samples are in (a command runs meanwhile).
      await page.getByRole("img", { name: "Commands per second" }).waitFor();
      await page.getByRole("img", { name: "Command latency (server side)" }).waitFor();
      const s = await api("POST", "/v1/sandboxes", {});
      await api("POST", `/v1/sandboxes/${s.id}/exec`, { cmd: "true" });
      const line = (chart, cls = "line") => page.locator(`svg[aria-label="${chart}"] path.${cls}`);
      const attached = { state: "attached", timeout: 20000 };
      await line("Command latency (server side)", "line.s1").waitFor(attached);  // p99
      await line("Create latency (server side)").first().waitFor(attached);
      // The rate: a point per interval (at least two once three samples are in).
      await page.waitForFunction(() => (document.querySelector('svg[aria-label="Commands per second"] path.line')
        ?.getAttribute("d") || "").split("L").length >= 2, null, { timeout: 20000 });
      await api("DELETE", `/v1/sandboxes/${s.id}`);
    }
    await shot(link.toLowerCase());
  }
});

// Secrets are listed by name, hosts and version: the value never reaches the page.
test("the secrets page lists names, never values", async () => {
  const value = "dash-secret-" + Math.random().toString(36).slice(2);
  await api("POST", "/v1/secrets", { name: "DASH_TOKEN", value, hosts: ["api.example.test"] });
  await page.getByRole("link", { name: "Secrets" }).click();
  await page.getByRole("heading", { name: "Secrets" }).waitFor();
  const row = page.getByRole("table", { name: "Secrets" }).locator("tr", { hasText: "DASH_TOKEN" });
  await row.waitFor();
  assert.match(await row.textContent(), /api\.example\.test\s*1/);
  assert.ok(!(await page.content()).includes(value));
  await shot("secrets");
  await api("DELETE", "/v1/secrets/DASH_TOKEN");
  await page.getByText("No secrets.").waitFor({ timeout: 10000 });
});

test("no console errors on any page", () => {
  assert.deepEqual(problems, []);
});
