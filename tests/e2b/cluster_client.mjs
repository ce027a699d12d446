// The E2B SDK against a cluster (tests/cluster/cluster_test.py runs it): the control plane on
// one host (E2B_API_URL), the sandbox plane on another (E2B_SANDBOX_URL), E2B_API_KEY.
//   node cluster_client.mjs create       -> prints the new sandbox's id
//   node cluster_client.mjs use ID       -> commands, files and a kill through the hosts given
import { Sandbox } from "e2b";
import assert from "node:assert/strict";

const [what, id] = process.argv.slice(2);
if (what === "create") {
  const sbx = await Sandbox.create({ metadata: { who: "cluster" } });
  console.log(sbx.sandboxId);
} else if (what === "use") {
  // Listed through the control plane's host, wherever it runs.
  const page = await Sandbox.list({ query: { metadata: { who: "cluster" } } }).nextItems();
  assert.deepEqual(page.map((s) => s.sandboxId), [id]);
  const sbx = await Sandbox.connect(id);
  const r = await sbx.commands.run("echo through; cat /tmp/mark 2>/dev/null || true");
  assert.equal(r.exitCode, 0);
  await sbx.files.write("/tmp/e2b-cluster.txt", "written through another host");
  assert.equal(await sbx.files.read("/tmp/e2b-cluster.txt"), "written through another host");
  const seen = [];
  await sbx.commands.run("echo one; sleep 0.2; echo two", { onStdout: (d) => seen.push(d) });
  assert.equal(seen.join(""), "one\ntwo\n");
  console.log(JSON.stringify({ stdout: r.stdout, running: await sbx.isRunning() }));
  await sbx.kill();
} else {
  console.error("usage: node cluster_client.mjs create | use ID");
  process.exit(2);
}
