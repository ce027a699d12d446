#!/usr/bin/env python3
"""Sandbox networking through the API against the real daemon: egress policies, the platform
resolver, isolation from the host, exposed ports, a host crash. Needs root (network namespaces).

Usage: network_test.py --daemon build/bin/pandastackd --cli build/bin/pandastack [unittest args]
All traffic goes to an upstream namespace the test builds itself, or to the daemon on 127.0.0.1.
"""
import argparse
import http.client
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
import harness  # noqa: E402
from harness import Api, Daemon  # noqa: E402


class _Args:
    """harness.ARGS, read when used (main sets it after import)."""

    def __getattr__(self, name):
        return getattr(harness.ARGS, name)


ARGS = _Args()


# A DNS server for the test's upstream namespace: A records for a few test names, NXDOMAIN else.
DNS_SERVER = r"""
ANSWERS = {"allowed.test": "198.19.0.2", "other.test": "198.19.0.3", "a.wild.test": "198.19.0.3",
           "wild.test": "198.19.0.3"}
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("198.19.0.2", 53))
while True:
    q, peer = s.recvfrom(512)
    i, labels = 12, []
    while q[i]:
        labels.append(q[i + 1:i + 1 + q[i]].decode()); i += 1 + q[i]
    qend = i + 5
    name, qtype = ".".join(labels).lower(), q[i + 1] << 8 | q[i + 2]
    ip = ANSWERS.get(name) if qtype == 1 else None
    flags = b"\x81\x80" if name in ANSWERS else b"\x81\x83"
    r = q[:2] + flags + q[4:6] + (b"\x00\x01" if ip else b"\x00\x00") + b"\x00\x00\x00\x00" + q[12:qend]
    if ip:
        r += b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04" + socket.inet_aton(ip)
    s.sendto(r, peer)
"""


