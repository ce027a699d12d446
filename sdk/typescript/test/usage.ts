// Type-checked (tsc --strict, `npm run typecheck`) against src/index.d.ts: the declarations cover
// what a TypeScript user writes. Not run: the runtime behaviour is tested in sdk.test.js.
import { Execution,
  Sandbox, SandboxNotFoundError, Volume, type ExecEvent, type ExecResult, type FileInfo, type PortInfo, type PreviewInfo, type MetricSample, type EgressEntry, type EgressLogPage, type SandboxInfo,
  type VolumeInfo, Database, type DatabaseInfo, type DatabaseBackup, type VolumeSnapshotInfo,
  Template, TemplateBuildFailedError, type TemplateInfo, type BuildProgress,
} from "../dist/index.js";

export async function templates(): Promise<string> {
  const seen: BuildProgress[] = [];
  try {
    const t = await Template.build("ml", {
      packages: ["python3-numpy"], run: ["mkdir -p /workspace/data"], env: { MODE: "x" },
      files: { "/etc/motd": "hi" }, onProgress: (p) => seen.push(p),
    });
    const all: TemplateInfo[] = await Template.list();
    const ctx: string = await Template.uploadContext(new Uint8Array([0]));
    await Template.build("app", { dockerfile: "FROM base\nCOPY . /app/\n", context: ctx });
    await t.delete();
    return `${t.info.sizeBytes}${all.length}${seen.length}`;
  } catch (e) {
    if (e instanceof TemplateBuildFailedError) return e.logTail;
    throw e;
  }
}

export async function usage(): Promise<string> {
  await using sbx = await Sandbox.create({ template: "base", ttlSeconds: 600, metadata: { a: "b" } });
  const r: ExecResult = await sbx.exec(["python3", "-c", "print(1)"], { timeoutSeconds: 5, env: { X: "1" } });
  const ac = new AbortController();
  const aborted: Promise<ExecResult> = sbx.exec("sleep 10", { signal: ac.signal });
  ac.abort();
  await aborted.catch(() => undefined);
  for await (const ev of sbx.execStream("echo hi")) {
    const e: ExecEvent = ev;
    if (e.kind === "stdout") console.log(e.text);
    else if (e.kind === "exit") console.log(e.exitCode, e.timedOut);
    else if (e.kind === "error") console.log(e.code);
  }
  await sbx.files.write("/tmp/x", new Uint8Array([1, 2]));
  await using limited = await Sandbox.create({ allow: ["192.0.2.0/24"] });
  await limited.setEgress("allow_all");
  const mode: string | undefined = limited.info.egress?.mode;
  const port: PortInfo = await limited.exposePort(8000);
  console.log(port.address, (await limited.ports()).length);
  await limited.unexposePort(8000);
  const preview: PreviewInfo = await limited.preview(8000, { ttlSeconds: 600, public: false });
  console.log(preview.url, preview.pathUrl, preview.token ?? "", (await limited.previews()).length);
  await limited.closePreview(8000);
  const samples: MetricSample[] = await limited.metrics({ fromMs: Date.now() - 60_000 });
  console.log(samples.map((m) => m.cpuUsedPct + m.memUsedBytes).length);
  const egress: EgressLogPage = await limited.egressLog({ kind: "connection", verdict: "denied", limit: 10 });
  console.log(egress.nextAfter, egress.entries.map((e: EgressEntry) => e.destination ?? e.name));
  console.log(mode, limited.info.network, (await Sandbox.create({ network: false })).info.network);
  const entries: FileInfo[] = await sbx.files.list("/tmp");
  const pid: number = await sbx.process.start("sleep 1");
  await sbx.process.kill(pid, 9);
  const kids: Sandbox[] = await sbx.fork(2);
  const one: Sandbox = await sbx.fork();
  await one.exec("true");
  const idle = await Sandbox.create({ idleTimeoutSeconds: 60, onTimeout: "hibernate", autoWake: true });
  const t: number = idle.info.idleTimeoutSeconds;
  const all: SandboxInfo[] = await Sandbox.list({ state: "running", metadata: { a: "b" } });
  const kept: "none" | "local" | "remote" = (await Sandbox.listSnapshots())[0].durable;
  const vol = await Volume.create({ sizeMib: 64, name: "cache" });
  const withVol = await Sandbox.create({ volumes: [{ volume: vol, mount: "/data" }, { volume: vol.id, mount: "/ro", readOnly: true }] });
  const held: string = withVol.info.volumes[0].mount;
  const vols: VolumeInfo[] = await Volume.list({ metadata: { a: "b" } });
  const stored: "local" | "remote" | undefined = vols[0].durable;
  await vol.update({ sizeMib: 128 });
  const snap: VolumeSnapshotInfo = await vol.snapshot();
  const copy = await Volume.create({ fromSnapshot: snap });
  await copy.delete();
  await vol.deleteSnapshot(snap.id);
  await vol.delete();
  const db = await Database.create({ name: "shop", metadata: { a: "b" } });
  const uri: string = db.connectionUri;
  const dbs: DatabaseInfo[] = await Database.list();
  await db.rotatePassword();
  await db.hibernate();
  const woke: DatabaseInfo = await db.wake();
  const log: string = await db.logs(10);
  const bk: DatabaseBackup = await db.backup();
  const bks: DatabaseBackup[] = await db.backups();
  const restored = await Database.create({ name: "copy", fromBackup: bk.id });
  const from: string = restored.info.restoredFrom;
  await db.deleteBackup(bks[0].id);
  await restored.delete();
  await db.delete();
  if (from.length + bk.bytes < 0) return "";
  if (uri.length + dbs.length + woke.port + log.length < 0) return "";
  if (held.length + vols.length + kept.length < 0) return "";
  const ran: Execution = await sbx.runCode("1 + 1", { timeoutSeconds: 30, env: { A: "b" } });
  const ctx: string = await sbx.createCodeContext({ cwd: "/tmp" });
  const ctxs: string[] = await sbx.codeContexts();
  await sbx.deleteCodeContext(ctx);
  const png: Buffer | undefined = ran.results[0]?.png;
  if ((ran.text ?? "").length + ctxs.length + (png?.length ?? 0) + (ran.error?.name.length ?? 0) < 0) return "";
  await Sandbox.deleteSnapshot(await sbx.snapshot());
  try {
    await Sandbox.get("sbx_x");
  } catch (e) {
    if (e instanceof SandboxNotFoundError) return `${e.code} ${e.status}`;
  }
  return `${r.stdout}${entries.length}${kids.length}${all.length}${sbx.state}${t}`;
}

// The agent toolkit's declarations.
import { Toolkit, TOOL_NAMES, type AnthropicTool, type ToolRun } from "../dist/tools.js";
async function toolkitUsage(): Promise<string> {
  const kit = new Toolkit({ template: "code-interpreter", tools: ["run_python"], perCall: false, maxOutputChars: 2000 });
  const tools: AnthropicTool[] = kit.anthropic();
  const fn = kit.openai()[0].function.parameters.required;
  const r: ToolRun = await kit.run("run_python", { code: "1 + 1", timeout_seconds: null });
  const blocks = await kit.callAnthropic([{ type: "tool_use", id: "t1", name: "run_python", input: { code: "2" } }]);
  const msgs = await kit.callOpenai([{ id: "c1", function: { name: "run_python", arguments: "{}" } }]);
  await kit.close();
  return `${tools.length} ${fn.length} ${r.text} ${blocks[0].tool_use_id} ${msgs[0].content} ${TOOL_NAMES.join()}`;
}
void toolkitUsage;
