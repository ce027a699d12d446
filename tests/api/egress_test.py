#!/usr/bin/env python3
"""The egress log through the real daemon and a real VM: what a sandbox's resolver answered and
refused, the connections it opened (with their bytes) and those its policy denied, with the
reason; paging and filters; kept across hibernate and wake; the resolver's rate limit. Secrets
through the egress proxy: the guest holds a placeholder, the test's HTTPS upstream (a CA of the
test's own) receives the value, other hosts and plain HTTP never do; rotation, deletion,
hibernate and wake, forks with and without inherit_secrets; E2B's network rules (headers whose
values name E2B secrets), set at create and by updateNetwork.

All traffic goes to an upstream network namespace this test builds (198.18.9.2 and .3 inside
it) or is refused inside the sandbox's own namespace (reserved and link-local addresses never
leave it).

Usage: egress_test.py --daemon build/bin/pandastackd [--images DIR]
"""
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
from upstream import Upstream  # noqa: E402

# The upstream's DNS server: A records for the test's names, no records for other types.
DNS_SERVER = r"""
import socket
ANSWERS = {"allowed.test": "198.18.9.2", "other.test": "198.18.9.3",
           "api.secret.test": "198.18.9.2"}
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("198.18.9.2", 53))
while True:
    q, peer = s.recvfrom(512)
    i, labels = 12, []
    while q[i]:
        labels.append(q[i + 1:i + 1 + q[i]].decode()); i += 1 + q[i]
    qend = i + 5
    name, qtype = ".".join(labels).lower(), q[i + 1] << 8 | q[i + 2]
    ip = ANSWERS.get(name) if qtype == 1 else None
    if name.endswith(".flood.test"):
        ip = "198.18.9.3" if qtype == 1 else None
    flags = b"\x81\x80"
    r = q[:2] + flags + q[4:6] + (b"\x00\x01" if ip else b"\x00\x00") + b"\x00\x00\x00\x00" + q[12:qend]
    if ip:
        r += b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04" + socket.inet_aton(ip)
    s.sendto(r, peer)
"""

# Run in the guest: one connection per target, each read to its end.
PROBE = r"""
import json, socket
def conn(host, port):
    try:
        s = socket.create_connection((host, port), 3)
        s.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
        n = 0
        while True:
            d = s.recv(65536)
            if not d:
                break
            n += len(d)
        s.close()
        return "ok %d" % n
    except OSError as e:
        return "error %s" % e
print(json.dumps({t: conn(h, p) for t, h, p in [
    ("allowed", "allowed.test", 8080), ("other_name", "other.test", 8080),
    ("other_addr", "198.18.9.3", 8080), ("reserved", "198.19.200.1", 80),
    ("internal", "169.254.169.254", 80)]}))
"""

# Run in the guest: N queries for distinct names (n0, n1, ...; then n0 again when AGAIN) sent at
# once, then the answers' codes counted.
FLOOD = r"""
import json, socket, struct, time
N, AGAIN = 1000, False
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
packets = []
for i in list(range(N)) + ([0] if AGAIN else []):
    q = struct.pack(">HHHHHH", i, 0x0100, 1, 0, 0, 0)
    for label in (b"n%d.flood.test" % i).split(b"."):
        q += bytes([len(label)]) + label
    packets.append(q + b"\x00\x00\x01\x00\x01")
codes, got = {}, 0
def take(r):
    global got
    codes[r[3] & 15] = codes.get(r[3] & 15, 0) + 1
    got += 1
# At most 64 queries in flight: the resolver's socket never overflows however slowly it runs
# (ASan), so every query is answered or refused.
s.settimeout(3)
start, sent = time.monotonic(), 0
try:
    while sent < len(packets):
        if sent - got < 64:
            s.sendto(packets[sent], ("172.31.255.1", 53))
            sent += 1
        else:
            take(s.recv(512))
except OSError:
    pass
elapsed = time.monotonic() - start
try:
    while got < len(packets):
        take(s.recv(512))
except OSError:
    pass
print(json.dumps({"codes": codes, "elapsed": elapsed}))
"""


# The upstream's HTTPS servers (ADDRESS CERT KEY LOG; CERT "-": plain HTTP on port 80): each
# request written to LOG (one JSON line each) and answered with its host and path only (never what
# it carried: the value must not come back into the guest).
HTTPS_SERVER = r"""
import http.server, json, ssl, sys
address, cert, key, log = sys.argv[1:5]
class Echo(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.do_GET()
    def do_GET(self):
        n = int(self.headers.get("Content-Length") or 0)
        seen = {"host": self.headers.get("Host"), "auth": self.headers.get("Authorization"),
                "path": self.path, "server": address, "body": self.rfile.read(n).decode()}
        with open(log, "a") as f:
            f.write(json.dumps(seen) + "\n")
        body = json.dumps({"host": seen["host"], "path": seen["path"]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
srv = http.server.ThreadingHTTPServer((address, 80 if cert == "-" else 443), Echo)
if cert != "-":
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
srv.serve_forever()
"""

