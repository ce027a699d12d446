// The PandaStack dashboard: a single-page app in plain ES modules, served by the daemon itself
// (gateway/dashboard.cc embeds these files). Hash routes (#/sandboxes, #/sandboxes/ID, ...);
// every call goes to the REST API with the key the user signed in with.
import { api, ApiError, key } from "/ui/api.js";
import { barChart, lineChart, linesChart, parseMetrics, quantiles, rates } from "/ui/charts.js";

const main = document.getElementById("main");
const nav = document.getElementById("nav");
let generation = 0;  // bumped per view: a view's timers and streams stop when it is left

const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) =>
  ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const when = (ms) => (ms ? new Date(ms).toLocaleString() : "—");
const age = (ms) => {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  return s < 60 ? `${s} s` : s < 3600 ? `${Math.floor(s / 60)} min` : `${Math.floor(s / 3600)} h`;
};
const state = (s) => `<span class="state state-${esc(s)}">${esc(s)}</span>`;
const errorBox = (e) => `<p class="error" role="alert">${esc(e instanceof ApiError ? e.message : String(e))}</p>`;

function toast(text) {
  const t = document.getElementById("toast");
  t.textContent = text;
  t.classList.add("show");
  setTimeout(() => t.classList.remove("show"), 2500);
}

// Runs `f` every `ms` while the current view is shown.
function every(ms, f) {
  const g = generation;
  const tick = async () => {
    if (g !== generation) return;
    try { await f(); } catch (e) { /* shown by f */ }
    if (g === generation) setTimeout(tick, ms);
  };
  setTimeout(tick, ms);
}

// ------------------------------------------------------------------------------------------
// Sign-in

function signin(message = "") {
  nav.hidden = true;
  main.innerHTML = `
    <section class="signin card">
      <h1>Sign in</h1>
      <p class="muted">An API key of this daemon (<code>make run</code> prints one). It stays in
        this tab only.</p>
      <form id="signin">
        <label>API key <input id="key" name="key" type="password" autocomplete="off" required></label>
        <div class="row"><button type="submit">Sign in</button></div>
      </form>
      <div id="signin-error">${message}</div>
    </section>`;
  document.getElementById("key").focus();
  document.getElementById("signin").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    key.set(document.getElementById("key").value.trim());
    try {
      await api.get("/v1/quotas");
      location.hash = "#/sandboxes";
      route();
    } catch (e) {
      key.clear();
      document.getElementById("signin-error").innerHTML =
        errorBox(e.status === 401 ? new Error(`The key was refused (${e.message})`) : e);
    }
  });
}

// ------------------------------------------------------------------------------------------
// Sandboxes

async function sandboxes() {
  main.innerHTML = `
    <h1>Sandboxes</h1>
    <form id="create" class="row card">
      <label>Template <select id="template" name="template"></select></label>
      <label>TTL (s) <input id="ttl" type="number" min="1" value="900"></label>
      <button type="submit">New sandbox</button>
    </form>
    <div id="err"></div>
    <table aria-label="Sandboxes"><thead><tr><th>ID</th><th>State</th><th>Template</th><th>Age</th>
      <th>Expires</th><th>Metadata</th></tr></thead><tbody id="rows"></tbody></table>`;
  document.getElementById("create").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const s = await api.post("/v1/sandboxes", {
        template: document.getElementById("template").value || "base",
        ttl_seconds: Number(document.getElementById("ttl").value) || undefined,
      });
      toast(`Created ${s.id}`);
      location.hash = `#/sandboxes/${s.id}`;
    } catch (e) { document.getElementById("err").innerHTML = errorBox(e); }
  });
  const templates = (await api.get("/v1/templates")).templates.filter((t) => t.status === "ready");
  document.getElementById("template").innerHTML =
    templates.map((t) => `<option${t.name === "base" ? " selected" : ""}>${esc(t.name)}</option>`).join("");
  const draw = async () => {
    try {
      const list = (await api.get("/v1/sandboxes")).sandboxes;
      document.getElementById("rows").innerHTML = list.length ? list.map((s) => `
        <tr><td><a class="mono" href="#/sandboxes/${esc(s.id)}">${esc(s.id)}</a></td>
        <td>${state(s.state)}</td><td>${esc(s.template)}</td><td>${age(s.created_at_ms)}</td>
        <td>${s.expires_at_ms ? when(s.expires_at_ms) : "never"}</td>
        <td class="mono">${esc(Object.entries(s.metadata || {}).map(([k, v]) => `${k}=${v}`).join(" "))}</td></tr>`).join("")
        : `<tr><td colspan="6" class="muted">No sandboxes yet.</td></tr>`;
      document.getElementById("err").innerHTML = "";
    } catch (e) { document.getElementById("err").innerHTML = errorBox(e); }
  };
  await draw();
  every(2000, draw);
}

