// Metrics drawn in the page: Prometheus text from /metrics parsed into series, and bar charts as
// SVG (no library).
export function parseMetrics(text) {
  const out = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = line.match(/^([a-zA-Z_:][\w:]*)(\{([^}]*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    for (const kv of (m[3] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[kv[1]] = kv[2];
    out.push({ name: m[1], labels, value: Number(m[4]) });
  }
  return out;
}

// A histogram's buckets (cumulative counts by `le`) as per-bucket counts.
export function buckets(series, name, match = {}) {
  const rows = series.filter((s) => s.name === `${name}_bucket` &&
    Object.entries(match).every(([k, v]) => s.labels[k] === v));
  const byLe = new Map();
  for (const r of rows) byLe.set(r.labels.le, (byLe.get(r.labels.le) || 0) + r.value);
  const les = [...byLe.keys()].sort((a, b) => (a === "+Inf" ? 1 : b === "+Inf" ? -1 : Number(a) - Number(b)));
  let prev = 0;
  return les.map((le) => {
    const c = byLe.get(le);
    const n = c - prev;
    prev = c;
    return { label: le === "+Inf" ? "more" : `≤${Number(le) * 1000} ms`, value: n };
  });
}

export function barChart(title, bars) {
  const w = 520, h = 180, pad = 28, bw = Math.max(8, (w - pad) / Math.max(1, bars.length) - 6);
  const max = Math.max(1, ...bars.map((b) => b.value));
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
  let g = "";
  bars.forEach((b, i) => {
    const x = pad + i * (bw + 6), bh = Math.round((h - 50) * b.value / max);
    g += `<rect class="b" x="${x}" y="${h - 30 - bh}" width="${bw}" height="${bh}"><title>${esc(b.label)}: ${b.value}</title></rect>`;
    g += `<text x="${x}" y="${h - 16}">${esc(b.label).slice(0, 9)}</text>`;
    g += `<text x="${x}" y="${h - 34 - bh}">${b.value}</text>`;
  });
  return `<figure class="card"><figcaption>${esc(title)}</figcaption>` +
    `<svg class="chart" role="img" aria-label="${esc(title)}" viewBox="0 0 ${w} ${h}" width="100%">${g}</svg></figure>`;
}

// A line over time: `points` [{t (ms), v}], `max` the top of the axis (the data's maximum when
// not given), `unit` appended to the axis labels.
export function lineChart(title, points, { max, unit = "" } = {}) {
  const w = 520, h = 160, pad = 40;
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
  const top = max ?? Math.max(1, ...points.map((p) => p.v));
  const t0 = points.length ? points[0].t : 0, t1 = points.length ? points[points.length - 1].t : 1;
  const x = (t) => pad + (w - pad - 10) * (t1 > t0 ? (t - t0) / (t1 - t0) : 0);
  const y = (v) => 10 + (h - 40) * (1 - Math.min(v, top) / top);
  const path = points.map((p, i) => `${i ? "L" : "M"}${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join(" ");
  const last = points.length ? points[points.length - 1].v : 0;
  const fmt = (v) => (v >= 100 ? Math.round(v) : v.toFixed(1));
  const g = `<line class="axis" x1="${pad}" y1="${h - 30}" x2="${w - 10}" y2="${h - 30}"/>` +
    `<text x="2" y="14">${fmt(top)}${esc(unit)}</text><text x="2" y="${h - 30}">0</text>` +
    `<text x="${pad}" y="${h - 12}">${points.length ? esc(new Date(t0).toLocaleTimeString()) : "no samples yet"}</text>` +
    (points.length ? `<text x="${w - 90}" y="${h - 12}">${esc(new Date(t1).toLocaleTimeString())}</text>` : "") +
    (path ? `<path class="line" d="${path}" fill="none"/>` : "");
  return `<figure class="card"><figcaption>${esc(title)}: ${fmt(last)}${esc(unit)}</figcaption>` +
    `<svg class="chart" role="img" aria-label="${esc(title)}" viewBox="0 0 ${w} ${h}" width="100%">${g}</svg></figure>`;
}