# Run in the guest: requests with the placeholder of TOKEN (its environment variable) to the
# secret's host, another host, and over plain HTTP. TAG marks the paths.
SECRET_PROBE = r"""
import json, os, urllib.error, urllib.request
tok = os.environ.get("TOKEN", "")
def get(url, headers):
    try:
        r = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=20)
        return {"status": r.status, "answer": json.loads(r.read())}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "body": e.read().decode()}
    except Exception as e:
        return {"error": str(e)}
auth = {"Authorization": "Bearer " + tok}
print(json.dumps({"token": tok,
                  "secret_host": get("https://api.secret.test/TAG/s", auth),
                  "other_host": get("https://other.test/TAG/o", auth),
                  "plain": get("http://api.secret.test/TAG/p", auth)}))
"""

SECRET_VALUE = "ghp_the-real-VALUE-9f8e7d6c"

# Run in the guest: KEY's placeholder in a query string, a body and a plain HTTP header; TOKEN's
# (headers only) in a query string.
OPT_IN_PROBE = r"""
import json, os, urllib.request
key, tok = os.environ["KEY"], os.environ["TOKEN"]
def call(url, data=None, headers={}):
    try:
        r = urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers),
                                   timeout=20)
        return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception as e:
        return str(e)
print(json.dumps({
    "query": call("https://api.secret.test/o/q?key=" + key + "&t=" + tok),
    "body": call("https://api.secret.test/o/b", data=("token=" + key + "&t=" + tok).encode()),
    "plain": call("http://api.secret.test/o/p", headers={"Authorization": "Bearer " + key}),
    "big": call("https://api.secret.test/o/big", data=(key + "x" * (2 << 20)).encode()),
    "key": key, "tok": tok}))
"""


def make_test_ca(folder):
    """A CA of the test's own and a certificate for the upstream's names; returns the CA's path."""
    def run(cmd):
        subprocess.run(cmd, shell=True, check=True, cwd=folder, capture_output=True)
    run("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key "
        "-out ca.crt -days 2 -subj /CN=pandastack-test-upstream-ca "
        "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign")
    run("openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout srv.key "
        "-out srv.csr -subj /CN=api.secret.test")
    with open(os.path.join(folder, "san.ext"), "w") as f:
        f.write("subjectAltName=DNS:api.secret.test,DNS:other.test\n")
    run("openssl x509 -req -in srv.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out srv.crt "
        "-days 2 -extfile san.ext")
    return os.path.join(folder, "ca.crt")


