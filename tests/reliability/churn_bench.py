#!/usr/bin/env python3
"""`make bench-churn N=10000`: does a host's cost grow with its history? A daemon of its own (no
network, default pools) creates and kills sandboxes one after another (`pandastack-bench api
churn`); after the first N/10 and after all N it is restarted and its start-up time (spawn to its
API answering) and RSS after start are measured. Prints the bench's JSON lines and a summary line:
create p50, RSS and start-up at N/10 and at N, and their ratios (issue 32: within 10%).

Usage: churn_bench.py --daemon build/bin/pandastackd --bench build/bin/pandastack-bench
  [--images var/images] [--n 10000] [--retention S]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "api"))
import harness  # noqa: E402
from harness import Daemon, rss_mib  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    p.add_argument("--bench", required=True)
    p.add_argument("--images", default=os.environ.get("PANDASTACK_IMAGES", "var/images"))
    p.add_argument("--n", type=int, default=10000)
    p.add_argument("--retention", type=int, default=None,
                   help="--ended-retention of the daemon (default: the daemon's)")
    args = p.parse_args()
    args.images = os.path.abspath(args.images)
    harness.ARGS = args
    base = tempfile.mkdtemp(prefix="pst-churn-", dir="/var/tmp")
    extra = ["--network", "off"]
    if args.retention is not None:
        extra += ["--ended-retention", str(args.retention)]
    data, state = os.path.join(base, "data"), os.path.join(base, "state")

    def start():
        t = time.monotonic()
        d = Daemon(data, state, extra=extra)
        return d, (time.monotonic() - t) * 1000.0

    d, first_start = start()
    marks = {}
    try:
        done = 0
        for upto in (max(1, args.n // 10), args.n):
            r = subprocess.run([args.bench, "api", "churn", "--url", d.url, "--key", d.key,
                                "--n", str(upto - done), "--window",
                                str(max(1, min(1000, (upto - done) // 2))),
                                "--daemon-pid", str(d.proc.pid)],
                               capture_output=True, text=True)
            print(r.stdout.strip(), flush=True)
            if r.returncode != 0:
                sys.stderr.write(r.stderr)
                return 1
            last = json.loads(r.stdout.strip().splitlines()[-1])["last"]
            done = upto
            d.stop()
            d, started_ms = start()
            time.sleep(2)  # its pools refill
            marks[upto] = {"create_p50_ms": last["create_p50_ms"],
                           "rss_mib_before_restart": last["daemon_rss_mib"],
                           "start_ms": round(started_ms, 1),
                           "rss_mib_after_start": round(rss_mib(d.proc.pid), 1)}
        a, b = marks[max(1, args.n // 10)], marks[args.n]
        print(json.dumps({"scenario": "churn-summary", "n": args.n,
                          "first_start_ms": round(first_start, 1), "at": marks,
                          "create_p50_ratio": round(b["create_p50_ms"] / a["create_p50_ms"], 3),
                          "rss_ratio": round(b["rss_mib_before_restart"] /
                                             a["rss_mib_before_restart"], 3),
                          "start_ratio": round(b["start_ms"] / a["start_ms"], 3)}), flush=True)
        return 0
    finally:
        d.stop(reap=True)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
