#!/usr/bin/env python3
"""A graceful restart against the real daemon: SIGTERM hibernates persistent sandboxes, a new
daemon on the same data wakes them intact, the audit log reads and replays.

Usage: restart_test.py --daemon build/bin/pandastackd --cli build/bin/pandastack [unittest args]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Api, Daemon  # noqa: E402


class _Args:
    """harness.ARGS, read when used (main sets it after import)."""

    def __getattr__(self, name):
        return getattr(harness.ARGS, name)


ARGS = _Args()


class RestartTest(unittest.TestCase):
    """SIGTERM hibernates persistent sandboxes; a new daemon on the same data wakes them intact."""

    def test_graceful_restart(self):
        base = tempfile.mkdtemp(prefix="pst-api-rs-", dir="/dev/shm")
        daemons = []  # stopped in `finally`, so a failing assertion leaves no daemon running
        try:
            data, state = os.path.join(base, "data"), os.path.join(base, "state")
            d = Daemon(data, state)
            daemons.append(d)
            c = Api(d)
            keep = c.create(persistent=True)["id"]
            drop = c.create()["id"]
            self.assertEqual(c.exec(keep, "echo kept > /tmp/mark")[0], 200)
            self.assertEqual(d.stop(), 0)
            old = os.path.join(base, "old")
            shutil.copytree(os.path.join(data, "store"), os.path.join(old, "store"))  # as at the stop
            d2 = Daemon(data, state)
            daemons.append(d2)
            self.assertEqual(d2.key, d.key)  # the key file is read back
            c2 = Api(d2)
            self.assertEqual(c2.call("GET", f"/v1/sandboxes/{keep}")[1]["state"], "hibernated")
            self.assertEqual(c2.call("GET", f"/v1/sandboxes/{drop}")[1]["state"], "stopped")
            # A sandbox that ended before the restart answers as it did before it.
            self.assertEqual(c2.call("DELETE", f"/v1/sandboxes/{drop}")[0], 200)
            for method, path, body in (("POST", "exec", {"cmd": "true"}), ("POST", "hibernate", {}),
                                       ("POST", "wake", {}), ("POST", "fork", {}),
                                       ("POST", "snapshots", {})):
                s, b = c2.call(method, f"/v1/sandboxes/{drop}/{path}", body)
                self.assertEqual((s, b["error"]["code"]), (409, "sandbox_stopped"), (path, b))
            s, b = c2.call("PATCH", f"/v1/sandboxes/{drop}", {"ttl_seconds": 100})
            self.assertEqual((s, b["error"]["code"]), (409, "sandbox_stopped"), b)
            s, b = c2.call("GET", f"/v1/sandboxes/{drop}/files/list?path=/")
            self.assertEqual((s, b["error"]["code"]), (409, "sandbox_stopped"), b)
            self.assertEqual(c2.call("POST", f"/v1/sandboxes/{keep}/wake")[0], 200)
            self.assertEqual(c2.exec(keep, "cat /tmp/mark")[1]["stdout"], "kept\n")
            # The audit log, read from the store while the daemon runs, and through the API.
            cli = lambda *a: subprocess.run([ARGS.cli, *a], capture_output=True, text=True,
                                            timeout=120)
            r = cli("audit", "--data", data, "--json")
            self.assertEqual(r.returncode, 0, r.stderr)
            lines = [json.loads(l) for l in r.stdout.splitlines()]
            self.assertEqual([l["seq"] for l in lines], list(range(1, len(lines) + 1)))
            mine = [l["type"] for l in lines if l["sandbox"] == keep]
            self.assertEqual(mine[:2], ["created", "started"])
            self.assertIn("hibernated", mine)
            self.assertEqual(mine[-5:], ["transition-started", "woke", "network-attached",
                                         "exec-started", "exec-finished"])
            r = cli("audit", "--url", d2.url, "--key", d2.key, "--sandbox", keep)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(len(r.stdout.splitlines()), len(mine))
            self.assertIn("exec-finished", r.stdout)
            r = cli("audit", "--data", data, "--from", "2000-01-01T00:00:00Z", "--to", "1")
            self.assertEqual((r.returncode, r.stdout), (0, ""))
            # Replay: the current log rebuilds the live state exactly ...
            r = cli("audit", "replay", "--data", data, "--url", d2.url, "--key", d2.key)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("0 difference(s)", r.stdout)
            # ... and the log from before the wake does not: non-zero, with the difference named.
            r = cli("audit", "replay", "--data", old, "--url", d2.url, "--key", d2.key)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertIn(keep, r.stdout)
            self.assertEqual(cli("audit", "replay").returncode, 2)
            self.assertEqual(cli("nonsense").returncode, 2)
            self.assertEqual(d2.stop(), 0)
        finally:
            for x in daemons:
                if x.proc.poll() is None:
                    x.stop()
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    p.add_argument("--cli", required=True)
    p.add_argument("--images", default=os.environ.get("PANDASTACK_IMAGES", "var/images"))
    args, rest = p.parse_known_args()
    args.images = os.path.abspath(args.images)
    harness.ARGS = args
    harness.run_unittests(rest)
