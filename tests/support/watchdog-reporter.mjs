// The per-case watchdog of the node:test suites (the gtest and Python suites have their own:
// tests/support/watchdog.h, tests/api/watchdog.py). A reporter beside the usual one: it follows
// the cases as they start and end, and a case that runs past PANDASTACK_WATCHDOG_SECONDS
// (default 180) is named on stderr as `WATCHDOG: <case> still running after N s` (again after
// each further N); a case that ended after a minute or more as `SLOW: <case> took N s`.
// scripts/ctest.sh collects both at the end of a run. Use:
//   node --test --test-reporter=spec --test-reporter-destination=stdout \
//        --test-reporter=../support/watchdog-reporter.mjs --test-reporter-destination=stderr ...
const limit = Number(process.env.PANDASTACK_WATCHDOG_SECONDS || 180) * 1000;
const slow = 60 * 1000;

export default async function* watchdog(source) {
  const running = new Map(); // "file:name" -> {name, started, reports}
  const timer = setInterval(() => {
    const now = Date.now();
    for (const c of running.values()) {
      if (now - c.started >= limit * (c.reports + 1)) {
        c.reports += 1;
        process.stderr.write(`WATCHDOG: ${c.name} still running after ${Math.round((now - c.started) / 1000)} s\n`);
      }
    }
  }, 1000);
  timer.unref();
  try {
    for await (const event of source) {
      const d = event.data || {};
      const key = `${d.file}:${d.nesting}:${d.name}`;
      if (d.name === d.file) continue; // the file itself, as the runner's own case
      if (event.type === "test:dequeue" || event.type === "test:start") {
        if (!running.has(key)) running.set(key, { name: d.name, started: Date.now(), reports: 0 });
      } else if (event.type === "test:pass" || event.type === "test:fail") {
        const c = running.get(key);
        running.delete(key);
        const took = c ? Date.now() - c.started : d.details?.duration_ms ?? 0;
        if (took >= slow) yield `SLOW: ${d.name} took ${Math.round(took / 1000)} s\n`;
      }
    }
  } finally {
    clearInterval(timer);
  }
}