class EgressLogTest(unittest.TestCase):
    UP_NS, UP_LINK = "pte-upstream", "upte0"

    @classmethod
    def setUpClass(cls):
        cls.base = tempfile.mkdtemp(prefix="pst-egress-", dir="/dev/shm")
        www = os.path.join(cls.base, "www")
        os.makedirs(www)
        with open(os.path.join(www, "index.html"), "w") as f:
            f.write("x" * 5000)
        cls.upstream = Upstream(cls.UP_NS, cls.UP_LINK, "198.18.9", [".2", ".3"], cls.base,
                                DNS_SERVER, www)
        ca = make_test_ca(cls.base)
        cls.https_log = os.path.join(cls.base, "https.log")
        script = os.path.join(cls.base, "https.py")
        with open(script, "w") as f:
            f.write(HTTPS_SERVER)
        for a in cls.upstream.addresses:
            for cert, key in ((os.path.join(cls.base, "srv.crt"), os.path.join(cls.base, "srv.key")),
                              ("-", "-")):
                cls.upstream.servers.append(subprocess.Popen(
                    ["ip", "netns", "exec", cls.UP_NS, "/usr/bin/python3", script, a, cert, key,
                     cls.https_log]))
        cls.flags = ["--dns-upstream", "198.18.9.2:53",
                     # the upstream is in a reserved range: the operator allows it
                     "--allow-private-egress", "198.18.9.0/24",
                     # and its HTTPS servers' CA is the test's own
                     "--egress-trust-ca", ca,
                     # the audit log's summaries every 4 s (and at the end)
                     "--egress-summary-seconds", "4"]
        cls.daemon = Daemon(os.path.join(cls.base, "data"), os.path.join(cls.base, "state"),
                            cls.flags)
        cls.api = Api(cls.daemon)

    @classmethod
    def tearDownClass(cls):
        code = cls.daemon.stop(reap=True)
        cls.upstream.remove()
        shutil.rmtree(cls.base, ignore_errors=True)
        assert code == 0, f"daemon exited {code}"

    def run_py(self, sid, code):
        path = "/tmp/probe.py"
        s, b = self.api.call("PUT", f"/v1/sandboxes/{sid}/files?path={path}", raw=code.encode())
        self.assertIn(s, (200, 201, 204), b)
        s, b = self.api.exec(sid, f"python3 {path}", timeout_seconds=60)
        self.assertEqual(s, 200, b)
        self.assertEqual(b["exit_code"], 0, b)
        return json.loads(b["stdout"])

    def egress(self, sid, query=""):
        s, b = self.api.call("GET", f"/v1/sandboxes/{sid}/egress{query}")
        self.assertEqual(s, 200, b)
        return b

    def test_what_a_sandbox_reached_and_was_refused(self):
        c = self.api
        sid = c.create(egress={"mode": "allowlist", "domains": ["allowed.test"]})["id"]
        out = self.run_py(sid, PROBE)
        self.assertTrue(out["allowed"].startswith("ok "), out)
        for t in ("other_name", "other_addr", "reserved", "internal"):
            self.assertTrue(out[t].startswith("error"), out)
        received = int(out["allowed"].split()[1])

        # The resolver's answers and refusals.
        dns = self.egress(sid, "?kind=dns")["entries"]
        a = [e for e in dns if e["name"] == "allowed.test" and e["type"] == "A"]
        self.assertTrue(a, dns)
        self.assertEqual((a[0]["verdict"], a[0]["answers"]), ("allowed", ["198.18.9.2"]), a)
        other = [e for e in dns if e["name"] == "other.test"]
        self.assertTrue(other, dns)
        self.assertEqual((other[0]["verdict"], other[0]["reason"], other[0]["answers"]),
                         ("denied", "policy", []))

        # The connections: the allowed one (named after the answer; its bytes once it ended)
        # and the three refusals with their reasons.
        deadline, conns = time.time() + 30, []
        while time.time() < deadline:
            conns = self.egress(sid, "?kind=connection")["entries"]
            done = [e for e in conns if e["verdict"] == "allowed" and e["ended_ms"]]
            if done:
                break
            time.sleep(1)
        ok = [e for e in conns if e["verdict"] == "allowed"]
        self.assertEqual(len(ok), 1, conns)
        self.assertEqual((ok[0]["protocol"], ok[0]["destination"], ok[0]["port"], ok[0]["name"]),
                         ("tcp", "198.18.9.2", 8080, "allowed.test"))
        self.assertTrue(ok[0]["ended_ms"], f"the connection's end was not seen: {ok[0]}")
        # (bytes on the wire: the payload and the IP and TCP headers)
        self.assertGreater(ok[0]["bytes_in"], received, ok[0])
        self.assertGreater(ok[0]["bytes_out"], 0, ok[0])
        denied = {(e["destination"], e["reason"]) for e in conns if e["verdict"] == "denied"}
        self.assertTrue({("198.18.9.3", "policy"), ("198.19.200.1", "reserved"),
                         ("169.254.169.254", "internal")} <= denied, conns)
        for e in conns:
            if e["verdict"] == "denied":
                self.assertEqual(e["protocol"], "tcp", e)
                self.assertNotIn("bytes_in", e)

        # Paging: one entry a page walks the same log; filters combine.
        full = self.egress(sid, "?limit=1000")
        self.assertEqual((full["dropped"], full["lost"]), (0, 0), full)
        seqs, after = [], 0
        while True:
            page = self.egress(sid, f"?limit=1&after={after}")
            if not page["entries"]:
                break
            seqs += [e["seq"] for e in page["entries"]]
            after = page["next_after"]
        self.assertEqual(seqs, [e["seq"] for e in full["entries"]])
        self.assertEqual(seqs, sorted(set(seqs)))
        both = self.egress(sid, "?kind=dns&verdict=denied")["entries"]
        self.assertTrue(both and all(e["kind"] == "dns" and e["verdict"] == "denied" for e in both))

        # The CLI prints the same log (all pages).
        cli = os.path.join(os.path.dirname(harness.ARGS.daemon), "pandastack")
        env = dict(os.environ, PANDASTACK_API_KEY=c.key, PANDASTACK_BASE_URL=self.daemon.url)
        r = subprocess.run([cli, "sandbox", "egress-log", sid, "--json"], env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual([e["seq"] for e in json.loads(r.stdout)], seqs)
        r = subprocess.run([cli, "sandbox", "egress-log", sid], env=env, capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"dns +denied +policy +other\.test A")
        self.assertRegex(r.stdout, r"connection +allowed +- +tcp 198\.18\.9\.2:8080 \(allowed\.test\)")

        # Kept across hibernate and wake; what the new VM does follows on.
        last = full["entries"][-1]["seq"]
        self.assertEqual(c.call("POST", f"/v1/sandboxes/{sid}/hibernate", {})[0], 200)
        self.assertEqual(self.egress(sid)["entries"][-1]["seq"], last)
        self.assertEqual(c.call("POST", f"/v1/sandboxes/{sid}/wake", {})[0], 200)
        self.run_py(sid, "import socket, json\ntry:\n socket.gethostbyname('other.test')\n"
                         "except OSError as e:\n print(json.dumps(str(e)))\n")
        after_wake = self.egress(sid, f"?after={last}")["entries"]
        self.assertTrue([e for e in after_wake if e["name"] == "other.test"], after_wake)
        self.assertGreater(after_wake[0]["seq"], last)

        # Bad queries and sandboxes without a log of this tenant.
        for q in ("?kind=tcp", "?verdict=maybe", "?limit=0", "?limit=1001", "?after=-1",
                  "?since=1"):
            s, b = c.call("GET", f"/v1/sandboxes/{sid}/egress{q}")
            self.assertEqual((s, b["error"]["code"]), (400, "invalid_argument"), (q, b))
        plain = c.create(network=False)["id"]
        s, b = c.call("GET", f"/v1/sandboxes/{plain}/egress")
        self.assertEqual((s, b["error"]["code"]), (409, "network_disabled"), b)
        s, b = c.call("GET", "/v1/sandboxes/sbx-none/egress")
        self.assertEqual((s, b["error"]["code"]), (404, "sandbox_not_found"), b)

        # The audit log sums the log up: every 4 s (this daemon's flag) and when it ends, the
        # summaries together count every entry once. A periodic one covers what came so far...
        def summaries():
            s, b = c.call("GET", f"/v1/sandboxes/{sid}/events")
            self.assertEqual(s, 200, b)
            return b["events"]

        def ask_once_more():
            s, b = c.exec(sid, "getent hosts other.test")
            self.assertEqual((s, b.get("exit_code")), (200, 2), b)

        def count():
            return len([e for e in summaries() if e["type"] == "egress-summary"])

        # ... and the last period's is recorded as the VM goes: right after a periodic one (the
        # next is 4 s away) the sandbox asks for a name once more and is deleted.
        seen = count()
        ask_once_more()
        deadline = time.time() + 30
        while time.time() < deadline and count() == seen:
            time.sleep(0.05)
        self.assertGreater(count(), seen, "a periodic summary")
        ask_once_more()
        log = self.egress(sid, "?limit=1000")["entries"]
        for x in (sid, plain):
            c.call("DELETE", f"/v1/sandboxes/{x}")
        deadline, events = time.time() + 30, []
        while time.time() < deadline:
            events = summaries()
            types = [e["type"] for e in events]
            if "killed" in types and "egress-summary" in types[types.index("killed"):]:
                break
            time.sleep(0.2)
        types = [e["type"] for e in events]
        self.assertIn("killed", types, events)
        self.assertIn("egress-summary", types[types.index("killed"):],
                      f"the last period's summary: {events}")
        sums = [e["event"] for e in events if e["type"] == "egress-summary"]
        self.assertGreaterEqual(len(sums), 2, events)

        def total(kind, verdict):
            return sum(x[kind][verdict] for x in sums)

        for kind, key in (("dns", "dns"), ("connection", "connections")):
            for verdict in ("allowed", "denied"):
                want = len([e for e in log if e["kind"] == kind and e["verdict"] == verdict])
                self.assertEqual(total(key, verdict), want, (kind, verdict, sums))
        self.assertGreater(sum(x["bytes_in"] for x in sums), received)
        names = {d["name"] for x in sums for d in x["destinations"]}
        self.assertTrue({"allowed.test", "other.test", "169.254.169.254"} <= names, sums)
        for x in sums:
            self.assertLessEqual(x["from_ms"], x["to_ms"])
        # A sandbox without a network has none.
        s, b = c.call("GET", f"/v1/sandboxes/{plain}/events")
        self.assertNotIn("egress-summary", [e["type"] for e in b["events"]])

    def upstream_saw(self, tag):
        """What the upstream's HTTPS servers received on paths of `tag`."""
        try:
            with open(self.https_log) as f:
                return [j for j in map(json.loads, f) if j["path"].startswith(f"/{tag}/")]
        except FileNotFoundError:
            return []

    def probe_secret(self, sid, tag, token=None):
        """SECRET_PROBE on paths of `tag`; with `token`, that instead of TOKEN's placeholder."""
        code = SECRET_PROBE.replace("TAG", tag)
        if token is not None:
            code = code.replace('os.environ.get("TOKEN", "")', repr(token))
        return self.run_py(sid, code)

    def auth_seen(self, tag, what="s"):
        """The Authorization header the upstream received on path /TAG/WHAT (None: no request)."""
        got = [j["auth"] for j in self.upstream_saw(tag) if j["path"] == f"/{tag}/{what}"]
        self.assertLessEqual(len(got), 1, got)
        return got[0] if got else None

    def test_secrets_reach_their_hosts_only_through_the_proxy(self):
        c = self.api
        s, b = c.call("POST", "/v1/secrets", {"name": "TOKEN", "value": SECRET_VALUE,
                                              "hosts": ["api.secret.test"]})
        self.assertEqual(s, 201, b)
        self.addCleanup(lambda: self.api.call("DELETE", "/v1/secrets/TOKEN"))
        # Refused: an unknown secret, a sandbox without a network (nothing made).
        s, b = c.call("POST", "/v1/sandboxes", {"secrets": ["NOPE"]})
        self.assertEqual((s, b["error"]["code"]), (404, "secret_not_found"), b)
        s, b = c.call("POST", "/v1/sandboxes", {"secrets": ["TOKEN"], "network": False})
        self.assertEqual((s, b["error"]["code"]), (400, "invalid_argument"), b)
        # other.test is allowed by the policy; the secret's host is added to it.
        sid = c.create(secrets=["TOKEN"],
                       egress={"mode": "allowlist", "domains": ["other.test"]})["id"]
        info = c.call("GET", f"/v1/sandboxes/{sid}")[1]
        self.assertEqual(sorted(info["egress"]["domains"]), ["api.secret.test", "other.test"])

        out = self.probe_secret(sid, "a")
        tok = out["token"]
        self.assertTrue(tok.startswith("pds_secret_") and len(tok) == 43, out)
        # The secret's host got the value (over TLS, checked against the test's CA); another
        # host got the placeholder; plain HTTP was refused by the proxy and never sent.
        self.assertEqual(out["secret_host"].get("status"), 200, out)
        self.assertEqual(self.auth_seen("a"), "Bearer " + SECRET_VALUE)
        self.assertEqual(out["other_host"].get("status"), 200, out)
        self.assertEqual(self.auth_seen("a", "o"), "Bearer " + tok)
        self.assertEqual(out["plain"].get("status"), 403, out)
        seen = self.upstream_saw("a")
        self.assertEqual(sorted((j["host"], j["auth"]) for j in seen),
                         [("api.secret.test", "Bearer " + SECRET_VALUE),
                          ("other.test", "Bearer " + tok)], seen)
        # The value is nowhere in the guest: its processes' environments, its files.
        # (a pattern that matches the value but not itself: grep's own command line never matches)
        find = f"'{SECRET_VALUE[:-1]}[{SECRET_VALUE[-1]}]'"
        s, b = c.exec(sid, f"cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | "
                           f"tr '\\0' '\\n' | grep -c {find}; grep -rl {find} /etc /root /tmp "
                           f"/home /usr/local /var 2>/dev/null | wc -l")
        self.assertEqual(s, 200, b)
        self.assertEqual(b["stdout"].split(), ["0", "0"], b)

        # The egress log: each use of the placeholder, with what was put in.
        uses = self.egress(sid, "?kind=secret")["entries"]
        by_host = {(e["name"], e["protocol"]): e for e in uses}
        ok = by_host[("api.secret.test", "https")]
        self.assertEqual((ok["verdict"], ok["injected"], ok["destination"], ok["port"]),
                         ("allowed", ["TOKEN"], "198.18.9.2", 443), ok)
        other = by_host[("other.test", "https")]
        self.assertEqual((other["verdict"], other["reason"], other["refused"]),
                         ("denied", "not_secret_host", ["TOKEN"]), other)
        plain = by_host[("api.secret.test", "http")]
        self.assertEqual((plain["verdict"], plain["reason"]), ("denied", "plain_http"), plain)
        self.assertNotIn(SECRET_VALUE, json.dumps(self.egress(sid, "?limit=1000")))

        # Rotation shows at the next request.
        rotated = SECRET_VALUE + "-v2"
        self.assertEqual(c.call("PATCH", "/v1/secrets/TOKEN", {"value": rotated})[0], 200)
        out = self.probe_secret(sid, "b")
        self.assertEqual(out["secret_host"].get("status"), 200, out)
        self.assertEqual(self.auth_seen("b"), "Bearer " + rotated)

        # Forks: a child that inherits gets the value put in; one that does not holds a
        # placeholder nothing replaces (its connection is not proxied: the upstream's CA is not
        # one its guest trusts, so nothing is sent at all).
        s, kids = c.call("POST", f"/v1/sandboxes/{sid}/fork", {"inherit_secrets": True})
        self.assertEqual(s, 201, kids)
        heir = kids["sandboxes"][0]["id"]
        out = self.probe_secret(heir, "c")
        self.assertEqual(out["token"], tok, out)
        self.assertEqual(out["secret_host"].get("status"), 200, out)
        self.assertEqual(self.auth_seen("c"), "Bearer " + rotated)
        s, kids = c.call("POST", f"/v1/sandboxes/{sid}/fork", {})
        self.assertEqual(s, 201, kids)
        plain_child = kids["sandboxes"][0]["id"]
        out = self.probe_secret(plain_child, "d")
        self.assertIn("error", out["secret_host"], out)
        self.assertIsNone(self.auth_seen("d"))
        s, b = c.call("POST", f"/v1/sandboxes/{sid}/fork",
                      {"inherit_secrets": True, "hosts": ["elsewhere"]})
        self.assertEqual((s, b["error"]["code"]), (501, "not_implemented"), b)

        # Hibernate and wake: the proxy comes back with the new VM (nothing of the secret was in
        # the hibernation).
        # (a process that holds the placeholder in its environment while it sleeps)
        s, b = c.call("POST", f"/v1/sandboxes/{sid}/processes", {"cmd": "exec sleep 600"})
        self.assertIn(s, (200, 201), b)
        self.assertEqual(c.call("POST", f"/v1/sandboxes/{sid}/hibernate", {})[0], 200)
        # Its hibernation (the guest's whole memory and device state) holds the placeholder,
        # never a value.
        folder = os.path.join(self.base, "state", "hibernated", sid)
        files = [os.path.join(folder, f) for f in os.listdir(folder)]
        found, searched = {"placeholder": False, "value": False}, 0
        for path in files:
            if os.path.isfile(path):
                searched += os.path.getsize(path)
                with open(path, "rb") as f:
                    data = f.read()
                found["placeholder"] |= tok.encode() in data
                found["value"] |= SECRET_VALUE.encode() in data
        self.assertGreater(searched, 64 << 20, files)  # (the guest's RAM is in it)
        self.assertEqual(found, {"placeholder": True, "value": False}, files)
        self.assertEqual(c.call("POST", f"/v1/sandboxes/{sid}/wake", {})[0], 200)
        out = self.probe_secret(sid, "e")
        self.assertEqual(out["secret_host"].get("status"), 200, out)
        self.assertEqual(self.auth_seen("e"), "Bearer " + rotated)
        # The daemon killed: the VM outlives it, and the new daemon adopts it with a proxy again.
        self.daemon.stop(signal.SIGKILL)
        type(self).daemon = Daemon(os.path.join(self.base, "data"),
                                   os.path.join(self.base, "state"), self.flags)
        c = type(self).api = Api(self.daemon)
        out = self.probe_secret(sid, "g")
        self.assertEqual(out["secret_host"].get("status"), 200, out)
        self.assertEqual(self.auth_seen("g"), "Bearer " + rotated)

        # Never a template of its own.
        s, b = c.call("POST", f"/v1/sandboxes/{sid}/template", {"name": "with-secrets"})
        self.assertEqual((s, b["error"]["code"]), (400, "invalid_argument"), b)

        # Expired (its TTL): its placeholder goes out as it is.
        self.assertEqual(c.call("PATCH", "/v1/secrets/TOKEN", {"ttl_seconds": 1})[0], 200)
        time.sleep(1.5)
        self.assertEqual(c.call("GET", "/v1/secrets/TOKEN")[0], 404)
        out = self.probe_secret(sid, "f")
        self.assertEqual(out["secret_host"].get("status"), 200, out)
        self.assertEqual(self.auth_seen("f"), "Bearer " + tok)
        for x in (sid, heir, plain_child):
            c.call("DELETE", f"/v1/sandboxes/{x}")

    def e2b(self, method, path, body=None):
        """A call of E2B's control plane (X-API-KEY, as the e2b SDK sends it)."""
        return self.api.call(method, path, body, headers={"X-API-KEY": self.daemon.key}, key="")

    def test_e2b_network_rules_put_secrets_into_headers(self):
        c = self.api
        value = "sk-e2b-VALUE-7a6b5c4d"
        s, b = self.e2b("POST", "/secrets", {"name": "openai-key", "value": value})
        self.assertEqual(s, 201, b)
        self.addCleanup(lambda: self.e2b("DELETE", "/secrets/openai-key"))
        marker = "Bearer ${e2b.secrets.openai-key}"

        def rules(host, header="Authorization", v=marker):
            return {host: [{"transform": {"headers": {header: v}}}]}
        # Refused, nothing made: an unknown secret, a bare "*" or a reserved header (400; never
        # 404, which E2B's SDK reads as "sandbox not found"), workload identity tokens (501).
        before = len(c.call("GET", "/v1/sandboxes")[1]["sandboxes"])
        for net, status in ((rules("api.secret.test", v="${e2b.secrets.nope}"), 400),
                            (rules("*"), 400), (rules("api.secret.test", "Host"), 400),
                            (rules("a.test", v="${e2b.identity.tokens.aws}"), 501)):
            s, b = self.e2b("POST", "/sandboxes", {"templateID": "base", "network": {"rules": net}})
            self.assertEqual(s, status, (net, b))
        self.assertEqual(len(c.call("GET", "/v1/sandboxes")[1]["sandboxes"]), before)

        s, b = self.e2b("POST", "/sandboxes", {"templateID": "base", "allow_internet_access": True,
                                               "network": {"rules": rules("API.secret.test")}})
        self.assertEqual(s, 201, b)
        sid = b["sandboxID"]
        # The rule's host gets the header over HTTPS, the guest's own replaced; another host and
        # plain HTTP get what the guest sent.
        out = self.probe_secret(sid, "r", "guest-own")
        self.assertEqual(out["token"], "guest-own", out)  # (what the guest sends itself)
        self.assertEqual(out["secret_host"].get("status"), 200, out)
        self.assertEqual(self.auth_seen("r"), "Bearer " + value)
        self.assertEqual(out["other_host"].get("status"), 200, out)
        self.assertEqual(self.auth_seen("r", "o"), "Bearer guest-own")
        self.assertEqual(out["plain"].get("status"), 200, out)
        self.assertEqual(self.auth_seen("r", "p"), "Bearer guest-own")
        uses = self.egress(sid, "?kind=secret")["entries"]
        by_host = {(e["name"], e["protocol"]): e for e in uses}
        ok = by_host[("api.secret.test", "https")]
        self.assertEqual((ok["verdict"], ok["injected"]), ("allowed", ["openai-key"]), ok)
        plain = by_host[("api.secret.test", "http")]
        self.assertEqual((plain["verdict"], plain["reason"], plain["refused"]),
                         ("denied", "plain_http", ["openai-key"]), plain)
        self.assertNotIn(value, json.dumps(self.egress(sid, "?limit=1000")))
        # Rotated through E2B's API: the next request carries the new value.
        rotated = value + "-v2"
        self.assertEqual(self.e2b("POST", "/secrets/openai-key", {"value": rotated})[0], 200)
        out = self.probe_secret(sid, "s", "guest-own")
        self.assertEqual(self.auth_seen("s"), "Bearer " + rotated)
        # updateNetwork replaces the rules: now other.test's, and api.secret.test's no more.
        s, b = self.e2b("PUT", f"/sandboxes/{sid}/network",
                        {"rules": rules("other.test", v="Token ${e2b.secrets.openai-key}")})
        self.assertEqual(s, 204, b)
        out = self.probe_secret(sid, "t", "guest-own")
        self.assertEqual(self.auth_seen("t"), "Bearer guest-own")
        self.assertEqual(self.auth_seen("t", "o"), "Token " + rotated)
        # Deleted: a request the rule needs it for is refused (403), never sent without it.
        self.assertEqual(self.e2b("DELETE", "/secrets/openai-key")[0], 204)
        out = self.probe_secret(sid, "u", "guest-own")
        self.assertEqual(out["other_host"].get("status"), 403, out)
        self.assertIsNone(self.auth_seen("u", "o"))
        self.assertEqual(out["secret_host"].get("status"), 200, out)
        refused = [e for e in self.egress(sid, "?kind=secret")["entries"]
                   if e.get("reason") == "unknown_secret"]
        self.assertEqual(refused[0]["refused"], ["openai-key"], refused)

        # A sandbox made without rules gets them from updateNetwork (its guest trusts its proxy's
        # CA from then on); rules do not open the egress policy.
        s, b = self.e2b("POST", "/secrets", {"name": "openai-key", "value": value})
        self.assertEqual(s, 201, b)
        net = {"allowOut": ["other.test"], "denyOut": ["0.0.0.0/0"]}
        s, b = self.e2b("POST", "/sandboxes", {"templateID": "base", "network": net})
        self.assertEqual(s, 201, b)
        late = b["sandboxID"]
        s, b = self.e2b("PUT", f"/sandboxes/{late}/network",
                        {**net, "rules": {**rules("other.test"), **rules("api.secret.test")}})
        self.assertEqual(s, 204, b)
        out = self.probe_secret(late, "v", "guest-own")
        self.assertEqual(out["other_host"].get("status"), 200, out)
        self.assertEqual(self.auth_seen("v", "o"), "Bearer " + value)
        self.assertIn("error", out["secret_host"], out)  # (not allowed: no connection)
        self.assertIsNone(self.auth_seen("v"))
        for x in (sid, late):
            self.assertEqual(self.e2b("DELETE", f"/sandboxes/{x}")[0], 204)

    def test_secrets_opted_into_queries_bodies_and_plain_http(self):
        c = self.api
        for name in ("KEY", "TOKEN"):
            self.addCleanup(lambda n=name: self.api.call("DELETE", f"/v1/secrets/{n}"))
        value = "key-VALUE-0123456789"
        s, b = c.call("POST", "/v1/secrets", {"name": "KEY", "value": value,
                                              "hosts": ["api.secret.test"],
                                              "inject_into": ["headers", "query", "body"],
                                              "allow_plain_http": True})
        self.assertEqual(s, 201, b)
        self.assertEqual((b["inject_into"], b["allow_plain_http"]),
                         (["headers", "query", "body"], True), b)
        s, b = c.call("POST", "/v1/secrets", {"name": "TOKEN", "value": SECRET_VALUE,
                                              "hosts": ["api.secret.test"]})
        self.assertIn(s, (201, 409), b)
        self.assertEqual(c.call("PATCH", "/v1/secrets/TOKEN", {"value": SECRET_VALUE})[0], 200)
        for bad in ({"inject_into": ["cookies"]}, {"inject_into": []},
                    {"allow_plain_http": "yes"}):
            s, b = c.call("POST", "/v1/secrets", {"name": "BAD", "value": "x",
                                                  "hosts": ["a.test"], **bad})
            self.assertEqual((s, b["error"]["code"]), (400, "invalid_argument"), (bad, b))
        sid = c.create(secrets=["KEY", "TOKEN"])["id"]
        out = self.run_py(sid, OPT_IN_PROBE)
        self.assertEqual((out["query"], out["body"], out["plain"]), (200, 200, 200), out)
        # A body the proxy would have to hold beyond its bound is refused (413, answered before
        # the upload ends: the client may see the connection close instead), never sent cut.
        self.assertTrue(out["big"] == 413 or "EOF" in str(out["big"]), out)
        seen = {j["path"].split("?")[0]: j for j in self.upstream_saw("o")}
        self.assertEqual(seen["/o/q"]["path"], f"/o/q?key={value}&t={out['tok']}", seen)
        self.assertEqual(seen["/o/b"]["body"], f"token={value}&t={out['tok']}", seen)
        self.assertEqual(seen["/o/p"]["auth"], "Bearer " + value, seen)
        self.assertNotIn("/o/big", seen)
        uses = self.egress(sid, "?kind=secret")["entries"]
        plain = [e for e in uses if e["protocol"] == "http"]
        self.assertEqual((plain[0]["verdict"], plain[0]["injected"]), ("allowed", ["KEY"]), uses)
        c.call("DELETE", f"/v1/sandboxes/{sid}")

    def test_a_query_flood_is_refused_past_the_rate(self):
        c = self.api
        sid = c.create(egress={"mode": "allowlist", "domains": ["*.flood.test"]})["id"]
        out = self.run_py(sid, FLOOD)
        codes, elapsed = out["codes"], out["elapsed"]
        # 200 at once (the burst), then 50 a second: of 1,000 sent as fast as the guest can, some
        # are REFUSED (5), and no more are answered than the bucket allows over the sending time
        # (+ the time the last answers took). The guest's pace varies (TCG, ASan): the bound
        # follows it.
        self.assertGreater(codes.get("5", 0), 0, out)
        self.assertGreaterEqual(codes.get("0", 0), 150, out)
        self.assertLessEqual(codes.get("0", 0), 200 + 50 * (elapsed + 5), out)
        denied = self.egress(sid, "?kind=dns&verdict=denied&limit=1000")["entries"]
        limited = [e for e in denied if e["reason"] == "rate_limit"]
        # A flood is logged as one entry a second, not one per query.
        self.assertTrue(limited, denied)
        self.assertLessEqual(len(limited), elapsed + 5, limited)
        c.call("DELETE", f"/v1/sandboxes/{sid}")

    def test_z_distinct_names_are_capped(self):
        # (last: it restarts the daemon with a cap of 20 distinct names per sandbox VM)
        self.daemon.stop(reap=True)
        type(self).daemon = Daemon(os.path.join(self.base, "data"), os.path.join(self.base, "state"),
                                   ["--dns-upstream", "198.18.9.2:53", "--allow-private-egress",
                                    "198.18.9.0/24", "--dns-max-names", "20"])
        c = type(self).api = Api(self.daemon)
        sid = c.create(egress={"mode": "allowlist", "domains": ["*.flood.test"]})["id"]
        # 30 distinct names (below the rate's burst), then the first again: 21 answered.
        codes = self.run_py(sid, FLOOD.replace("N, AGAIN = 1000, False", "N, AGAIN = 30, True"))["codes"]
        self.assertEqual(codes, {"0": 21, "5": 10}, codes)
        denied = self.egress(sid, "?kind=dns&verdict=denied")["entries"]
        self.assertEqual(sorted(e["name"] for e in denied),
                         sorted(f"n{i}.flood.test" for i in range(20, 30)), denied)
        self.assertEqual({e["reason"] for e in denied}, {"unique_names"})
        c.call("DELETE", f"/v1/sandboxes/{sid}")


if __name__ == "__main__":
    harness.main()
