#!/usr/bin/env python3
"""Integrity cycles through the real daemon and real VMs: a 64 MiB file in the guest's tmpfs
(memory) and one on its disk, hashed in the guest after every hibernate/wake cycle and in every
generation of a fork chain (a fork of a fork of ...): any mismatch fails.

Usage: integrity_test.py --daemon build/bin/pandastackd [--images DIR] [--cycles N] [--json]
`make test-integrity` runs 100 cycles and 100 generations (CYCLES=...); ctest `integrity` runs 3
of each. Prints a JSON summary line (cycles, generations, mismatches, per-step timings).
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "api"))
import harness  # noqa: E402
from harness import Api, Daemon  # noqa: E402

CYCLES = 3
MIB = 64
# The files: random bytes made once in the guest; memory (tmpfs) and disk.
FILES = ("/dev/shm/mem.bin", "/root/disk.bin")


def pct(xs, p):
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, max(0, int(round(p / 100 * len(xs) + 0.5)) - 1))], 3) if xs else None


class IntegrityTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.base = tempfile.mkdtemp(prefix="pst-integrity-", dir="/dev/shm")
        # A long TTL: 100 cycles take longer than the default 15 minutes.
        cls.daemon = Daemon(os.path.join(cls.base, "data"), os.path.join(cls.base, "state"),
                            extra=("--network", "off"))
        cls.api = Api(cls.daemon)
        cls.summary = {"mib": MIB}

    @classmethod
    def tearDownClass(cls):
        code = cls.daemon.stop(reap=True)
        shutil.rmtree(cls.base, ignore_errors=True)
        print(json.dumps({"integrity": cls.summary}), flush=True)
        assert code == 0, f"daemon exited {code}"

    def sh(self, sid, cmd, timeout=600):
        s, r = self.api.exec(sid, cmd, timeout_seconds=timeout)
        self.assertEqual((s, r.get("exit_code")), (200, 0), r)
        return r["stdout"]

    def hashes(self, sid):
        return self.sh(sid, "md5sum " + " ".join(FILES) + " | cut -d' ' -f1").split()

    def prepare(self):
        sid = self.api.create(ttl_seconds=86400)["id"]
        self.sh(sid, f"head -c {MIB}M /dev/urandom > {FILES[0]} && cp {FILES[0]} {FILES[1]} && "
                     f"dd if=/dev/urandom of={FILES[1]} bs=1M count=1 seek=7 conv=notrunc "
                     "status=none && sync")
        want = self.hashes(sid)
        self.assertEqual(len(want), 2)
        self.assertNotEqual(want[0], want[1])  # two different files
        return sid, want

    def test_hibernate_wake_cycles(self):
        sid, want = self.prepare()
        mismatches, hib, wake = 0, [], []
        for i in range(CYCLES):
            t0 = time.monotonic()
            s, b = self.api.call("POST", f"/v1/sandboxes/{sid}/hibernate")
            self.assertEqual((s, b.get("state")), (200, "hibernated"), b)
            t1 = time.monotonic()
            s, b = self.api.call("POST", f"/v1/sandboxes/{sid}/wake")
            self.assertEqual((s, b.get("state")), (200, "running"), b)
            t2 = time.monotonic()
            hib.append(t1 - t0)
            wake.append(t2 - t1)
            got = self.hashes(sid)
            if got != want:
                mismatches += 1
                print(f"cycle {i}: {got} != {want}", file=sys.stderr, flush=True)
        self.summary.update(cycles=CYCLES, cycle_mismatches=mismatches,
                            hibernate_s={"p50": pct(hib, 50), "p99": pct(hib, 99)},
                            wake_s={"p50": pct(wake, 50), "p99": pct(wake, 99)})
        self.assertEqual(mismatches, 0)

    def test_fork_generations(self):
        sid, want = self.prepare()
        mismatches, forks, chain = 0, [], [sid]
        for g in range(CYCLES):
            t0 = time.monotonic()
            s, b = self.api.call("POST", f"/v1/sandboxes/{chain[-1]}/fork", {"count": 1})
            self.assertEqual(s, 201, b)
            forks.append(time.monotonic() - t0)
            kid = b["sandboxes"][0]["id"]
            got = self.hashes(kid)
            if got != want:
                mismatches += 1
                print(f"generation {g + 1}: {got} != {want}", file=sys.stderr, flush=True)
            # The parent is done: the chain goes on from its child (RAM stays bounded).
            if len(chain) > 1:
                self.api.call("DELETE", f"/v1/sandboxes/{chain[-1]}")
            chain.append(kid)
        # The first sandbox still has its own files, untouched by its descendants.
        self.assertEqual(self.hashes(sid), want)
        self.summary.update(generations=CYCLES, generation_mismatches=mismatches,
                            fork_s={"p50": pct(forks, 50), "p99": pct(forks, 99)})
        self.assertEqual(mismatches, 0)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    p.add_argument("--images", default=os.environ.get("PANDASTACK_IMAGES", "var/images"))
    p.add_argument("--cycles", type=int, default=3)
    args, rest = p.parse_known_args()
    args.images = os.path.abspath(args.images)
    harness.ARGS = args
    CYCLES = args.cycles
    harness.run_unittests(rest)
