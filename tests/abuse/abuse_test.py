#!/usr/bin/env python3
"""Guest abuse against the real daemon (real VMs): what a hostile or careless guest does, and what
the daemon answers. Each case must end in its documented result while the daemon and another
sandbox keep working: 60 MB of non-streamed output, a disk filled to ENOSPC, a QEMU killed from the
host, a fork bomb that starves the guest agent, and a snapshot that fails for want of room. The
cases that run while a bystander is measured (a busy loop, a memory hog past the guest's RAM, an
output flood to a client that does not read, 10,000 files, garbage written at the agent's port,
the fork bomb) must leave the bystander's API latency within 2x of idle: the figures are printed
(ABUSE lines) and kept in docs/reliability.md.

Usage: abuse_test.py --daemon build/bin/pandastackd [--images var/images]
The daemon's data folder is on a real disk (guest disks live there) and its state folder on a
tmpfs of its own (1.5 GiB, mounted by the test: root), so the test can fill it.
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "api"))
import harness  # noqa: E402
from harness import Api, Daemon, qemu_pid  # noqa: E402


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
        cls.bystander_latency()  # warm
        cls.idle = cls.bystander_latency()
        print(f"ABUSE idle bystander latency p50 {cls.idle * 1000:.0f} ms", flush=True)

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

    @classmethod
    def bystander_latency(cls, n=5):
        """The bystander's API latency (s): the sum of the medians of n of each of an exec, a GET
        and a file read (one figure that moves with any of them)."""
        calls = (lambda: cls.api.exec(cls.other, "true"),
                 lambda: cls.api.call("GET", f"/v1/sandboxes/{cls.other}"),
                 lambda: cls.api.call("GET", f"/v1/sandboxes/{cls.other}/files?path=/etc/hostname"))
        times = [[], [], []]
        for _ in range(n):
            for i, call in enumerate(calls):
                t0 = time.time()
                s, b = call()
                times[i].append(time.time() - t0)
                assert s == 200, (s, b)
        return sum(statistics.median(t) for t in times)

    def while_abusing(self, name, abuse, settle=1.0):
        """Runs `abuse` in a thread; once it has run `settle` s, measures the bystander; asserts
        its latency stays within 2x of idle; returns what `abuse` returned."""
        out = {}
        t = threading.Thread(target=lambda: out.update(r=abuse()))
        t.start()
        time.sleep(settle)
        busy = self.bystander_latency()
        t.join(600)
        self.assertFalse(t.is_alive(), name)
        print(f"ABUSE {name}: bystander latency p50 {busy * 1000:.0f} ms "
              f"(idle {self.idle * 1000:.0f} ms, x{busy / self.idle:.2f})", flush=True)
        self.assertLess(busy, 2 * self.idle, f"{name}: {busy:.3f} s against {self.idle:.3f} s idle")
        return out.get("r")

    def test_a_busy_loop_is_stopped_at_its_timeout(self):
        s, b = self.while_abusing("busy loop", lambda: self.api.exec(
            self.sid, "while :; do :; done", timeout_seconds=12))
        self.assertEqual((s, b["timed_out"]), (200, True), b)
        s, b = self.api.exec(self.sid, "echo alive")
        self.assertEqual((s, b["stdout"]), (200, "alive\n"))

    def test_a_memory_hog_past_the_guest_ram_is_killed_in_the_guest(self):
        pid = qemu_pid(self.state, self.sid)
        ram = int(self.api.exec(self.sid, "awk '/MemTotal/ {print $2}' /proc/meminfo")[1]["stdout"])
        # Twice the guest's RAM, touched: the guest's OOM killer ends it (the agent, PID 1, is
        # never its victim); the host's QEMU cannot grow past the guest's RAM.
        hog = f"head -c {ram * 2}k /dev/zero | tail > /dev/null"
        s, b = self.while_abusing("memory hog", lambda: self.api.exec(self.sid, hog,
                                                                         timeout_seconds=120))
        self.assertEqual(s, 200, b)
        self.assertNotEqual(b["exit_code"], 0, b)
        self.assertFalse(b["timed_out"], b)
        s, b = self.api.exec(self.sid, "dmesg | grep -c 'Out of memory' || true")
        self.assertGreaterEqual(int(b["stdout"]), 1, b)
        with open(f"/proc/{pid}/status") as f:
            rss_kib = int([l.split()[1] for l in f if l.startswith("VmRSS")][0])
        self.assertLess(rss_kib, ram + 256 * 1024, "QEMU grew past the guest's RAM")
        s, b = self.api.exec(self.sid, "echo alive")
        self.assertEqual((s, b["stdout"]), (200, "alive\n"))

    def test_an_output_flood_to_a_client_that_does_not_read_is_stopped(self):
        rss_before = self.daemon_rss_kib()

        def flood():
            c = http.client.HTTPConnection(self.daemon.host, self.daemon.port, timeout=120)
            c.request("POST", f"/v1/sandboxes/{self.sid}/exec/stream",
                      body=json.dumps({"cmd": "cat /dev/zero", "timeout_seconds": 300}),
                      headers={"Authorization": "Bearer " + self.daemon.key})
            r = c.getresponse()
            time.sleep(12)  # reads nothing while the guest writes as fast as it can
            rest = r.read()  # then everything the server kept: it ends with the cancel
            c.close()
            return r.status, rest
        status, body = self.while_abusing("output flood, client not reading", flood)
        self.assertEqual(status, 200)
        self.assertIn(b"event: error", body[-4096:])
        self.assertIn(b"cancelled", body[-4096:])
        self.assertLess(len(body), 64 << 20)  # bounded: the 16 MiB stream buffer and the socket's
        self.assertLess(self.daemon_rss_kib() - rss_before, 128 * 1024)
        self.assertFalse(harness.guest_has_process(self.api, self.sid, "cat./dev/zero"))

    def test_ten_thousand_files(self):
        def make():
            return self.api.exec(self.sid, "mkdir -p /tmp/many && cd /tmp/many && "
                                           "seq 1 10000 | xargs touch && ls | wc -l",
                                 timeout_seconds=300)
        s, b = self.while_abusing("10,000 files", make)
        self.assertEqual((s, b["stdout"]), (200, "10000\n"), b)
        s, b = self.api.call("GET", f"/v1/sandboxes/{self.sid}/files/list?path=/tmp/many")
        self.assertEqual((s, len(b["entries"])), (200, 10000))
        s, b = self.api.call("DELETE", f"/v1/sandboxes/{self.sid}/files?path=/tmp/many&recursive=1")
        self.assertEqual(s, 204, b)

    def test_garbage_written_at_the_agent_port_is_refused_in_the_guest(self):
        # The agent holds the port: virtio-serial lets one opener at a time, so another guest
        # process (root) cannot write into the host's session. (A hostile agent itself is the
        # fuzz target fuzz_agent_client's case.)
        s, b = self.while_abusing("garbage at the agent's port", lambda: self.api.exec(
            self.sid, "for p in /dev/vport*; do head -c 4M /dev/urandom > $p; echo $p $?; done "
                      "2>&1", timeout_seconds=60))
        self.assertEqual(s, 200, b)
        self.assertIn("Device or resource busy", b["stdout"], b)
        s, b = self.api.exec(self.sid, "echo alive")
        self.assertEqual((s, b["stdout"]), (200, "alive\n"))

    def daemon_rss_kib(self):
        with open(f"/proc/{self.daemon.proc.pid}/status") as f:
            return int([l.split()[1] for l in f if l.startswith("VmRSS")][0])

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
        s, b = self.while_abusing("fork bomb", lambda: self.api.exec(
            self.sid, "bomb() { bomb | bomb & }; bomb", timeout_seconds=5))
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

    def test_a_volume_larger_than_the_free_disk_is_refused(self):
        # Exploratory test 3 #20: the volume folder is a 256 MiB tmpfs here; a volume (or a grow)
        # its guest could not fill without filling the host's disk is refused before its file.
        vols = os.path.join(self.base, "data", "volumes")
        os.makedirs(vols, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m,mode=0700", "tmpfs", vols],
                       check=True)
        try:
            s, b = self.api.call("POST", "/v1/volumes", {"size_mib": 512})
            self.assertEqual((s, b["error"]["code"]), (503, "host_full"), b)
            self.assertIn("volume folder", b["error"]["message"])
            s, v = self.api.call("POST", "/v1/volumes", {"size_mib": 64})
            self.assertEqual(s, 201, v)
            s, b = self.api.call("PATCH", f"/v1/volumes/{v['id']}", {"size_mib": 400})
            self.assertEqual((s, b["error"]["code"]), (503, "host_full"), b)
            self.assertEqual(self.api.call("DELETE", f"/v1/volumes/{v['id']}")[0], 204)
            self.assertEqual(os.listdir(vols), [])
        finally:
            subprocess.run(["umount", vols], check=True)

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


class FullDataDiskTest(unittest.TestCase):
    """The data folder (the event store and the guests' disks) on a full disk: a 256 MiB tmpfs of
    its own, filled by the test. Creates are refused before they start (503 host_full), store
    writes (commands, metadata) are 507 no_space before RocksDB meets the full disk (its reserve),
    running sandboxes keep their state and files, a guest's disk write is an I/O error in the
    guest (not a paused VM), and everything works again once space is back, also after a SIGKILL
    and a restart. (A store write that meets a full disk anyway: storage_test EventStoreFullDisk.)"""

    def test_a_full_data_disk_is_refused_clearly_and_loses_nothing(self):
        base = tempfile.mkdtemp(prefix="pst-full-", dir="/var/tmp")
        data, state = os.path.join(base, "data"), os.path.join(base, "state")
        os.makedirs(data)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m,mode=0700", "tmpfs", data],
                       check=True)
        d = None
        try:
            d = Daemon(data, state, extra=("--network", "off"))
            api = Api(d)
            sid = api.create(network=False)["id"]
            s, b = api.exec(sid, "echo token-1 > /dev/shm/mark")
            self.assertEqual(s, 200, b)
            s, b = api.call("POST", f"/v1/sandboxes/{sid}/processes", {"cmd": (
                "while [ ! -e /dev/shm/go ]; do sleep 0.2; done; dd if=/dev/urandom"
                " of=/workspace/x bs=1M count=16 conv=fsync >/dev/shm/out 2>&1;"
                " echo rc=$? >>/dev/shm/out")})
            self.assertEqual(s, 201, b)
            filler = os.path.join(data, "filler")
            subprocess.run(["dd", "if=/dev/zero", "of=" + filler, "bs=1M"], capture_output=True)
            s, b = api.call("POST", "/v1/sandboxes", {"network": False})
            self.assertEqual((s, b["error"]["code"]), (503, "host_full"), b)
            self.assertIn("MiB free", b["error"]["message"])
            # Commands are audited before they start: with no room for the record, an exec is
            # refused (507), nothing runs. Reads and file access go on.
            s, b = api.exec(sid, "echo hi")
            self.assertEqual((s, b["error"]["code"]), (507, "no_space"), b)
            s, info = api.call("GET", f"/v1/sandboxes/{sid}")
            self.assertEqual((s, info["state"]), (200, "running"), info)
            s, b = api.call("GET", f"/v1/sandboxes/{sid}/files?path=/dev/shm/mark")
            self.assertEqual((s, b), (200, b"token-1\n"))
            # The guest's disk cannot grow: its write fails in the guest, the VM keeps running.
            # (The writer was started before the disk filled; a file starts it.)
            t0 = time.time()
            s, b = api.call("PUT", f"/v1/sandboxes/{sid}/files?path=/dev/shm/go", raw=b"go")
            self.assertEqual(s, 200, b)
            out = b""
            while b"rc=" not in out and time.time() - t0 < 60:
                time.sleep(0.5)
                s, out = api.call("GET", f"/v1/sandboxes/{sid}/files?path=/dev/shm/out")
                out = out if s == 200 else b""
            self.assertIn(b"rc=", out)
            self.assertNotIn(b"rc=0", out)
            s, b = api.call("PATCH", f"/v1/sandboxes/{sid}", {"metadata": {"a": "b"}})
            self.assertEqual((s, b["error"]["code"]), (507, "no_space"), b)
            self.assertIn("reserve", b["error"]["message"])
            # Space back: writes resume.
            os.unlink(filler)
            deadline = time.time() + 60
            while True:
                meta = {"after": "space"}
                s, b = api.call("PATCH", f"/v1/sandboxes/{sid}", {"metadata": meta})
                if s == 200:
                    break
                self.assertLess(time.time(), deadline, b)
                time.sleep(0.5)
            s, b = api.call("POST", "/v1/sandboxes", {"network": False})
            self.assertEqual(s, 201, b)
            # Nothing acknowledged is lost across a SIGKILL and a restart.
            d.stop(signal.SIGKILL)
            d = Daemon(data, state, extra=("--network", "off"))
            api = Api(d)
            deadline = time.time() + 60
            while api.call("GET", "/healthz")[1].get("status") != "ok" and time.time() < deadline:
                time.sleep(0.2)
            s, info = api.call("GET", f"/v1/sandboxes/{sid}")
            self.assertEqual((s, info["state"], info["metadata"]), (200, "running", meta), info)
            s, b = api.exec(sid, "cat /dev/shm/mark")
            self.assertEqual((s, b["stdout"]), (200, "token-1\n"), b)
            code = d.stop(reap=True)
            d = None
            self.assertEqual(code, 0, "the daemon did not exit cleanly")
        finally:
            if d is not None:
                d.stop(reap=True)
            harness.reap_vms(state, data)
            subprocess.run(["umount", "-l", data])
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    p.add_argument("--images", default=os.environ.get("PANDASTACK_IMAGES", "var/images"))
    args, rest = p.parse_known_args()
    args.images = os.path.abspath(args.images)
    harness.ARGS = args
    harness.run_unittests(rest)