// A sandbox's egress log: every DNS query, connection and refusal (GET .../egress).
const kEgressShown = 100;
function egressTable(log) {
  const entries = log.entries.slice(-kEgressShown).reverse();
  if (!entries.length) return `<p class="muted">Nothing reached or refused yet.</p>`;
  const where = (e) => e.kind === "dns"
    ? `${esc(e.name)} ${esc(e.type)}${(e.answers || []).length ? ` → ${esc(e.answers.join(", "))}` : ""}`
    : e.kind === "secret"
      ? `${esc(e.method)} ${esc(e.protocol)}://${esc(e.name)} (${esc(e.destination)}:${esc(e.port)})`
      : `${esc(e.protocol)} ${esc(e.destination)}${e.port ? `:${esc(e.port)}` : ""}${e.name ? ` (${esc(e.name)})` : ""}`;
  // A request that carried secrets' placeholders: which were put in, which were not.
  const secrets = (e) => [(e.injected || []).length ? `put in: ${esc(e.injected.join(", "))}` : "",
    (e.refused || []).length ? `not put in: ${esc(e.refused.join(", "))}` : ""].filter(Boolean).join("; ");
  const bytes = (e) => (e.kind === "connection" && e.verdict === "allowed"
    ? `${esc(e.bytes_out)} / ${esc(e.bytes_in)}${e.ended_ms ? "" : " (open)"}`
    : e.kind === "secret" ? secrets(e) : "");
  const lost = log.dropped || log.lost
    ? `<p class="muted">${esc(log.dropped)} older entries dropped, ${esc(log.lost)} lost.</p>` : "";
  return `${lost}<table aria-label="Egress log"><thead><tr><th>Time</th><th>Kind</th><th>Verdict</th>
    <th>Where</th><th>Bytes out / in, secrets</th></tr></thead><tbody>${entries.map((e) => `
    <tr><td>${when(e.timestamp_ms)}</td><td>${esc(e.kind)}</td>
    <td>${state(e.verdict)}${e.reason ? ` <span class="muted">${esc(e.reason)}</span>` : ""}</td>
    <td class="mono">${where(e)}</td><td>${bytes(e)}</td></tr>`).join("")}</tbody></table>`;
}

