#!/usr/bin/env python3
"""Chaos: rounds of 20 concurrent clients doing random lifecycle operations (create, exec, write a
file, snapshot, fork, hibernate, wake, kill, expose a port, change egress, SIGKILL a sandbox's QEMU
from the host) against one real daemon (real VMs, sandbox networks), which is SIGKILLed at a random
moment and started again on the same data. After every restart:
  - `pandastack audit replay` rebuilds every sandbox from its events and matches the daemon;
  - every operation the API acknowledged is there: acknowledged creates exist, kills are stopped,
    snapshots are listed with their sandbox;
  - every sandbox listed as running answers a command, and every hibernated one wakes; each has
    the memory it had: a token written in its tmpfs (/dev/shm) when acknowledged (a fork's
    children have their parent's);
  - a sandbox whose QEMU was killed is failed with a reason (or ended as a racing transition said:
    then it answers like any other);
  - no QEMU, run folder, cgroup, network namespace, snapshot or hibernation folder exists that no
    live sandbox (or pool) names;
  - volumes: every attachment names a live sandbox; a running holder reads the token it synced
    to the volume; a volume whose holder ended keeps its token (the next sandbox reads it); every
    acknowledged volume snapshot is listed; every volume's file exists and no file lacks a
    volume;
  - databases (at most two, created, written to, hibernated and woken by the clients): one that
    says `running` has a port and answers with every row whose insert was acknowledged; a
    hibernated one wakes and does the same; a failed one has a reason (never `running` without
    a server).

Usage: chaos_test.py --daemon build/bin/pandastackd --cli build/bin/pandastack [--rounds N]
  [--seed S] [--verbose]   (CHAOS_SEED, CHAOS_ROUNDS: the same from the environment)
CHAOS_KEEP=1 keeps the data and state folders (and copies the console of a sandbox that does not
answer); CHAOS_HOLD=SECONDS keeps the daemon up that long after such a failure, to look at it.
"""
import argparse
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

import psycopg2  # Debian's python3-psycopg2

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "api"))
import harness  # noqa: E402
from harness import Api, Daemon  # noqa: E402

CLIENTS = 20
MAX_LIVE = 8  # sandboxes the clients keep at most (20 TCG guests on 2 cores would crawl)


class Ledger:
    """What the API acknowledged, across rounds (guarded by `mu`)."""

    def __init__(self):
        self.mu = threading.Lock()
        self.live = set()      # believed live (created or forked, not killed)
        self.created = set()
        self.killed = set()
        self.marks = {}        # sid -> token acknowledged in its /dev/shm/mark
        self.snapshots = {}    # snapshot id -> sandbox id
        self.qemu_killed = set()  # sandboxes whose QEMU a client SIGKILLed (from the host)
        self.ops = 0
        self.failed_after_kill = 0
        self.acked = 0
        self.statuses = {}  # (op, status) -> count: what the rounds met
        self.volumes = {}    # volume id -> {"sid": holder or None, "mark": synced token or None}
        self.vsnaps = {}     # volume snapshot id -> volume id
        self.dbs = {}        # database id -> {"password", "user", "rows": acknowledged tokens}
        self.db_busy = set()  # databases a client is creating or using (one client each)
        self.violations = []  # what a client saw that must never be


