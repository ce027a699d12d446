#!/usr/bin/env python3
"""Hibernations in an object store (issue 39), against a real S3 server on loopback (s3rver from
npm, tests/objectstore/server.cjs: the S3 REST API, objects as files in the test's folder).

A daemon with --object-store uploads each hibernation once its copy is on the data disk
(`durable: "remote"` once its manifest is in the store). With the store down, a hibernation
stays `local` and its upload is retried until the store is back. Then the data disk's copies
are lost with a reboot (daemon SIGKILLed, QEMUs killed, state tmpfs emptied, the data folder's
hibernations deleted): a hibernation comes back from the store with memory and disk intact; one
whose chunk was corrupted in the store is refused by hash and failed with the reason. Named
snapshots likewise: each is `"durable": "remote"` once uploaded; after the reboot one comes back
from the store and restores as taken, one whose manifest the store lost is deleted with the reason.
A volume, detached, is `"durable": "remote"` once its file is in the store; its file lost with the
data disk comes back from there, as it was. Once every manifest is spent (woken, failed,
deleted), the chunks no manifest names are collected.

Usage: object_store_test.py --daemon build/bin/pandastackd [--images var/images]
"""
import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import harness
from harness import Api, Daemon

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER_DIR = os.path.join(HERE, "..", "objectstore")
BUCKET = "pandastack"


class S3Server:
    """s3rver on loopback, its objects under `folder` (the same folder again after a restart)."""

    def __init__(self, folder, port=0):
        if not os.path.isdir(os.path.join(SERVER_DIR, "node_modules", "s3rver")):
            subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                           cwd=SERVER_DIR, check=True)
        self.folder = folder
        self.proc = subprocess.Popen(["node", os.path.join(SERVER_DIR, "server.cjs"), folder,
                                      BUCKET, str(port)], stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        self.port = json.loads(line)["port"]

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=10)
        self.proc.stdout.close()

    def objects(self, prefix):
        """{key: file} of the bucket's objects under `prefix` (s3rver keeps KEY._S3rver_object)."""
        root = os.path.join(self.folder, BUCKET)
        out = {}
        for f in glob.glob(os.path.join(root, prefix + "*._S3rver_object")):
            out[os.path.relpath(f, root)[:-len("._S3rver_object")]] = f
        return out


def wait_durable(c, sid, want, timeout=120, path=None):
    """The sandbox's (or `path`'s: a snapshot, a volume) JSON once its `durable` is `want`, and
    how long that took (or as it is after `timeout` s)."""
    t0 = time.monotonic()
    while True:
        b = c.call("GET", path or f"/v1/sandboxes/{sid}")[1]
        if b.get("durable") == want or time.monotonic() - t0 > timeout:
            return b, time.monotonic() - t0
        time.sleep(0.05)


def manifest_of(c, sid, kind="hibernation-uploaded", snap=None):
    events = c.call("GET", f"/v1/sandboxes/{sid}/events")[1]["events"]
    uploaded = [e for e in events if e["type"] == kind
                and (snap is None or e["event"]["snapshot_id"] == snap)]
    return uploaded[-1]["event"]["manifest"] if uploaded else None


def wait_snapshot_remote(c, snap):
    return wait_durable(c, None, "remote", path=f"/v1/snapshots/{snap}")


def wait_volume(c, vol, want):
    return wait_durable(c, None, want, path=f"/v1/volumes/{vol}")


def folders_and_store():
    """A data folder on a disk, a state folder on tmpfs, a credentials file and the S3 server."""
    base = tempfile.mkdtemp(prefix="pst-s3-", dir="/var/tmp")
    state = tempfile.mkdtemp(prefix="pst-s3-state-", dir="/dev/shm")
    creds = os.path.join(base, "credentials")
    with open(creds, "w") as f:
        f.write("access_key_id = S3RVER\nsecret_access_key = S3RVER\n")
    return base, state, os.path.join(base, "data"), creds, S3Server(os.path.join(base, "s3"))


