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