class Client(threading.Thread):
    def __init__(self, api, ledger, stop, seed, state):
        super().__init__(daemon=True)
        self.api, self.l, self.stop, self.rng = api, ledger, stop, random.Random(seed)
        self.state = state

    def pick(self):
        with self.l.mu:
            live = sorted(self.l.live)
        return self.rng.choice(live) if live else None

    def run(self):
        ops = ["create"] * 3 + ["exec"] * 4 + ["file"] * 2 + ["snapshot", "fork", "hibernate",
                                                                  "wake", "wake", "kill", "port",
                                                                  "egress", "qemu_kill", "volume",
                                                                  "volume", "volume_snapshot",
                                                                  "database"]
        while not self.stop.is_set():
            op = self.rng.choice(ops)
            with self.l.mu:
                crowded = len(self.l.live) >= MAX_LIVE
            if op in ("create", "fork", "volume") and crowded:
                op = "kill"
            sid = self.pick()
            if op not in ("create", "volume", "database") and sid is None:
                op = "create"
            self.last = None
            try:
                self.one(op, sid)
                status = self.last
            except (OSError, harness.http.client.HTTPException, ValueError):
                status = "gone"  # the daemon died under us: not acknowledged
            with self.l.mu:
                self.l.statuses[(op, status)] = self.l.statuses.get((op, status), 0) + 1
            with self.l.mu:
                self.l.ops += 1

    def ack(self):
        with self.l.mu:
            self.l.acked += 1

    def call(self, *a, **kw):
        s, b = self.api.call(*a, **kw)
        self.last = s if s < 300 else f"{s} {b['error']['code'] if isinstance(b, dict) and 'error' in b else ''}"
        return s, b

    def exec(self, sid, cmd):
        return self.call("POST", f"/v1/sandboxes/{sid}/exec", {"cmd": cmd})

    def one(self, op, sid):
        api, l = self.api, self.l
        if op == "create":
            s, b = self.call("POST", "/v1/sandboxes", {"ttl_seconds": 3600})
            if s != 201:
                return
            new = b["id"]
            with l.mu:
                l.created.add(new)
                l.live.add(new)
            self.ack()
            token = f"{new}-{self.rng.getrandbits(64):x}"
            s, b = self.exec(new, f"echo {token} > /dev/shm/mark")
            if s == 200 and b["exit_code"] == 0:
                with l.mu:
                    l.marks[new] = token
                self.ack()
        elif op == "exec":
            if self.exec(sid, "cat /dev/shm/mark")[0] == 200:
                self.ack()
        elif op == "file":
            if self.call("PUT", f"/v1/sandboxes/{sid}/files?path=/tmp/chaos.bin",
                        raw=os.urandom(4096))[0] == 200:
                self.ack()
        elif op == "snapshot":
            s, b = self.call("POST", f"/v1/sandboxes/{sid}/snapshots", {})
            if s == 201:
                with l.mu:
                    l.snapshots[b["snapshot_id"]] = sid
                self.ack()
        elif op == "fork":
            with l.mu:
                mark = l.marks.get(sid)
            s, b = self.call("POST", f"/v1/sandboxes/{sid}/fork", {})
            if s == 201:
                with l.mu:
                    for k in b["sandboxes"]:
                        l.created.add(k["id"])
                        l.live.add(k["id"])
                        if mark is not None:
                            l.marks[k["id"]] = mark
                self.ack()
        elif op in ("hibernate", "wake"):
            if self.call("POST", f"/v1/sandboxes/{sid}/{op}", {})[0] == 200:
                self.ack()
        elif op == "kill":
            if self.call("DELETE", f"/v1/sandboxes/{sid}")[0] == 200:
                with l.mu:
                    l.killed.add(sid)
                    l.live.discard(sid)
                    for v in l.volumes.values():
                        if v["sid"] == sid:
                            v["sid"] = None
                self.ack()
        elif op == "port":
            if self.call("POST", f"/v1/sandboxes/{sid}/ports", {"port": 8000})[0] in (200, 201):
                self.ack()
        elif op == "qemu_kill":
            # From the host, as the OOM killer or an operator would: the sandbox fails (or, if a
            # transition raced it, ends as that transition says); nothing of its VM stays.
            for f in glob.glob(os.path.join(self.state, "run", "*", "vm.json")):
                try:
                    with open(f) as fh:
                        r = json.load(fh)
                except (OSError, ValueError):
                    continue
                if r.get("name", "").startswith(sid):
                    try:
                        os.kill(r["pid"], signal.SIGKILL)
                    except ProcessLookupError:
                        continue
                    with l.mu:
                        l.qemu_killed.add(sid)
                    self.last = "qemu killed"
                    break
        elif op == "volume":
            self.volume_op()
        elif op == "volume_snapshot":
            with l.mu:
                held = sorted(v for v, x in l.volumes.items() if x["sid"] in l.live)
            if held:
                vid = self.rng.choice(held)
                s, b = self.call("POST", f"/v1/volumes/{vid}/snapshots", {})
                if s == 201:
                    with l.mu:
                        l.vsnaps[b["id"]] = vid
                    self.ack()
        elif op == "database":
            self.database_op()
        elif op == "egress":
            mode = self.rng.choice(["deny_all", "allow_all"])
            if self.call("PATCH", f"/v1/sandboxes/{sid}", {"egress": {"mode": mode}})[0] == 200:
                self.ack()


    def volume_op(self):
        """A sandbox with a volume at /data: a new volume, or (at most 6) one whose holder ended,
        which must still have the token synced to it."""
        l = self.l
        with l.mu:
            free = sorted(v for v, x in l.volumes.items() if x["sid"] is None)
            many = len(l.volumes) >= 6
        if many and not free:
            return
        if free and (many or self.rng.random() < 0.5):
            vid = self.rng.choice(free)
            with l.mu:
                if l.volumes[vid]["sid"] is not None:
                    return
                l.volumes[vid]["sid"] = "taking"  # one client at a time
        else:
            s, b = self.call("POST", "/v1/volumes", {"size_mib": 16})
            if s != 201:
                return
            vid = b["id"]
            with l.mu:
                l.volumes[vid] = {"sid": "taking", "mark": None}
            self.ack()
        s, b = self.call("POST", "/v1/sandboxes", {"ttl_seconds": 3600, "volumes": [
            {"volume": vid, "mount": "/data"}]})
        if s != 201:
            with l.mu:
                l.volumes[vid]["sid"] = None
            return
        new = b["id"]
        with l.mu:
            l.created.add(new)
            l.live.add(new)
            l.volumes[vid]["sid"] = new
            mark = l.volumes[vid]["mark"]
            landed = {mark, *l.volumes[vid].get("unacknowledged", ())}
        self.ack()
        if mark is not None:
            s, b = self.exec(new, "cat /data/mark")
            if s == 200 and b["stdout"].strip() not in landed:
                with l.mu:
                    l.violations.append(("a volume lost its synced token", vid, new, mark, b))
        token = f"{vid}-{self.rng.getrandbits(64):x}"
        with l.mu:  # (a write whose answer a kill cuts off may have landed, or not)
            l.volumes[vid].setdefault("unacknowledged", set()).add(token)
        s, b = self.exec(new, f"echo {token} > /data/mark.new && sync && mv /data/mark.new "
                              f"/data/mark && sync")
        if s == 200 and b["exit_code"] == 0:
            with l.mu:
                l.volumes[vid]["mark"] = token
                l.volumes[vid]["unacknowledged"] = set()
            self.ack()

    def database_op(self):
        """At most two databases: create one, or on one no other client uses, insert a row,
        hibernate or wake it."""
        l = self.l
        with l.mu:
            idle = sorted(d for d in l.dbs if d not in l.db_busy)
            creating = "creating" in l.db_busy
            if not idle and (len(l.dbs) >= 2 or creating):
                return
            if idle and (len(l.dbs) >= 2 or creating or self.rng.random() < 0.7):
                db = self.rng.choice(idle)
            else:
                db = "creating"
            l.db_busy.add(db)
        try:
            if db == "creating":
                s, b = self.call("POST", "/v1/databases", {"name": f"chaos{self.rng.getrandbits(16)}"})
                if s == 201:
                    with l.mu:
                        l.dbs[b["id"]] = {"password": b["password"], "user": b["user"],
                                          "rows": set()}
                    self.ack()
                return
            what = self.rng.choice(["insert", "insert", "hibernate", "wake"])
            if what in ("hibernate", "wake"):
                if self.call("POST", f"/v1/databases/{db}/{what}", {})[0] == 200:
                    self.ack()
                return
            s, info = self.call("GET", f"/v1/databases/{db}")
            if s != 200 or info["status"] != "running":
                return
            token = f"{self.rng.getrandbits(64):x}"
            try:
                with db_connect(info, l.dbs[db]["password"]) as conn, conn.cursor() as cur:
                    cur.execute("CREATE TABLE IF NOT EXISTS chaos (token text)")
                    cur.execute("INSERT INTO chaos VALUES (%s)", (token,))
                with l.mu:
                    l.dbs[db]["rows"].add(token)
                self.last = "inserted"
                self.ack()
            except psycopg2.Error as e:
                self.last = f"psql {type(e).__name__}"
        finally:
            with l.mu:
                l.db_busy.discard(db)