class ObjectStoreTest(unittest.TestCase):

    def test_hibernations_survive_the_loss_of_the_data_disk(self):
        base, state, data, creds, s3 = folders_and_store()
        flags = ["--object-store", f"http://127.0.0.1:{s3.port}/{BUCKET}/hosts/a",
                 "--object-store-credentials", creds, "--object-store-gc-seconds", "1"]
        daemons = []
        try:
            # Bad configurations are refused at the start, saying why.
            for bad in (["--object-store", f"http://10.0.0.1:{s3.port}/{BUCKET}",
                         "--object-store-credentials", creds],
                        ["--object-store", f"http://127.0.0.1:{s3.port}/{BUCKET}"]):
                p = subprocess.run([harness.ARGS.daemon, "--data", os.path.join(base, "bad"),
                                    "--images", harness.ARGS.images, *bad],
                                   capture_output=True, text=True, timeout=60)
                self.assertNotEqual(p.returncode, 0)
                self.assertIn("--object-store", p.stderr + p.stdout)
            d = Daemon(data, state, extra=flags)
            daemons.append(d)
            c = Api(d)
            kept, corrupt = [c.create(persistent=True)["id"] for _ in range(2)]
            for sid in (kept, corrupt):  # a token in the guest's memory, a file on its disk
                s, b = c.exec(sid, f"echo {sid} > /dev/shm/token && echo disk-{sid} > /root/f && "
                                   f"head -c 3000000 /dev/urandom > /dev/shm/noise")
                self.assertEqual(s, 200, b)
            # A volume, detached, goes to the store once no sandbox holds it.
            s, vol = c.call("POST", "/v1/volumes", {"name": "kept", "size_mib": 64})
            self.assertEqual(s, 201, vol)
            vol = vol["id"]
            self.assertEqual(wait_volume(c, vol, "remote")[0]["durable"], "remote")  # (empty)
            s, b = c.call("POST", "/v1/sandboxes", {"volumes": [{"volume": vol, "mount": "/data"}]})
            self.assertEqual(s, 201, b)
            holder = b["id"]
            self.assertEqual(c.call("GET", f"/v1/volumes/{vol}")[1]["durable"], "local")
            s, b = c.exec(holder, "echo vol-data > /data/f && sync && echo ok")
            self.assertEqual((s, b["stdout"]), (200, "ok\n"), b)
            self.assertEqual(c.call("DELETE", f"/v1/sandboxes/{holder}")[0], 200)
            b, took = wait_volume(c, vol, "remote")
            self.assertEqual(b["durable"], "remote", b)
            print(f"S3 volume detach-to-remote {took * 1000:.0f} ms", flush=True)
            # A named snapshot of each goes to the store too, once its copy is on the data disk.
            snaps = {}
            for sid in (kept, corrupt):
                s, b = c.call("POST", f"/v1/sandboxes/{sid}/snapshots", {"name": "n-" + sid})
                self.assertEqual(s, 201, b)
                snaps[sid] = b["snapshot_id"]
            for sid in (kept, corrupt):
                b, took = wait_snapshot_remote(c, snaps[sid])
                self.assertEqual(b.get("durable"), "remote", b)
                print(f"S3 snapshot-to-remote {took * 1000:.0f} ms", flush=True)
            snap_manifests = {sid: manifest_of(c, sid, "snapshot-uploaded", snaps[sid])
                              for sid in (kept, corrupt)}
            for m in snap_manifests.values():
                self.assertRegex(m or "", r"^manifests/[0-9a-f]{64}$")
                self.assertIn("hosts/a/" + m, s3.objects("hosts/a/manifests/"))
            s, b = c.call("POST", f"/v1/sandboxes/{kept}/hibernate", {})
            self.assertEqual((s, b.get("state")), (200, "hibernated"), b)
            self.assertIn(b.get("durable"), ("none", "local"), b)
            b, took = wait_durable(c, kept, "remote")
            self.assertEqual(b.get("durable"), "remote", b)
            print(f"S3 hibernate-to-remote {took * 1000:.0f} ms", flush=True)
            m_kept = manifest_of(c, kept)
            self.assertRegex(m_kept or "", r"^manifests/[0-9a-f]{64}$")
            self.assertIn("hosts/a/" + m_kept, s3.objects("hosts/a/manifests/"))
            chunks_after_one = set(s3.objects("hosts/a/chunks/"))
            self.assertGreater(len(chunks_after_one), 0)

            # The store down: the hibernation stays local (never called remote), and its upload
            # is retried until the store is back.
            s3.stop()
            s, b = c.call("POST", f"/v1/sandboxes/{corrupt}/hibernate", {})
            self.assertEqual((s, b.get("state")), (200, "hibernated"), b)
            b, _ = wait_durable(c, corrupt, "local")
            self.assertEqual(b.get("durable"), "local", b)
            time.sleep(2)
            self.assertEqual(c.call("GET", f"/v1/sandboxes/{corrupt}")[1].get("durable"), "local")
            with open(os.path.join(data, "daemon.log")) as f:
                self.assertIn("is not in the object store", f.read())
            s3 = S3Server(s3.folder, s3.port)
            b, took = wait_durable(c, corrupt, "remote", timeout=60)
            self.assertEqual(b.get("durable"), "remote", b)
            print(f"S3 remote after the store came back {took * 1000:.0f} ms", flush=True)
            m_corrupt = manifest_of(c, corrupt)
            # The two share what they have in common (the same template's pages): the second
            # sent fewer chunks than it names.
            with open(s3.objects("hosts/a/" + m_corrupt)["hosts/a/" + m_corrupt]) as f:
                named = [h for e in json.load(f)["files"] for h in e.get("chunks", []) if h]
            with open(s3.objects("hosts/a/" + m_kept)["hosts/a/" + m_kept]) as f:
                named_kept = {h for e in json.load(f)["files"] for h in e.get("chunks", []) if h}
            own = [h for h in set(named) if h not in named_kept]
            print(f"S3 second hibernation: {len(set(named))} chunks named, {len(own)} not shared "
                  f"with the first", flush=True)
            self.assertTrue(own)
            with open(os.path.join(data, "daemon.log")) as f:
                for line in f:
                    if "is in the object store as" in line:
                        print("S3 " + line.strip().split("] ", 2)[-1], flush=True)
            # One chunk only the second names is corrupted in the store.
            victim = s3.objects("hosts/a/chunks/" + own[0])["hosts/a/chunks/" + own[0]]
            with open(victim, "r+b") as f:
                f.seek(100)
                byte = f.read(1)
                f.seek(100)
                f.write(bytes([byte[0] ^ 0xFF]))

            # The second snapshot's manifest is lost from the store.
            os.remove(s3.objects("hosts/a/" + snap_manifests[corrupt])
                      ["hosts/a/" + snap_manifests[corrupt]])

            # The reboot, and the data disk's copies lost with it.
            d.stop(signal.SIGKILL)
            harness.reap_vms(state, data)
            shutil.rmtree(state)
            os.makedirs(state)
            shutil.rmtree(os.path.join(data, "hibernations"))
            shutil.rmtree(os.path.join(data, "snapshots"))
            os.remove(os.path.join(data, "volumes", vol + ".img"))
            d2 = Daemon(data, state, extra=flags)
            daemons.append(d2)
            c2 = Api(d2)
            s, b = c2.call("GET", f"/v1/sandboxes/{kept}")
            self.assertEqual((b["state"], b.get("durable")), ("hibernated", "remote"), b)
            s, b = c2.call("GET", f"/v1/sandboxes/{corrupt}")
            self.assertEqual(b["state"], "failed", b)
            self.assertTrue(b["failure_reason"].startswith("hibernation_snapshot_lost: "), b)
            self.assertIn("does not match its hash", b["failure_reason"])
            with open(os.path.join(data, "daemon.log")) as f:
                fetched = [l for l in f if "came from the object store" in l]
            self.assertTrue(fetched)
            print("S3 " + fetched[-1].strip().split("] ", 2)[-1], flush=True)
            # The first snapshot came back from the store and restores as taken; the second,
            # whose manifest was lost, is deleted with the reason (never offered to a create).
            s, listed = c2.call("GET", "/v1/snapshots")
            self.assertEqual([(x["id"], x["durable"]) for x in listed["snapshots"]],
                             [(snaps[kept], "remote")], listed)
            s, b = c2.call("GET", f"/v1/snapshots/{snaps[corrupt]}")
            self.assertEqual((s, b["error"]["code"]), (404, "snapshot_not_found"), b)
            deleted = [e for e in c2.call("GET", f"/v1/sandboxes/{corrupt}/events")[1]["events"]
                       if e["type"] == "snapshot-deleted"]
            self.assertEqual([(e["event"]["snapshot_id"], e["event"].get("reason"))
                              for e in deleted], [(snaps[corrupt], "snapshot_lost")], deleted)
            child = c2.create(from_snapshot=snaps[kept])["id"]
            s, b = c2.exec(child, "cat /dev/shm/token /root/f")
            self.assertEqual((s, b["stdout"]), (200, f"{kept}\ndisk-{kept}\n"), b)
            self.assertEqual(c2.call("DELETE", f"/v1/sandboxes/{child}")[0], 200)
            s, b = c2.call("DELETE", f"/v1/snapshots/{snaps[kept]}")
            self.assertIn(s, (200, 204), b)
            # The volume's file came back from the store, as it was when it was detached.
            self.assertEqual(c2.call("GET", f"/v1/volumes/{vol}")[1]["durable"], "remote")
            s, b = c2.call("POST", "/v1/sandboxes",
                           {"volumes": [{"volume": vol, "mount": "/data"}]})
            self.assertEqual(s, 201, b)
            holder = b["id"]
            s, b = c2.exec(holder, "cat /data/f")
            self.assertEqual((s, b["stdout"]), (200, "vol-data\n"), b)
            self.assertEqual(c2.call("DELETE", f"/v1/sandboxes/{holder}")[0], 200)
            self.assertEqual(c2.call("DELETE", f"/v1/volumes/{vol}")[0], 204)
            t0 = time.monotonic()
            s, b = c2.call("POST", f"/v1/sandboxes/{kept}/wake", {})
            self.assertEqual((s, b.get("state")), (200, "running"), b)
            print(f"S3 wake after the fetch {(time.monotonic() - t0) * 1000:.0f} ms", flush=True)
            s, b = c2.exec(kept, "cat /dev/shm/token /root/f")
            self.assertEqual((s, b["stdout"]), (200, f"{kept}\ndisk-{kept}\n"), b)
            # Woken: its manifest is spent (the failed one's too), and the deleted snapshot's;
            # the store keeps none.
            t0 = time.monotonic()
            while s3.objects("hosts/a/manifests/") and time.monotonic() - t0 < 10:
                time.sleep(0.1)
            self.assertEqual(s3.objects("hosts/a/manifests/"), {})
            # And their chunks, which no manifest names any more, are collected (1 s later here).
            t0 = time.monotonic()
            while s3.objects("hosts/a/chunks/") and time.monotonic() - t0 < 20:
                time.sleep(0.2)
            self.assertEqual(s3.objects("hosts/a/chunks/"), {})
            self.assertEqual(d2.stop(), 0)
        finally:
            for x in daemons:
                if x.proc.poll() is None:
                    x.stop(reap=True)
            harness.reap_vms(state, data)
            if s3.proc.poll() is None:
                s3.stop()
            if sys.exc_info()[0] is not None:  # (the daemon's side of a failure)
                with open(os.path.join(data, "daemon.log"), errors="replace") as f:
                    print("".join(l for l in f if "object store" in l or "uploader" in l)[-4000:])
            shutil.rmtree(base, ignore_errors=True)
            shutil.rmtree(state, ignore_errors=True)

    def test_ten_forks_of_one_sandbox_share_their_chunks(self):
        """Ten forks of one sandbox, each a little changed and hibernated: the store keeps what
        they share once (the figure: chunks and bytes named by their manifests against those
        stored)."""
        base, state, data, creds, s3 = folders_and_store()
        d = None
        try:
            d = Daemon(data, state, extra=["--object-store", f"http://127.0.0.1:{s3.port}/{BUCKET}",
                                           "--object-store-credentials", creds])
            c = Api(d)
            parent = c.create(persistent=True)["id"]
            s, b = c.exec(parent, "head -c 20000000 /dev/urandom > /dev/shm/shared")
            self.assertEqual(s, 200, b)
            s, b = c.call("POST", f"/v1/sandboxes/{parent}/fork", {"count": 10})
            self.assertEqual(s, 201, b)
            kids = [k["id"] for k in b["sandboxes"]]
            self.assertEqual(len(kids), 10)
            for kid in kids:
                s, b = c.exec(kid, f"echo {kid} > /dev/shm/me")
                self.assertEqual(s, 200, b)
                s, b = c.call("POST", f"/v1/sandboxes/{kid}/hibernate", {})
                self.assertEqual((s, b.get("state")), (200, "hibernated"), b)
            t0 = time.monotonic()
            for kid in kids:
                b, _ = wait_durable(c, kid, "remote", timeout=120 - (time.monotonic() - t0))
                self.assertEqual(b.get("durable"), "remote", b)
            stored = {k[len("chunks/"):]: os.path.getsize(f)
                      for k, f in s3.objects("chunks/").items()}
            named, named_bytes = 0, 0
            for kid in kids:
                key = manifest_of(c, kid)
                with open(s3.objects(key)[key]) as f:
                    for e in json.load(f)["files"]:
                        for h in e.get("chunks", []):
                            if h:
                                named += 1
                                named_bytes += stored[h]
            stored_bytes = sum(stored.values())
            print(f"S3 10 forks: {named} chunks named ({named_bytes >> 20} MiB), {len(stored)} "
                  f"stored ({stored_bytes >> 20} MiB): {named_bytes / stored_bytes:.1f}x less",
                  flush=True)
            self.assertGreater(named_bytes, 3 * stored_bytes)
            self.assertEqual(d.stop(), 0)
        finally:
            if d and d.proc.poll() is None:
                d.stop(reap=True)
            harness.reap_vms(state, data)
            if s3.proc.poll() is None:
                s3.stop()
            shutil.rmtree(base, ignore_errors=True)
            shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    p.add_argument("--images", default=os.environ.get("PANDASTACK_IMAGES", "var/images"))
    args, rest = p.parse_known_args()
    args.images = os.path.abspath(args.images)
    harness.ARGS = args
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
