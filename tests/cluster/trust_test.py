#!/usr/bin/env python3
"""A cluster that trusts no network (security review 3: C2, H1, H2, L3), attacked through the
real binaries: etcd with TLS and client certificates, two hosts with their own certificates (no
VMs: nothing here boots one). Each case failed on the main before mutual TLS:

- C2: etcd refuses plain HTTP and a client without a certificate; a key record written straight
  into etcd (as etcd's operator could) is not accepted as a key by any host; a daemon refuses a
  plain http:// etcd unless --insecure-cluster.
- C2/H1: a host record redirected to an attacker's listener makes the host connect there with
  TLS and send no credential and no tenant key in the clear.
- H1/L3: the peer port refuses a client without a certificate, and one whose certificate another
  CA issued; a host's certificate must name its --host-id.
- H2: 64 MiB of junk sent to the peer port before any login costs the daemon < 32 MiB, and the
  connection is closed long before the junk ends; one address holds at most 64 connections.
- H1 (scoped authority): a hostile peer with a certificate of the cluster's own CA
  (tests/cluster/peer_probe.cc) cannot discard a sandbox it did not start on its connection, send
  a snapshot without a key of the tenant it names, or start sandboxes from a snapshot it did not
  send on its connection.

- L2: a command sent through a host that does not own its sandbox ends on the owner when its
  client hangs up; a 5 MiB file goes up and down through it in parts.

Two sandboxes are made (on h1: the hostile-peer and hang-up cases); nothing else boots a VM.

Usage: PANDASTACK_PEER_PROBE=build/bin/pandastack-peer-probe \
       trust_test.py --daemon build/bin/pandastackd [--images var/images]
"""
import base64
import hashlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "api"))
import harness  # noqa: E402
from cluster_test import CERTS, Etcd, make_pki  # noqa: E402
from harness import Api, Daemon, guest_has_process  # noqa: E402


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def b64(s):
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


class TrustTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.base = tempfile.mkdtemp(prefix="pst-trust-", dir="/dev/shm")
        cls.pki = os.path.join(cls.base, "pki")
        make_pki(cls.pki, ("h1", "h2", "h9"))  # (h9: the hostile peer's)
        cls.etcd = Etcd(os.path.join(cls.base, "etcd"), cls.pki)
        cls.daemons = {}
        for h in ("h1", "h2"):
            cls.daemons[h] = Daemon(
                os.path.join(cls.base, h), os.path.join(cls.base, h + "-state"),
                extra=("--cluster", cls.etcd.url, "--host-id", h, "--advertise", "127.0.0.1:0",
                       "--cluster-tls", os.path.join(cls.pki, "hosts", h), "--pool-size", "0",
                       "--spare-pool-size", "0"))
        cls.key = cls.daemons["h1"].key
        cls.api = {h: Api(d, key=cls.key) for h, d in cls.daemons.items()}
        hosts = cls.etcd.prefix("/pandastack/hosts/")
        cls.peer = {h: json.loads(hosts["/pandastack/hosts/" + h])["peer"] for h in ("h1", "h2")}

    @classmethod
    def tearDownClass(cls):
        for d in cls.daemons.values():
            d.stop(reap=True)
        cls.etcd.stop()
        shutil.rmtree(cls.base, ignore_errors=True)

    def put(self, key, value):
        self.etcd.call("/v3/kv/put", {"key": b64(key), "value": b64(value)})

    # --- C2: etcd ---

    def test_etcd_refuses_plain_http_and_clients_without_a_certificate(self):
        body = json.dumps({"key": b64("/pandastack/keys/x"), "value": b64("x")}).encode()
        plain = self.etcd.url.replace("https://", "http://") + "/v3/kv/put"
        with self.assertRaises((urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.urlopen(urllib.request.Request(plain, data=body), timeout=5).read()
        no_cert = ssl.create_default_context(cafile=os.path.join(self.pki, "ca.pem"))
        with self.assertRaises((urllib.error.URLError, ssl.SSLError, ConnectionError, OSError)):
            urllib.request.urlopen(urllib.request.Request(self.etcd.url + "/v3/kv/put", data=body),
                                   timeout=5, context=no_cert).read()
        self.assertNotIn("/pandastack/keys/x", self.etcd.prefix("/pandastack/keys/"))

    def test_a_key_record_written_into_etcd_is_not_a_key(self):
        # What an etcd operator (or a stolen etcd client certificate) could write: an admin
        # record with the hash of a secret of its choosing, in the record layout the hosts use.
        kid, secret = "forgedaaaaaa", "a" * 40
        record = b"\x01" + (0).to_bytes(8, "big") + hashlib.sha256(secret.encode()).digest() + \
            b"default"
        self.etcd.call("/v3/kv/put", {"key": b64("/pandastack/keys/" + kid), "value": b64(record)})
        forged = f"pds_{kid}_{secret}"
        for h, d in self.daemons.items():
            s, b = Api(d, key=forged).call("GET", "/v1/keys")
            self.assertEqual(s, 401, (h, b))
            # the real admin key (its record MACed by the host that made it) works everywhere
            s, b = self.api[h].call("GET", "/v1/keys")
            self.assertEqual(s, 200, (h, b))
            self.assertNotIn(kid, json.dumps(b))

    def test_the_daemon_refuses_plain_etcd_and_a_certificate_of_another_host(self):
        def run(*extra):
            d = os.path.join(self.base, "refused")
            return subprocess.run(
                [harness.ARGS.daemon, "--data", d, "--images", harness.ARGS.images,
                 "--listen", "127.0.0.1:0", "--rpc-listen", "127.0.0.1:0", "--advertise",
                 "127.0.0.1:0", *extra], capture_output=True, text=True, timeout=30)
        plain = self.etcd.url.replace("https://", "http://")
        r = run("--cluster", plain, "--host-id", "h3",
                "--cluster-tls", os.path.join(self.pki, "hosts", "h1"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--insecure-cluster", r.stderr)
        r = run("--cluster", self.etcd.url, "--host-id", "h2",
                "--cluster-tls", os.path.join(self.pki, "hosts", "h1"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("not --host-id h2", r.stderr)

    # --- C2/H1: a redirected host record ---

    def test_a_redirected_host_record_gets_no_credential_and_no_key(self):
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        listener.settimeout(20)
        got = []

        def collect():
            try:
                c, _ = listener.accept()
                with c:
                    c.settimeout(5)
                    while True:
                        d = c.recv(65536)
                        if not d:
                            break
                        got.append(d)
            except OSError:
                pass

        t = threading.Thread(target=collect)
        t.start()
        now = int(time.time() * 1000)
        self.put("/pandastack/hosts/h9", json.dumps(
            {"id": "h9", "peer": "127.0.0.1:%d" % listener.getsockname()[1], "url": "",
             "accel": "tcg", "free_mib": 100000, "total_mib": 100000, "sandboxes": 0,
             "draining": False, "templates": ["base"], "started_ms": now, "updated_ms": now}))
        self.put("/pandastack/owners/sbx_redirected00000", "h9")
        try:
            # (the host's view of the live hosts is cached for a second: until it sees h9 up,
            # the id answers host_unavailable without a connection)
            for _ in range(10):
                s, b = self.api["h1"].call("GET", "/v1/sandboxes/sbx_redirected00000")
                self.assertNotEqual(s, 200, b)
                if s != 503 or b["error"]["code"] != "host_unavailable":
                    break
                time.sleep(0.5)
        finally:
            listener.close()
            t.join(30)
            self.etcd.call("/v3/kv/deleterange", {"key": b64("/pandastack/hosts/h9")})
        sent = b"".join(got)
        self.assertTrue(sent, "the host did not connect to the redirected address")
        self.assertEqual(sent[0], 0x16, "the first bytes are not a TLS handshake")
        self.assertNotIn(self.key.encode(), sent)
        self.assertNotIn(b"Bearer", sent)

    # --- L1: the forwarding header is the peer server's ---

    def test_a_clients_forwarding_header_is_ignored(self):
        # Draining h1: a create through it is placed elsewhere or refused, never served on h1
        # because the client claims to be a peer.
        s, b = self.api["h1"].call("POST", "/v1/hosts/h1/drain")
        self.assertIn(s, (200, 202), b)
        try:
            s, b = self.api["h1"].call("POST", "/v1/sandboxes",
                                       {"network": False, "placement": {"host": "h1"}},
                                       headers={"X-Pandastack-Forwarded": "h9"})
            self.assertEqual(s, 503, b)
        finally:
            s, b = self.api["h1"].call("DELETE", "/v1/hosts/h1/drain")
            self.assertIn(s, (200, 202), b)

    # --- H1/L3: the peer port ---

    def tls_to_peer(self, ctx):
        host, port = self.peer["h1"].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            with ctx.wrap_socket(raw, server_hostname="h1") as s:
                s.sendall(b"\0" * 64)
                return s.recv(1)  # a refused client certificate ends here (alert or EOF)

    def test_the_peer_port_refuses_clients_without_the_clusters_certificate(self):
        ctx = ssl.create_default_context(cafile=os.path.join(self.pki, "ca.pem"))
        ctx.check_hostname = True
        with self.assertRaises((ssl.SSLError, ConnectionError, OSError)) as e:
            if self.tls_to_peer(ctx) == b"":
                raise ConnectionError("closed")
        other = os.path.join(self.base, "other-pki")
        make_pki(other, ("h2",))
        ctx.load_cert_chain(os.path.join(other, "hosts", "h2", "host.pem"),
                            os.path.join(other, "hosts", "h2", "host.key"))
        with self.assertRaises((ssl.SSLError, ConnectionError, OSError)):
            if self.tls_to_peer(ctx) == b"":
                raise ConnectionError("closed")
        del e

    # --- H1: a logged-in peer's authority is scoped ---

    def probe(self, *args):
        """What a hostile host with a certificate of the cluster CA (h9) asks of h1's peer port."""
        r = subprocess.run(
            [os.environ["PANDASTACK_PEER_PROBE"], "--tls", os.path.join(self.pki, "hosts", "h9"),
             "--self", "h9", "--host", "h1", "--address", self.peer["h1"], *args],
            capture_output=True, text=True, timeout=60)
        lines = r.stdout.strip().splitlines()
        self.assertTrue(lines, r.stderr)
        return json.loads(lines[-1])

    def test_a_hostile_peer_acts_for_no_tenant_and_on_nothing_it_did_not_start(self):
        def key_of(tenant):
            s, b = self.api["h1"].call("POST", "/v1/keys", {"tenant": tenant})
            self.assertEqual(s, 201, b)
            return b["key"]
        victim_key, own_key = key_of("victim"), key_of("hostile")
        victim = Api(self.daemons["h1"], key=victim_key)
        s, sbx = victim.call("POST", "/v1/sandboxes",
                             {"network": False, "placement": {"host": "h1"}})
        self.assertEqual(s, 201, sbx)
        try:
            # It cannot discard what it did not start on its own connection.
            self.assertEqual(self.probe("discard", "victim", sbx["id"]), {"ok": True})
            s, b = victim.call("GET", "/v1/sandboxes/" + sbx["id"])
            self.assertEqual((s, b.get("state")), (200, "running"), b)
            # Nothing is written for a tenant whose key it does not present.
            for key in ("", "pds_aaaaaaaaaaaa_" + "a" * 40, own_key):
                out = self.probe("receive", "victim", key)
                self.assertIn("API key", out.get("error", ""), (key[:12], out))
            # Its own tenant's key passes that check (the offer itself is then judged).
            out = self.probe("receive", "hostile", own_key)
            self.assertNotIn("API key", out.get("error", ""), out)
            # No start from a snapshot it did not send on this connection, even with the
            # victim's key (one it saw forwarded).
            out = self.probe("start", "victim", "imp_" + "a" * 16, victim_key, sbx["id"])
            self.assertIn("not sent on this connection", out.get("error", ""), out)
            s, b = victim.call("GET", "/v1/sandboxes")
            self.assertEqual([x["id"] for x in b["sandboxes"]], [sbx["id"]], b)
        finally:
            victim.call("DELETE", "/v1/sandboxes/" + sbx["id"])

    # --- L2: a forwarded request ends with its client ---

    def test_forwarded_bodies_travel_in_parts_and_a_command_ends_with_its_client(self):
        s, sbx = self.api["h1"].call("POST", "/v1/sandboxes",
                                     {"network": False, "placement": {"host": "h1"}})
        self.assertEqual(s, 201, sbx)
        sid, owner = sbx["id"], self.api["h1"]
        try:
            # A file of several parts up and down through the host that does not own it (each
            # message between the hosts carries at most 1 MiB of it).
            data = os.urandom((5 << 20) + 123)
            s, b = self.api["h2"].call("PUT", f"/v1/sandboxes/{sid}/files?path=/tmp/big.bin",
                                       raw=data)
            self.assertIn(s, (200, 201, 204), b)
            s, b = self.api["h2"].call("GET", f"/v1/sandboxes/{sid}/files?path=/tmp/big.bin")
            self.assertEqual(s, 200)
            self.assertEqual(hashlib.sha256(b).hexdigest(), hashlib.sha256(data).hexdigest())
            d = self.daemons["h2"]  # not the owner: it forwards
            sock = socket.create_connection((d.host, d.port))
            body = '{"cmd":"sleep 3002","timeout_seconds":3600}'
            sock.sendall((f"POST /v1/sandboxes/{sid}/exec HTTP/1.1\r\nHost: x\r\n"
                          f"Authorization: Bearer {self.key}\r\n"
                          f"Content-Type: application/json\r\n"
                          f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
            deadline = time.time() + 20
            while not guest_has_process(owner, sid, "sleep 3002") and time.time() < deadline:
                time.sleep(0.2)
            self.assertTrue(guest_has_process(owner, sid, "sleep 3002"))
            sock.close()
            deadline = time.time() + 10
            while guest_has_process(owner, sid, "sleep 3002") and time.time() < deadline:
                time.sleep(0.3)
            self.assertFalse(guest_has_process(owner, sid, "sleep 3002"),
                             "the forwarded command outlived its client")
        finally:
            owner.call("DELETE", "/v1/sandboxes/" + sid)

    # --- H2: bounded before login ---

    def test_one_source_holds_at_most_64_peer_connections(self):
        host, port = self.peer["h1"].rsplit(":", 1)
        conns = [socket.create_connection((host, int(port)), timeout=10) for _ in range(80)]
        time.sleep(1)
        closed = 0
        for c in conns:
            c.setblocking(False)
            try:
                if c.recv(1) == b"":
                    closed += 1
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
        for c in conns:
            c.close()
        # (the other host's own connections come from this address too)
        self.assertGreaterEqual(closed, 80 - 64, closed)
        time.sleep(0.5)
        s, b = self.api["h2"].call("GET", "/v1/sandboxes")  # h2 still reaches h1
        self.assertEqual(s, 200, b)
        self.assertEqual(b.get("unreachable_hosts", []), [], b)

    def test_junk_before_login_is_cut_off_and_costs_little(self):
        pid = self.daemons["h1"].proc.pid
        before = rss_kib(pid)
        host, port = self.peer["h1"].rsplit(":", 1)
        conns, sent = [], [0] * 4
        chunk = b"\x00\x00\x00\x00\xff\xff\xff\x07" + b"j" * (1 << 20)  # a "1 GiB" frame header
        for i in range(4):
            c = socket.create_connection((host, int(port)), timeout=10)
            conns.append(c)
        for i, c in enumerate(conns):
            try:
                while sent[i] < (16 << 20):
                    c.sendall(chunk)
                    sent[i] += len(chunk)
            except OSError:
                pass
        peak = rss_kib(pid)
        for c in conns:
            c.close()
        self.assertLess(peak - before, 32 << 10, (before, peak))
        self.assertTrue(all(s < (16 << 20) for s in sent), sent)
        s, b = self.api["h1"].call("GET", "/v1/hosts")  # the host still serves
        self.assertEqual(s, 200, b)


if __name__ == "__main__":
    harness.main()