def db_connect(info, password):
    conn = psycopg2.connect(host=info["host"], port=info["port"], user=info["user"],
                            password=password, dbname=info["database"], connect_timeout=30)
    conn.autocommit = True
    return conn


class ChaosTest(unittest.TestCase):

    def test_sigkill_under_load_loses_nothing_acknowledged_and_leaves_nothing(self):
        base = tempfile.mkdtemp(prefix="pst-chaos-", dir="/var/tmp")
        data, state = os.path.join(base, "data"), os.path.join(base, "state")
        ledger = Ledger()
        rng = random.Random(ARGS.seed)
        d = Daemon(data, state)
        ARGS_DATA[:] = [data]
        prefix = Daemon.network_flags(data)[1]
        try:
            self.seed_resources(Api(d), ledger)
            for rnd in range(ARGS.rounds):
                api = Api(d)
                stop = threading.Event()
                clients = [Client(api, ledger, stop, rng.getrandbits(32), state)
                           for _ in range(CLIENTS)]
                for c in clients:
                    c.start()
                time.sleep(rng.uniform(4, 12))
                stop.set()  # no new operations; those in flight meet the kill
                d.stop(signal.SIGKILL)  # at a random moment: whatever was in flight
                for c in clients:
                    c.join(120)
                d = Daemon(data, state)
                self.wait_recovered(d)
                self.check(d, ledger, state, prefix, rnd)
                if ARGS.verbose:
                    print(sorted(ledger.statuses.items(), key=lambda x: -x[1])[:20], flush=True)
                print(f"CHAOS round {rnd + 1}/{ARGS.rounds}: {ledger.ops} operations, "
                      f"{ledger.acked} acknowledged, {len(ledger.live)} live, "
                      f"{len(ledger.snapshots)} snapshots, {len(ledger.qemu_killed)} QEMUs killed "
                      f"({ledger.failed_after_kill} of their sandboxes failed)", flush=True)
        finally:
            d.stop(reap=True)
            harness.reap_vms(state, data)
            if os.environ.get("CHAOS_KEEP"):
                print(f"CHAOS kept {base}", flush=True)
            else:
                shutil.rmtree(base, ignore_errors=True)

    def seed_resources(self, api, ledger):
        """A database and a sandbox with a volume from the start (under load a round is often
        too short to make them): the clients write to, hibernate and wake them every round."""
        s, b = api.call("POST", "/v1/databases", {"name": "chaos"})
        self.assertEqual(s, 201, b)
        ledger.dbs[b["id"]] = {"password": b["password"], "user": b["user"], "rows": set()}
        s, v = api.call("POST", "/v1/volumes", {"size_mib": 16})
        self.assertEqual(s, 201, v)
        s, b = api.call("POST", "/v1/sandboxes", {"ttl_seconds": 3600, "volumes": [
            {"volume": v["id"], "mount": "/data"}]})
        self.assertEqual(s, 201, b)
        s, r = api.exec(b["id"], f"echo {v['id']}-seed > /data/mark && sync")
        self.assertEqual((s, r.get("exit_code")), (200, 0), r)
        ledger.created.add(b["id"])
        ledger.live.add(b["id"])
        ledger.volumes[v["id"]] = {"sid": b["id"], "mark": f"{v['id']}-seed"}

    def wait_recovered(self, d):
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(d.url + "/healthz", timeout=5) as r:
                    if json.load(r)["status"] == "ok":
                        return
            except OSError:
                pass
            time.sleep(0.2)
        self.fail("the restarted daemon did not finish its recovery in 120 s")

    def check(self, d, ledger, state, prefix, rnd):
        api = Api(d)
        r = subprocess.run([ARGS.cli, "audit", "replay", "--data", d.data, "--url", d.url,
                            "--key", d.key], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, f"round {rnd}: audit replay: {r.stdout}{r.stderr}")
        s, b = api.call("GET", "/v1/sandboxes")  # every state
        self.assertEqual(s, 200, b)
        listed = {x["id"]: x for x in b["sandboxes"]}
        for sid in list(ledger.created):
            s, info = api.call("GET", f"/v1/sandboxes/{sid}")
            self.assertEqual(s, 200, (rnd, sid, info))  # an acknowledged create is kept
            listed[sid] = info
        for sid in ledger.killed:  # (a sandbox that had failed stays failed when deleted)
            self.assertIn(listed[sid]["state"], ("stopped", "failed"), (rnd, sid, listed[sid]))
        for snap, sid in ledger.snapshots.items():
            if sid in ledger.killed:
                continue
            self.assertIn(snap, listed[sid].get("snapshots", []), (rnd, snap, sid))
        self.assertEqual(ledger.violations, [], rnd)
        dbs = self.check_databases(api, ledger, rnd)
        for sid, info in list(listed.items()):  # a database's sandbox: checked through its database
            if "pandastack.database" in info.get("metadata", {}):
                # ... and a live one belongs to a database (a create cut short leaves none).
                if info["state"] in ("running", "hibernated"):
                    self.assertIn(sid, dbs, (rnd, "a database sandbox no database names", info))
                del listed[sid]
        failed_after_kill = 0
        for sid in ledger.qemu_killed:
            info = listed.get(sid)
            if info and info["state"] == "failed":
                failed_after_kill += 1
                self.assertTrue(info.get("failure_reason"), (rnd, sid, info))
        ledger.failed_after_kill = failed_after_kill
        live = set()
        for sid, info in listed.items():
            st = info["state"]
            if st == "hibernated":
                s, b = api.call("POST", f"/v1/sandboxes/{sid}/wake", {})
                self.assertEqual(s, 200, (rnd, sid, b))
                st = "running"
            if st == "running":
                live.add(sid)
                s, b = api.exec(sid, "cat /dev/shm/mark 2>/dev/null || true")
                if s != 200 and os.environ.get("CHAOS_KEEP"):
                    for f in glob.glob(os.path.join(state, "run", "*" + sid + "*", "q", "console.log")):
                        shutil.copy(f, os.path.join(os.path.dirname(state), "console-" + sid))
                    for i in range(5):
                        time.sleep(1)
                        s2, b2 = api.exec(sid, "echo retry")
                        print(f"CHAOS retry {i}: {s2} {b2}", flush=True)
                    if os.environ.get("CHAOS_HOLD"):
                        print(f"CHAOS hold {sid} {d.url} {d.key}", flush=True)
                        time.sleep(int(os.environ["CHAOS_HOLD"]))
                self.assertEqual(s, 200, (rnd, sid, b, "its QEMU was killed" if sid in
                                          ledger.qemu_killed else "", info))
                if sid in ledger.marks:
                    self.assertEqual(b["stdout"].strip(), ledger.marks[sid], (rnd, sid))
            elif sid in ledger.live and st in ("stopped", "failed"):
                with ledger.mu:
                    ledger.live.discard(sid)
        self.check_volumes(api, ledger, listed, rnd)
        live |= dbs  # their VMs are live too
        # Nothing that no live sandbox names (pool members and spares are the daemon's own).
        time.sleep(1)
        # Snapshot folders: each named by a sandbox's snapshots (recovery removes the others);
        # hibernation folders: none of a sandbox that is stopped or failed.
        named = {snap for info in listed.values() for snap in info.get("snapshots", [])}
        for d in glob.glob(os.path.join(state, "snapshots", "*")):
            self.assertIn(os.path.basename(d), named, (rnd, "a snapshot folder no sandbox names"))
        for d in glob.glob(os.path.join(state, "hibernated", "*")):
            info = listed.get(os.path.basename(d))
            self.assertFalse(info is not None and info["state"] in ("stopped", "failed"),
                             (rnd, "the hibernation folder of a sandbox that is gone", d))
        gone = [sid for sid in ledger.created if sid not in live]
        for root in ("/sys/fs/cgroup/pids/pandastack", "/sys/fs/cgroup/pandastack"):
            if os.path.isdir(root):
                left = [c for c in os.listdir(root) if any(sid in c for sid in gone)]
                self.assertEqual(left, [], (rnd, "cgroups of sandboxes that are gone"))
        for f in glob.glob(os.path.join(state, "run", "*", "vm.json")):
            with open(f) as fh:
                name = json.load(fh)["name"]
            self.assertTrue(name.startswith(("pool-", "spare-")) or
                            any(name.startswith(s) for s in live), (rnd, name))
        def strays():
            """QEMUs of this daemon that no live record names (by pid: a pool member taken by a
            sandbox keeps its first folder in its command line, its record moves)."""
            recorded = set()
            for f in glob.glob(os.path.join(state, "run", "*", "vm.json")):
                try:
                    with open(f) as fh:
                        recorded.add(json.load(fh)["pid"])
                except (OSError, ValueError, KeyError):
                    pass
            def where(argv):
                cmd = " ".join(argv)
                return cmd.split("mem-path=")[1].split(",")[0] if "mem-path=" in cmd else cmd[:160]
            return {pid: where(argv) for pid, argv in harness.qemu_processes(state).items()
                    if pid not in recorded}
        # A pool member or spare being launched has no record for a moment: a stray is one
        # that still has none seconds later.
        first = strays()
        if first:
            time.sleep(5)
        strays = {pid: run for pid, run in strays().items() if pid in first}
        self.assertEqual(strays, {}, (rnd, "QEMUs without a live record"))
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        ours = [l.split()[0] for l in netns.splitlines() if l.startswith(prefix)]
        running = sum(1 for sid in live)
        pooled = sum(1 for f in glob.glob(os.path.join(state, "run", "*", "vm.json"))
                     if os.path.basename(os.path.dirname(f)).startswith(("pool-", "spare-")))
        self.assertLessEqual(len(ours), running + pooled + 4, (rnd, ours))

    def check_databases(self, api, ledger, rnd):
        """Each database's state is what it is: running answers with its rows, hibernated wakes,
        failed says why. Returns the sandboxes of the live ones."""
        s, b = api.call("GET", "/v1/databases")
        self.assertEqual(s, 200, b)
        listed = {x["id"]: x for x in b["databases"]}
        live = {x["sandbox"] for x in b["databases"] if x["status"] != "failed"}
        for db, known in ledger.dbs.items():
            info = listed.get(db)
            self.assertIsNotNone(info, (rnd, "an acknowledged database is gone", db))
            if info["status"] == "hibernated":
                s, info = api.call("POST", f"/v1/databases/{db}/wake", {})
                self.assertEqual(s, 200, (rnd, db, info))
            if info["status"] == "failed":
                self.assertTrue(info.get("failure_reason"), (rnd, db, info))
                continue
            self.assertEqual(info["status"], "running", (rnd, db, info))
            self.assertGreater(info["port"], 0, (rnd, db, info))
            live.add(info["sandbox"])
            with db_connect(info, known["password"]) as conn, conn.cursor() as cur:
                cur.execute("CREATE TABLE IF NOT EXISTS chaos (token text)")
                cur.execute("SELECT token FROM chaos")
                have = {r[0] for r in cur.fetchall()}
            self.assertEqual(known["rows"] - have, set(), (rnd, db, "acknowledged rows lost"))
        return live

    def check_volumes(self, api, ledger, listed, rnd):
        s, b = api.call("GET", "/v1/volumes")
        self.assertEqual(s, 200, b)
        vols = {v["id"]: v for v in b["volumes"]}
        for vid, v in vols.items():
            for a in v["attachments"]:
                holder = listed.get(a["sandbox"])
                if holder is None:  # a database's data volume
                    continue
                self.assertIn(holder["state"], ("running", "hibernated"),
                              (rnd, vid, "attached to a sandbox that is not live", holder))
        for vid, known in ledger.volumes.items():
            self.assertIn(vid, vols, (rnd, "an acknowledged volume is gone", vid))
            holders = [a["sandbox"] for a in vols[vid]["attachments"]]
            running = [h for h in holders if listed.get(h, {}).get("state") == "running"]
            if running and known["mark"] is not None:
                # The last acknowledged token, or a later write that landed though its answer
                # never came (the daemon was killed first): never an older one.
                s, r = api.exec(running[0], "cat /data/mark")
                self.assertEqual(s, 200, r)
                have = r.get("stdout", "").strip()
                self.assertIn(have, {known["mark"], *known.get("unacknowledged", ())},
                              (rnd, vid, running[0]))
                known["mark"] = have
                known["unacknowledged"] = set()
            if not holders:
                known["sid"] = None  # free for the next round's clients
            elif known["sid"] not in holders:
                known["sid"] = holders[0]
        for snap, vid in ledger.vsnaps.items():
            s, b = api.call("GET", f"/v1/volumes/{vid}/snapshots")
            self.assertEqual(s, 200, (rnd, vid, b))
            self.assertIn(snap, [x["id"] for x in b["snapshots"]], (rnd, vid))
        files = {f[:-4] for f in os.listdir(os.path.join(ARGS_DATA[0], "volumes"))
                 if f.endswith(".img")}
        self.assertEqual(files, set(vols), (rnd, "volume files and volumes differ"))


ARGS_DATA = []

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    p.add_argument("--cli", required=True)
    p.add_argument("--images", default=os.environ.get("PANDASTACK_IMAGES", "var/images"))
    p.add_argument("--rounds", type=int, default=int(os.environ.get("CHAOS_ROUNDS", "3")))
    p.add_argument("--seed", type=int, default=int(os.environ.get("CHAOS_SEED", str(int(time.time())))))
    p.add_argument("--verbose", action="store_true")
    args, rest = p.parse_known_args()
    args.images = os.path.abspath(args.images)
    harness.ARGS = args
    ARGS = args
    print(f"CHAOS seed {args.seed}", flush=True)
    harness.run_unittests(rest)
