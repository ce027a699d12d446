"""The test harness of the API suites: a real pandastackd on loopback (Daemon), a small HTTP and
SSE client (Api), a WebSocket client, and helpers. Python's standard library only; traffic goes
only to the daemon on 127.0.0.1."""
import base64
import glob
import hashlib
import http.client
import json
import os
import signal
import sys
import socket
import subprocess
import time
import urllib.parse

# Set by the suite's main: .daemon, .cli, .images (absolute).
ARGS = None


class Daemon:
    """A pandastackd process on a free loopback port with its own data and state folders."""

    def __init__(self, data, state, extra=(), images=None, defaults=False):
        """`state` None: the daemon's default state folder (printed at start, in self.state).
        `defaults`: only the flags that keep it apart from other daemons on this host (data
        folder, ports, network prefix and pool, no DNS upstream), nothing else."""
        self.data, self.state = data, state
        cmd = [ARGS.daemon, "--data", data, "--images", images or ARGS.images,
               *(["--state-dir", state] if state else []),
               "--listen", "127.0.0.1:0", "--rpc-listen", "127.0.0.1:0",
               *([] if defaults else ["--accel", "tcg"]),
               *Daemon.network_flags(data), *extra]
        os.makedirs(data, exist_ok=True)
        self.log = open(os.path.join(data, "daemon.log"), "ab")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.url = self.key = None
        deadline = time.time() + 60
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.strip().startswith("URL:"):
                self.url = line.split()[1]
            if line.strip().startswith("State:"):
                self.state = line.split()[1]
            if line.strip().startswith("API key:"):
                self.key = line.split()[2]
            if line.strip().startswith("(key file"):
                break
        if not self.url:
            raise RuntimeError("daemon did not start; see " + os.path.join(data, "daemon.log"))
        if not self.key.startswith("pds_"):
            # (a cluster's later hosts have none: the first host's key serves everywhere)
            path = os.path.join(data, "api-key")
            self.key = None
            if os.path.exists(path):
                with open(path) as f:
                    self.key = f.read().strip()
        u = urllib.parse.urlparse(self.url)
        self.host, self.port = u.hostname, u.port

    @staticmethod
    def network_flags(data):
        """A network prefix and subnet pool of this data folder's own (stable across restarts), so
        test daemons never touch another daemon's sandbox networks."""
        h = int(hashlib.sha256(os.path.abspath(data).encode()).hexdigest(), 16)
        prefix = "pt" + "".join("abcdefghijklmnopqrstuvwxyz"[(h >> (5 * i)) % 26] for i in range(3))
        pool = "10.%d.%d.0/22" % (210 + (h >> 20) % 40, 4 * ((h >> 30) % 64))
        # No resolver upstream unless a test names its own: guests never make the host send DNS
        # queries anywhere.
        return ["--network-prefix", prefix, "--subnet-pool", pool, "--dns-upstream", "off"]

    def stop(self, sig=signal.SIGTERM, timeout=120, reap=False):
        """Stops the daemon. Its sandboxes' QEMUs outlive it by design (a restarted daemon adopts
        them); `reap` (a suite's end) kills those of this daemon's folders too, so a test that
        failed half-way leaves no VM running on the machine."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout)
        if reap:
            reap_vms(*[f for f in (self.state, self.data) if f])
        self.log.close()
        self.proc.stdout.close()
        code = self.proc.returncode
        if code not in (0, -sig, -signal.SIGKILL):
            # Why it died (a sanitizer's report, an exception) goes with the test's output.
            with open(os.path.join(self.data, "daemon.log"), "rb") as f:
                tail = f.read()[-12000:].decode(errors="replace")
            sys.stderr.write(f"--- daemon exited {code}; the end of its log:\n{tail}\n---\n")
        return code


class LogOnFailure:
    """Mixed into a TestCase whose class has a `daemon`: when one of its tests fails, the end of
    the daemon's log goes to stderr with the failure (CI keeps no data folder to look in)."""

    def run(self, result=None):
        before = len(result.failures) + len(result.errors) if result is not None else 0
        out = super().run(result)
        daemon = getattr(self, "daemon", None)
        if result is not None and daemon is not None and \
                len(result.failures) + len(result.errors) > before:
            try:
                with open(os.path.join(daemon.data, "daemon.log"), "rb") as f:
                    tail = f.read()[-8000:].decode(errors="replace")
                sys.stderr.write(f"--- {self.id()} failed; the end of the daemon's log:\n{tail}\n---\n")
            except OSError:
                pass
        return out


def qemu_pid(state, sid):
    """The pid of the QEMU running sandbox `sid` of the daemon whose state folder is `state`
    (from its live record), or None."""
    for f in glob.glob(os.path.join(state, "run", "*", "vm.json")):
        with open(f) as fh:
            r = json.load(fh)
        if r["name"].startswith(sid):
            return r["pid"]
    return None


