#!/usr/bin/env python3
"""Soak: a daemon of its own (real VMs) under `pandastack-bench api soak` (N sandboxes, C clients
of mixed exec, file write/read-back and streamed commands) for S seconds. Fails on any error, and
when the daemon's threads, descriptors or memory grow past the stated bounds between the start
and the end of the run: threads +8, descriptors +16, RSS +64 MiB.

Usage: soak_test.py --daemon build/bin/pandastackd --bench build/bin/pandastack-bench
  [--images DIR] [--sandboxes 20] [--clients 16] [--seconds 600]
`make test-soak` runs it with those defaults (SECONDS=, SANDBOXES=, CLIENTS= to change them).
Prints the bench's JSON line.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "api"))
import harness  # noqa: E402
from harness import Daemon  # noqa: E402

BOUNDS = {"daemon_threads": 8, "daemon_fds": 16, "daemon_rss_mib": 64}


class SoakTest(unittest.TestCase):

    def test_a_mixed_load_makes_no_error_and_the_daemon_does_not_grow(self):
        base = tempfile.mkdtemp(prefix="pst-soak-", dir="/var/tmp")
        d = Daemon(os.path.join(base, "data"), os.path.join(base, "state"),
                   extra=("--network", "off"))
        try:
            r = subprocess.run([ARGS.bench, "api", "soak", "--url", d.url, "--key", d.key,
                                "--sandboxes", str(ARGS.sandboxes), "--clients",
                                str(ARGS.clients), "--seconds", str(ARGS.seconds),
                                "--create-body", '{"network": false}'],
                               capture_output=True, text=True, timeout=ARGS.seconds + 900)
            print(r.stdout.strip(), flush=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            out = json.loads(r.stdout.strip().splitlines()[-1])
            self.assertEqual(out["errors"], 0)
            self.assertGreater(out["ops"], 0)
            for key, bound in BOUNDS.items():
                # (null when the bench did not find exactly one pandastackd on this host)
                self.assertIsNotNone(out[key], "run the soak with no other daemon on this host")
                grew = out[key]["end"] - out[key]["start"]
                self.assertLessEqual(grew, bound, (key, out[key]))
        finally:
            d.stop(reap=True)
            harness.reap_vms(base)
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    p.add_argument("--bench", required=True)
    p.add_argument("--images", default=os.environ.get("PANDASTACK_IMAGES", "var/images"))
    p.add_argument("--sandboxes", type=int, default=20)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=int, default=600)
    args, rest = p.parse_known_args()
    args.images = os.path.abspath(args.images)
    harness.ARGS = args
    ARGS = args
    harness.run_unittests(rest)