async function sandbox(id) {
  const base = `/v1/sandboxes/${encodeURIComponent(id)}`;
  main.innerHTML = `
    <p><a href="#/sandboxes">← Sandboxes</a></p>
    <h1 class="mono">${esc(id)}</h1>
    <div id="err"></div>
    <div class="grid">
      <section class="card" aria-labelledby="h-info"><h2 id="h-info">Details</h2><div id="info"></div>
        <div class="row">
          <button type="button" data-act="hibernate" class="secondary">Hibernate</button>
          <button type="button" data-act="wake" class="secondary">Wake</button>
          <button type="button" data-act="snapshots" class="secondary">Snapshot</button>
          <button type="button" data-act="fork" class="secondary">Fork</button>
          <button type="button" data-act="kill" class="danger">Kill</button>
        </div></section>
      <section class="card" aria-labelledby="h-events"><h2 id="h-events">Events</h2>
        <ol class="timeline" id="events"></ol></section>
    </div>
    <section class="card" aria-labelledby="h-exec"><h2 id="h-exec">Console</h2>
      <form id="exec" class="row">
        <label style="flex:1">Command <input id="cmd" class="mono" autocomplete="off" placeholder="python3 -c 'print(6*7)'"></label>
        <button type="submit">Run</button>
      </form>
      <pre class="console" id="output" aria-live="polite" aria-label="Command output"></pre></section>
    <section class="card" aria-labelledby="h-files"><h2 id="h-files">Files</h2>
      <form id="ls" class="row">
        <label style="flex:1">Folder <input id="path" class="mono" value="/workspace"></label>
        <button type="submit" class="secondary">List</button>
      </form>
      <table aria-label="Files"><thead><tr><th>Name</th><th>Size</th><th></th></tr></thead><tbody id="files"></tbody></table>
      <form id="upload" class="row">
        <label>Upload a file <input id="file" type="file"></label>
        <button type="submit" class="secondary">Upload</button>
      </form></section>
    <div class="grid">
      <section class="card" aria-labelledby="h-net"><h2 id="h-net">Network and ports</h2><div id="net"></div></section>
      <section class="card" aria-labelledby="h-snaps"><h2 id="h-snaps">Snapshots and fork tree</h2><div id="snaps"></div></section>
    </div>
    <section class="card" aria-labelledby="h-egress"><h2 id="h-egress">Egress</h2><div id="egress"></div></section>
    <section class="card" aria-labelledby="h-use"><h2 id="h-use">Resources</h2><div id="use" class="grid"></div></section>`;
  const err = (e) => { document.getElementById("err").innerHTML = e ? errorBox(e) : ""; };
  const draw = async () => {
    const s = await api.get(base);
    document.getElementById("info").innerHTML = `
      <table><tbody>
        <tr><th>State</th><td id="state">${state(s.state)}</td></tr>
        <tr><th>Template</th><td>${esc(s.template)}</td></tr>
        <tr><th>Shape</th><td>${esc(s.memory_mib)} MiB, ${esc(s.vcpus)} vCPU${s.vcpus === 1 ? "" : "s"}</td></tr>
        <tr><th>Created</th><td>${when(s.created_at_ms)} (${age(s.created_at_ms)} ago)</td></tr>
        <tr><th>Expires</th><td>${s.expires_at_ms ? when(s.expires_at_ms) : "never"}</td></tr>
        <tr><th>Metadata</th><td class="mono">${esc(JSON.stringify(s.metadata || {}))}</td></tr>
        ${s.parent ? `<tr><th>Parent</th><td><a class="mono" href="#/sandboxes/${esc(s.parent)}">${esc(s.parent)}</a></td></tr>` : ""}
        <tr><th>Volumes</th><td class="mono">${esc((s.volumes || []).map((v) => `${v.volume} at ${v.mount}`).join(", ") || "none")}</td></tr>
      </tbody></table>`;
    // Preview URLs: a link each (with its token: this is the tenant's own page), and a form.
    const previews = s.network ? (await api.get(`${base}/previews`)).previews : [];
    const live = previews.filter((p) => p.expires_at_ms > Date.now());
    document.getElementById("net").innerHTML = s.network
      ? `<p>Egress: <code>${esc(s.egress?.mode ?? "")}</code> ${esc((s.egress?.cidrs || []).join(" "))}</p>
         <p>Ports: ${esc((s.ports || []).join(", ") || "none exposed")}</p>
         <ul aria-label="Preview URLs">${live.map((p) => `<li><a class="mono preview-link" target="_blank"
           rel="noopener noreferrer" href="${esc(p.url)}">port ${esc(p.port)}</a>
           ${p.public ? "(public)" : ""} until ${when(p.expires_at_ms)}</li>`).join("") || "<li class=\"muted\">No preview URLs.</li>"}</ul>
         <form id="preview" class="row"><label>Preview port <input id="preview-port" type="number" min="1" max="65535" required></label>
           <button type="submit" class="secondary">Open a preview URL</button></form>`
      : `<p class="muted">No network.</p>`;
    document.getElementById("preview")?.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      try {
        const p = await api.post(`${base}/previews`, { port: Number(document.getElementById("preview-port").value) });
        toast(`Preview of port ${p.port} ready`);
        await draw();
        err();
      } catch (e) { err(e); }
    });
    // What it reached and was refused (its egress log, newest first; refreshed with the page).
    document.getElementById("egress").innerHTML = s.network ? egressTable(await api.get(`${base}/egress?limit=1000`))
      : `<p class="muted">No network: nothing leaves this sandbox.</p>`;
    // The fork tree around it: its parent, and its children (sandboxes forked from it).
    const all = (await api.get("/v1/sandboxes")).sandboxes;
    const link = (x) => `<a class="mono" href="#/sandboxes/${esc(x)}">${esc(x)}</a>`;
    const kids = all.filter((x) => x.parent === id);
    document.getElementById("snaps").innerHTML =
      `<p>Snapshots: ${(s.snapshots || []).map((x) => `<span class="mono">${esc(x)}</span>`).join(", ") || "none"}</p>
       <ul class="tree" aria-label="Fork tree"><li>${s.parent ? `${link(s.parent)} (parent)<ul><li>` : ""}<strong class="mono">${esc(id)}</strong>
       ${kids.length ? `<ul>${kids.map((k) => `<li>${link(k.id)} ${state(k.state)}</li>`).join("")}</ul>` : ""}
       ${s.parent ? "</li></ul>" : ""}</li></ul>`;
    // CPU, memory and disk over time (the host's view of its VM, sampled every few seconds).
    const samples = s.state === "running" || s.state === "hibernated"
      ? (await api.get(`${base}/metrics`)).metrics : [];
    const series = (f) => samples.map((m) => ({ t: m.timestamp_ms, v: f(m) }));
    const mib = (b) => b / 1048576;
    document.getElementById("use").innerHTML =
      lineChart("CPU", series((m) => m.cpu_used_pct), { max: 100, unit: " %" }) +
      lineChart("Memory", series((m) => mib(m.mem_used_bytes)), { max: mib(s.memory_mib * 1048576), unit: " MiB" }) +
      lineChart("Disk written", series((m) => mib(m.disk_used_bytes)), { unit: " MiB" });
    const ev = (await api.get(`${base}/events`)).events;
    document.getElementById("events").innerHTML = ev.slice(-200).reverse().map((e) =>
      `<li><span class="muted">${when(e.time_ms)}</span> <strong>${esc(e.type)}</strong></li>`).join("");
    return s;
  };
  // (its forms work before its first data arrives: every handler is in place first)
  main.querySelectorAll("button[data-act]").forEach((b) => b.addEventListener("click", async () => {
    const act = b.dataset.act;
    b.disabled = true;
    try {
      if (act === "kill") {
        await api.del(base);
        toast(`Killed ${id}`);
      } else if (act === "fork") {
        const r = await api.post(`${base}/fork`, { count: 1 });
        toast(`Forked: ${r.sandboxes[0].id}`);
      } else if (act === "snapshots") {
        const r = await api.post(`${base}/snapshots`);
        toast(`Snapshot ${r.snapshot_id}`);
      } else {
        await api.post(`${base}/${act}`);
        toast(`${act === "wake" ? "Woken" : "Hibernated"}`);
      }
      await draw();
      err();
    } catch (e) { err(e); } finally { b.disabled = false; }
  }));
  // The console: the command's output as it streams.
  document.getElementById("exec").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const out = document.getElementById("output");
    const cmd = document.getElementById("cmd").value;
    if (!cmd) return;
    out.textContent = `$ ${cmd}\n`;
    const add = (text, cls) => {
      const span = document.createElement("span");
      if (cls) span.className = cls;
      span.textContent = text;
      out.appendChild(span);
      out.scrollTop = out.scrollHeight;
    };
    const decode = (d) => (d.encoding === "base64" ? atob(d.data) : d.data);
    try {
      await api.stream("POST", `${base}/exec/stream`, { cmd, timeout_seconds: 300 }, (event, d) => {
        if (event === "stdout") add(decode(d));
        else if (event === "stderr") add(decode(d), "err");
        else if (event === "exit") add(`\n[exit ${d.exit_code}${d.timed_out ? ", timed out" : ""}]\n`);
        else if (event === "error") add(`\n[${d.code}: ${d.message}]\n`, "err");
      });
    } catch (e) { add(`\n[${e.message}]\n`, "err"); }
  });
  // Files: list, download (a blob fetched with the key), upload.
  const list = async () => {
    const path = document.getElementById("path").value;
    try {
      const r = await api.get(`${base}/files/list?path=${encodeURIComponent(path)}`);
      const entries = r.entries || [];
      const dir = (f) => f.type === "directory";
      document.getElementById("files").innerHTML = entries.length ? entries.map((f) => `
        <tr><td class="mono">${esc(f.name)}${dir(f) ? "/" : ""}</td><td>${dir(f) ? "" : esc(f.size)}</td>
        <td>${dir(f) ? "" : `<button type="button" class="secondary" aria-label="Download ${esc(f.name)}" data-download="${esc(`${r.path.replace(/\/$/, "")}/${f.name}`)}">Download</button>`}</td></tr>`).join("")
        : `<tr><td colspan="3" class="muted">Empty.</td></tr>`;
      document.querySelectorAll("button[data-download]").forEach((b) => b.addEventListener("click", async () => {
        try {
          const blob = await api.blob(`${base}/files?path=${encodeURIComponent(b.dataset.download)}`);
          const a = document.createElement("a");
          a.href = URL.createObjectURL(blob);
          a.download = b.dataset.download.split("/").pop();
          document.body.appendChild(a);
          a.click();
          a.remove();
        } catch (e) { err(e); }
      }));
      err();
    } catch (e) { err(e); }
  };
  document.getElementById("ls").addEventListener("submit", (ev) => { ev.preventDefault(); list(); });
  document.getElementById("upload").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const f = document.getElementById("file").files[0];
    if (!f) return;
    const dir = document.getElementById("path").value.replace(/\/$/, "");
    try {
      await api.put(`${base}/files?path=${encodeURIComponent(`${dir}/${f.name}`)}`, f);
      toast(`Uploaded ${f.name}`);
      await list();
    } catch (e) { err(e); }
  });
  list();
  try { await draw(); } catch (e) { return err(e); }
  every(2000, async () => { try { await draw(); err(); } catch (e) { err(e); } });
}

