// Create a sandbox, run code, read a file back (Node >= 18). PANDASTACK_API_KEY must be set.
import { Sandbox } from "../sdk/typescript/dist/index.js";  // (built: sdk/typescript/build.sh)

const sbx = await Sandbox.create();
try {
  console.log((await sbx.exec("python3 -c 'print(6 * 7)'")).stdout.trim());
  await sbx.files.write("/workspace/hello.txt", "hello from node");
  console.log(await sbx.files.readText("/workspace/hello.txt"));
  for await (const ev of sbx.execStream("for i in 1 2 3; do echo tick $i; done")) {
    if (ev.kind === "stdout") process.stdout.write(ev.text);
    if (ev.kind === "exit") console.log(`exit ${ev.exitCode}`);
  }
} finally {
  await sbx.kill();
}
