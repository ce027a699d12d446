// A real pandastackd (PANDASTACKD, PANDASTACK_IMAGES) for one test file: started before its tests,
// found by the SDK through the environment (as users' code does), stopped after them.
import { before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";

export function useDaemon() {
  let daemon, base;
  before(async () => {
    base = mkdtempSync("/dev/shm/pst-ts-");
    const images = process.env.PANDASTACK_IMAGES ?? join(process.cwd(), "../../var/images");
    daemon = spawn(process.env.PANDASTACKD, [
      "--data", join(base, "data"), "--state-dir", join(base, "state"), "--images", images,
      "--listen", "127.0.0.1:0", "--rpc-listen", "127.0.0.1:0", "--accel", "tcg", "--network", "off",
    ], { stdio: ["ignore", "pipe", "ignore"] });
    const lines = createInterface({ input: daemon.stdout });
    for await (const line of lines) {
      const t = line.trim();
      if (t.startsWith("URL:")) process.env.PANDASTACK_BASE_URL = t.split(/\s+/)[1];
      if (t.startsWith("API key:")) process.env.PANDASTACK_API_KEY = t.split(/\s+/)[2];
      if (t.startsWith("(key file")) break;
    }
  });
  after(async () => {
    const exited = new Promise((r) => daemon.on("exit", r));
    daemon.kill("SIGTERM");
    assert.equal(await exited, 0);
    rmSync(base, { recursive: true, force: true });
  });
}
