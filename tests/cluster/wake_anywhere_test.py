#!/usr/bin/env python3
"""Wake anywhere (issue 39): a sandbox hibernated on a host that is then lost wakes on another
host from the object store. A cluster on one machine: its own etcd (TLS, client certificates),
a real S3 server (s3rver, tests/objectstore) and three daemons, each with its own prefix of one
bucket (hosts/<id>/).

Three sandboxes hibernate on host b (a named snapshot of the second taken first); their
hibernations and the snapshot reach the store and are parked in etcd
(sealed with the cluster's records key). Host b is SIGKILLed, its QEMUs killed, its state tmpfs
emptied and its data folder taken away. Through host c (draining: placement passes it by) a wake
of the first is placed on host a, which fetches it from b's prefix, verifies it, takes it over in
one etcd transaction and starts it: its tmpfs token and its disk file are there. Another tenant's
key, and a parked record forged without the records key, wake nothing; E2B's connect wakes the
third on the host asked. A create from the snapshot (REST through c, placed on a; RPC on c)
starts a new sandbox from the store with the second's token and file; the snapshot stays b's.
The first is a's from then on (a hibernation and wake there). Host b comes back with its data
folder: it ends its copy of the first (a has it) and wakes the second from its own disk; the
snapshot, deleted there, is unparked and leaves the store; a second snapshot, whose every copy was
lost meanwhile, is deleted by b's recovery and unparked.

WakeCyclesTest (`make test-long`, WAKE_CYCLES=100): one sandbox goes back and forth between two
hosts, each cycle losing the host it sleeps on (daemon SIGKILLed, restarted after the wake): its
tmpfs token and disk file carry every cycle's count, 0 mismatches.

Usage: wake_anywhere_test.py --daemon build/bin/pandastackd [--images var/images] [TestClass]
"""
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "api"))
import harness  # noqa: E402
import watchdog  # noqa: E402
from harness import Api, Daemon  # noqa: E402
from cluster_test import Etcd, make_pki  # noqa: E402
from object_store_test import BUCKET, S3Server, manifest_of, wait_durable  # noqa: E402

LEASE = 3  # seconds


class Cluster(unittest.TestCase):
    HOSTS = ("a", "b", "c")
    POOL = "1"

    @classmethod
    def setUpClass(cls):
        # Data folders on a disk (hibernations are synced there), state folders on tmpfs.
        cls.base = tempfile.mkdtemp(prefix="pst-wake-", dir="/var/tmp")
        cls.shm = tempfile.mkdtemp(prefix="pst-wake-", dir="/dev/shm")
        cls.pki = os.path.join(cls.base, "pki")
        make_pki(cls.pki, cls.HOSTS)
        cls.etcd = Etcd(os.path.join(cls.base, "etcd"), cls.pki)
        cls.creds = os.path.join(cls.base, "credentials")
        with open(cls.creds, "w") as f:
            f.write("access_key_id = S3RVER\nsecret_access_key = S3RVER\n")
        cls.s3 = S3Server(os.path.join(cls.base, "s3"))
        cls.daemons = {}
        for h in cls.HOSTS:
            cls.start_host(h)
        cls.key = cls.daemons["a"].key
        cls.api = {h: Api(d, key=cls.key) for h, d in cls.daemons.items()}

    @classmethod
    def start_host(cls, h):
        cls.daemons[h] = Daemon(
            os.path.join(cls.base, h), os.path.join(cls.shm, h),
            extra=("--cluster", cls.etcd.url, "--host-id", h, "--advertise", "127.0.0.1:0",
                   "--cluster-tls", os.path.join(cls.pki, "hosts", h), "--lease-ttl", str(LEASE),
                   "--pool-size", cls.POOL, "--spare-pool-size", "0",
                   "--object-store", f"http://127.0.0.1:{cls.s3.port}/{BUCKET}/hosts/{h}",
                   "--object-store-credentials", cls.creds, "--object-store-gc-seconds", "1"))
        if hasattr(cls, "api"):  # (a restart: a new port)
            cls.api[h] = Api(cls.daemons[h], key=cls.key)

    @classmethod
    def tearDownClass(cls):
        codes = {h: d.stop(reap=True) for h, d in cls.daemons.items() if d.proc.poll() is None}
        harness.reap_vms(cls.base, cls.shm)
        cls.etcd.stop()
        cls.s3.stop()
        shutil.rmtree(cls.base, ignore_errors=True)
        shutil.rmtree(cls.shm, ignore_errors=True)
        for h, code in codes.items():  # (a sanitizer's report at exit is a failure)
            assert code == 0, f"daemon {h} exited {code}"

    def put(self, key, value):
        """Writes bytes `value` at `key` (an operator's etcd certificate: no records key)."""
        self.etcd.call("/v3/kv/put", {"key": base64.b64encode(key.encode()).decode(),
                                      "value": base64.b64encode(value).decode()})

    def raw(self, key):
        """The bytes at `key` (b"" for none)."""
        r = self.etcd.call("/v3/kv/range", {"key": base64.b64encode(key.encode()).decode()})
        kvs = r.get("kvs", [])
        return base64.b64decode(kvs[0].get("value", "")) if kvs else b""

    def lose(self, h):
        """Host h is lost: its daemon SIGKILLed, its QEMUs killed; once its lease expired."""
        self.daemons[h].stop(sig=signal.SIGKILL)
        harness.reap_vms(self.daemons[h].data, os.path.join(self.shm, h))
        other = next(x for x in self.HOSTS if x != h)
        deadline = time.time() + LEASE + 10
        while True:
            s, b = self.api[other].call("GET", "/v1/hosts")
            if s == 200 and {x["id"]: x["state"] for x in b["hosts"]}.get(h) == "down":
                return
            self.assertLess(time.time(), deadline, b)
            time.sleep(0.1)

    def parked_by(self, sid, host, timeout=10):
        """Its parked record once host `host` wrote it."""
        deadline = time.time() + timeout
        while True:
            rec = self.etcd.prefix("/pandastack/parked/").get(f"/pandastack/parked/{sid}", "")
            if f'"host":"{host}"' in rec or time.time() > deadline:
                return rec
            time.sleep(0.05)


