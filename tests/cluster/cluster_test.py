#!/usr/bin/env python3
"""A cluster on one machine: its own etcd (Debian's etcd-server, on free loopback ports, in a
folder of its own) and three daemons (own data folders, ports, network prefixes and subnet
pools), all with real VMs. Creates through host a land where placement puts them; exec, files and
SSE through a reach sandboxes on b; ownership is recorded once per id; a SIGKILLed host's
sandboxes are host_unavailable within its lease and answer again once it restarts; an etcd
restart loses no ownership record.

Usage: cluster_test.py --daemon build/bin/pandastackd [--images var/images]
"""
import base64
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import unittest
import http.client
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "api"))
import harness  # noqa: E402
from harness import Api, Daemon, WebSocket  # noqa: E402

LEASE = 3  # seconds


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


CERTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                     "cluster-certs.sh")


def make_pki(folder, hosts):
    """The cluster CA and keys, etcd's certificate, an operator's client certificate and one
    certificate per host (scripts/cluster-certs.sh)."""
    for args in (["init", folder], ["etcd", folder], ["client", folder, "operator"],
                 *[["host", folder, h] for h in hosts]):
        subprocess.run([CERTS, *args], check=True, stdout=subprocess.DEVNULL)


class Etcd:
    """etcd with TLS and client-certificate auth (as a cluster must run it); `call` is an
    operator's request (its own client certificate)."""

    def __init__(self, folder, pki):
        """`pki` None: plain HTTP (an --insecure-cluster's etcd)."""
        self.folder, self.pki = folder, pki
        self.client, self.peer = free_port(), free_port()
        self.url = f"{'https' if pki else 'http'}://127.0.0.1:{self.client}"
        self.ctx = None
        if pki:
            self.ctx = ssl.create_default_context(cafile=os.path.join(pki, "ca.pem"))
            self.ctx.load_cert_chain(os.path.join(pki, "clients", "operator.pem"),
                                     os.path.join(pki, "clients", "operator.key"))
        self.start()

    def start(self):
        peer = f"http://127.0.0.1:{self.peer}"
        self.log = open(self.folder + ".log", "ab")
        tls = []
        if self.pki:
            e = os.path.join(self.pki, "etcd")
            tls = ["--cert-file", os.path.join(e, "server.pem"), "--key-file",
                   os.path.join(e, "server.key"), "--client-cert-auth", "--trusted-ca-file",
                   os.path.join(e, "ca.pem")]
        self.proc = subprocess.Popen(
            ["etcd", "--data-dir", self.folder, "--listen-client-urls", self.url,
             "--advertise-client-urls", self.url, "--listen-peer-urls", peer,
             "--initial-advertise-peer-urls", peer, "--initial-cluster", "default=" + peer, *tls],
            stdout=self.log, stderr=self.log)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                self.call("/v3/kv/range", {"key": base64.b64encode(b"probe").decode()})
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("etcd did not start")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        self.log.close()

    def call(self, path, body):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     method="POST")
        with urllib.request.urlopen(req, timeout=5, context=self.ctx) as r:
            return json.loads(r.read())

    def prefix(self, p):
        """{key: value} of every key under prefix `p`."""
        end = p[:-1] + chr(ord(p[-1]) + 1)
        r = self.call("/v3/kv/range", {"key": base64.b64encode(p.encode()).decode(),
                                       "range_end": base64.b64encode(end.encode()).decode()})
        return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", "")).decode(errors="replace")
                for kv in r.get("kvs", [])}


class ClusterTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.base = tempfile.mkdtemp(prefix="pst-cluster-", dir="/dev/shm")
        cls.pki = os.path.join(cls.base, "pki")
        make_pki(cls.pki, ("a", "b", "c"))
        cls.etcd = Etcd(os.path.join(cls.base, "etcd"), cls.pki)
        cls.daemons = {}
        for h in ("a", "b", "c"):
            cls.start_host(h)
        # Every host serves with the first host's key (keys live in etcd).
        cls.key = cls.daemons["a"].key
        cls.api = {h: Api(d, key=cls.key) for h, d in cls.daemons.items()}

    @classmethod
    def start_host(cls, h):
        data = os.path.join(cls.base, h)
        cls.daemons[h] = Daemon(
            data, os.path.join(cls.base, h + "-state"),
            extra=("--cluster", cls.etcd.url, "--host-id", h, "--advertise", "127.0.0.1:0",
                   "--cluster-tls", os.path.join(cls.pki, "hosts", h), "--lease-ttl", str(LEASE),
                   "--pool-size", "1", "--spare-pool-size", "0"))

    @classmethod
    def tearDownClass(cls):
        codes = {h: d.stop(reap=True) for h, d in cls.daemons.items()}
        cls.etcd.stop()
        shutil.rmtree(cls.base, ignore_errors=True)
        for h, code in codes.items():
            assert code in (0, -signal.SIGKILL), f"daemon {h} exited {code}"

    def local_ids(self, h):
        """Ids of the sandboxes host h runs itself (the merged list names each one's host; a
        client's forwarding header is ignored, security review 3 L1)."""
        s, b = self.api[h].call("GET", "/v1/sandboxes")
        self.assertEqual(s, 200, b)
        rows = b["sandboxes"] if isinstance(b, dict) else b
        return {x["id"] for x in rows if x.get("host") == h}

    def exec_until(self, through, sid, cmd, status, seconds, every):
        """Runs `cmd` through host `through` until it answers `status` (within `seconds`); the
        answer's body."""
        deadline = time.time() + seconds
        while True:
            s, b = self.api[through].exec(sid, cmd)
            if s == status:
                return b
            self.assertLess(time.time(), deadline, (s, b))
            time.sleep(every)

    def create_on(self, through, host):
        s, b = self.api[through].call("POST", "/v1/sandboxes",
                                      {"network": False, "placement": {"host": host}})
        self.assertEqual(s, 201, b)
        return b["id"]

    def test_1_hosts_are_listed(self):
        s, b = self.api["a"].call("GET", "/v1/hosts")
        self.assertEqual(s, 200, b)
        self.assertEqual(b["self"], "a")
        up = {h["id"]: h for h in b["hosts"] if h["state"] == "up"}
        self.assertEqual(set(up), {"a", "b", "c"})
        for h in up.values():
            self.assertGreater(h["total_mib"], 0)
            self.assertTrue(h["peer"].startswith("127.0.0.1:"))

    def test_1_metrics_per_host(self):
        for h in ("a", "b", "c"):
            s, body = self.api["a"].call("GET", f"/v1/hosts/{h}/metrics")
            self.assertEqual(s, 200)
            self.assertIn(f'pandastack_cluster_host{{host="{h}"}} 1'.encode(), body)
        s, b = self.api["a"].call("GET", "/v1/hosts/nowhere/metrics")
        self.assertEqual((s, b["error"]["code"]), (404, "host_not_found"), b)

    def test_2_routing_through_another_host(self):
        sid = self.create_on("a", "b")
        self.assertIn(sid, self.local_ids("b"))
        self.assertNotIn(sid, self.local_ids("a"))
        a = self.api["a"]
        s, b = a.exec(sid, "echo routed; hostname")
        self.assertEqual((s, b["exit_code"]), (200, 0), b)
        self.assertTrue(b["stdout"].startswith("routed\n"))
        # Files both ways, through a and through c.
        s, _ = a.call("PUT", f"/v1/sandboxes/{sid}/files?path=/tmp/x.bin", raw=os.urandom(0) + b"\x00\x01data")
        self.assertEqual(s, 200)
        s, body = self.api["c"].call("GET", f"/v1/sandboxes/{sid}/files?path=/tmp/x.bin")
        self.assertEqual((s, body), (200, b"\x00\x01data"))
        # An error is the owner's error, as it sent it.
        s, b = a.call("GET", f"/v1/sandboxes/{sid}/files?path=/tmp/nope")
        self.assertEqual((s, b["error"]["code"]), (404, "file_not_found"))
        # SSE streams through, event by event.
        events = list(a.sse(f"/v1/sandboxes/{sid}/exec/stream",
                            {"cmd": "for i in 1 2 3; do echo line$i; sleep 0.2; done"}))
        out = "".join(d.get("data", "") for e, d in events if e == "stdout")
        self.assertEqual(out, "line1\nline2\nline3\n")
        self.assertEqual(events[-1][0], "exit")
        # Tenancy is checked on the owner: another tenant's key gets 404 through any host.
        s, k = a.call("POST", "/v1/keys", {"tenant": "other"})
        self.assertEqual(s, 201, k)
        other = k["key"]
        for h in ("a", "b"):
            s, b = self.api[h].call("GET", f"/v1/sandboxes/{sid}", key=other)
            self.assertEqual((s, b["error"]["code"]), (404, "sandbox_not_found"), h)
        # A wrong key is refused before anything is forwarded.
        s, b = a.call("GET", f"/v1/sandboxes/{sid}", key="pds_" + "a" * 12 + "_" + "b" * 40)
        self.assertEqual((s, b["error"]["code"]), (401, "unauthorized"))
        # The RPC API through a: get (the calls proxied to b), exec, a fork there; a create placed.
        example = os.path.join(os.path.dirname(harness.ARGS.daemon), "pandastack-rpc-example")
        rpc = ["--connect", "unix:" + os.path.join(self.daemons["a"].data, "rpc.sock"),
               "--key", self.key]
        r = subprocess.run([example, *rpc, "--sandbox", sid, "--", "cat", "/tmp/x.bin"],
                           capture_output=True, timeout=60)
        self.assertEqual((r.returncode, r.stdout), (0, b"\x00\x01data"), r.stderr)
        r = subprocess.run([example, *rpc, "--sandbox", sid, "--fork", "--", "cat", "/tmp/x.bin"],
                           capture_output=True, timeout=60)
        self.assertEqual((r.returncode, r.stdout), (0, b"\x00\x01data"), r.stderr)
        r = subprocess.run([example, *rpc, "--", "sh", "-c", "exit 7"], capture_output=True,
                           timeout=120)
        self.assertEqual(r.returncode, 7, r.stderr)
        r = subprocess.run([example, *rpc, "--sandbox", "sbx_nope", "--", "true"],
                           capture_output=True, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(b"sandbox_not_found", r.stderr)
        # A WebSocket through a reaches the sandbox on b: stdin in, output out, the exit, a close.
        ws = WebSocket(self.daemons["a"], f"/v1/sandboxes/{sid}/exec/ws", self.key)
        self.assertEqual(ws.status, 101)
        ws.send_json({"cmd": "while read l; do echo got:$l; done; echo bye >&2; exit 5"})
        self.assertEqual(ws.recv()[1]["type"], "started")
        ws.send_binary(b"one\n")
        self.assertEqual(ws.recv()[1], {"type": "stdout", "data": "got:one\n"})
        ws.send_json({"type": "stdin", "data": "two\n"})
        self.assertEqual(ws.recv()[1]["data"], "got:two\n")
        ws.send_json({"type": "close_stdin"})
        msgs = []
        while True:
            op, msg = ws.recv()
            if op == 8:
                break
            msgs.append(msg)
        self.assertEqual(msgs, [{"type": "stderr", "data": "bye\n"},
                                {"type": "exit", "exit_code": 5, "timed_out": False}])
        ws.sock.close()
        # A client that goes away ends the command on the owner.
        ws = WebSocket(self.daemons["c"], f"/v1/sandboxes/{sid}/exec/ws", self.key)
        ws.send_json({"cmd": "echo up; exec sleep 305"})
        self.assertEqual(ws.recv()[1]["type"], "started")
        self.assertEqual(ws.recv()[1]["data"], "up\n")
        ws.close()
        ws.sock.close()
        deadline = time.time() + 15
        while True:
            s, b = a.exec(sid, "cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -c 'sleep[ ]305' || true")
            if b.get("stdout") == "0\n" or time.time() > deadline:
                break
            time.sleep(0.3)
        self.assertEqual(b["stdout"], "0\n")
        # Refused before the upgrade: the owner's plain error, through a.
        bad = WebSocket(self.daemons["a"], f"/v1/sandboxes/{sid}/exec/ws", other)
        self.assertEqual((bad.status, bad.body["error"]["code"]), (404, "sandbox_not_found"))

    def test_2_preview_through_another_host(self):
        """A preview URL of a sandbox on b, opened through a: the request (and its WebSocket-free
        answer, streamed) crosses to b, which checks the token and proxies to the guest, telling
        it the client's address as a saw it (X-Forwarded-For)."""
        s, b = self.api["a"].call("POST", "/v1/sandboxes",
                                  {"network": True, "placement": {"host": "b"}})
        self.assertEqual(s, 201, b)
        sid = b["id"]
        a = self.api["a"]
        app = ("import http.server\n"
               "class H(http.server.BaseHTTPRequestHandler):\n"
               "    def do_GET(self):\n"
               "        b = ('from-b ' + self.headers.get('X-Forwarded-For', '-') + '\\n').encode()\n"
               "        self.send_response(200)\n"
               "        self.send_header('Content-Length', str(len(b)))\n"
               "        self.end_headers()\n"
               "        self.wfile.write(b)\n"
               "http.server.HTTPServer(('0.0.0.0', 8000), H).serve_forever()\n")
        s, b = a.call("POST", f"/v1/sandboxes/{sid}/processes",
                      {"argv": ["python3", "-c", app]})
        self.assertEqual(s, 201, b)
        s, p = a.call("POST", f"/v1/sandboxes/{sid}/previews", {"port": 8000})
        self.assertEqual(s, 201, p)
        u = urllib.parse.urlsplit(p["path_url"])
        da = self.daemons["a"]
        body = None
        for _ in range(100):
            c = http.client.HTTPConnection(da.host, da.port, timeout=60)
            c.request("GET", f"{u.path}?{u.query}")
            r = c.getresponse()
            r.read()
            self.assertEqual(r.status, 302)
            cookie = r.getheader("Set-Cookie").split(";")[0]
            c.request("GET", u.path + "index.html", headers={"Cookie": cookie})
            r = c.getresponse()
            body = r.read()
            c.close()
            if r.status == 200:
                break
            self.assertEqual(r.status, 502, body)  # (until the server listens)
            time.sleep(0.3)
        self.assertEqual(body, b"from-b 127.0.0.1\n")
        # No token through a: refused by b.
        c = http.client.HTTPConnection(da.host, da.port, timeout=60)
        c.request("GET", u.path + "index.html")
        r = c.getresponse()
        self.assertEqual(r.status, 401, r.read())
        c.close()
        s, m = a.call("GET", "/metrics")
        self.assertRegex(m.decode(), r'pandastack_preview_requests_total\{outcome="forwarded"\} [1-9]')
        self.api["a"].call("DELETE", f"/v1/sandboxes/{sid}")

    def test_3_placement_and_ownership(self):
        ids = {h: self.create_on("a", h) for h in ("b", "c")}
        time.sleep(LEASE)  # the hosts publish their sandbox counts every lease/3
        # Unpinned: the host with the most free memory per sandbox. a runs none.
        s, b = self.api["b"].call("POST", "/v1/sandboxes", {"network": False})
        self.assertEqual(s, 201, b)
        self.assertIn(b["id"], self.local_ids("a"))
        ids["a"] = b["id"]
        owners = self.etcd.prefix("/pandastack/owners/")
        for h, sid in ids.items():
            self.assertEqual(owners.get("/pandastack/owners/" + sid), h)
        # Two hosts never own one id: every host's sandboxes are owned by it alone.
        local = {h: self.local_ids(h) for h in ("a", "b", "c")}
        for h, mine in local.items():
            for sid in mine:
                self.assertEqual(owners.get("/pandastack/owners/" + sid), h, sid)
        self.assertFalse(local["a"] & local["b"] or local["b"] & local["c"] or local["a"] & local["c"])
        # The list through any host is every host's, each sandbox marked with its host.
        for through in ("a", "c"):
            s, b = self.api[through].call("GET", "/v1/sandboxes")
            self.assertEqual(s, 200, b)
            self.assertNotIn("unreachable_hosts", b)
            listed = {x["id"]: x["host"] for x in b["sandboxes"]}
            self.assertEqual(listed, {sid: h for h, mine in local.items() for sid in mine})
            created = [x["created_at_ms"] for x in b["sandboxes"]]
            self.assertEqual(created, sorted(created))
        s, k = self.api["a"].call("POST", "/v1/keys", {"tenant": "lister"})
        s, b = self.api["b"].call("GET", "/v1/sandboxes", key=k["key"])
        self.assertEqual((s, b["sandboxes"]), (200, []), b)
        # Pinned to a host that is not up: a clear error.
        s, b = self.api["a"].call("POST", "/v1/sandboxes",
                                  {"network": False, "placement": {"host": "nowhere"}})
        self.assertEqual((s, b["error"]["code"]), (503, "host_unavailable"))

    def test_4_a_dead_host_is_unavailable_then_back(self):
        sid = self.create_on("a", "c")
        s, b = self.api["a"].exec(sid, "echo before > /tmp/mark; cat /tmp/mark")
        self.assertEqual((s, b["stdout"]), (200, "before\n"))
        self.daemons["c"].stop(sig=signal.SIGKILL)
        b = self.exec_until("a", sid, "true", 503, LEASE + 3, 0.2)
        self.assertEqual(b["error"]["code"], "host_unavailable")
        self.assertIn("host c", b["error"]["message"])
        s, hosts = self.api["a"].call("GET", "/v1/hosts")
        self.assertEqual({h["id"]: h["state"] for h in hosts["hosts"]}["c"], "down")
        # c comes back (the same folders): it re-adopts its VM, and a reaches it again.
        self.start_host("c")
        self.api["c"] = Api(self.daemons["c"], key=self.key)
        b = self.exec_until("a", sid, "cat /tmp/mark", 200, 60, 0.5)
        self.assertEqual(b["stdout"], "before\n")  # the same VM: its tmpfs state is there

    def test_5_etcd_restart_loses_no_owner(self):
        sid = self.create_on("b", "a")
        before = self.etcd.prefix("/pandastack/owners/")
        self.etcd.stop()
        self.etcd.start()
        after = self.etcd.prefix("/pandastack/owners/")
        self.assertEqual(before, after)
        # The hosts' leases survive a short etcd restart (or are granted again): routing works.
        b = self.exec_until("c", sid, "echo again", 200, 3 * LEASE, 0.3)
        self.assertEqual(b["stdout"], "again\n")

    def mark(self, sid, text):
        """Leaves state in the guest's memory: a tmpfs file and a background process."""
        s, b = self.api["a"].exec(
            sid, f"echo {text} > /tmp/mark; nohup sleep 900 >/dev/null 2>&1 & echo started")
        self.assertEqual((s, b["stdout"]), (200, "started\n"), b)

    def check_mark(self, sid, text, through="a"):
        s, b = self.api[through].exec(sid, "cat /tmp/mark; cat /proc/[0-9]*/comm | grep -c '^sleep$'")
        self.assertEqual((s, b["stdout"]), (200, f"{text}\n1\n"), b)

    def test_6_cross_host_fork(self):
        sid = self.create_on("a", "b")
        self.mark(sid, "parent")
        # Through a; children on c and on b (the parent's host).
        s, b = self.api["a"].call("POST", f"/v1/sandboxes/{sid}/fork", {"count": 3, "hosts": ["c", "b"]})
        self.assertEqual(s, 201, b)
        kids = b["sandboxes"]
        self.assertEqual(sorted(k["host"] for k in kids), ["b", "c", "c"])
        owners = self.etcd.prefix("/pandastack/owners/")
        for k in kids:
            self.assertEqual(k["parent"], sid)
            self.assertIn(k["id"], self.local_ids(k["host"]))
            self.assertEqual(owners.get("/pandastack/owners/" + k["id"]), k["host"])
            self.check_mark(k["id"], "parent")  # the parent's memory, on either host
        # The children are theirs: a write in one is not in another, nor in the parent.
        c_kids = [k["id"] for k in kids if k["host"] == "c"]
        s, _ = self.api["a"].exec(c_kids[0], "echo child > /tmp/mark")
        self.check_mark(c_kids[1], "parent")
        self.check_mark(sid, "parent")
        # The snapshot the fork shipped is gone from the parent's list.
        s, b = self.api["b"].call("GET", f"/v1/sandboxes/{sid}")
        self.assertEqual((s, b["snapshots"]), (200, []), b)
        # Hosts that are not up, and a cluster-less daemon's hosts, are refused clearly.
        s, b = self.api["a"].call("POST", f"/v1/sandboxes/{sid}/fork", {"count": 1, "hosts": ["nowhere"]})
        self.assertEqual((s, b["error"]["code"]), (503, "host_unavailable"), b)
        s, b = self.api["a"].call("POST", f"/v1/sandboxes/{sid}/fork", {"count": 1, "hosts": ["b", "c"]})
        self.assertEqual((s, b["error"]["code"]), (400, "invalid_argument"), b)
        # A second fork to c sends no disk layer c already has.
        s, b = self.api["a"].call("POST", f"/v1/sandboxes/{sid}/fork", {"count": 1, "hosts": ["c"]})
        self.assertEqual(s, 201, b)
        self.check_mark(b["sandboxes"][0]["id"], "parent")

    def test_7_migrate(self):
        sid = self.create_on("a", "b")
        self.mark(sid, "moving")
        s, b = self.api["c"].call("POST", f"/v1/sandboxes/{sid}/migrate", {"host": "c"})
        self.assertEqual(s, 200, b)
        self.assertEqual((b["id"], b["host"], b["state"]), (sid, "c", "running"))
        self.assertEqual(self.etcd.prefix("/pandastack/owners/").get("/pandastack/owners/" + sid), "c")
        self.assertIn(sid, self.local_ids("c"))
        self.assertNotIn(sid, self.local_ids("b"))  # ended on b (its events stay there)
        # Its memory and tmpfs came along; any host reaches it.
        for h in ("a", "b", "c"):
            self.check_mark(sid, "moving", through=h)
        # Back to b, hibernated first: it wakes there.
        s, b = self.api["a"].call("POST", f"/v1/sandboxes/{sid}/hibernate")
        self.assertEqual((s, b["state"]), (200, "hibernated"), b)
        s, b = self.api["a"].call("POST", f"/v1/sandboxes/{sid}/migrate", {"host": "b"})
        self.assertEqual((s, b["host"]), (200, "b"), b)
        self.check_mark(sid, "moving")
        # Bad asks.
        s, b = self.api["a"].call("POST", f"/v1/sandboxes/{sid}/migrate", {"host": "b"})
        self.assertEqual((s, b["error"]["code"]), (409, "conflict"), b)
        s, b = self.api["a"].call("POST", f"/v1/sandboxes/{sid}/migrate", {"host": "nowhere"})
        self.assertEqual((s, b["error"]["code"]), (503, "host_unavailable"), b)
        s, b = self.api["a"].call("POST", f"/v1/sandboxes/{sid}/migrate", {})
        self.assertEqual((s, b["error"]["code"]), (400, "invalid_argument"), b)

    def volume_on(self, host, name):
        s, v = self.api[host].call("POST", "/v1/volumes", {"name": name, "size_mib": 64})
        self.assertEqual(s, 201, v)
        return v["id"]

    def owner(self, id):
        return self.etcd.prefix("/pandastack/owners/").get("/pandastack/owners/" + id)

    def test_7_volumes_move_with_their_sandbox(self):
        vid = self.volume_on("b", "moving")
        s, snap = self.api["a"].call("POST", f"/v1/volumes/{vid}/snapshots")
        self.assertEqual(s, 201, snap)
        # Placed with its volume (on b), through a.
        s, b = self.api["a"].call("POST", "/v1/sandboxes",
                                  {"network": False, "volumes": [{"volume": vid, "mount": "/data"}]})
        self.assertEqual(s, 201, b)
        sid = b["id"]
        self.assertIn(sid, self.local_ids("b"))
        s, b = self.api["a"].exec(sid, "echo kept > /data/f && sync && echo ok")
        self.assertEqual((s, b["stdout"]), (200, "ok\n"), b)
        self.mark(sid, "with-volume")
        s, b = self.api["a"].call("POST", f"/v1/sandboxes/{sid}/migrate", {"host": "c"})
        self.assertEqual((s, b.get("host")), (200, "c"), b)
        # Sandbox and volume are c's, in etcd and in every host's answers; the volume keeps its
        # id, name, snapshot and data, and is attached as before.
        self.assertEqual((self.owner(sid), self.owner(vid)), ("c", "c"))
        self.check_mark(sid, "with-volume", through="b")
        s, b = self.api["a"].exec(sid, "cat /data/f; echo more >> /data/f; sync")
        self.assertEqual((s, b["stdout"]), (200, "kept\n"), b)
        s, v = self.api["b"].call("GET", f"/v1/volumes/{vid}")
        self.assertEqual(s, 200, v)
        self.assertEqual((v["name"], [a["sandbox"] for a in v["attachments"]],
                          [x["id"] for x in v["snapshots"]]), ("moving", [sid], [snap["id"]]), v)
        s, listed = self.api["a"].call("GET", "/v1/volumes")
        mine = [x for x in listed["volumes"] if x["id"] == vid]
        self.assertEqual([x.get("host") for x in mine], ["c"], listed)
        # b ended it (volume-migrated), and lists it no more.
        s, merged = self.api["b"].call("GET", "/v1/volumes")
        self.assertNotIn(vid, [x["id"] for x in merged["volumes"] if x.get("host") == "b"])
        # Back to b, hibernated first: the volume's stream goes on there.
        s, b = self.api["a"].call("POST", f"/v1/sandboxes/{sid}/hibernate")
        self.assertEqual(s, 200, b)
        s, b = self.api["a"].call("POST", f"/v1/sandboxes/{sid}/migrate", {"host": "b"})
        self.assertEqual((s, b.get("host")), (200, "b"), b)
        self.assertEqual(self.owner(vid), "b")
        s, b = self.api["c"].exec(sid, "cat /data/f")
        self.assertEqual((s, b["stdout"]), (200, "kept\nmore\n"), b)
        # A new volume from the snapshot that travelled there and back, on b.
        s, v2 = self.api["b"].call("POST", "/v1/volumes", {"from_snapshot": snap["id"]})
        self.assertEqual(s, 201, v2)

        # A cross-host fork: each child on c gets its own copy of the volume.
        s, b = self.api["a"].call("POST", f"/v1/sandboxes/{sid}/fork", {"count": 2, "hosts": ["c"]})
        self.assertEqual(s, 201, b)
        kids = [k["id"] for k in b["sandboxes"]]
        copies = set()
        for k in kids:
            s, kb = self.api["a"].call("GET", f"/v1/sandboxes/{k}")
            copy = kb["volumes"][0]["volume"]
            self.assertNotEqual(copy, vid)
            copies.add(copy)
            self.assertEqual(self.owner(copy), "c")
            s, out = self.api["a"].exec(k, f"cat /data/f; echo {k} >> /data/f")
            self.assertEqual((s, out["stdout"]), (200, "kept\nmore\n"), out)
            s, cv = self.api["b"].call("GET", f"/v1/volumes/{copy}")
            self.assertEqual((s, cv["origin"]), (200, f"fork:{sid}:{vid}"), cv)
        self.assertEqual(len(copies), 2)
        s, out = self.api["a"].exec(sid, "cat /data/f")
        self.assertEqual(out["stdout"], "kept\nmore\n", out)  # the parent's is its own

        # A volume shared read-only by two sandboxes moves with neither; a read-only volume
        # does not go to another host's fork children (it stays with the parent).
        ro = self.volume_on("b", "shared")
        sids = []
        for _ in range(2):
            s, b = self.api["a"].call("POST", "/v1/sandboxes", {
                "network": False, "volumes": [{"volume": ro, "mount": "/ro", "read_only": True}]})
            self.assertEqual(s, 201, b)
            sids.append(b["id"])
        s, b = self.api["a"].call("POST", f"/v1/sandboxes/{sids[0]}/migrate", {"host": "c"})
        self.assertEqual((s, b["error"]["code"]), (409, "volume_in_use"), b)
        self.assertEqual(self.owner(sids[0]), "b")
        s, b = self.api["a"].exec(sids[0], "echo still")
        self.assertEqual((s, b["stdout"]), (200, "still\n"), b)
        s, b = self.api["a"].call("POST", f"/v1/sandboxes/{sids[0]}/fork", {"count": 1, "hosts": ["c"]})
        self.assertEqual((s, b["error"]["code"]), (501, "not_implemented"), b)

    def test_8_same_host_fork_through_another_host(self):
        sid = self.create_on("a", "b")
        s, b = self.api["a"].call("POST", f"/v1/sandboxes/{sid}/fork", {"count": 1})
        self.assertEqual(s, 201, b)
        child = (b["sandboxes"] if isinstance(b, dict) else b)[0]["id"]
        self.assertIn(child, self.local_ids("b"))

    def test_8_a_custom_template_is_created_where_it_lives(self):
        # A tenant's own template (here: published from a sandbox on c) lives on c alone: a
        # create naming it through another host is placed there.
        src = self.create_on("a", "c")
        s, t = self.api["b"].call("POST", f"/v1/sandboxes/{src}/template", {"name": "placed"})
        self.assertEqual((s, t.get("status")), (201, "ready"), t)
        # Listed through any host: the shipped ones once, this one with its host.
        s, l = self.api["a"].call("GET", "/v1/templates")
        names = [(x["name"], x.get("host")) for x in l["templates"]]
        self.assertEqual(names.count(("base", None)), 1, names)
        self.assertIn(("placed", "c"), names)
        deadline = time.time() + 3 * LEASE  # (until c's heartbeat lists it)
        while True:
            s, b = self.api["b"].call("POST", "/v1/sandboxes",
                                      {"template": "placed", "network": False})
            if s == 201 or time.time() > deadline:
                break
            self.assertEqual((s, b["error"]["code"]), (404, "template_not_found"), b)
            time.sleep(0.5)
        self.assertEqual((s, b.get("template")), (201, "placed"), b)
        self.assertIn(b["id"], self.local_ids("c"))
        # Another tenant's create of that name is not sent there: it has no such template.
        s, k = self.api["a"].call("POST", "/v1/keys", {"tenant": "placer"})
        s, e = self.api["a"].call("POST", "/v1/sandboxes", {"template": "placed"}, key=k["key"])
        self.assertEqual((s, e["error"]["code"]), (404, "template_not_found"), e)
        for sid in (b["id"], src):
            self.assertEqual(self.api["a"].call("DELETE", f"/v1/sandboxes/{sid}")[0], 200)
        s, t = self.api["c"].call("DELETE", "/v1/templates/placed")
        self.assertEqual(s, 200, t)

    def test_9_drain(self):
        running = self.create_on("a", "c")
        self.mark(running, "drained")
        vid = self.volume_on("c", "drained")
        s, b = self.api["a"].call("POST", "/v1/sandboxes",
                                  {"network": False, "volumes": [{"volume": vid, "mount": "/v"}]})
        self.assertEqual(s, 201, b)
        with_volume = b["id"]
        s, b = self.api["a"].exec(with_volume, "echo on-volume > /v/f && sync && echo ok")
        self.assertEqual((s, b["stdout"]), (200, "ok\n"), b)
        asleep = self.create_on("a", "c")
        self.mark(asleep, "asleep")
        s, b = self.api["a"].call("POST", f"/v1/sandboxes/{asleep}/hibernate")
        self.assertEqual(s, 200, b)
        # Through a: the route goes to c, which moves everything off itself.
        s, b = self.api["a"].call("POST", "/v1/hosts/c/drain")
        self.assertEqual(s, 200, b)
        self.assertEqual((b["host"], b["draining"], b["failed"]), ("c", True, []), b)
        moved = {m["id"]: m["host"] for m in b["moved"]}
        self.assertIn(running, moved)
        self.assertIn(asleep, moved)
        self.assertFalse(self.local_ids("c") & set(moved))
        for sid, text in ((running, "drained"), (asleep, "asleep")):
            self.assertIn(moved[sid], ("a", "b"))
            self.check_mark(sid, text)
        self.assertEqual(self.owner(vid), moved[with_volume])
        s, b = self.api["a"].exec(with_volume, "cat /v/f")
        self.assertEqual((s, b["stdout"]), (200, "on-volume\n"), b)
        s, hosts = self.api["b"].call("GET", "/v1/hosts")
        self.assertTrue({h["id"]: h for h in hosts["hosts"]}["c"]["draining"])
        # A draining host takes no creates: unpinned ones go elsewhere, pinned ones are refused.
        s, b = self.api["c"].call("POST", "/v1/sandboxes", {"network": False})
        self.assertEqual(s, 201, b)
        self.assertNotIn(b["id"], self.local_ids("c"))
        s, b = self.api["a"].call("POST", "/v1/sandboxes",
                                  {"network": False, "placement": {"host": "c"}})
        self.assertEqual((s, b["error"]["code"]), (503, "host_unavailable"), b)
        self.assertIn("draining", b["error"]["message"])
        s, b = self.api["a"].call("DELETE", "/v1/hosts/c/drain")
        self.assertEqual((s, b["draining"]), (200, False), b)
        s, b = self.api["a"].call("POST", "/v1/hosts/nowhere/drain")
        self.assertEqual((s, b["error"]["code"]), (404, "host_not_found"), b)
        # Admins only.
        s, k = self.api["a"].call("POST", "/v1/keys", {"tenant": "drainer"})
        s, b = self.api["a"].call("POST", "/v1/hosts/c/drain", key=k["key"])
        self.assertEqual((s, b["error"]["code"]), (403, "forbidden"), b)


    def test_y_e2b_through_other_hosts(self):
        """The real E2B SDK: a create through a (placed by the cluster), then the sandbox plane
        through a host that does not own the sandbox."""
        e2b = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2b")
        if not os.path.isdir(os.path.join(e2b, "node_modules", "e2b")):
            subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=e2b,
                           check=True, timeout=600)

        def client(api, sandbox, *args):
            env = dict(os.environ, E2B_API_KEY=self.key, E2B_API_URL=self.daemons[api].url,
                       E2B_SANDBOX_URL=self.daemons[sandbox].url)
            r = subprocess.run(["node", "cluster_client.mjs", *args], cwd=e2b, env=env,
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            return r.stdout.strip()

        sid = client("a", "a", "create")
        owner = self.etcd.prefix("/pandastack/owners/").get("/pandastack/owners/" + sid)
        self.assertIn(owner, ("a", "b", "c"))
        self.assertIn(sid, self.local_ids(owner))
        others = [h for h in ("a", "b", "c") if h != owner]
        s, b = self.api[owner].exec(sid, "echo e2b-mark > /tmp/mark")
        self.assertEqual(s, 200, b)
        out = json.loads(client(others[0], others[1], "use", sid))
        self.assertEqual(out, {"stdout": "through\ne2b-mark\n", "running": True})
        s, b = self.api["a"].call("GET", f"/v1/sandboxes/{sid}")
        self.assertEqual((s, b["state"]), (200, "stopped"), b)  # killed through the SDK

    def test_z_audit_is_merged(self):
        s, b = self.api["b"].call("GET", "/v1/audit?limit=10000")
        self.assertEqual(s, 200, b)
        self.assertNotIn("unreachable_hosts", b)
        events = b["events"]
        self.assertEqual({e["host"] for e in events}, {"a", "b", "c"})
        times = [e["time_ms"] for e in events]
        self.assertEqual(times, sorted(times))  # merged by time
        for h in ("a", "b", "c"):
            seqs = [e["seq"] for e in events if e["host"] == h]
            self.assertEqual(seqs, sorted(seqs))  # each host's order kept
        # Pages of 7 through another host, with the cursor: the same events, once each.
        paged, cursor = [], ""
        while True:
            s, p = self.api["c"].call("GET", "/v1/audit?limit=7" + ("&cursor=" + cursor if cursor else ""))
            self.assertEqual(s, 200, p)
            if not p["events"]:
                break
            paged += p["events"]
            cursor = p["next_cursor"]
        key = lambda e: (e["host"], e["seq"])
        self.assertEqual(sorted(map(key, paged)), sorted(map(key, events)))
        s, p = self.api["a"].call("GET", "/v1/audit?cursor=nonsense")
        self.assertEqual((s, p["error"]["code"]), (400, "invalid_argument"), p)


if __name__ == "__main__":
    harness.main()
