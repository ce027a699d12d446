#!/usr/bin/env python3
"""API tests against the real daemon binary: real HTTP, real VMs (TCG here), real RocksDB.

Usage: api_test.py --daemon build/bin/pandastackd [--images var/images] [unittest args]
Traffic goes only to the daemon on 127.0.0.1.
"""
import argparse
import base64
import fcntl
import hashlib
import http.client
import json
import os
import pty
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
import unittest
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Api, Daemon, WebSocket, guest_has_process  # noqa: E402,F401
from upstream import Upstream  # noqa: E402


class _Args:
    """harness.ARGS, read when used (main sets it after import)."""

    def __getattr__(self, name):
        return getattr(harness.ARGS, name)


ARGS = _Args()


class ApiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.base = tempfile.mkdtemp(prefix="pst-api-", dir="/dev/shm")
        cls.daemon = Daemon(os.path.join(cls.base, "data"), os.path.join(cls.base, "state"),
                            ["--max-concurrent-execs", "3", "--metrics-interval-ms", "300"])
        try:
            cls.api = Api(cls.daemon)
            cls.sbx = cls.api.create(template="base", metadata={"team": "red"})
        except BaseException:
            # tearDownClass does not run when setUpClass fails: never leave the daemon running.
            cls.daemon.stop()
            shutil.rmtree(cls.base, ignore_errors=True)
            raise

    @classmethod
    def tearDownClass(cls):
        code = cls.daemon.stop(reap=True)
        shutil.rmtree(cls.base, ignore_errors=True)
        assert code == 0, f"daemon exited {code}"

    def sid(self):
        return self.sbx["id"]

    def assertError(self, result, status, code):
        s, b = result
        self.assertEqual(s, status, b)
        self.assertIsInstance(b, dict, b)
        self.assertEqual(b["error"]["code"], code, b)
        self.assertTrue(b["error"]["message"])

    # -- basics ---------------------------------------------------------------------------------

    def test_metrics_over_time(self):
        """CPU, memory and disk of a running sandbox, sampled every 300 ms here: real figures
        (a CPU-bound command shows; written data shows on its disk), bounded by a time range,
        and reading them is not a use of the sandbox."""
        c = self.api
        sbx = c.create(template="base")["id"]
        try:
            c.exec(sbx, "dd if=/dev/urandom of=/root/blob bs=1M count=8 2>/dev/null; sync; "
                        "timeout 2 sh -c 'while :; do :; done'; true")
            time.sleep(1)
            s, b = c.call("GET", f"/v1/sandboxes/{sbx}/metrics")
            self.assertEqual(s, 200, b)
            m = b["metrics"]
            self.assertGreaterEqual(len(m), 3, m)
            ts = [x["timestamp_ms"] for x in m]
            self.assertEqual(ts, sorted(ts))
            last = m[-1]
            self.assertEqual((last["cpu_count"], last["mem_total_bytes"]), (1, 256 << 20))
            self.assertGreater(last["mem_used_bytes"], 16 << 20)
            self.assertGreater(last["disk_used_bytes"], 8 << 20)
            self.assertGreater(last["disk_total_bytes"], last["disk_used_bytes"])
            self.assertGreater(max(x["cpu_used_pct"] for x in m), 50, m)  # the busy loop
            self.assertTrue(all(0 <= x["cpu_used_pct"] <= 100 for x in m))
            s, b = c.call("GET", f"/v1/sandboxes/{sbx}/metrics?from_ms={ts[-1]}")
            self.assertEqual([x["timestamp_ms"] for x in b["metrics"]][:1], [ts[-1]])
            s, b = c.call("GET", f"/v1/sandboxes/{sbx}/metrics?to_ms=1")
            self.assertEqual(b["metrics"], [])
            self.assertError(c.call("GET", f"/v1/sandboxes/{sbx}/metrics?from_ms=x"), 400,
                             "invalid_argument")
            self.assertError(c.call("GET", "/v1/sandboxes/sbx_nosuchsandbox00/metrics"), 404,
                             "sandbox_not_found")
            # Sampling is not use: an idle sandbox still reaches its idle timeout.
            s, b = c.call("POST", "/v1/sandboxes", {"idle_timeout_seconds": 2,
                                                    "on_timeout": "hibernate"})
            self.assertEqual(s, 201, b)
            idle = b["id"]
            deadline = time.time() + 30
            while c.call("GET", f"/v1/sandboxes/{idle}")[1]["state"] != "hibernated":
                self.assertLess(time.time(), deadline, "sampled into never being idle")
                time.sleep(0.3)
            c.call("DELETE", f"/v1/sandboxes/{idle}")
        finally:
            c.call("DELETE", f"/v1/sandboxes/{sbx}")

    def test_health_metrics_and_templates(self):
        self.assertEqual(self.api.call("GET", "/healthz", key=""), (200, {"status": "ok"}))
        s, b = self.api.call("GET", "/v1/templates")
        self.assertEqual(s, 200)
        self.assertIn("base", [t["name"] for t in b["templates"]])
        s, text = self.api.call("GET", "/metrics", key="")
        self.assertEqual(s, 200)
        text = text.decode()
        self.assertIn("pandastack_creates_total", text)
        self.assertIn('pandastack_sandboxes{state="running"}', text)
        self.assertIn("pandastack_create_seconds_bucket", text)

    def test_openapi_matches_served_routes(self):
        s, doc = self.api.call("GET", "/openapi.json", key="")
        self.assertEqual(s, 200)
        self.assertEqual(doc["openapi"][:2], "3.")
        self.assertIn("sandbox_not_found", doc["components"]["schemas"]["Error"]["properties"]
                      ["error"]["properties"]["code"]["enum"])
        self.assertGreaterEqual(len(doc["paths"]), 25)
        # Every documented operation is served (never route_not_found / method_not_allowed) ...
        for path, item in doc["paths"].items():
            concrete = path.replace("{id}", "sbx_doesnotexist000000").replace("{pid}", "1") \
                           .replace("{key_id}", "nokey")
            for method in item:
                s, b = self.api.call(method.upper(), concrete, key="pds_x")
                if isinstance(b, dict) and "error" in b:
                    self.assertNotIn(b["error"]["code"], ("route_not_found", "method_not_allowed"),
                                     (method, path))
        # ... and what is not documented is not served.
        self.assertError(self.api.call("GET", "/v1/nothing"), 404, "route_not_found")
        self.assertError(self.api.call("PUT", "/v1/sandboxes"), 405, "method_not_allowed")
        self.assertNotIn("/v1/secret", doc["paths"])

    def test_auth(self):
        self.assertError(self.api.call("GET", "/v1/sandboxes", key=""), 401, "unauthorized")
        self.assertError(self.api.call("GET", "/v1/sandboxes", key="pds_nope"), 401, "unauthorized")
        bad = "pds_" + "a" * 12 + "_" + "b" * 40
        self.assertError(self.api.call("GET", "/v1/sandboxes", key=bad), 401, "unauthorized")
        self.assertEqual(self.api.call("GET", "/v1/sandboxes")[0], 200)
        self.assertNotIn(self.daemon.key.split("_")[2],
                         open(os.path.join(self.daemon.data, "daemon.log")).read())

    def test_bad_input_gets_clear_errors_and_the_daemon_stays_healthy(self):
        c = self.api
        self.assertError(c.call("POST", "/v1/sandboxes", raw="{\"template\":"), 400, "invalid_json")
        self.assertError(c.call("POST", "/v1/sandboxes", raw="[1,2]"), 400, "invalid_json")
        self.assertError(c.call("POST", "/v1/sandboxes", {"ttl_seconds": "x"}), 400,
                         "invalid_argument")
        self.assertError(c.call("POST", "/v1/sandboxes", {"metadata": {"a": 1}}), 400,
                         "invalid_argument")
        self.assertError(c.call("POST", "/v1/sandboxes", {"tempalte": "base"}), 400,
                         "invalid_argument")
        self.assertError(c.call("POST", "/v1/sandboxes", {"template": "nope"}), 404,
                         "template_not_found")
        self.assertError(c.call("POST", "/v1/sandboxes", {"template": "../kernel"}), 400,
                         "invalid_argument")
        self.assertError(c.call("POST", "/v1/sandboxes", {"ttl_seconds": 10 ** 9}), 400,
                         "invalid_argument")
        self.assertError(c.call("POST", "/v1/sandboxes", {"from_snapshot": "snap_nope"}), 404,
                         "snapshot_not_found")
        self.assertIn("body_too_large", self.raw_head("POST", "/v1/sandboxes", (1 << 20) + 1))
        sid = self.sid()
        self.assertError(c.exec(sid, "x" * (70 << 10)), 413, "body_too_large")
        self.assertError(c.call("POST", f"/v1/sandboxes/{sid}/exec", {}), 400, "invalid_argument")
        self.assertError(c.call("POST", f"/v1/sandboxes/{sid}/exec", {"cmd": "true", "argv": ["x"]}),
                         400, "invalid_argument")
        self.assertError(c.exec(sid, "true", timeout_seconds=0), 400, "invalid_argument")
        self.assertError(c.call("GET", "/v1/sandboxes?state=sleepy"), 400, "invalid_argument")
        # A file larger than the limit is refused from its Content-Length, before any upload.
        self.assertIn("file_too_large",
                      self.raw_head("PUT", f"/v1/sandboxes/{sid}/files?path=/tmp/big", (64 << 20) + 1))
        # A file in parts (?offset=): appended where the file ends, refused elsewhere (#10).
        f = f"/v1/sandboxes/{sid}/files?path=/tmp/parts"
        self.assertEqual(c.call("PUT", f, raw=b"abc")[0], 200)
        self.assertEqual(c.call("PUT", f + "&offset=3", raw=b"def")[1]["size"], 6)
        self.assertError(c.call("PUT", f + "&offset=3", raw=b"x"), 409, "offset_mismatch")
        self.assertError(c.call("PUT", f + "&offset=-1", raw=b"x"), 400, "invalid_argument")
        self.assertEqual(c.call("GET", f)[1], b"abcdef")
        self.assertEqual(c.call("GET", f + "&offset=2&length=3")[1], b"cde")
        self.assertEqual(c.call("GET", f + "&offset=5&length=100")[1], b"f")
        self.assertError(c.call("GET", f + f"&length={(64 << 20) + 1}"), 400, "invalid_argument")
        # Path traversal and malformed paths.
        for p in ("/tmp/../etc/passwd", "tmp/a", "", "/a/./b", "/" + "a" * 5000):
            self.assertError(c.call("GET", f"/v1/sandboxes/{sid}/files?path=" +
                                    urllib.parse.quote(p)), 400, "invalid_path")
        self.assertError(c.call("GET", f"/v1/sandboxes/{sid}/files"), 400, "invalid_path")
        self.assertError(c.call("GET", "/v1/sandboxes/sbx_nope"), 404, "sandbox_not_found")
        self.assertEqual(c.call("GET", "/healthz", key="")[0], 200)
        self.assertEqual(c.exec(sid, "echo still")[1]["stdout"], "still\n")

    def raw_head(self, method, path, length):
        """Sends only the head of a request announcing `length` body bytes; returns the answer."""
        with socket.create_connection((self.daemon.host, self.daemon.port), timeout=30) as s:
            s.sendall((f"{method} {path} HTTP/1.1\r\nHost: x\r\n"
                       f"Authorization: Bearer {self.api.key}\r\n"
                       f"Content-Length: {length}\r\n\r\n").encode())
            answer = b""
            while b"}}" not in answer:
                chunk = s.recv(4096)
                if not chunk:
                    break
                answer += chunk
            answer = answer.decode()
            self.assertTrue(answer.startswith("HTTP/1.1 413"), answer)
            return answer

    # -- sandboxes ------------------------------------------------------------------------------

    def test_domain_allowlist_needs_a_resolver(self):
        s, b = self.api.call("POST", "/v1/sandboxes", {"egress": {"domains": ["allowed.test"]}})
        self.assertEqual((s, b["error"]["code"]), (501, "not_implemented"), b)

    def test_get_list_patch(self):
        c, sid = self.api, self.sid()
        s, b = c.call("GET", f"/v1/sandboxes/{sid}")
        self.assertEqual((s, b["state"], b["template"]), (200, "running", "base"))
        self.assertTrue(b["id"].startswith("sbx_") and len(b["id"]) == 20)
        ids = lambda q: [x["id"] for x in c.call("GET", "/v1/sandboxes" + q)[1]["sandboxes"]]
        self.assertIn(sid, ids(""))
        self.assertIn(sid, ids("?state=running&metadata.team=red"))
        self.assertNotIn(sid, ids("?metadata.team=blue"))
        self.assertNotIn(sid, ids("?state=hibernated"))
        s, b = c.call("PATCH", f"/v1/sandboxes/{sid}", {"ttl_seconds": 1200,
                                                        "metadata": {"team": "red", "x": "1"}})
        self.assertEqual(s, 200, b)
        self.assertEqual(b["metadata"], {"team": "red", "x": "1"})
        self.assertAlmostEqual(b["expires_at_ms"] - time.time() * 1000, 1200_000, delta=30_000)
        self.assertError(c.call("PATCH", f"/v1/sandboxes/{sid}", {}), 400, "invalid_argument")

    def test_exec(self):
        c, sid = self.api, self.sid()
        s, b = c.exec(sid, "echo out; echo err >&2; exit 3")
        self.assertEqual(s, 200, b)
        self.assertEqual((b["stdout"], b["stderr"], b["exit_code"], b["timed_out"]),
                         ("out\n", "err\n", 3, False))
        self.assertGreater(b["duration_ms"], 0)
        s, b = c.call("POST", f"/v1/sandboxes/{sid}/exec",
                      {"argv": ["sh", "-c", "cat; echo $FOO; pwd"], "stdin": "in\n",
                       "env": {"FOO": "bar"}, "cwd": "/tmp"})
        self.assertEqual(b["stdout"], "in\nbar\n/tmp\n", b)
        s, b = c.exec(sid, "head -c 3 /dev/zero; printf '\\377'")
        self.assertEqual((b["stdout_encoding"], b["stdout"]), ("base64", "AAAA/w=="), b)
        s, b = c.exec(sid, "sleep 10", timeout_seconds=1)
        self.assertTrue(b["timed_out"], b)
        # The caller's mistakes are 4xx with their own codes, the same on every way to run it.
        s, b = c.call("POST", f"/v1/sandboxes/{sid}/exec", {"argv": ["/no/such/binary"]})
        self.assertEqual((s, b["error"]["code"]), (400, "command_not_found"), b)
        s, b = c.call("POST", f"/v1/sandboxes/{sid}/exec", {"cmd": "pwd", "cwd": "/nonexistent"})
        self.assertEqual((s, b["error"]["code"]), (400, "invalid_cwd"), b)
        s, b = c.call("POST", f"/v1/sandboxes/{sid}/processes", {"argv": ["/no/such/binary"]})
        self.assertEqual((s, b["error"]["code"]), (400, "command_not_found"), b)
        # As another account of the guest: every template has `user` (uid 1000, /home/user).
        s, b = c.call("POST", f"/v1/sandboxes/{sid}/exec",
                      {"cmd": "id -un; pwd; echo $HOME; touch /root/x", "user": "user"})
        self.assertEqual((s, b["stdout"], b["exit_code"]), (200, "user\n/home/user\n/home/user\n", 1), b)
        self.assertIn("Permission denied", b["stderr"])
        s, b = c.call("POST", f"/v1/sandboxes/{sid}/processes",
                      {"argv": ["id", "-un"], "user": "nosuchuser"})
        self.assertEqual((s, b["error"]["code"]), (400, "unknown_user"), b)
        s, b = c.call("POST", f"/v1/sandboxes/{sid}/exec", {"cmd": "id", "user": "../root"})
        self.assertEqual((s, b["error"]["code"]), (400, "invalid_argument"), b)
        ws = WebSocket(self.daemon, f"/v1/sandboxes/{sid}/exec/ws", c.key)
        ws.send_json({"cmd": "ls", "cwd": "/nope"})
        op, msg = ws.recv()
        self.assertEqual((msg["type"], msg["code"]), ("error", "invalid_cwd"), msg)
        # Binary stdin (base64), and output with NUL bytes travels as base64, not as \u0000s.
        s, b = c.call("POST", f"/v1/sandboxes/{sid}/exec",
                      {"cmd": "od -An -tx1 | tr -d ' \\n'", "stdin": "//4A",
                       "stdin_encoding": "base64"})
        self.assertEqual((s, b["stdout"]), (200, "fffe00"), b)
        s, b = c.exec(sid, "printf 'a\\000b'")
        self.assertEqual((b["stdout_encoding"], b["stdout"]), ("base64", "YQBi"), b)
        # Nothing mangled silently: NUL in commands, odd env names, both template and snapshot.
        for bad in ({"cmd": "echo a\u0000b"}, {"argv": ["echo", "a\u0000b"]},
                    {"cmd": "true", "env": {"A=B": "z"}}, {"cmd": "true", "env": {"": "z"}},
                    {"cmd": "true", "env": {"A": "a\u0000b"}},
                    {"cmd": "true", "stdin": "!!", "stdin_encoding": "base64"}):
            s, b = c.call("POST", f"/v1/sandboxes/{sid}/exec", bad)
            self.assertEqual((s, b["error"]["code"]), (400, "invalid_argument"), (bad, b))

    def test_concurrent_execs_and_their_limit(self):
        c, sid = self.api, self.sid()
        results = []
        def run():
            results.append(c.exec(sid, "sleep 2; echo done"))
        threads = [threading.Thread(target=run) for _ in range(3)]
        t0 = time.time()
        for t in threads:
            t.start()
        time.sleep(0.8)
        self.assertError(c.exec(sid, "true"), 429, "too_many_execs")  # limit 3 in this daemon
        for t in threads:
            t.join()
        self.assertLess(time.time() - t0, 5.5)  # they ran side by side
        self.assertEqual([r[1]["stdout"] for r in results], ["done\n"] * 3)

    def test_exec_stream_delivers_output_before_the_end(self):
        c, sid = self.api, self.sid()
        t0 = time.time()
        events = []
        for ev, data in c.sse(f"/v1/sandboxes/{sid}/exec/stream",
                              {"cmd": "echo first; sleep 3; echo second >&2; exit 4"}):
            events.append((ev, data, time.time() - t0))
        self.assertEqual(events[0][:2], ("stdout", {"data": "first\n"}))
        self.assertLess(events[0][2], 2.5)  # before the command ended
        self.assertEqual(events[1][:2], ("stderr", {"data": "second\n"}))
        self.assertEqual(events[2][0], "exit")
        self.assertEqual(events[2][1]["exit_code"], 4)
        # Errors before the stream starts are plain JSON errors.
        s, b = c.call("POST", "/v1/sandboxes/sbx_nope/exec/stream", {"cmd": "true"})
        self.assertEqual((s, b["error"]["code"]), (404, "sandbox_not_found"))

    def test_closing_the_stream_kills_the_guest_command(self):
        c, sid = self.api, self.sid()
        gen = c.sse(f"/v1/sandboxes/{sid}/exec/stream", {"cmd": "echo up; exec sleep 301"})
        self.assertEqual(next(gen), ("stdout", {"data": "up\n"}))
        self.assertTrue(guest_has_process(c, sid, "sleep.301"))
        c.last_conn.sock.shutdown(socket.SHUT_RDWR)
        c.last_conn.close()
        deadline = time.time() + 15
        while time.time() < deadline and guest_has_process(c, sid, "sleep.301"):
            time.sleep(0.5)
        self.assertFalse(guest_has_process(c, sid, "sleep.301"))

    def test_websocket_exec_with_stdin(self):
        c, sid = self.api, self.sid()
        ws = WebSocket(self.daemon, f"/v1/sandboxes/{sid}/exec/ws", c.key)
        self.assertEqual(ws.status, 101)
        ws.send_json({"cmd": "while read l; do echo got:$l; done; echo bye >&2; exit 5"})
        op, msg = ws.recv()
        self.assertEqual(msg["type"], "started", msg)
        ws.send_binary(b"one\n")
        op, msg = ws.recv()
        self.assertEqual((msg["type"], msg["data"]), ("stdout", "got:one\n"))
        ws.send_json({"type": "stdin", "data": "two\n"})
        op, msg = ws.recv()
        self.assertEqual(msg["data"], "got:two\n")
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

    def test_websocket_close_kills_the_command_and_errors(self):
        c, sid = self.api, self.sid()
        ws = WebSocket(self.daemon, f"/v1/sandboxes/{sid}/exec/ws", c.key)
        ws.send_json({"cmd": "echo up; exec sleep 304"})
        self.assertEqual(ws.recv()[1]["type"], "started")
        self.assertEqual(ws.recv()[1]["data"], "up\n")
        self.assertTrue(guest_has_process(c, sid, "sleep.304"))
        ws.close()
        ws.sock.close()
        deadline = time.time() + 15
        while time.time() < deadline and guest_has_process(c, sid, "sleep.304"):
            time.sleep(0.3)
        self.assertFalse(guest_has_process(c, sid, "sleep.304"))
        # Refused before the upgrade: a plain JSON error.
        bad = WebSocket(self.daemon, "/v1/sandboxes/sbx_nope/exec/ws", c.key)
        self.assertEqual((bad.status, bad.body["error"]["code"]), (404, "sandbox_not_found"))
        bad = WebSocket(self.daemon, f"/v1/sandboxes/{sid}/exec/ws", "pds_wrong")
        self.assertEqual((bad.status, bad.body["error"]["code"]), (401, "unauthorized"))
        self.assertError(c.call("GET", f"/v1/sandboxes/{sid}/exec/ws"), 400, "invalid_argument")
        # A bad command is an error message, then the socket closes.
        ws = WebSocket(self.daemon, f"/v1/sandboxes/{sid}/exec/ws", c.key)
        ws.send_json({"cmd": "true", "argv": ["x"]})
        op, msg = ws.recv()
        self.assertEqual((msg["type"], msg["code"]), ("error", "invalid_argument"))
        self.assertEqual(ws.recv()[0], 8)
        ws.sock.close()

    def test_terminal_over_websocket(self):
        c, sid = self.api, self.sid()
        ws = WebSocket(self.daemon, f"/v1/sandboxes/{sid}/pty", c.key)
        self.assertEqual(ws.status, 101)
        ws.send_json({"cols": 100, "rows": 30})  # the default: a login shell
        op, msg = ws.recv()
        self.assertEqual(msg["type"], "started", msg)

        def read_until(marker):
            out = b""
            while marker not in out:
                op, p = ws.recv()
                self.assertNotEqual(op, 8, out)
                if op == 2:
                    out += p
                else:
                    self.assertNotIn(p["type"], ("exit", "error"), (p, out))
            return out
        # The terminal echoes what is typed; only the output has the computed marker.
        ws.send_binary(b"tty; stty size; echo mark-$((6*7))\n")
        out = read_until(b"mark-42")
        self.assertIn(b"/dev/pts/", out)
        self.assertIn(b"30 100", out)
        ws.send_json({"type": "resize", "cols": 120, "rows": 40})
        ws.send_json({"type": "stdin", "data": "stty size; echo mark-$((6*8))\n"})
        self.assertIn(b"40 120", read_until(b"mark-48"))
        # Ctrl-C goes through the terminal's line discipline to the foreground command.
        ws.send_binary(b"sleep 305; echo after-$((1+1))\n")
        deadline = time.time() + 15
        while time.time() < deadline and not guest_has_process(c, sid, "sleep.305"):
            time.sleep(0.2)
        ws.send_binary(b"\x03")
        ws.send_binary(b"echo mark-$((7*7))\n")
        out = read_until(b"mark-49")
        self.assertNotIn(b"after-2", out)
        ws.send_binary(b"exit 3\n")
        msgs = []
        while True:
            op, msg = ws.recv()
            if op == 8:
                break
            if op == 1:
                msgs.append(msg)
        self.assertEqual(msgs[-1], {"type": "exit", "exit_code": 3, "timed_out": False})
        ws.sock.close()
        # Bad settings are an error message, then the socket closes.
        ws = WebSocket(self.daemon, f"/v1/sandboxes/{sid}/pty", c.key)
        ws.send_json({"cols": 0})
        op, msg = ws.recv()
        self.assertEqual((msg["type"], msg["code"]), ("error", "invalid_argument"), msg)
        ws.sock.close()

    def test_watch_a_folder(self):
        c, sid = self.api, self.sid()
        base = f"/v1/sandboxes/{sid}/files/watch"
        self.assertEqual(c.exec(sid, "mkdir -p /tmp/w/sub")[0], 200)
        events, ready = [], threading.Event()

        def reader():
            for ev, data in c.sse(base + "?path=/tmp/w&recursive=1", timeout=60):
                if ev == "ready":
                    ready.set()
                    continue
                events.append((data["type"], data["name"]))
                self.assertEqual(data["path"], "/tmp/w/" + data["name"])
                if data["name"] == "done":
                    break
        t = threading.Thread(target=reader)
        t.start()
        self.assertTrue(ready.wait(30))
        s, b = c.exec(sid, "echo a > /tmp/w/a.txt; echo b >> /tmp/w/a.txt; mkdir /tmp/w/sub/new; "
                           "echo c > /tmp/w/sub/new/c.txt; mv /tmp/w/a.txt /tmp/w/b.txt; "
                           "chmod 600 /tmp/w/b.txt; rm /tmp/w/b.txt; touch /tmp/w/done")
        self.assertEqual((s, b["exit_code"]), (200, 0), b)
        t.join(60)
        self.assertFalse(t.is_alive())
        want = [("create", "a.txt"), ("write", "a.txt"), ("create", "sub/new"),
                ("create", "sub/new/c.txt"), ("rename", "a.txt"), ("create", "b.txt"),
                ("chmod", "b.txt"), ("remove", "b.txt"), ("create", "done")]
        it = iter(events)
        self.assertTrue(all(w in it for w in want), events)  # in this order
        # A missing folder, a file: plain errors before the stream starts.
        self.assertError(c.call("GET", base + "?path=/tmp/nope"), 404, "file_not_found")
        c.call("PUT", f"/v1/sandboxes/{sid}/files?path=/tmp/w/f", raw=b"x")
        self.assertError(c.call("GET", base + "?path=/tmp/w/f"), 409, "not_a_directory")
        self.assertError(c.call("GET", base), 400, "invalid_path")

    def test_files(self):
        c, sid = self.api, self.sid()
        base = f"/v1/sandboxes/{sid}/files"
        blob = os.urandom(300_000)
        s, b = c.call("PUT", base + "?path=/tmp/f/data.bin", raw=blob)
        self.assertEqual((s, b["size"]), (200, len(blob)))
        s, got = c.call("GET", base + "?path=/tmp/f/data.bin")
        self.assertEqual((s, got), (200, blob))
        s, b = c.call("GET", base + "/stat?path=/tmp/f/data.bin")
        self.assertEqual((b["type"], b["size"]), ("file", len(blob)))
        self.assertEqual(c.call("POST", base + "/mkdir", {"path": "/tmp/f/sub/deep"})[0], 204)
        self.assertEqual(c.call("POST", base + "/rename",
                                {"from": "/tmp/f/data.bin", "to": "/tmp/f/sub/d.bin"})[0], 204)
        s, b = c.call("GET", base + "/list?path=/tmp/f/sub")
        self.assertEqual(sorted((e["name"], e["type"]) for e in b["entries"]),
                         [("d.bin", "file"), ("deep", "directory")])
        self.assertError(c.call("GET", base + "?path=/tmp/f/data.bin"), 404, "file_not_found")
        self.assertEqual(c.call("DELETE", base + "?path=/tmp/f&recursive=1")[0], 204)
        self.assertError(c.call("GET", base + "/stat?path=/tmp/f"), 404, "file_not_found")
        self.assertError(c.call("POST", base + "/rename", {"from": "/tmp/../a", "to": "/b"}), 400,
                         "invalid_path")

    def test_background_processes(self):
        c, sid = self.api, self.sid()
        s, b = c.call("POST", f"/v1/sandboxes/{sid}/processes",
                      {"cmd": "for i in 1 2 3; do echo tick$i; sleep 0.3; done"})
        self.assertEqual(s, 201, b)
        pid = b["pid"]
        s, b = c.call("GET", f"/v1/sandboxes/{sid}/processes")
        self.assertIn(pid, [p["pid"] for p in b["processes"]])
        events = list(c.sse(f"/v1/sandboxes/{sid}/processes/{pid}/stream"))
        out = "".join(d["data"] for e, d in events if e == "stdout")
        self.assertEqual(out, "tick1\ntick2\ntick3\n")
        self.assertEqual(events[-1][0], "exit")
        s, b = c.call("POST", f"/v1/sandboxes/{sid}/processes", {"cmd": "exec sleep 302"})
        pid = b["pid"]
        self.assertEqual(c.call("DELETE", f"/v1/sandboxes/{sid}/processes/{pid}")[0], 204)
        deadline = time.time() + 10
        while time.time() < deadline and guest_has_process(c, sid, "sleep.302"):
            time.sleep(0.3)
        self.assertFalse(guest_has_process(c, sid, "sleep.302"))
        self.assertError(c.call("DELETE", f"/v1/sandboxes/{sid}/processes/abc"), 400,
                         "invalid_argument")

    def test_snapshot_fork_hibernate_wake_events_and_kill(self):
        c = self.api
        sbx = c.create(metadata={"k": "v"})
        sid = sbx["id"]
        self.assertEqual(c.exec(sid, "echo 42 > /tmp/state")[0], 200)
        s, b = c.call("POST", f"/v1/sandboxes/{sid}/snapshots")
        self.assertEqual(s, 201, b)
        snap = b["snapshot_id"]
        restored = c.create(from_snapshot=snap)
        self.assertEqual(c.exec(restored["id"], "cat /tmp/state")[1]["stdout"], "42\n")
        # A name: it stands for the newest snapshot taken with it (list ?name=, GET, creates).
        s, named = c.call("POST", f"/v1/sandboxes/{sid}/snapshots", {"name": "nightly"})
        self.assertEqual((s, named["name"]), (201, "nightly"), named)
        self.assertEqual(c.exec(sid, "echo 43 > /tmp/state")[0], 200)
        s, newer = c.call("POST", f"/v1/sandboxes/{sid}/snapshots", {"name": "nightly"})
        self.assertEqual(s, 201, newer)
        s, b = c.call("GET", "/v1/snapshots?name=nightly")
        self.assertEqual([x["id"] for x in b["snapshots"]], [newer["snapshot_id"]])
        self.assertTrue(b["snapshots"][0]["current"])
        s, b = c.call("GET", f"/v1/snapshots/{named['snapshot_id']}")
        self.assertEqual((s, b["name"], b["current"]), (200, "nightly", False))
        self.assertEqual(c.call("GET", "/v1/snapshots/nightly")[1]["id"], newer["snapshot_id"])
        by_name = c.create(from_snapshot="nightly")
        self.assertEqual(c.exec(by_name["id"], "cat /tmp/state")[1]["stdout"], "43\n")
        self.assertError(c.call("POST", f"/v1/sandboxes/{sid}/snapshots", {"name": "a/b"}), 400,
                         "invalid_argument")
        self.assertError(c.call("POST", "/v1/sandboxes", {"from_snapshot": "nope"}), 404,
                         "snapshot_not_found")
        for x in (named["snapshot_id"], newer["snapshot_id"]):
            self.assertEqual(c.call("DELETE", f"/v1/snapshots/{x}")[0], 204)
        self.assertEqual(c.call("DELETE", f"/v1/sandboxes/{by_name['id']}")[0], 200)
        self.assertEqual(c.exec(sid, "echo 42 > /tmp/state")[0], 200)
        snaps = os.path.join(self.base, "state", "snapshots")
        before = sorted(os.listdir(snaps))
        self.assertIn(snap, before)
        s, b = c.call("POST", f"/v1/sandboxes/{sid}/fork", {"count": 2})
        self.assertEqual(s, 201, b)
        kids = [k["id"] for k in b["sandboxes"]]
        self.assertEqual(len(kids), 2)
        for k in kids:
            self.assertEqual(c.exec(k, "cat /tmp/state")[1]["stdout"], "42\n")
        # The fork's own snapshot (not one of the sandbox's) is removed once the children run:
        # the named ones are left (the removal runs on the parent's VM worker, after the fork
        # answered).
        for _ in range(50):
            if sorted(os.listdir(snaps)) == before:
                break
            time.sleep(0.1)
        self.assertEqual(sorted(os.listdir(snaps)), before)
        # Deleting the named snapshot: recorded, its files gone, creates from it refused; the
        # sandbox restored from it runs on. Another tenant cannot delete one of ours.
        s, b = c.call("DELETE", f"/v1/snapshots/{snap}")
        self.assertEqual(s, 204, b)
        for _ in range(50):  # the files go right after the deletion is recorded
            if snap not in os.listdir(snaps):
                break
            time.sleep(0.1)
        self.assertNotIn(snap, os.listdir(snaps))
        self.assertError(c.call("POST", "/v1/sandboxes", {"from_snapshot": snap}), 404,
                         "snapshot_not_found")
        self.assertError(c.call("DELETE", f"/v1/snapshots/{snap}"), 404, "snapshot_not_found")
        self.assertEqual(c.exec(restored["id"], "cat /tmp/state")[1]["stdout"], "42\n")
        self.assertNotIn(snap, c.call("GET", f"/v1/sandboxes/{sid}")[1]["snapshots"])
        self.assertError(c.call("POST", f"/v1/sandboxes/{sid}/fork", {"count": 0}), 400,
                         "invalid_argument")
        s, b = c.call("POST", f"/v1/sandboxes/{sid}/hibernate")
        self.assertEqual((s, b["state"]), (200, "hibernated"))
        self.assertError(c.exec(sid, "true"), 409, "sandbox_hibernated")
        self.assertError(c.call("GET", f"/v1/sandboxes/{sid}/files?path=/tmp/state"), 409,
                         "sandbox_hibernated")
        s, b = c.call("POST", f"/v1/sandboxes/{sid}/wake")
        self.assertEqual((s, b["state"]), (200, "running"))
        self.assertEqual(c.exec(sid, "cat /tmp/state")[1]["stdout"], "42\n")
        s, b = c.call("GET", f"/v1/sandboxes/{sid}/events")
        kinds = [e["type"] for e in b["events"]]
        for k in ("created", "started", "exec-started", "exec-finished", "snapshot-taken",
                  "forked", "hibernated", "woke"):
            self.assertIn(k, kinds)
        self.assertEqual([e["version"] for e in b["events"]], list(range(1, len(kinds) + 1)))
        s, b = c.call("GET", "/v1/audit?limit=5")
        self.assertEqual((s, len(b["events"])), (200, 5))
        s, b2 = c.call("GET", f"/v1/audit?after={b['next_after']}&limit=5")
        self.assertGreater(b2["events"][0]["seq"], b["events"][-1]["seq"])
        for x in [sid, restored["id"], *kids]:
            s, b = c.call("DELETE", f"/v1/sandboxes/{x}")
            self.assertEqual((s, b["state"]), (200, "stopped"))
        self.assertError(c.exec(sid, "true"), 409, "sandbox_stopped")

    def test_hibernate_with_the_disk_only(self):
        """memory: false keeps only the disk (its RAM freed): a wake boots the guest afresh on
        it. What was written stays; processes and /tmp (a tmpfs) are gone. At a timeout too."""
        c = self.api
        sid = c.create()["id"]
        try:
            s, b = c.exec(sid, "echo kept > /root/on-disk; echo lost > /tmp/in-ram")
            self.assertEqual(s, 200, b)
            s, b = c.call("POST", f"/v1/sandboxes/{sid}/processes", {"cmd": "sleep 1000"})
            self.assertEqual(s, 201, b)
            sleeps = "grep -lx sleep /proc/[0-9]*/comm 2>/dev/null | wc -l"  # (no pgrep in base)

            def sleep_started():  # (it is its shell until that execs sleep: a while on a busy host)
                deadline = time.time() + 20
                while c.exec(sid, sleeps)[1]["stdout"] != "1\n":
                    self.assertLess(time.time(), deadline, "the sleep never started")
                    time.sleep(0.2)
            sleep_started()
            s, b = c.call("POST", f"/v1/sandboxes/{sid}/hibernate", {"memory": False})
            self.assertEqual((s, b["state"], b["hibernated_memory"]), (200, "hibernated", False), b)
            hib = os.path.join(self.base, "state", "hibernated", sid)
            self.assertFalse(os.path.exists(os.path.join(hib, "mem")))  # host memory freed
            self.assertFalse(os.path.exists(os.path.join(hib, "state")))
            s, b = c.call("POST", f"/v1/sandboxes/{sid}/wake")
            self.assertEqual((s, b["state"]), (200, "running"), b)
            self.assertNotIn("hibernated_memory", b)
            s, b = c.exec(sid, "cat /root/on-disk; cat /tmp/in-ram 2>&1; " + sleeps)
            self.assertEqual(b["stdout"].splitlines()[0], "kept", b)
            self.assertIn("No such file", b["stdout"])
            self.assertEqual(b["stdout"].splitlines()[-1], "0", b)
            self.assertFalse(os.path.exists(hib))  # the wake took it
            # A hibernation with memory still keeps the processes.
            self.assertEqual(c.call("POST", f"/v1/sandboxes/{sid}/processes",
                                    {"cmd": "sleep 1000"})[0], 201)
            sleep_started()
            self.assertEqual(c.call("POST", f"/v1/sandboxes/{sid}/hibernate")[1]["hibernated_memory"], True)
            c.call("POST", f"/v1/sandboxes/{sid}/wake")
            self.assertEqual(c.exec(sid, sleeps)[1]["stdout"], "1\n")
            self.assertError(c.call("POST", f"/v1/sandboxes/{sid}/hibernate", {"memory": "no"}),
                             400, "invalid_argument")
        finally:
            c.call("DELETE", f"/v1/sandboxes/{sid}")
        # At its timeout, as the create said.
        s, b = c.call("POST", "/v1/sandboxes", {"idle_timeout_seconds": 2, "on_timeout": "hibernate",
                                                "hibernate_memory": False})
        self.assertEqual((s, b["hibernate_memory"]), (201, False), b)
        idle = b["id"]
        try:
            c.exec(idle, "echo t > /root/at-timeout")
            deadline = time.time() + 60
            while (b := c.call("GET", f"/v1/sandboxes/{idle}")[1])["state"] != "hibernated":
                self.assertLess(time.time(), deadline, b)
                time.sleep(0.3)
            self.assertFalse(b["hibernated_memory"])
            self.assertEqual(c.call("POST", f"/v1/sandboxes/{idle}/wake")[0], 200)
            self.assertEqual(c.exec(idle, "cat /root/at-timeout")[1]["stdout"], "t\n")
        finally:
            c.call("DELETE", f"/v1/sandboxes/{idle}")

    def test_events_follow_streams_new_events(self):
        c = self.api
        sid = c.create()["id"]
        got = []
        def follow():
            for ev, data in c.sse(f"/v1/sandboxes/{sid}/events?follow=1"):
                got.append(data["type"])
        t = threading.Thread(target=follow)
        t.start()
        time.sleep(0.5)
        c.exec(sid, "true")
        c.call("DELETE", f"/v1/sandboxes/{sid}")
        t.join(30)
        self.assertFalse(t.is_alive())
        self.assertEqual(got, ["created", "started", "network-attached", "exec-started",
                               "exec-finished", "killed"])

    def test_cli_commands(self):
        env = dict(os.environ, PANDASTACK_API_KEY=self.api.key, PANDASTACK_BASE_URL=self.daemon.url)
        def cli(*a, **kw):
            if "input" not in kw:
                kw["stdin"] = subprocess.DEVNULL
            return subprocess.run([ARGS.cli, *a], capture_output=True, text=True, timeout=120,
                                  env=kw.pop("env", env), **kw)
        r = cli("sandbox", "create", "--metadata", "via=cli")
        self.assertEqual(r.returncode, 0, r.stderr)
        sid = r.stdout.strip()
        self.assertTrue(sid.startswith("sbx_"))
        r = cli("sandbox", "list", "--metadata", "via=cli")
        self.assertIn(sid, r.stdout)
        self.assertTrue(r.stdout.startswith("ID "))  # a table with a header
        r = cli("sandbox", "list", "--json")
        self.assertIn(sid, [s["id"] for s in json.loads(r.stdout)])
        # exec streams, passes stderr through and exits with the command's code
        r = cli("sandbox", "exec", sid, "--", "echo out; echo err >&2; exit 7")
        self.assertEqual((r.returncode, r.stdout, r.stderr), (7, "out\n", "err\n"))
        r = cli("sandbox", "exec", sid, "--env", "A=b", "--cwd", "/tmp", "--", "sh", "-c", "echo $A; pwd")
        self.assertEqual((r.returncode, r.stdout), (0, "b\n/tmp\n"))
        r = cli("sandbox", "exec", sid, "--json", "--", "echo j")
        self.assertEqual(json.loads(r.stdout)["stdout"], "j\n")
        # stdin is forwarded; a signal is 128+N, a timeout 124, like a shell and timeout(1).
        r = cli("sandbox", "exec", sid, "--", "cat", input="piped-data\n")
        self.assertEqual((r.returncode, r.stdout), (0, "piped-data\n"))
        self.assertEqual(cli("sandbox", "exec", sid, "--", "kill -9 $$").returncode, 137)
        r = cli("sandbox", "exec", sid, "--timeout", "1", "--", "sleep 5")
        self.assertEqual(r.returncode, 124, r.stderr)
        self.assertIn("timed out", r.stderr)
        # A terminal: piped input is typed, then Ctrl-D; the exit status is the shell's.
        r = cli("sandbox", "shell", sid, input="tty; stty size; exit 7\n")
        self.assertEqual(r.returncode, 7, (r.stdout, r.stderr))
        self.assertIn("/dev/pts/", r.stdout)
        self.assertIn("24 80", r.stdout)
        self.cli_shell_on_a_local_terminal(sid, env)
        # Help, version, and a missing key said before any call.
        for args in (("help",), ("sandbox", "--help"), ("sandbox", "help"), ("--version",)):
            r = cli(*args)
            self.assertEqual(r.returncode, 0, (args, r.stderr))
            self.assertTrue(r.stdout, args)
        no_key = {k: v for k, v in env.items() if k != "PANDASTACK_API_KEY"}
        r = cli("sandbox", "list", env=no_key)
        self.assertEqual(r.returncode, 2)
        self.assertIn("set PANDASTACK_API_KEY or pass --key", r.stderr)
        local = os.path.join(self.base, "cli.txt")
        with open(local, "w") as f:
            f.write("via cli")
        self.assertEqual(cli("files", "cp", local, f"{sid}:/tmp/c/x.txt").returncode, 0)
        self.assertEqual(cli("files", "cat", sid, "/tmp/c/x.txt").stdout, "via cli")
        self.assertIn("x.txt", cli("files", "ls", sid, "/tmp/c").stdout)
        self.assertEqual(cli("files", "cp", f"{sid}:/tmp/c/x.txt", local + ".back").returncode, 0)
        # Into a folder, as cp does.
        self.assertEqual(cli("files", "cp", local, f"{sid}:/tmp/c/").returncode, 0)
        self.assertEqual(cli("files", "cat", sid, "/tmp/c/cli.txt").stdout, "via cli")
        with open(local + ".back") as f:
            self.assertEqual(f.read(), "via cli")
        kid = cli("sandbox", "fork", sid).stdout.strip()
        self.assertTrue(kid.startswith("sbx_"))
        self.assertEqual(cli("sandbox", "exec", kid, "--", "cat /tmp/c/x.txt").stdout, "via cli")
        self.assertIn("exec-finished", cli("sandbox", "logs", sid).stdout)
        snap = cli("sandbox", "snapshot", sid).stdout.strip()
        self.assertTrue(snap.startswith("snap_"))
        self.assertEqual(cli("snapshot", "delete", snap).returncode, 0)
        r = cli("snapshot", "delete", snap)
        self.assertEqual((r.returncode, r.stderr.split(":")[1].strip()), (1, "snapshot_not_found"))
        self.assertIn("base", cli("template", "list").stdout)
        r = cli("sandbox", "get", "sbx_nope")
        self.assertEqual((r.returncode, r.stderr.split(":")[1].strip()), (1, "sandbox_not_found"))
        self.assertEqual(cli("sandbox", "bogus", "x").returncode, 2)
        r = cli("sandbox", "create", "--ttl", "abc")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--ttl needs a whole number of seconds", r.stderr)
        r = cli("sandbox", "create", "--idle-timeout", "300", "--on-timeout", "hibernate",
                "--auto-wake", "--json")
        idle = json.loads(r.stdout)
        self.assertEqual((idle["idle_timeout_seconds"], idle["on_timeout"], idle["auto_wake"]),
                         (300, "hibernate", True))
        cli("sandbox", "kill", idle["id"])
        for x in (kid, sid):
            r = cli("sandbox", "kill", x, "--json")
            self.assertEqual(json.loads(r.stdout)["state"], "stopped")
        # The list shows live sandboxes unless asked for all.
        self.assertNotIn(sid, cli("sandbox", "list").stdout)
        self.assertIn(sid, cli("sandbox", "list", "--all").stdout)

    # -- tenancy and keys -----------------------------------------------------------------------

    def cli_shell_on_a_local_terminal(self, sid, env):
        """`pandastack sandbox shell` on a real local terminal: raw mode (keys such as Ctrl-C go
        to the sandbox's terminal), the window's size, and a resize that follows (SIGWINCH)."""
        pid, master = pty.fork()
        if pid == 0:
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 101, 0, 0))
            os.execve(ARGS.cli, [ARGS.cli, "sandbox", "shell", sid], env)
        out = b""

        def read_until(marker):
            nonlocal out
            deadline = time.time() + 60
            while marker not in out and time.time() < deadline:
                if select.select([master], [], [], 1)[0]:
                    try:
                        out += os.read(master, 65536)
                    except OSError:
                        break
            self.assertIn(marker, out)
        try:
            os.write(master, b"stty size; echo m-$((2*21))\r")
            read_until(b"m-42")
            self.assertIn(b"33 101", out)
            fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
            os.write(master, b"sleep 308; echo after-$((1+1))\r")
            time.sleep(2)
            os.write(master, b"\x03")  # raw mode: Ctrl-C reaches the sandbox's terminal
            os.write(master, b"stty size; echo m-$((2*22))\r")
            read_until(b"m-44")
            self.assertIn(b"40 120", out)
            self.assertNotIn(b"after-2", out)
            os.write(master, b"exit 5\r")
            read_until(b"exit 5")
        finally:
            deadline = time.time() + 30
            while time.time() < deadline:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                try:
                    os.read(master, 65536)
                except OSError:
                    time.sleep(0.1)
            else:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                status = -1
            os.close(master)
        self.assertEqual(os.waitstatus_to_exitcode(status), 5, out)

    def test_tenant_isolation_on_every_route_and_keys(self):
        c, sid = self.api, self.sid()
        s, b = c.call("POST", "/v1/keys", {"tenant": "other"})
        self.assertEqual(s, 201, b)
        other = Api(self.daemon, b["key"])
        other_id = b["id"]
        self.assertTrue(b["key"].startswith("pds_"))
        self.assertEqual(other.call("GET", "/v1/sandboxes")[1]["sandboxes"], [])
        s, doc = c.call("GET", "/openapi.json", key="")
        for path, item in doc["paths"].items():
            if "{id}" not in path:
                continue
            concrete = path.replace("{id}", sid).replace("{pid}", "1")
            if path.endswith("/exec/ws") or path.endswith("/pty"):
                ws = WebSocket(self.daemon, concrete, other.key)
                self.assertEqual((ws.status, ws.body["error"]["code"]), (404, "sandbox_not_found"))
                ws.sock.close()
                continue
            for method in item:
                body = {"post": {"bogus": 1}, "patch": {"bogus": 1}}.get(method)
                s, b = other.call(method.upper(), concrete + "?path=/tmp", body)
                self.assertEqual(s, 404, (method, path, b))
                if not path.startswith("/v1/"):  # the E2B control plane: E2B's error shape
                    self.assertEqual(b["code"], 404, (method, path, b))
                    continue
                self.assertEqual(b["error"]["code"], "sandbox_not_found", (method, path))
        # Snapshots too: another tenant's id is not found, and stays usable by its owner.
        s, b = c.call("POST", f"/v1/sandboxes/{sid}/snapshots")
        self.assertEqual(s, 201, b)
        self.assertError(other.call("DELETE", f"/v1/snapshots/{b['snapshot_id']}"), 404,
                         "snapshot_not_found")
        self.assertEqual(c.call("DELETE", f"/v1/snapshots/{b['snapshot_id']}")[0], 204)
        self.assertError(c.call("POST", "/v1/keys", {"tenant": "*"}), 400, "invalid_argument")
        self.assertError(other.call("GET", "/v1/sandboxes?all=1"), 403, "forbidden")
        self.assertIn(sid, [x["id"] for x in c.call("GET", "/v1/sandboxes?all=1")[1]["sandboxes"]])
        # Not an admin: no key management.
        self.assertError(other.call("POST", "/v1/keys", {"tenant": "x"}), 403, "forbidden")
        self.assertError(other.call("GET", "/v1/keys"), 403, "forbidden")
        s, b = c.call("GET", "/v1/keys")
        self.assertIn(other_id, [k["id"] for k in b["keys"]])
        self.assertNotIn("key", b["keys"][0])
        self.assertEqual(c.call("DELETE", f"/v1/keys/{other_id}")[0], 204)
        self.assertError(other.call("GET", "/v1/sandboxes"), 401, "unauthorized")
        self.assertError(c.call("DELETE", f"/v1/keys/{other_id}"), 404, "key_not_found")


