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
    "--pool-size", "1", "--spare-pool-size", "0",
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
  page.on("console", (m) => { if (m.type() === "error") problems.push(`console: ${m.text()}`); });
  page.on("pageerror", (e) => problems.push(`page: ${e.message}`));
});

after(async () => {
  await browser?.close();
  const exited = new Promise((r) => daemon.on("exit", r));
  daemon.kill("SIGTERM");
  assert.equal(await exited, 0);
  rmSync(base, { recursive: true, force: true });
});

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
  await page.getByLabel("Command").fill("echo one; sleep 2; echo two");
  await page.getByRole("button", { name: "Run" }).click();
  const out = page.getByLabel("Command output");
  await out.getByText("one").waitFor();
  assert.ok(!(await out.textContent()).includes("two"), "the output came all at once");
  await out.getByText("[exit 0]").waitFor();
  assert.match(await out.textContent(), /one\ntwo\n/);
  await page.getByLabel("Command").fill("echo oops >&2; exit 3");
  await page.getByRole("button", { name: "Run" }).click();
  await out.getByText("[exit 3]").waitFor();
  await shot("sandbox");
});

test("upload and download a file", async () => {
  await page.getByLabel("Upload a file").setInputFiles({
    name: "notes.txt", mimeType: "text/plain", buffer: Buffer.from("from the browser\n"),
  });
  await page.getByRole("button", { name: "Upload" }).click();
  const download = page.waitForEvent("download");
  await page.getByRole("button", { name: "Download notes.txt" }).click();
  const d = await download;
  assert.equal(d.suggestedFilename(), "notes.txt");
  assert.equal(readFileSync(await d.path(), "utf8"), "from the browser\n");
  // The guest has it too.
  await page.getByLabel("Command").fill("cat /workspace/notes.txt");
  await page.getByRole("button", { name: "Run" }).click();
  await page.getByLabel("Command output").getByText("from the browser").waitFor();
});

test("hibernate and wake show as they happen, with their events", async () => {
  await page.getByRole("button", { name: "Hibernate" }).click();
  await page.locator("#state").getByText("hibernated").waitFor({ timeout: 60000 });
  await page.getByRole("button", { name: "Wake" }).click();
  await page.locator("#state").getByText("running").waitFor({ timeout: 60000 });
  const events = page.locator("#events");
  await events.getByText("hibernated", { exact: true }).waitFor();
  await events.getByText("woken", { exact: true }).waitFor();
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
  await page.getByLabel("Debian packages (space separated)").fill("no-such-package-pandastack");
  await page.getByRole("button", { name: "Build" }).click();
  const log = page.getByLabel("Build log");
  await log.getByText("I: Retrieving").first().waitFor({ timeout: 120000 });
  await log.getByText(/Failed: the root file system build failed/).waitFor({ timeout: 300000 });
  assert.equal(await page.locator("#stage").textContent(), "failed");
  await page.getByRole("cell", { name: "failed" }).waitFor();
  await shot("templates");
});

test("volumes, databases, hosts and metrics pages", async () => {
  for (const [link, heading] of [["Volumes", "Volumes"], ["Databases", "Databases"], ["Hosts", "Hosts"],
                                 ["Metrics", "Metrics"]]) {
    await page.getByRole("link", { name: link }).click();
    await page.getByRole("heading", { name: heading }).waitFor();
    if (link === "Hosts") await page.getByText("This daemon runs on its own").waitFor();
    if (link === "Metrics") {
      await page.getByRole("img", { name: "Sandboxes by state" }).waitFor();
      await page.getByRole("img", { name: "Command latency (server side)" }).waitFor();
    }
    await shot(link.toLowerCase());
  }
});

test("no console errors on any page", () => {
  assert.deepEqual(problems, []);
});
