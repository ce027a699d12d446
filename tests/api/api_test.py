#!/usr/bin/env python3
"""API tests against the real daemon binary: real HTTP, real VMs (TCG here), real RocksDB.

Usage: api_test.py --daemon build/bin/pandastackd --cli build/bin/pandastack [--images var/images]
[unittest args]. Traffic goes only to the daemon on 127.0.0.1. The CLI's cases (cli_cases.py) run on
this suite's daemon; networking is network_test.py, a graceful restart restart_test.py.
"""
import argparse
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Api, Daemon, WebSocket, guest_has_process  # noqa: E402,F401
from cli_cases import CliCases  # noqa: E402


class _Args:
    """harness.ARGS, read when used (main sets it after import)."""

    def __getattr__(self, name):
        return getattr(harness.ARGS, name)


ARGS = _Args()


class ApiTest(CliCases, unittest.TestCase):
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
            self.assertEqual(c.exec(sid, sleeps)[1]["stdout"], "1\n")
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

    # -- tenancy and keys -----------------------------------------------------------------------

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


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    p.add_argument("--cli", required=True)
    p.add_argument("--images", default=os.environ.get("PANDASTACK_IMAGES", "var/images"))
    args, rest = p.parse_known_args()
    args.images = os.path.abspath(args.images)
    harness.ARGS = args
    harness.run_unittests(rest)