// ------------------------------------------------------------------------------------------
// Templates (with a build's live progress)

async function templates() {
  main.innerHTML = `
    <h1>Templates</h1>
    <div id="err"></div>
    <table aria-label="Templates"><thead><tr><th>Name</th><th>Kind</th><th>Status</th><th>From</th>
      <th>Packages</th><th>Memory</th><th>vCPUs</th><th>Build</th><th>Size</th><th></th></tr></thead><tbody id="rows"></tbody></table>
    <section class="card" aria-labelledby="h-build"><h2 id="h-build">Build a template</h2>
      <form id="build">
        <div class="row">
          <label>Name <input id="t-name" required maxlength="40"></label>
          <label>From <select id="t-from"><option>base</option><option>code-interpreter</option></select></label>
          <label style="flex:1">Debian packages (space separated) <input id="t-packages" placeholder="jq git"></label>
          <label>Memory (MiB) <input id="t-memory" type="number" min="128" max="65536" step="64" placeholder="host default"></label>
          <label>vCPUs <input id="t-vcpus" type="number" min="1" max="32" placeholder="host default"></label>
        </div>
        <label>Commands run as root in the guest (one per line)
          <textarea id="t-run" rows="3" class="mono"></textarea></label>
        <div class="row"><button type="submit">Build</button></div>
      </form>
      <div id="progress" hidden>
        <div class="row"><span id="stage">queued</span>
          <div class="bar" role="progressbar" aria-label="Build progress" aria-valuemin="0" aria-valuemax="100" id="bar"><div style="width:0"></div></div>
          <span id="pct">0%</span></div>
        <pre class="console" id="log" aria-label="Build log"></pre>
      </div>
    </section>`;
  const err = (e) => { document.getElementById("err").innerHTML = e ? errorBox(e) : ""; };
  const draw = async () => {
    const list = (await api.get("/v1/templates")).templates;
    document.getElementById("rows").innerHTML = list.map((t) => `
      <tr><td>${esc(t.name)}</td><td>${esc(t.kind)}</td><td>${state(t.status)}</td><td>${esc(t.from ?? "")}</td>
      <td class="mono">${esc((t.packages || []).join(" "))}</td>
      <td>${esc(t.memory_mib ?? "")} MiB</td><td>${esc(t.vcpus ?? "")}</td>
      <td>${t.build_ms ? `${(t.build_ms / 1000).toFixed(1)} s` : ""}</td>
      <td>${t.size_bytes ? `${(t.size_bytes / 1e6).toFixed(0)} MB` : ""}</td>
      <td>${t.kind === "custom" && t.status !== "building" ? `<button type="button" class="danger" data-delete="${esc(t.name)}">Delete</button>` : ""}</td></tr>`).join("");
    document.querySelectorAll("button[data-delete]").forEach((b) => b.addEventListener("click", async () => {
      try { await api.del(`/v1/templates/${encodeURIComponent(b.dataset.delete)}`); await draw(); err(); } catch (e) { err(e); }
    }));
  };
  try { await draw(); } catch (e) { err(e); }
  document.getElementById("build").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const name = document.getElementById("t-name").value;
    const body = {
      name,
      from: document.getElementById("t-from").value,
      packages: document.getElementById("t-packages").value.split(/\s+/).filter(Boolean),
      run: document.getElementById("t-run").value.split("\n").filter((l) => l.trim()),
    };
    const memory = document.getElementById("t-memory").value;
    const vcpus = document.getElementById("t-vcpus").value;
    if (memory) body.memory_mib = Number(memory);
    if (vcpus) body.vcpus = Number(vcpus);
    const log = document.getElementById("log");
    document.getElementById("progress").hidden = false;
    log.textContent = "";
    try {
      await api.post("/v1/templates", body);
      await draw();
      await api.stream("GET", `/v1/templates/${encodeURIComponent(name)}/build`, undefined, (event, d) => {
        if (event === "stage") {
          document.getElementById("stage").textContent = d.stage;
          document.getElementById("pct").textContent = `${d.percent}%`;
          const bar = document.getElementById("bar");
          bar.setAttribute("aria-valuenow", d.percent);
          bar.firstElementChild.style.width = `${d.percent}%`;
        } else if (event === "log") {
          log.textContent += `${d.line}\n`;
          log.scrollTop = log.scrollHeight;
        } else if (event === "end") {
          log.textContent += d.status === "ready" ? "\nReady.\n" : `\nFailed: ${d.error}\n`;
        }
      });
      await draw();
      err();
    } catch (e) { err(e); }
  });
}