class NetworkTest(unittest.TestCase):
    """Sandbox networking through the API: egress policies set at create and by PATCH, isolation
    from the host, removal on kill. All traffic goes to an upstream network namespace this test
    builds itself (198.19.0.2 inside it), never anywhere else."""

    UP_NS, UP_LINK = "pta-upstream", "upta0"

    @classmethod
    def setUpClass(cls):
        sh = lambda cmd: subprocess.run(cmd, shell=True, check=True)
        subprocess.run(f"ip netns del {cls.UP_NS}; ip link del {cls.UP_LINK}", shell=True,
                       stderr=subprocess.DEVNULL)
        sh(f"ip netns add {cls.UP_NS} && ip link add {cls.UP_LINK} type veth peer name eth0 "
           f"netns {cls.UP_NS} && ip addr add 198.19.0.1/24 dev {cls.UP_LINK} && "
           f"ip link set {cls.UP_LINK} up && ip -n {cls.UP_NS} addr add 198.19.0.2/24 dev eth0 && "
           f"ip -n {cls.UP_NS} addr add 198.19.0.3/24 dev eth0 && ip -n {cls.UP_NS} link set eth0 up")
        cls.servers = [subprocess.Popen(["ip", "netns", "exec", cls.UP_NS, "python3", "-m",
                                         "http.server", "--bind", a, "8080"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                       for a in ("198.19.0.2", "198.19.0.3")]
        cls.base = tempfile.mkdtemp(prefix="pst-api-net-", dir="/dev/shm")
        # The upstream's DNS server: the platform resolver forwards allowed names to it.
        dns = os.path.join(cls.base, "dns.py")
        with open(dns, "w") as f:
            f.write(DNS_SERVER)
        cls.servers.append(subprocess.Popen(["ip", "netns", "exec", cls.UP_NS, "python3", dns],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        cls.data = os.path.join(cls.base, "data")
        cls.daemon = Daemon(cls.data, os.path.join(cls.base, "state"),
                            ["--dns-upstream", "198.19.0.2:53",
                             # the upstream is in a reserved range: the operator allows it
                             "--allow-private-egress", "198.18.0.0/15"])
        cls.api = Api(cls.daemon)
        cls.prefix = Daemon.network_flags(cls.data)[1]

    @classmethod
    def tearDownClass(cls):
        code = cls.daemon.stop(reap=True)
        for p in cls.servers:
            p.terminate()
            p.wait()
        subprocess.run(f"ip netns del {cls.UP_NS}; ip link del {cls.UP_LINK}", shell=True,
                       stderr=subprocess.DEVNULL)
        shutil.rmtree(cls.base, ignore_errors=True)
        assert code == 0, f"daemon exited {code}"
        # A graceful stop removes every network of the daemon and its host table.
        assert not [n for n in os.listdir("/run/netns") if n.startswith(cls.prefix + "-")]
        tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
        assert "pandastack_" + cls.prefix not in tables, tables

    def fetch(self, sid, addr, port=8080):
        code = ("import socket\ntry:\n s=socket.create_connection(('%s',%d),3)\n"
                " s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n'); print('ok', s.recv(12).decode())\n"
                "except OSError as e: print('error', e)" % (addr, port))
        s, b = self.api.exec(sid, "python3 -c \"" + code + "\"")
        self.assertEqual(s, 200, b)
        return b["stdout"].strip()

    def subnet(self, sid):
        s, b = self.api.call("GET", f"/v1/sandboxes/{sid}/events")
        self.assertEqual(s, 200, b)
        attached = [e for e in b["events"] if e["type"] == "network-attached"]
        self.assertTrue(attached, b)
        return attached[-1]["event"]["subnet"]

    def test_egress_policies_isolation_and_cleanup(self):
        c = self.api
        sbx = c.create(egress={"mode": "allowlist", "cidrs": ["198.19.0.2"]})
        sid = sbx["id"]
        self.assertEqual(sbx["network"], True)
        self.assertEqual(sbx["egress"], {"mode": "allowlist", "cidrs": ["198.19.0.2/32"],
                                         "domains": []})
        self.assertEqual(self.fetch(sid, "198.19.0.2"), "ok HTTP/1.0 200")
        self.assertTrue(self.fetch(sid, "198.19.0.3").startswith("error"))
        # The host (its address on the upstream link, the API port itself) is never reachable.
        self.assertTrue(self.fetch(sid, "198.19.0.1", self.daemon.port).startswith("error"))
        # PATCH: deny_all, then allow_all.
        s, b = c.call("PATCH", f"/v1/sandboxes/{sid}", {"egress": {"mode": "deny_all"}})
        self.assertEqual((s, b["egress"]["mode"]), (200, "deny_all"))
        self.assertTrue(self.fetch(sid, "198.19.0.2").startswith("error"))
        c.call("PATCH", f"/v1/sandboxes/{sid}", {"egress": {"mode": "allow_all"}})
        self.assertEqual(self.fetch(sid, "198.19.0.3"), "ok HTTP/1.0 200")
        # Refused: bad CIDRs, modes and domain names (400), a policy for a sandbox without a
        # network (409); nothing changes.
        self.assertError(c.call("PATCH", f"/v1/sandboxes/{sid}", {"egress": {"cidrs": ["10.0.0.1/8"]}}),
                         400, "invalid_argument")
        self.assertError(c.call("PATCH", f"/v1/sandboxes/{sid}", {"egress": {"mode": "open"}}),
                         400, "invalid_argument")
        self.assertError(c.call("PATCH", f"/v1/sandboxes/{sid}", {"egress": {"domains": ["a b.test"]}}),
                         400, "invalid_argument")
        self.assertEqual(c.call("GET", f"/v1/sandboxes/{sid}")[1]["egress"]["mode"], "allow_all")
        plain = c.create(network=False)
        self.assertEqual(plain["network"], False)
        self.assertError(c.call("PATCH", f"/v1/sandboxes/{plain['id']}", {"egress": {"mode": "allow_all"}}),
                         409, "network_disabled")
        self.assertTrue(self.fetch(plain["id"], "198.19.0.2").startswith("error"))
        # A fork gets a network of its own with the parent's policy.
        s, b = c.call("POST", f"/v1/sandboxes/{sid}/fork", {"count": 1})
        self.assertEqual(s, 201, b)
        child = b["sandboxes"][0]
        self.assertEqual(child["egress"]["mode"], "allow_all")
        self.assertEqual(self.fetch(child["id"], "198.19.0.2"), "ok HTTP/1.0 200")
        self.assertNotEqual(self.subnet(child["id"]), self.subnet(sid))
        # Kill: the namespace and host link go.
        n = self.subnet(sid)
        self.assertTrue(os.path.exists(f"/run/netns/{self.prefix}-{n}"))
        self.assertEqual(c.call("DELETE", f"/v1/sandboxes/{sid}")[0], 200)
        for _ in range(50):
            if not os.path.exists(f"/run/netns/{self.prefix}-{n}"):
                break
            time.sleep(0.1)
        self.assertFalse(os.path.exists(f"/run/netns/{self.prefix}-{n}"))
        self.assertFalse(os.path.exists(f"/sys/class/net/{self.prefix}{n}"))
        for x in (child["id"], plain["id"]):
            c.call("DELETE", f"/v1/sandboxes/{x}")

    def test_template_default_network(self):
        # A recipe's `network=off` (written to IMAGES/<template>/network) makes its sandboxes
        # network-less unless a create asks for one.
        path = os.path.join(ARGS.images, "base", "network")
        with open(path) as f:
            saved = f.read()
        try:
            with open(path, "w") as f:
                f.write("off\n")
            plain = self.api.create()
            self.assertEqual(plain["network"], False)
            asked = self.api.create(network=True)
            self.assertEqual(asked["network"], True)
        finally:
            with open(path, "w") as f:
                f.write(saved)
        for x in (plain, asked):
            self.api.call("DELETE", f"/v1/sandboxes/{x['id']}")

    def resolve(self, sid, name):
        s, b = self.api.exec(sid, "r=$(getent hosts %s) && echo ${r%%%% *} || echo none" % name)
        self.assertEqual(s, 200, b)
        return b["stdout"].strip()

    def test_domain_allowlist_through_the_platform_resolver(self):
        c = self.api
        sid = c.create(egress={"domains": ["allowed.test", "*.wild.test"]})["id"]
        self.assertEqual(c.call("GET", f"/v1/sandboxes/{sid}")[1]["egress"],
                         {"mode": "allowlist", "cidrs": [], "domains": ["*.wild.test", "allowed.test"]})
        # Not yet resolved: its address is not allowed.
        self.assertTrue(self.fetch(sid, "198.19.0.2").startswith("error"))
        self.assertEqual(self.resolve(sid, "allowed.test"), "198.19.0.2")
        self.assertEqual(self.fetch(sid, "198.19.0.2"), "ok HTTP/1.0 200")
        # Names not on the list are refused; their addresses stay closed.
        self.assertEqual(self.resolve(sid, "other.test"), "none")
        self.assertEqual(self.resolve(sid, "wild.test"), "none")  # *.wild.test: below it only
        self.assertTrue(self.fetch(sid, "198.19.0.3").startswith("error"))
        self.assertEqual(self.resolve(sid, "a.wild.test"), "198.19.0.3")
        self.assertEqual(self.fetch(sid, "198.19.0.3"), "ok HTTP/1.0 200")
        # Without a domain on the list, nothing resolves.
        c.call("PATCH", f"/v1/sandboxes/{sid}", {"egress": {"mode": "deny_all"}})
        self.assertEqual(self.resolve(sid, "allowed.test"), "none")
        c.call("DELETE", f"/v1/sandboxes/{sid}")

    def test_networks_survive_a_host_crash_and_leftovers_go(self):
        base = tempfile.mkdtemp(prefix="pst-api-nc-", dir="/dev/shm")
        data, state = os.path.join(base, "data"), os.path.join(base, "state")
        prefix = Daemon.network_flags(data)[1]
        mine = lambda: sorted(n for n in os.listdir("/run/netns") if n.startswith(prefix + "-"))
        daemons = []
        try:
            allow = ["--allow-private-egress", "198.18.0.0/15"]  # the test's upstream
            d = Daemon(data, state, allow)
            daemons.append(d)
            c = Api(d)
            sid = c.create(egress={"mode": "allowlist", "cidrs": ["198.19.0.2"]})["id"]
            c.call("POST", f"/v1/sandboxes/{sid}/processes",
                   {"cmd": "cd /tmp && echo crash > index.html && exec python3 -m http.server 8000"})
            port = c.call("POST", f"/v1/sandboxes/{sid}/ports", {"port": 8000})[1]
            for _ in range(100):
                if self.host_get(port["host_port"])[0] == 200:
                    break
                time.sleep(0.2)
            before = mine()
            self.assertGreaterEqual(len(before), 1)
            d.stop(signal.SIGKILL)  # the VM (and its namespace) outlive the host process
            d2 = Daemon(data, state, allow)
            daemons.append(d2)
            c2 = Api(d2)
            self.assertEqual(c2.call("GET", f"/v1/sandboxes/{sid}")[1]["state"], "running")
            save, self.api = self.api, c2
            try:
                self.assertEqual(self.fetch(sid, "198.19.0.2"), "ok HTTP/1.0 200")
                self.assertTrue(self.fetch(sid, "198.19.0.3").startswith("error"))
            finally:
                self.api = save
            p2 = c2.call("GET", f"/v1/sandboxes/{sid}/ports")[1]["ports"][0]
            self.assertEqual(self.host_get(p2["host_port"]), (200, b"crash\n"))
            # The crashed host's pool members were killed and their namespaces removed: what
            # remains is the adopted sandbox's namespace and the new pool's.
            n = c2.call("GET", f"/v1/sandboxes/{sid}/events")[1]["events"]
            subnet = [e for e in n if e["type"] == "network-attached"][-1]["event"]["subnet"]
            self.assertIn(f"{prefix}-{subnet}", mine())
            self.assertEqual(d2.stop(), 0)
            self.assertEqual(mine(), [])
        finally:
            for x in daemons:  # a graceful stop of the live one kills the VMs and their networks
                x.stop()
            shutil.rmtree(base, ignore_errors=True)

    def host_get(self, port):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/")
            r = conn.getresponse()
            body = r.read()
            conn.close()
            return r.status, body
        except OSError as e:
            return None, str(e)

    def test_exposed_port_follows_the_sandbox_through_hibernation(self):
        c = self.api
        sid = c.create(persistent=True)["id"]  # deny_all egress: inbound forwards still work
        s, b = c.call("POST", f"/v1/sandboxes/{sid}/processes",
                      {"cmd": "cd /tmp && echo hi > index.html && exec python3 -m http.server 8000"})
        self.assertEqual(s, 201, b)
        s, p = c.call("POST", f"/v1/sandboxes/{sid}/ports", {"port": 8000})
        self.assertEqual(s, 201, p)
        self.assertEqual((p["port"], p["host"]), (8000, "127.0.0.1"))
        self.assertEqual(p["address"], "127.0.0.1:%d" % p["host_port"])
        got = (None, "")
        for _ in range(100):
            got = self.host_get(p["host_port"])
            if got[0] == 200:
                break
            time.sleep(0.2)
        self.assertEqual(got, (200, b"hi\n"))
        self.assertEqual(c.call("GET", f"/v1/sandboxes/{sid}/ports")[1]["ports"], [p])
        self.assertEqual(c.call("GET", f"/v1/sandboxes/{sid}")[1]["ports"], [8000])
        # Hibernated: recorded, not forwarded; woken: forwarded again (the server survived).
        self.assertEqual(c.call("POST", f"/v1/sandboxes/{sid}/hibernate")[0], 200)
        self.assertEqual(self.host_get(p["host_port"])[0], None)
        self.assertEqual(c.call("GET", f"/v1/sandboxes/{sid}/ports")[1]["ports"][0]["host_port"], None)
        self.assertEqual(c.call("POST", f"/v1/sandboxes/{sid}/wake")[0], 200)
        p2 = c.call("GET", f"/v1/sandboxes/{sid}/ports")[1]["ports"][0]
        self.assertEqual(self.host_get(p2["host_port"]), (200, b"hi\n"))
        # Errors, then removal.
        self.assertError(c.call("POST", f"/v1/sandboxes/{sid}/ports", {"port": 0}), 400, "invalid_argument")
        self.assertError(c.call("POST", f"/v1/sandboxes/{sid}/ports", {}), 400, "invalid_argument")
        self.assertError(c.call("DELETE", f"/v1/sandboxes/{sid}/ports/9"), 404, "port_not_found")
        self.assertError(c.call("DELETE", f"/v1/sandboxes/{sid}/ports/x"), 400, "invalid_argument")
        # The CLI: list, expose again (same forward), change the egress policy.
        env = dict(os.environ, PANDASTACK_API_KEY=self.daemon.key, PANDASTACK_BASE_URL=self.daemon.url)
        cli = lambda *a: subprocess.run([ARGS.cli, "sandbox", *a], capture_output=True, text=True,
                                        env=env, timeout=120)
        r = cli("ports", sid, "--json")
        self.assertEqual((r.returncode, json.loads(r.stdout)), (0, [p2]), r.stderr)
        r = cli("expose", sid, "8000")
        self.assertEqual((r.returncode, r.stdout.strip()), (0, p2["address"]), r.stderr)
        r = cli("egress", sid, "allowlist", "--allow", "198.19.0.2", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["egress"]["cidrs"], ["198.19.0.2/32"])
        self.assertEqual(cli("egress", sid, "open").returncode, 1)
        self.assertEqual(c.call("DELETE", f"/v1/sandboxes/{sid}/ports/8000")[0], 204)
        self.assertEqual(self.host_get(p2["host_port"])[0], None)
        self.assertEqual(c.call("GET", f"/v1/sandboxes/{sid}/ports")[1]["ports"], [])
        plain = c.create(network=False)["id"]
        self.assertError(c.call("POST", f"/v1/sandboxes/{plain}/ports", {"port": 80}), 409,
                         "network_disabled")
        for x in (sid, plain):
            c.call("DELETE", f"/v1/sandboxes/{x}")

    def assertError(self, result, status, code):
        s, b = result
        self.assertEqual(s, status, b)
        self.assertEqual(b["error"]["code"], code, b)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    p.add_argument("--cli", required=True)
    p.add_argument("--images", default=os.environ.get("PANDASTACK_IMAGES", "var/images"))
    args, rest = p.parse_known_args()
    args.images = os.path.abspath(args.images)
    harness.ARGS = args
    harness.run_unittests(rest)