def qemu_processes(*folders):
    """{pid: argv} of every QEMU whose command line names one of `folders`."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if not args or "qemu-system" not in os.path.basename(args[0]):
            continue
        if any(os.path.abspath(d) in a for d in folders for a in args):
            out[int(pid)] = args
    return out


def reap_vms(*folders):
    """Kills (SIGKILL) every QEMU whose command line names one of `folders`; returns how many."""
    killed = 0
    for pid in qemu_processes(*folders):
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            pass
    return killed


class Api:
    def __init__(self, daemon, key=None):
        self.d, self.key = daemon, key if key is not None else daemon.key

    def conn(self, timeout=300):
        return http.client.HTTPConnection(self.d.host, self.d.port, timeout=timeout)

    def call(self, method, path, body=None, raw=None, headers=None, key=None):
        c = self.conn()
        h = dict(headers or {})
        k = self.key if key is None else key
        if k:
            h["Authorization"] = "Bearer " + k
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        payload = r.read()
        c.close()
        ctype = r.getheader("Content-Type", "")
        if ctype.startswith("application/json") and payload:
            return r.status, json.loads(payload)
        return r.status, payload

    def create(self, **kw):
        s, b = self.call("POST", "/v1/sandboxes", kw)
        assert s == 201, (s, b)
        return b

    def exec(self, sid, cmd, **kw):
        return self.call("POST", f"/v1/sandboxes/{sid}/exec", dict(cmd=cmd, **kw))

    def sse(self, path, body=None, timeout=120):
        """Yields (event, data) pairs as they arrive; the connection is in self.last_conn."""
        c = self.conn(timeout)
        self.last_conn = c
        c.request("POST" if body is not None else "GET", path,
                  body=json.dumps(body) if body is not None else None,
                  headers={"Authorization": "Bearer " + self.key})
        r = c.getresponse()
        if r.status != 200:
            raise AssertionError((r.status, r.read()))
        event = None
        try:
            while True:
                line = r.fp.readline()
                if not line:
                    return
                line = line.decode().rstrip("\n")
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    yield event, json.loads(line[6:])
        finally:
            r.close()
            c.close()


class WebSocket:
    """A minimal RFC 6455 client (text/binary/close; unfragmented frames) for the exec socket."""

    def __init__(self, daemon, path, key, host="x", headers=None):
        """`key` None: no Authorization header; `headers`: more of them (a Cookie...)."""
        self.sock = socket.create_connection((daemon.host, daemon.port), timeout=60)
        nonce = base64.b64encode(os.urandom(16)).decode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        if key:
            extra += f"Authorization: Bearer {key}\r\n"
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {nonce}\r\n"
                           f"Sec-WebSocket-Version: 13\r\n{extra}\r\n").encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self.buf += self.sock.recv(4096)
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        self.status = int(head.split(b" ")[1])
        self.body = None
        if self.status != 101:
            length = int([l.split(b":")[1] for l in head.split(b"\r\n")
                          if l.lower().startswith(b"content-length")][0])
            while len(self.buf) < length:
                self.buf += self.sock.recv(4096)
            self.body = json.loads(self.buf[:length])

    def _send(self, opcode, payload):
        mask = os.urandom(4)
        n = len(payload)
        head = bytes([0x80 | opcode])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + n.to_bytes(2, "big")
        else:
            head += bytes([0x80 | 127]) + n.to_bytes(8, "big")
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def send_json(self, obj):
        self._send(1, json.dumps(obj).encode())

    def send_binary(self, data):
        self._send(2, data)

    def close(self):
        self._send(8, (1000).to_bytes(2, "big"))

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def send_text(self, text):
        self._send(1, text.encode())

    def recv_raw(self):
        """(opcode, payload bytes)."""
        b0, b1 = self._read(2)
        n = b1 & 0x7F
        if n == 126:
            n = int.from_bytes(self._read(2), "big")
        elif n == 127:
            n = int.from_bytes(self._read(8), "big")
        return b0 & 0x0F, self._read(n)

    def recv(self):
        """(opcode, payload); text payloads are decoded JSON."""
        opcode, payload = self.recv_raw()
        return opcode, json.loads(payload) if opcode == 1 else payload


def guest_has_process(api, sid, marker):
    # "[s]leep.301" matches the process's "sleep 301" but not this command line itself.
    pattern = "[" + marker[0] + "]" + marker[1:]
    s, b = api.exec(sid, f"cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c '{pattern}'")
    assert s == 200, b
    return int(b["stdout"].strip() or 0) > 0


def main():
    """The main of a suite that takes --daemon and --images: sets ARGS, runs unittest with the
    remaining arguments."""
    import argparse
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    p.add_argument("--images", default=os.environ.get("PANDASTACK_IMAGES", "var/images"))
    args, rest = p.parse_known_args()
    args.images = os.path.abspath(args.images)
    ARGS = args
    run_unittests(rest)


def run_unittests(rest):
    """Runs the __main__ module's cases (unittest arguments `rest`) under the per-case watchdog
    (watchdog.py)."""
    import unittest
    import watchdog
    watchdog.install()
    unittest.main(module="__main__", argv=[sys.argv[0], *rest], verbosity=2)


def rss_mib(pid):
    """A process's resident memory in MiB (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0