// ------------------------------------------------------------------------------------------
// Volumes, databases, hosts, metrics

async function table(title, path, field, columns, empty) {
  main.innerHTML = `<h1>${esc(title)}</h1><div id="err"></div>
    <table aria-label="${esc(title)}"><thead><tr>${columns.map(([h]) => `<th>${esc(h)}</th>`).join("")}</tr></thead>
    <tbody id="rows"></tbody></table>`;
  const draw = async () => {
    try {
      const list = (await api.get(path))[field] || [];
      document.getElementById("rows").innerHTML = list.length
        ? list.map((x) => `<tr>${columns.map(([, f]) => `<td>${f(x)}</td>`).join("")}</tr>`).join("")
        : `<tr><td colspan="${columns.length}" class="muted">${esc(empty)}</td></tr>`;
      document.getElementById("err").innerHTML = "";
    } catch (e) {
      document.getElementById("err").innerHTML = e.code === "cluster_disabled"
        ? `<p class="muted">This daemon runs on its own (no cluster): one host, this one.</p>` : errorBox(e);
    }
  };
  await draw();
  every(3000, draw);
}

const volumes = () => table("Volumes", "/v1/volumes", "volumes", [
  ["ID", (v) => `<span class="mono">${esc(v.id)}</span>`], ["Name", (v) => esc(v.name)],
  ["Status", (v) => state(v.status)], ["Size", (v) => `${esc(v.size_mib)} MiB`],
  ["Attached to", (v) => (v.attachments || []).map((a) => `<a class="mono" href="#/sandboxes/${esc(a.sandbox)}">${esc(a.sandbox)}</a> ${esc(a.mount)}`).join("<br>")],
  ["Snapshots", (v) => esc((v.snapshots || []).length)],
], "No volumes.");