# A DNS server for the test's upstream namespace: A records for a few test names, NXDOMAIN else.
DNS_SERVER = r"""
import socket
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
        cls.base = tempfile.mkdtemp(prefix="pst-api-net-", dir="/dev/shm")
        # Web servers on .2 and .3; the DNS server the platform resolver forwards allowed names to.
        cls.upstream = Upstream(cls.UP_NS, cls.UP_LINK, "198.19.0", [".2", ".3"], cls.base,
                                DNS_SERVER)
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
        cls.upstream.remove()
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


class RestartTest(unittest.TestCase):
    """SIGTERM hibernates persistent sandboxes; a new daemon on the same data wakes them intact."""

    def test_graceful_restart(self):
        base = tempfile.mkdtemp(prefix="pst-api-rs-", dir="/dev/shm")
        daemons = []  # stopped in `finally`, so a failing assertion leaves no daemon running
        try:
            data, state = os.path.join(base, "data"), os.path.join(base, "state")
            d = Daemon(data, state)
            daemons.append(d)
            c = Api(d)
            keep = c.create(persistent=True)["id"]
            drop = c.create()["id"]
            self.assertEqual(c.exec(keep, "echo kept > /tmp/mark")[0], 200)
            self.assertEqual(d.stop(), 0)
            old = os.path.join(base, "old")
            shutil.copytree(os.path.join(data, "store"), os.path.join(old, "store"))  # as at the stop
            d2 = Daemon(data, state)
            daemons.append(d2)
            self.assertEqual(d2.key, d.key)  # the key file is read back
            c2 = Api(d2)
            self.assertEqual(c2.call("GET", f"/v1/sandboxes/{keep}")[1]["state"], "hibernated")
            self.assertEqual(c2.call("GET", f"/v1/sandboxes/{drop}")[1]["state"], "stopped")
            # A sandbox that ended before the restart answers as it did before it.
            self.assertEqual(c2.call("DELETE", f"/v1/sandboxes/{drop}")[0], 200)
            for method, path, body in (("POST", "exec", {"cmd": "true"}), ("POST", "hibernate", {}),
                                       ("POST", "wake", {}), ("POST", "fork", {}),
                                       ("POST", "snapshots", {})):
                s, b = c2.call(method, f"/v1/sandboxes/{drop}/{path}", body)
                self.assertEqual((s, b["error"]["code"]), (409, "sandbox_stopped"), (path, b))
            s, b = c2.call("PATCH", f"/v1/sandboxes/{drop}", {"ttl_seconds": 100})
            self.assertEqual((s, b["error"]["code"]), (409, "sandbox_stopped"), b)
            s, b = c2.call("GET", f"/v1/sandboxes/{drop}/files/list?path=/")
            self.assertEqual((s, b["error"]["code"]), (409, "sandbox_stopped"), b)
            self.assertEqual(c2.call("POST", f"/v1/sandboxes/{keep}/wake")[0], 200)
            self.assertEqual(c2.exec(keep, "cat /tmp/mark")[1]["stdout"], "kept\n")
            # The audit log, read from the store while the daemon runs, and through the API.
            cli = lambda *a: subprocess.run([ARGS.cli, *a], capture_output=True, text=True,
                                            timeout=120)
            r = cli("audit", "--data", data, "--json")
            self.assertEqual(r.returncode, 0, r.stderr)
            lines = [json.loads(l) for l in r.stdout.splitlines()]
            self.assertEqual([l["seq"] for l in lines], list(range(1, len(lines) + 1)))
            mine = [l["type"] for l in lines if l["sandbox"] == keep]
            self.assertEqual(mine[:2], ["created", "started"])
            self.assertIn("hibernated", mine)
            self.assertEqual(mine[-5:], ["transition-started", "woke", "network-attached",
                                         "exec-started", "exec-finished"])
            r = cli("audit", "--url", d2.url, "--key", d2.key, "--sandbox", keep)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(len(r.stdout.splitlines()), len(mine))
            self.assertIn("exec-finished", r.stdout)
            r = cli("audit", "--data", data, "--from", "2000-01-01T00:00:00Z", "--to", "1")
            self.assertEqual((r.returncode, r.stdout), (0, ""))
            # Replay: the current log rebuilds the live state exactly ...
            r = cli("audit", "replay", "--data", data, "--url", d2.url, "--key", d2.key)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("0 difference(s)", r.stdout)
            # ... and the log from before the wake does not: non-zero, with the difference named.
            r = cli("audit", "replay", "--data", old, "--url", d2.url, "--key", d2.key)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertIn(keep, r.stdout)
            self.assertEqual(cli("audit", "replay").returncode, 2)
            self.assertEqual(cli("nonsense").returncode, 2)
            self.assertEqual(d2.stop(), 0)
        finally:
            for x in daemons:
                if x.proc.poll() is None:
                    x.stop()
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    p.add_argument("--cli", required=True)
    p.add_argument("--images", default=os.environ.get("PANDASTACK_IMAGES", "var/images"))
    args, rest = p.parse_known_args()
    args.images = os.path.abspath(args.images)
    harness.ARGS = args
    harness.run_unittests(rest)