class WakeAnywhereTest(Cluster):

    def test_a_hibernation_wakes_on_another_host_once_its_host_is_lost(self):
        a, c = self.api["a"], self.api["c"]
        sids = []
        for text in ("first", "second", "third"):
            s, b = a.call("POST", "/v1/sandboxes", {"network": False, "persistent": True,
                                                    "placement": {"host": "b"}})
            self.assertEqual(s, 201, b)
            sid = b["id"]
            s, b = a.exec(sid, f"echo {text}-{sid} > /dev/shm/token && echo disk-{sid} > /root/f"
                               f" && sync && echo ok")
            self.assertEqual((s, b["stdout"]), (200, "ok\n"), b)
            if text == "second":  # named snapshots of it, parked too
                s, b = a.call("POST", f"/v1/sandboxes/{sid}/snapshots", {"name": "kept"})
                self.assertEqual(s, 201, b)
                snap = b["snapshot_id"]
                s, b = a.call("POST", f"/v1/sandboxes/{sid}/snapshots", {"name": "doomed"})
                self.assertEqual(s, 201, b)
                doomed = b["snapshot_id"]
            s, b = a.call("POST", f"/v1/sandboxes/{sid}/hibernate", {})
            self.assertEqual((s, b.get("state")), (200, "hibernated"), b)
            sids.append(sid)
        first, second, third = sids
        for sid in sids:
            b, took = wait_durable(a, sid, "remote")
            self.assertEqual(b.get("durable"), "remote", b)
        manifest = manifest_of(a, first)
        self.assertIn(f"hosts/b/{manifest}", self.s3.objects("hosts/b/manifests/"))
        # Parked in etcd: the tenant, b's prefix, the manifest, sealed (a MAC after the JSON).
        self.assertIn('"host":"b"', self.parked_by(first, "b"))
        self.assertIn('"host":"b"', self.parked_by(second, "b"))
        self.assertIn('"host":"b"', self.parked_by(snap, "b", timeout=60))
        self.assertIn('"host":"b"', self.parked_by(doomed, "b", timeout=60))
        doomed_manifest = manifest_of(a, second, "snapshot-uploaded", doomed)
        s, b = a.call("GET", f"/v1/snapshots/{snap}")
        self.assertEqual((s, b.get("durable")), (200, "remote"), b)
        record = self.raw(f"/pandastack/parked/{first}")
        body = json.loads(record[:-32])  # (then its 32-byte MAC)
        self.assertEqual((body["prefix"], body["manifest"], body["tenant"]),
                         ("hosts/b/", manifest, "default"), body)

        # Host b is lost: the daemon SIGKILLed, its QEMUs killed, its tmpfs emptied, its data
        # folder gone (kept aside, to bring it back later).
        b_data = self.daemons["b"].data
        self.daemons["b"].stop(sig=signal.SIGKILL)
        harness.reap_vms(b_data, os.path.join(self.shm, "b"))
        shutil.rmtree(os.path.join(self.shm, "b"))
        os.rename(b_data, b_data + "-aside")
        deadline = time.time() + LEASE + 5
        while True:
            s, b = a.exec(first, "true")
            if s == 503:
                break
            self.assertLess(time.time(), deadline, (s, b))
            time.sleep(0.2)
        self.assertEqual(b["error"]["code"], "host_unavailable")

        # Another tenant's key wakes nothing (and learns nothing beyond what routing says).
        s, k = a.call("POST", "/v1/keys", {"tenant": "stranger"})
        self.assertEqual(s, 201, k)
        s, b = a.call("POST", f"/v1/sandboxes/{first}/wake", {}, key=k["key"])
        self.assertEqual((s, b["error"]["code"]), (503, "host_unavailable"), b)
        # A record changed without the records key (an etcd client certificate alone) does not
        # verify: nothing is woken from it.
        forged = record.replace(manifest.encode(), b"manifests/" + b"0" * 64)  # (its MAC kept)
        self.put(f"/pandastack/parked/{first}", forged)
        s, b = a.call("POST", f"/v1/sandboxes/{first}/wake", {})
        self.assertEqual((s, b["error"]["code"]), (503, "host_unavailable"), b)
        self.assertIn("not in the object store", b["error"]["message"])
        self.put(f"/pandastack/parked/{first}", record)

        # A create from b's snapshot: refused for another tenant; for its own, placed on a
        # through c (draining), which fetches it from b's prefix and starts a new sandbox from
        # it (a's; the snapshot stays b's, parked for the next create).
        s, b = a.call("POST", "/v1/sandboxes", {"from_snapshot": snap}, key=k["key"])
        self.assertEqual((s, b["error"]["code"]), (503, "host_unavailable"), b)
        s, b = c.call("POST", "/v1/hosts/c/drain")
        self.assertEqual((s, b["draining"]), (200, True), b)
        t0 = time.monotonic()
        s, b = c.call("POST", "/v1/sandboxes", {"from_snapshot": snap})
        took = time.monotonic() - t0
        self.assertEqual(s, 201, b)
        child = b["id"]
        print(f"create from a lost host's snapshot: {took * 1000:.0f} ms through c (placed on a)",
              flush=True)
        with open(os.path.join(self.daemons["a"].data, "daemon.log")) as f:
            made = [l for l in f if f"created here from snapshot {snap}" in l]
        self.assertTrue(made)
        print("create from the store: " + made[-1].strip().split("] ", 2)[-1], flush=True)
        self.assertEqual(self.etcd.prefix(f"/pandastack/owners/{child}"),
                         {f"/pandastack/owners/{child}": "a"})
        s, b = c.exec(child, "cat /dev/shm/token /root/f")
        self.assertEqual((s, b["stdout"]), (200, f"second-{second}\ndisk-{second}\n"), b)
        self.assertEqual(c.call("DELETE", f"/v1/sandboxes/{child}")[0], 200)
        self.assertIn('"host":"b"', self.parked_by(snap, "b"))
        s, b = c.call("DELETE", "/v1/hosts/c/drain")
        self.assertEqual(s, 200, b)
        # The RPC API's create from it is made on the host asked (c), the same way.
        example = os.path.join(os.path.dirname(harness.ARGS.daemon), "pandastack-rpc-example")
        r = subprocess.run([example, "--connect",
                            "unix:" + os.path.join(self.daemons["c"].data, "rpc.sock"),
                            "--key", self.key, "--from-snapshot", snap, "--",
                            "cat", "/dev/shm/token", "/root/f"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual((r.returncode, r.stdout), (0, f"second-{second}\ndisk-{second}\n"),
                         r.stderr)

        # Through c, which is draining: placement puts the wake on a.
        s, b = c.call("POST", "/v1/hosts/c/drain")
        self.assertEqual((s, b["draining"]), (200, True), b)
        t0 = time.monotonic()
        s, b = c.call("POST", f"/v1/sandboxes/{first}/wake", {})
        took = time.monotonic() - t0
        self.assertEqual((s, b.get("state"), b.get("host"), b.get("woken_from")),
                         (200, "running", "a", "b"), b)
        print(f"wake anywhere: {took * 1000:.0f} ms through c (placed on a; a's own "
              f"{b.get('wake_ms', 0):.0f} ms)", flush=True)
        with open(os.path.join(self.daemons["a"].data, "daemon.log")) as f:
            woke = [l for l in f if "woke " + first + " here" in l]
        self.assertTrue(woke)
        print("wake anywhere: " + woke[-1].strip().split("] ", 2)[-1], flush=True)
        s, b = c.call("DELETE", "/v1/hosts/c/drain")
        self.assertEqual(s, 200, b)
        s, b = c.exec(first, "cat /dev/shm/token /root/f")
        self.assertEqual((s, b["stdout"]), (200, f"first-{first}\ndisk-{first}\n"), b)
        # a owns it; its parked record and its manifest in b's prefix are gone.
        self.assertEqual(self.etcd.prefix(f"/pandastack/owners/{first}"),
                         {f"/pandastack/owners/{first}": "a"})
        self.assertNotIn(f"/pandastack/parked/{first}", self.etcd.prefix("/pandastack/parked/"))
        self.assertNotIn(f"hosts/b/{manifest}", self.s3.objects("hosts/b/manifests/"))
        # A second wake of it is a running sandbox's (its owner answers: nothing moves).
        s, b = c.call("POST", f"/v1/sandboxes/{first}/wake", {})
        self.assertEqual((s, b.get("state"), b.get("woken_from")), (200, "running", None), b)

        # E2B's connect (resume) wakes a paused sandbox of a lost host the same way (here: a).
        s, b = a.call("POST", f"/sandboxes/{third}/connect", {"timeout": 600},
                      headers={"X-API-Key": self.key})
        self.assertEqual((s, b.get("sandboxID")), (200, third), b)
        s, b = a.exec(third, "cat /dev/shm/token /root/f")
        self.assertEqual((s, b["stdout"]), (200, f"third-{third}\ndisk-{third}\n"), b)

        # It is a's now: hibernated there, into a's prefix, parked by a, woken there.
        s, b = a.call("POST", f"/v1/sandboxes/{first}/hibernate", {})
        self.assertEqual(s, 200, b)
        b, _ = wait_durable(a, first, "remote")
        self.assertEqual(b.get("durable"), "remote", b)
        again = manifest_of(a, first)
        self.assertIn(f"hosts/a/{again}", self.s3.objects("hosts/a/manifests/"))
        self.assertIn('"prefix":"hosts/a/"', self.parked_by(first, "a"))
        s, b = a.call("POST", f"/v1/sandboxes/{first}/wake", {})
        self.assertEqual((s, b.get("state")), (200, "running"), b)
        s, b = a.exec(first, "cat /dev/shm/token")
        self.assertEqual((s, b["stdout"]), (200, f"first-{first}\n"), b)

        # b comes back with its data folder: its copy of the first is ended there (a has it),
        # the second is still b's and wakes there from b's own disk. The doomed snapshot lost
        # every copy meanwhile (its data-disk copy, its manifest in the store): b's recovery
        # deletes it (snapshot_lost) and takes its parked record away.
        os.remove(self.s3.objects(f"hosts/b/{doomed_manifest}")[f"hosts/b/{doomed_manifest}"])
        os.rename(b_data + "-aside", b_data)
        shutil.rmtree(os.path.join(b_data, "snapshots", doomed))
        self.start_host("b")
        with open(os.path.join(b_data, "daemon.log")) as f:
            self.assertIn(f"{first} was taken over by host a", f.read())
        s, b = a.call("GET", f"/v1/snapshots/{doomed}")
        self.assertEqual((s, b["error"]["code"]), (404, "snapshot_not_found"), b)
        self.assertNotIn(f"/pandastack/parked/{doomed}", self.etcd.prefix("/pandastack/parked/"))
        s, b = a.call("POST", f"/v1/sandboxes/{second}/wake", {})
        self.assertEqual((s, b.get("state")), (200, "running"), b)
        s, b = a.exec(second, "cat /dev/shm/token /root/f")
        self.assertEqual((s, b["stdout"]), (200, f"second-{second}\ndisk-{second}\n"), b)
        s, b = a.call("GET", "/v1/sandboxes")
        rows = [r for r in (b["sandboxes"] if isinstance(b, dict) else b) if r["id"] == first]
        self.assertEqual([(r["host"], r["state"]) for r in rows if r["state"] == "running"],
                         [("a", "running")], rows)
        # The second's copy in the store is spent with its wake: its parked record goes too.
        deadline = time.time() + 10
        while time.time() < deadline and \
                f"/pandastack/parked/{second}" in self.etcd.prefix("/pandastack/parked/"):
            time.sleep(0.1)
        self.assertNotIn(f"/pandastack/parked/{second}", self.etcd.prefix("/pandastack/parked/"))
        # Its snapshot, deleted on b (back), is unparked and leaves the store.
        snap_manifest = manifest_of(a, second, "snapshot-uploaded", snap)
        self.assertIn(f"hosts/b/{snap_manifest}", self.s3.objects("hosts/b/manifests/"))
        s, b = a.call("DELETE", f"/v1/snapshots/{snap}")
        self.assertEqual(s, 204, b)
        deadline = time.time() + 10  # (unparked first, then its manifest goes)
        while time.time() < deadline and (
                f"/pandastack/parked/{snap}" in self.etcd.prefix("/pandastack/parked/")
                or f"hosts/b/{snap_manifest}" in self.s3.objects("hosts/b/manifests/")):
            time.sleep(0.1)
        self.assertNotIn(f"/pandastack/parked/{snap}", self.etcd.prefix("/pandastack/parked/"))
        self.assertNotIn(f"hosts/b/{snap_manifest}", self.s3.objects("hosts/b/manifests/"))


class WakeCyclesTest(Cluster):
    HOSTS = ("a", "b")
    POOL = "0"

    @watchdog.expect_seconds(60 + 20 * int(os.environ.get("WAKE_CYCLES", "3")))
    def test_hibernate_lose_the_host_wake_on_the_other(self):
        cycles = int(os.environ.get("WAKE_CYCLES", "3"))
        s, b = self.api["a"].call("POST", "/v1/sandboxes", {"network": False, "persistent": True,
                                                            "placement": {"host": "a"}})
        self.assertEqual(s, 201, b)
        sid, here = b["id"], "a"
        mismatches, took = 0, []
        for i in range(cycles):
            there = "b" if here == "a" else "a"
            s, b = self.api[there].exec(
                sid, f"cat /dev/shm/token /root/f 2>/dev/null; echo {i} > /dev/shm/token && "
                     f"echo {i} > /root/f && sync")
            want = "" if i == 0 else f"{i - 1}\n{i - 1}\n"
            if (s, b.get("stdout")) != (200, want):
                mismatches += 1
                print(f"cycle {i}: {s} {b}", flush=True)
            s, b = self.api[there].call("POST", f"/v1/sandboxes/{sid}/hibernate", {})
            self.assertEqual(s, 200, b)
            b, _ = wait_durable(self.api[there], sid, "remote")
            self.assertEqual(b.get("durable"), "remote", b)
            self.assertIn(f'"host":"{here}"', self.parked_by(sid, here))
            self.lose(here)
            t0 = time.monotonic()
            s, b = self.api[there].call("POST", f"/v1/sandboxes/{sid}/wake", {})
            took.append(time.monotonic() - t0)
            self.assertEqual((s, b.get("host"), b.get("woken_from")), (200, there, here), b)
            self.start_host(here)  # (with its data: it ends its copy)
            here = there
        s, b = self.api[here].exec(sid, "cat /dev/shm/token /root/f")
        if (s, b.get("stdout")) != (200, f"{cycles - 1}\n{cycles - 1}\n"):
            mismatches += 1
        took.sort()
        print(f"wake anywhere cycles: {cycles}, mismatches {mismatches}, wake p50 "
              f"{took[len(took) // 2] * 1000:.0f} ms, max {took[-1] * 1000:.0f} ms", flush=True)
        self.assertEqual(mismatches, 0)


if __name__ == "__main__":
    harness.main()