const databases = () => table("Databases", "/v1/databases", "databases", [
  ["ID", (d) => `<span class="mono">${esc(d.id)}</span>`], ["Name", (d) => esc(d.name)],
  ["Status", (d) => state(d.status)], ["Address", (d) => esc(d.host ? `${d.host}:${d.port}` : "")],
  ["Backups", (d) => esc((d.backups || []).length)],
], "No databases.");

// Secrets: names, where each may be sent, version and expiry; a value is never answered.
const secrets = () => table("Secrets", "/v1/secrets", "secrets", [
  ["Name", (v) => `<span class="mono">${esc(v.name)}</span>`],
  ["Hosts", (v) => `<span class="mono">${esc((v.hosts || []).join(", "))}</span>`],
  ["Version", (v) => esc(v.version)], ["Updated", (v) => when(v.updated_at_ms)],
  ["Expires", (v) => (v.expires_at_ms ? when(v.expires_at_ms) : "never")],
], "No secrets. Create one with the API or `pandastack secret create NAME --host H` (the value from stdin).");

const hosts = () => table("Hosts", "/v1/hosts", "hosts", [
  ["Host", (h) => `${esc(h.id)}${h.self ? " (this one)" : ""}`], ["State", (h) => state(h.state === "up" ? "running" : "failed")],
  ["Sandboxes", (h) => esc(h.sandboxes)], ["Free memory", (h) => `${esc(h.free_mib)} MiB`],
  ["Draining", (h) => (h.draining ? "yes" : "")], ["Accelerator", (h) => esc(h.accel)],
], "No hosts.");

