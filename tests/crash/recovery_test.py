#!/usr/bin/env python3
"""Recovery after a crash: a daemon with running sandboxes, pool members, a spare and one VM that
does not answer (its QEMU SIGSTOPped) is SIGKILLed and started again on the same data. The new
daemon must answer /healthz at once (adoption runs behind it), adopt the healthy VMs with their
memory intact, fail the stopped one with the reason and kill it, and leave no process behind.

Usage: recovery_test.py --daemon build/bin/pandastackd [--images var/images]
"""
import argparse
import glob
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "api"))
import harness  # noqa: E402
from harness import Api, Daemon  # noqa: E402


def records(state):
    """{vm name: pid} of every live record in the state folder."""
    out = {}
    for f in glob.glob(os.path.join(state, "run", "*", "vm.json")):
        try:
            with open(f) as fh:
                r = json.load(fh)
            out[r["name"]] = r["pid"]
        except (OSError, ValueError):
            pass
    return out


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return ") Z " not in f.read()
    except OSError:
        return False


class RecoveryTest(unittest.TestCase):

    def test_restart_adopts_healthy_vms_fails_the_stuck_one_and_leaves_nothing(self):
        base = tempfile.mkdtemp(prefix="pst-rec-", dir="/dev/shm")
        data, state = os.path.join(base, "data"), os.path.join(base, "state")
        daemons = []
        stopped_pid = None
        try:
            d = Daemon(data, state)
            daemons.append(d)
            c = Api(d)
            healthy = [c.create()["id"] for _ in range(2)]
            stuck = c.create(network=False)["id"]
            for sid in healthy + [stuck]:
                s, b = c.exec(sid, f"echo {sid} > /dev/shm/mark")
                self.assertEqual(s, 200, b)
            # Pools and a spare filled (they are waiting VMs with records too).
            deadline = time.time() + 60
            while time.time() < deadline:
                names = records(state)
                if sum(n.startswith("spare-") for n in names) >= 1 and \
                        sum(n.startswith("pool-") for n in names) >= 2:
                    break
                time.sleep(0.5)
            before = records(state)
            self.assertTrue(any(n.startswith("spare-") for n in before), before)
            stopped_pid = [p for n, p in before.items() if n.startswith(stuck)][0]
            os.kill(stopped_pid, signal.SIGSTOP)  # a VM that will not answer
            d.stop(signal.SIGKILL)

            t0 = time.monotonic()
            d2 = Daemon(data, state)
            daemons.append(d2)
            took = None
            while time.monotonic() - t0 < 30:
                try:
                    with urllib.request.urlopen(d2.url + "/healthz", timeout=5) as r:
                        health = json.load(r)
                        took = time.monotonic() - t0
                        break
                except OSError:
                    time.sleep(0.005)
            self.assertIsNotNone(took)
            # The API answers before the VMs are adopted (a process start, the store's replay).
            self.assertLess(took, 2.0, health)
            c2 = Api(d2)
            deadline = time.time() + 30
            while health["status"] != "ok" and time.time() < deadline:
                time.sleep(0.1)
                health = c2.call("GET", "/healthz")[1]
            self.assertEqual(health["status"], "ok", health)
            self.assertEqual(health["recovery"], {"to_adopt": 3, "adopted": 2, "failed": 1})
            for sid in healthy:
                s, b = c2.exec(sid, "cat /dev/shm/mark")
                self.assertEqual((s, b["stdout"]), (200, sid + "\n"), b)
            s, info = c2.call("GET", f"/v1/sandboxes/{stuck}")
            self.assertEqual(info["state"], "failed")
            self.assertTrue(info["failure_reason"].startswith("host_restart"), info)
            # Nothing of the previous daemon runs but the adopted VMs: the stuck one, its pool
            # members and its spare are gone.
            time.sleep(0.5)
            for name, pid in before.items():
                if any(name.startswith(h) for h in healthy):
                    self.assertTrue(alive(pid), name)
                else:
                    self.assertFalse(alive(pid), name)
            self.assertEqual(d2.stop(), 0)
            # After a graceful stop nothing of them is left in tmpfs or running.
            for pid in before.values():
                self.assertFalse(alive(pid))
            self.assertFalse(os.path.exists(os.path.join(state, "templates")) and
                             os.listdir(os.path.join(state, "templates")))
        finally:
            if stopped_pid and alive(stopped_pid):
                os.kill(stopped_pid, signal.SIGKILL)
            for x in daemons:
                if x.proc.poll() is None:
                    x.stop()
            shutil.rmtree(base, ignore_errors=True)

    def test_a_reboot_keeps_every_acknowledged_hibernation(self):
        """A host reboot, simulated: the daemon SIGKILLed, its QEMUs killed, the state tmpfs
        emptied. Every hibernation whose copy was on the data disk (`durable: local`) wakes with
        its memory and disk; one whose copy is gone is failed with the reason, not `hibernated`.
        Named snapshots likewise: a durable one restores, a lost one is deleted with its reason."""
        base = tempfile.mkdtemp(prefix="pst-reboot-", dir="/var/tmp")  # the data folder: a disk
        state = tempfile.mkdtemp(prefix="pst-reboot-state-", dir="/dev/shm")
        data = os.path.join(base, "data")
        daemons = []
        try:
            d = Daemon(data, state)
            daemons.append(d)
            c = Api(d)
            sids = [c.create(persistent=True)["id"] for _ in range(3)]
            for sid in sids:  # a token in the guest's memory (tmpfs), a file on its disk
                s, b = c.exec(sid, f"echo {sid} > /dev/shm/token && echo disk-{sid} > /root/f")
                self.assertEqual(s, 200, b)
            mem, disk_only, lost = sids
            # Two named snapshots of one of them (they outlive it): each durable once its copy
            # is synced; one copy is lost with its disk below.
            snaps = {}
            for name in ("kept", "gone"):
                s, b = c.call("POST", f"/v1/sandboxes/{mem}/snapshots", {"name": name})
                self.assertEqual(s, 201, b)
                snaps[name] = b["snapshot_id"]
                t0 = time.monotonic()
                while time.monotonic() - t0 < 120:
                    s, info = c.call("GET", f"/v1/snapshots/{snaps[name]}")
                    self.assertEqual(s, 200, info)
                    self.assertIn(info["durable"], ("none", "local"), info)
                    if info["durable"] == "local":
                        break
                    time.sleep(0.05)
                self.assertEqual(info["durable"], "local", info)
                print(f"REBOOT snapshot-to-durable {(time.monotonic() - t0) * 1000:.0f} ms",
                      flush=True)
            durable_after = []
            for sid, body in ((mem, {}), (disk_only, {"memory": False}), (lost, {})):
                s, b = c.call("POST", f"/v1/sandboxes/{sid}/hibernate", body)
                self.assertEqual((s, b.get("state")), (200, "hibernated"), b)
                t0 = time.monotonic()
                self.assertIn(b.get("durable"), ("none", "local"), b)
                while b.get("durable") != "local" and time.monotonic() - t0 < 120:
                    time.sleep(0.05)
                    b = c.call("GET", f"/v1/sandboxes/{sid}")[1]
                self.assertEqual(b.get("durable"), "local", b)
                durable_after.append(time.monotonic() - t0)
                events = [e["type"] for e in c.call("GET", f"/v1/sandboxes/{sid}/events")[1]["events"]]
                self.assertEqual(events[-1], "hibernation-persisted")
            print(f"REBOOT hibernate-to-durable {max(durable_after) * 1000:.0f} ms at most "
                  f"({', '.join(f'{t * 1000:.0f}' for t in durable_after)} ms)", flush=True)
            # One copy is lost with the disk it was on (as if never persisted).
            shutil.rmtree(os.path.join(data, "hibernations", lost))
            shutil.rmtree(os.path.join(data, "snapshots", snaps["gone"]))
            d.stop(signal.SIGKILL)
            harness.reap_vms(state, data)
            shutil.rmtree(state)  # the reboot: tmpfs is empty
            os.makedirs(state)

            d2 = Daemon(data, state)
            daemons.append(d2)
            c2 = Api(d2)
            for sid in (mem, disk_only):
                s, b = c2.call("GET", f"/v1/sandboxes/{sid}")
                self.assertEqual((b["state"], b.get("durable")), ("hibernated", "local"), b)
            s, b = c2.call("GET", f"/v1/sandboxes/{lost}")
            self.assertEqual((b["state"], b.get("failure_reason")),
                             ("failed", "hibernation_snapshot_lost"), b)
            t0 = time.monotonic()
            s, b = c2.call("POST", f"/v1/sandboxes/{mem}/wake", {})
            woke_ms = (time.monotonic() - t0) * 1000
            self.assertEqual((s, b.get("state")), (200, "running"), b)
            s, b = c2.exec(mem, "cat /dev/shm/token /root/f")
            self.assertEqual((s, b["stdout"]), (200, f"{mem}\ndisk-{mem}\n"), b)
            s, b = c2.call("POST", f"/v1/sandboxes/{disk_only}/wake", {})
            self.assertEqual((s, b.get("state")), (200, "running"), b)
            s, b = c2.exec(disk_only, "cat /root/f; test -e /dev/shm/token || echo no-token")
            self.assertEqual((s, b["stdout"]), (200, f"disk-{disk_only}\nno-token\n"), b)
            print(f"REBOOT wake after the reboot {woke_ms:.0f} ms", flush=True)
            # The durable snapshot restores (memory and disk as taken); the lost one is no more,
            # and its sandbox's events say why.
            s, listed = c2.call("GET", "/v1/snapshots")
            self.assertEqual(s, 200, listed)
            self.assertEqual([(x["id"], x["durable"]) for x in listed["snapshots"]],
                             [(snaps["kept"], "local")], listed)
            s, b = c2.call("GET", f"/v1/snapshots/{snaps['gone']}")
            self.assertEqual((s, b["error"]["code"]), (404, "snapshot_not_found"), b)
            deleted = [e for e in c2.call("GET", f"/v1/sandboxes/{mem}/events")[1]["events"]
                       if e["type"] == "snapshot-deleted"]
            self.assertEqual([(e["event"]["snapshot_id"], e["event"].get("reason")) for e in deleted],
                             [(snaps["gone"], "snapshot_lost")], deleted)
            child = c2.create(from_snapshot="kept")["id"]
            s, b = c2.exec(child, "cat /dev/shm/token /root/f")
            self.assertEqual((s, b["stdout"]), (200, f"{mem}\ndisk-{mem}\n"), b)
            # Woken: the durable copies are spent.
            time.sleep(0.5)
            self.assertEqual(sorted(os.listdir(os.path.join(data, "hibernations"))), [])
            self.assertEqual(d2.stop(), 0)
        finally:
            for x in daemons:
                if x.proc.poll() is None:
                    x.stop(reap=True)
            harness.reap_vms(state, data)
            shutil.rmtree(base, ignore_errors=True)
            shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    p.add_argument("--images", default=os.environ.get("PANDASTACK_IMAGES", "var/images"))
    args, rest = p.parse_known_args()
    args.images = os.path.abspath(args.images)
    harness.ARGS = args
    harness.run_unittests(rest)
