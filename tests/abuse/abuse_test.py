#!/usr/bin/env python3
"""Guest abuse against the real daemon (real VMs): what a hostile or careless guest does, and what
the daemon answers. Each case must end in its documented result while the daemon and another
sandbox keep working: 60 MB of non-streamed output, a disk filled to ENOSPC, a QEMU killed from the
host, a fork bomb that starves the guest agent, and a snapshot that fails for want of room.

Usage: abuse_test.py --daemon build/bin/pandastackd [--images var/images]
The daemon's data folder is on a real disk (guest disks live there) and its state folder on a
tmpfs of its own (1.5 GiB, mounted by the test: root), so the test can fill it.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "api"))
import harness  # noqa: E402
from harness import Api, Daemon  # noqa: E402


def qemu_pid(state, sid):
    """The pid of the QEMU running sandbox `sid` (from its live record)."""
    for f in glob.glob(os.path.join(state, "run", "*", "vm.json")):
        with open(f) as fh:
            r = json.load(fh)
        if r["name"].startswith(sid):
            return r["pid"]
    return None


class GuestAbuseTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.base = tempfile.mkdtemp(prefix="pst-abuse-", dir="/var/tmp")
        cls.state = os.path.join(cls.base, "state")
        os.makedirs(cls.state)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1536m,mode=0700", "tmpfs", cls.state],
                       check=True)
        try:
            cls.daemon = Daemon(os.path.join(cls.base, "data"), cls.state)
        except Exception:
            subprocess.run(["umount", "-l", cls.state])
            raise
        cls.api = Api(cls.daemon)
        cls.other = cls.api.create(network=False)["id"]  # a bystander: must not notice a thing

    @classmethod
    def tearDownClass(cls):
        code = cls.daemon.stop(reap=True)
        subprocess.run(["umount", "-l", cls.state])
        shutil.rmtree(cls.base, ignore_errors=True)
        assert code == 0, f"daemon exited {code}"

    def setUp(self):
        self.sid = self.api.create(network=False)["id"]

    def tearDown(self):
        self.api.call("DELETE", f"/v1/sandboxes/{self.sid}")
        # The daemon and the bystander are fine.
        s, b = self.api.call("GET", "/healthz")
        self.assertEqual(s, 200)
        s, b = self.api.exec(self.other, "echo fine")
        self.assertEqual((s, b.get("stdout")), (200, "fine\n"), b)

    def test_sixty_megabytes_of_output_are_cut_at_16_mib(self):
        s, b = self.api.exec(self.sid, "head -c 60000000 /dev/zero | tr '\\0' a",
                             timeout_seconds=300)
        self.assertEqual(s, 200, b)
        self.assertEqual((len(b["stdout"]), b["stdout_truncated"], b["exit_code"]),
                         (16 << 20, True, 0))
        s, b = self.api.exec(self.sid, "echo alive")  # the agent (PID 1) survived
        self.assertEqual((s, b["stdout"]), (200, "alive\n"))

    def test_a_full_disk_is_enospc_in_the_guest_not_a_dead_vm(self):
        s, b = self.api.exec(self.sid, "dd if=/dev/zero of=/workspace/fill bs=1M count=4000 2>&1;"
                             " df -P /workspace | tail -1", timeout_seconds=900)
        self.assertEqual(s, 200, b)
        self.assertIn("No space left on device", b["stdout"])
        self.assertIn("100%", b["stdout"])
        s, info = self.api.call("GET", f"/v1/sandboxes/{self.sid}")
        self.assertEqual(info["state"], "running")
        s, b = self.api.exec(self.sid, "rm /workspace/fill; echo still here")
        self.assertEqual((s, b["stdout"]), (200, "still here\n"))
        # A write into the full disk through the files API is the guest's no_space, not a 5xx.
        self.api.exec(self.sid, "dd if=/dev/zero of=/workspace/fill bs=1M count=4000 2>/dev/null")
        s, b = self.api.call("PUT", f"/v1/sandboxes/{self.sid}/files?path=/workspace/more",
                             raw=b"x" * (1 << 20))
        self.assertEqual((s, b["error"]["code"]), (507, "no_space"), b)

    def test_a_qemu_killed_from_the_host_fails_its_sandbox(self):
        pid = qemu_pid(self.state, self.sid)
        self.assertIsNotNone(pid)
        os.kill(pid, 9)
        deadline = time.time() + 10
        info = {}
        while time.time() < deadline:
            s, info = self.api.call("GET", f"/v1/sandboxes/{self.sid}")
            if info["state"] == "failed":
                break
            time.sleep(0.2)
        self.assertEqual(info["state"], "failed")
        self.assertTrue(info["failure_reason"].startswith(
            "vm_exited: QEMU was killed by signal 9"), info["failure_reason"])
        s, b = self.api.exec(self.sid, "true")
        self.assertEqual((s, b["error"]["code"]), (409, "sandbox_failed"))
        s, metrics = self.api.call("GET", "/metrics")
        self.assertRegex(metrics.decode(), r"pandastack_vm_exits_total [1-9]")
        # Reaped (no zombie) and its files gone.
        time.sleep(0.5)
        with open(f"/proc/{pid}/stat") if os.path.exists(f"/proc/{pid}") else open(os.devnull) as f:
            self.assertNotIn(") Z ", f.read())
        self.assertEqual(qemu_pid(self.state, self.sid), None)
        events = [e["type"] for e in self.api.call("GET", f"/v1/sandboxes/{self.sid}/events")[1]["events"]]
        self.assertEqual(events[-1], "failed")

    def test_the_host_enforces_exec_timeouts_when_a_fork_bomb_starves_the_guest(self):
        s, b = self.api.exec(self.sid, "bomb() { bomb | bomb & }; bomb", timeout_seconds=5)
        self.assertEqual(s, 200, b)
        t0 = time.time()
        s, b = self.api.exec(self.sid, "echo alive", timeout_seconds=5)
        took = time.time() - t0
        # An answer by the timeout plus the host's grace (5 s), whatever the guest does.
        self.assertLess(took, 16, b)
        self.assertIn(s, (200, 503), b)
        if s == 200 and b["exit_code"] != 0:
            self.assertTrue(b["timed_out"], b)

    def test_a_snapshot_that_cannot_be_written_is_an_error_and_leaves_nothing(self):
        # The snapshots folder full: a 16 MiB tmpfs over it (the guest's RAM does not fit). Not the
        # whole state folder: running guests' RAM files live there too, and a full tmpfs under a
        # running guest's RAM is a SIGBUS for its QEMU.
        snaps = os.path.join(self.state, "snapshots")
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", snaps],
                       check=True)
        try:
            s, b = self.api.call("POST", f"/v1/sandboxes/{self.sid}/snapshots", {})
            self.assertEqual((s, b["error"]["code"]), (500, "snapshot_failed"), b)
            self.assertIn("No space left", b["error"]["message"])
            self.assertEqual(os.listdir(snaps), [])  # nothing half-written
            s, info = self.api.call("GET", f"/v1/sandboxes/{self.sid}")
            self.assertEqual((info["state"], info["snapshots"]), ("running", []))
            s, b = self.api.call("POST", f"/v1/sandboxes/{self.sid}/fork", {})
            self.assertEqual((s, b["error"]["code"]), (500, "fork_failed"), b)
            self.assertEqual(os.listdir(snaps), [])
            s, b = self.api.exec(self.sid, "echo alive")
            self.assertEqual((s, b.get("stdout")), (200, "alive\n"), b)
        finally:
            subprocess.run(["umount", snaps], check=True)
        s, b = self.api.call("POST", f"/v1/sandboxes/{self.sid}/snapshots", {})
        self.assertEqual(s, 201, b)
        self.assertEqual(self.api.call("DELETE", f"/v1/snapshots/{b['snapshot_id']}")[0], 204)

    def test_a_hibernation_that_cannot_be_written_loses_nothing(self):
        # The hibernated folder full (a 16 MiB tmpfs over it): the guest's RAM does not fit. The
        # VM keeps running, its memory intact (before, QEMU was killed first: the sandbox came
        # back "running" with no VM, its memory gone).
        s, b = self.api.exec(self.sid, "echo kept > /tmp/m8 && cat /tmp/m8")
        self.assertEqual((s, b.get("stdout")), (200, "kept\n"), b)
        hib = os.path.join(self.state, "hibernated")
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", hib],
                       check=True)
        try:
            s, b = self.api.call("POST", f"/v1/sandboxes/{self.sid}/hibernate", {})
            self.assertEqual((s, b["error"]["code"]), (500, "hibernate_failed"), b)
            self.assertEqual(os.listdir(hib), [])  # nothing half-written
        finally:
            subprocess.run(["umount", hib], check=True)
        s, info = self.api.call("GET", f"/v1/sandboxes/{self.sid}")
        self.assertEqual(info["state"], "running")
        s, b = self.api.exec(self.sid, "cat /tmp/m8")
        self.assertEqual((s, b.get("stdout")), (200, "kept\n"), b)

    def test_fork_does_not_wait_for_commands_and_a_killed_fork_leaves_no_child(self):
        import threading
        out = {}
        t = threading.Thread(target=lambda: out.update(
            r=self.api.exec(self.sid, "sleep 6; echo slept", timeout_seconds=60)))
        t.start()
        time.sleep(1)
        t0 = time.time()
        s, b = self.api.call("POST", f"/v1/sandboxes/{self.sid}/fork", {})
        self.assertEqual(s, 201, b)
        self.assertLess(time.time() - t0, 4)  # not behind the 6 s command
        kid = b["sandboxes"][0]["id"]
        s, r = self.api.exec(kid, "echo child")
        self.assertEqual((s, r["stdout"]), (200, "child\n"))
        t.join()
        self.assertEqual(out["r"][1]["stdout"], "slept\n")
        self.api.call("DELETE", f"/v1/sandboxes/{kid}")
        # Killed while forking: the fork fails and none of its children survives.
        res = {}
        t = threading.Thread(target=lambda: res.update(
            r=self.api.call("POST", f"/v1/sandboxes/{self.sid}/fork", {"count": 3})))
        t.start()
        time.sleep(0.1)
        self.api.call("DELETE", f"/v1/sandboxes/{self.sid}")
        t.join()
        s, b = res["r"]
        if s == 201:  # the fork won the race: its children are known to the caller
            kids = [k["id"] for k in b["sandboxes"]]
            for k in kids:
                self.api.call("DELETE", f"/v1/sandboxes/{k}")
        else:
            self.assertEqual((s, b["error"]["code"]), (409, "sandbox_stopped"), b)
            time.sleep(2)
            s, lst = self.api.call("GET", "/v1/sandboxes?state=running")
            self.assertEqual([x["id"] for x in lst["sandboxes"] if x.get("parent") == self.sid], [])


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    p.add_argument("--images", default=os.environ.get("PANDASTACK_IMAGES", "var/images"))
    args, rest = p.parse_known_args()
    args.images = os.path.abspath(args.images)
    harness.ARGS = args
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)