// The daemon's /metrics, sampled while the page is open (kept across visits: the last 5 minutes):
// rates and latency percentiles between samples, and the sandboxes by state now.
const samples = [];
const kSampleMs = 2000, kKeepMs = 5 * 60 * 1000;

async function metrics() {
  main.innerHTML = `<h1>Metrics</h1><div id="err"></div><div id="charts" class="grid charts"></div>
    <p class="muted">Sampled every ${kSampleMs / 1000} s while this page is open (the last five minutes).</p>`;
  const draw = async () => {
    try {
      const series = parseMetrics(await api.text("/metrics"));
      const now = Date.now();
      samples.push({ t: now, series });
      while (samples.length && samples[0].t < now - kKeepMs) samples.shift();
      const states = series.filter((s) => s.name === "pandastack_sandboxes")
        .map((s) => ({ label: s.labels.state, value: s.value }));
      const latency = (title, name) => linesChart(title, [
        { name: "p50", points: quantiles(samples, name, 0.5) },
        { name: "p99", points: quantiles(samples, name, 0.99) }], { unit: " ms" });
      document.getElementById("charts").innerHTML =
        barChart("Sandboxes by state", states) +
        lineChart("Creates per second", rates(samples, "pandastack_creates_total"), { unit: "/s" }) +
        lineChart("Commands per second", rates(samples, "pandastack_execs_total"), { unit: "/s" }) +
        lineChart("Errors per second", rates(samples, "pandastack_errors_total"), { unit: "/s" }) +
        latency("Create latency (server side)", "pandastack_create_seconds") +
        latency("Command latency (server side)", "pandastack_exec_seconds");
    } catch (e) { document.getElementById("err").innerHTML = errorBox(e); }
  };
  await draw();
  every(kSampleMs, draw);
}

// ------------------------------------------------------------------------------------------
// The router

async function route() {
  const g = ++generation;
  const hash = location.hash || "#/sandboxes";
  if (!key.get()) return signin();
  nav.hidden = false;
  const parts = hash.slice(2).split("/");
  for (const a of nav.querySelectorAll("a"))
    a.classList.toggle("active", a.getAttribute("href") === `#/${parts[0]}`);
  try {
    if (parts[0] === "sandboxes" && parts[1]) await sandbox(decodeURIComponent(parts[1]));
    else if (parts[0] === "templates") await templates();
    else if (parts[0] === "volumes") await volumes();
    else if (parts[0] === "databases") await databases();
    else if (parts[0] === "secrets") await secrets();
    else if (parts[0] === "hosts") await hosts();
    else if (parts[0] === "metrics") await metrics();
    else await sandboxes();
  } catch (e) {
    // A view left before it finished (the user went on): what it failed at is not this page's.
    if (g !== generation) return;
    if (e.status === 401) {
      key.clear();
      return signin(errorBox(new Error(`The key was refused (${e.message})`)));
    }
    main.innerHTML = errorBox(e);
  }
  main.focus();
}

document.getElementById("sign-out").addEventListener("click", () => {
  key.clear();
  location.hash = "";
  route();
});
window.addEventListener("hashchange", route);
route();
