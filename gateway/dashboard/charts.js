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

// Horizontal bars, one row each with its whole label on the left: labels never overlap, however
// many bars or however long their names.
export function barChart(title, bars) {
  const row = 22, w = 520, labelW = 130, h = 10 + row * Math.max(1, bars.length);
  const max = Math.max(1, ...bars.map((b) => b.value));
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
  let g = "";
  bars.forEach((b, i) => {
    const y = 5 + i * row, bw = Math.round((w - labelW - 60) * b.value / max);
    g += `<text class="label" x="${labelW - 6}" y="${y + 15}" text-anchor="end">${esc(b.label)}</text>`;
    g += `<rect class="b" x="${labelW}" y="${y + 3}" width="${bw}" height="${row - 8}"><title>${esc(b.label)}: ${b.value}</title></rect>`;
    g += `<text x="${labelW + bw + 6}" y="${y + 15}">${b.value}</text>`;
  });
  return `<figure class="card"><figcaption>${esc(title)}</figcaption>` +
    `<svg class="chart" role="img" aria-label="${esc(title)}" viewBox="0 0 ${w} ${h}" width="100%">${g}</svg></figure>`;
}

// A counter's rate per second between consecutive samples ([{t (ms), series}]): [{t, v}].
export function rates(samples, name) {
  const total = (s) => s.series.filter((x) => x.name === name).reduce((a, x) => a + x.value, 0);
  const out = [];
  for (let i = 1; i < samples.length; i++) {
    const dt = (samples[i].t - samples[i - 1].t) / 1000;
    if (dt > 0) out.push({ t: samples[i].t, v: Math.max(0, total(samples[i]) - total(samples[i - 1])) / dt });
  }
  return out;
}

// The q-quantile (0..1) in milliseconds of what a histogram observed between consecutive
// samples: [{t, v}], a point only where something was observed (the bucket's upper bound,
// interpolated linearly inside it; past the last bound, that bound).
export function quantiles(samples, name, q) {
  const cumulative = (s) => {
    const m = new Map();
    for (const x of s.series)
      if (x.name === `${name}_bucket`) m.set(x.labels.le, (m.get(x.labels.le) || 0) + x.value);
    return m;
  };
  const out = [];
  for (let i = 1; i < samples.length; i++) {
    const a = cumulative(samples[i - 1]), b = cumulative(samples[i]);
    const les = [...b.keys()].sort((x, y) => (x === "+Inf" ? 1 : y === "+Inf" ? -1 : Number(x) - Number(y)));
    const n = (b.get("+Inf") || 0) - (a.get("+Inf") || 0);
    if (n <= 0) continue;
    let lower = 0, below = 0, v = 0;
    for (const le of les) {
      const c = (b.get(le) || 0) - (a.get(le) || 0);
      if (le === "+Inf") { v = lower; break; }
      const upper = Number(le) * 1000;
      if (c >= q * n) { v = lower + (upper - lower) * Math.max(0, q * n - below) / Math.max(1, c - below); break; }
      lower = upper;
      below = c;
    }
    out.push({ t: samples[i].t, v });
  }
  return out;
}

// Lines over time: `lines` [{name, points: [{t (ms), v}]}] on one axis; `max` the top of the axis
// (the data's maximum when not given), `unit` appended to the axis labels. One line: its latest
// value in the caption; several: a legend.
export function linesChart(title, lines, { max, unit = "" } = {}) {
  const w = 520, h = 160, pad = 40;
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
  const all = lines.flatMap((l) => l.points);
  const top = max ?? Math.max(1, ...all.map((p) => p.v));
  const t0 = all.length ? Math.min(...all.map((p) => p.t)) : 0, t1 = all.length ? Math.max(...all.map((p) => p.t)) : 1;
  const x = (t) => pad + (w - pad - 10) * (t1 > t0 ? (t - t0) / (t1 - t0) : 0);
  const y = (v) => 10 + (h - 40) * (1 - Math.min(v, top) / top);
  const fmt = (v) => (v >= 100 ? Math.round(v) : v.toFixed(1));
  let g = `<line class="axis" x1="${pad}" y1="${h - 30}" x2="${w - 10}" y2="${h - 30}"/>` +
    `<text x="2" y="14">${fmt(top)}${esc(unit)}</text><text x="2" y="${h - 30}">0</text>` +
    `<text x="${pad}" y="${h - 12}">${all.length ? esc(new Date(t0).toLocaleTimeString()) : "no samples yet"}</text>` +
    (all.length ? `<text x="${w - 90}" y="${h - 12}">${esc(new Date(t1).toLocaleTimeString())}</text>` : "");
  lines.forEach((l, i) => {
    const path = l.points.map((p, j) => `${j ? "L" : "M"}${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join(" ");
    if (path) g += `<path class="line s${i}" d="${path}" fill="none"><title>${esc(l.name)}</title></path>`;
    // (a dot per sample: a lone one shows too)
    for (const p of l.points) g += `<circle class="dot s${i}" cx="${x(p.t).toFixed(1)}" cy="${y(p.v).toFixed(1)}" r="2.5"/>`;
  });
  const latest = (l) => (l.points.length ? fmt(l.points[l.points.length - 1].v) + unit : "–");
  const caption = lines.length === 1 ? `${esc(title)}: ${esc(latest(lines[0]))}`
    : `${esc(title)} <span class="legend">${lines.map((l, i) => `<span class="s${i}">${esc(l.name)} ${esc(latest(l))}</span>`).join(" ")}</span>`;
  return `<figure class="card"><figcaption>${caption}</figcaption>` +
    `<svg class="chart" role="img" aria-label="${esc(title)}" viewBox="0 0 ${w} ${h}" width="100%">${g}</svg></figure>`;
}

export function lineChart(title, points, opts = {}) {
  return linesChart(title, [{ name: title, points }], opts);
}
