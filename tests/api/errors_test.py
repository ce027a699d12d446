#!/usr/bin/env python3
"""Honest errors and exact answers through the real daemon (the exploratory test's findings): file
errors with their own codes, special files, file modes, snapshot listing, refused input that used
to be mangled silently, HTTP details (405 Allow, HEAD, the Bearer scheme, Retry-After), and the
limits named in their messages.

Usage: errors_test.py --daemon build/bin/pandastackd [--images var/images]
"""
import argparse
import os
import shutil
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Api, Daemon  # noqa: E402


class ErrorsTest(harness.LogOnFailure, unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.base = tempfile.mkdtemp(prefix="pst-err-", dir="/dev/shm")
        cls.daemon = Daemon(os.path.join(cls.base, "data"), os.path.join(cls.base, "state"),
                            extra=("--max-concurrent-execs", "2"))
        cls.api = Api(cls.daemon)
        cls.sid = cls.api.create(network=False)["id"]

    @classmethod
    def tearDownClass(cls):
        code = cls.daemon.stop(reap=True)
        shutil.rmtree(cls.base, ignore_errors=True)
        assert code == 0, f"daemon exited {code}"

    def err(self, reply):
        s, b = reply
        return s, b["error"]["code"] if isinstance(b, dict) and "error" in b else b

    def files(self, method, query, body=None, raw=None):
        return self.api.call(method, f"/v1/sandboxes/{self.sid}/files{query}", body, raw)

    def test_file_errors_have_their_own_codes(self):
        c = self.api
        self.assertEqual(self.files("PUT", "?path=/workspace/f.txt", raw=b"x")[0], 200)
        c.exec(self.sid, "mkdir -p /workspace/full && touch /workspace/full/x")
        cases = [
            (("GET", "?path=/workspace"), (409, "is_a_directory")),
            (("PUT", "?path=/workspace", None, b"x"), (409, "is_a_directory")),
            (("PUT", "?path=/workspace/f.txt/child", None, b"x"), (409, "not_a_directory")),
            (("GET", "/list?path=/workspace/f.txt"), (409, "not_a_directory")),
            (("DELETE", "?path=/workspace/full"), (409, "directory_not_empty")),
            (("PUT", "?path=/proc/version", None, b"x"), (422, "io_error")),
            (("GET", "?path=/workspace/nope"), (404, "file_not_found")),
        ]
        for args, want in cases:
            self.assertEqual(self.err(self.files(*args)), want, args)
        s, b = c.call("POST", f"/v1/sandboxes/{self.sid}/files/mkdir",
                      {"path": "/workspace/full", "parents": False})
        self.assertEqual((s, b["error"]["code"]), (409, "file_exists"))
        s, b = c.call("POST", f"/v1/sandboxes/{self.sid}/files/rename", {"from": "/workspace/f.txt"})
        self.assertEqual((s, b["error"]["code"]), (400, "invalid_path"))
        self.assertIn("to is required", b["error"]["message"])

    def test_special_files_and_modes(self):
        s, body = self.files("GET", "?path=/proc/sys/kernel/hostname")
        self.assertEqual(s, 200, body)
        hostname = c_exec = self.api.exec(self.sid, "hostname")[1]["stdout"]
        self.assertEqual(body.decode(), c_exec)
        s, b = self.api.exec(self.sid, "cat /etc/hostname")
        self.assertEqual(b["stdout"], hostname)  # /etc/hostname says what `hostname` says
        self.assertEqual(self.err(self.files("GET", "?path=/dev/zero")), (413, "file_too_large"))
        # A mode on write: an uploaded script runs.
        s, b = self.files("PUT", "?path=/workspace/run.sh&mode=755", raw=b"#!/bin/sh\necho ran\n")
        self.assertEqual(s, 200, b)
        s, b = self.api.exec(self.sid, "/workspace/run.sh")
        self.assertEqual((b["exit_code"], b["stdout"]), (0, "ran\n"))
        s, b = self.files("GET", "/stat?path=/workspace/run.sh")
        self.assertEqual(b["mode"] & 0o777, 0o755)
        self.assertEqual(self.err(self.files("PUT", "?path=/workspace/x&mode=9z", raw=b"")),
                         (400, "invalid_argument"))
        # Unknown query parameters are refused on every route, not ignored.
        self.assertEqual(self.err(self.files("PUT", "?path=/workspace/x&mdoe=755", raw=b"")),
                         (400, "invalid_argument"))
        self.assertEqual(self.err(self.api.call("GET", f"/v1/sandboxes/{self.sid}/events?foo=1")),
                         (400, "invalid_argument"))

    def test_snapshots_are_listed_with_sizes(self):
        c = self.api
        s, b = c.call("POST", f"/v1/sandboxes/{self.sid}/snapshots", {})
        self.assertEqual(s, 201, b)
        snap = b["snapshot_id"]
        s, b = c.call("GET", "/v1/snapshots")
        self.assertEqual(s, 200)
        mine = [x for x in b["snapshots"] if x["id"] == snap]
        self.assertEqual(len(mine), 1)
        self.assertEqual((mine[0]["sandbox"], mine[0]["template"]), (self.sid, "base"))
        self.assertGreater(mine[0]["memory_bytes"], 1 << 20)
        self.assertGreaterEqual(mine[0]["size_bytes"], mine[0]["memory_bytes"])
        self.assertGreater(mine[0]["created_at_ms"], 0)
        s, one = c.call("GET", f"/v1/snapshots/{snap}")
        # (its durable copy may land between the two reads: "none" then "local")
        self.assertIn((mine[0]["durable"], one["durable"]),
                      {("none", "none"), ("none", "local"), ("local", "local")})
        self.assertEqual((s, dict(one, durable=None)), (200, dict(mine[0], durable=None)))
        self.assertEqual(c.call("DELETE", f"/v1/snapshots/{snap}")[0], 204)
        self.assertEqual(self.err(c.call("GET", f"/v1/snapshots/{snap}")),
                         (404, "snapshot_not_found"))

    def test_input_is_refused_not_mangled(self):
        c = self.api
        s, b = c.call("POST", "/v1/sandboxes", raw='{"template":"nope","template":"base"}')
        self.assertEqual((s, b["error"]["code"]), (400, "invalid_json"))
        self.assertIn("duplicate key", b["error"]["message"])
        s, b = c.call("POST", "/v1/sandboxes", {"from_snapshot": "snap_x", "template": "base"})
        self.assertEqual((s, b["error"]["code"]), (400, "invalid_argument"))
        s, b = c.call("GET", f"/v1/sandboxes/{self.sid}/events?follow=yes")
        self.assertEqual((s, b["error"]["code"]), (400, "invalid_argument"))
        self.assertEqual(self.err(c.call("DELETE", f"/v1/sandboxes/{self.sid}/processes/1?signal=9abc")),
                         (400, "invalid_argument"))
        self.assertEqual(self.err(c.call("DELETE", f"/v1/sandboxes/{self.sid}/processes/1?signal=0")),
                         (400, "invalid_argument"))
        # Ranges name the real limits.
        for body, text in (({"ttl_seconds": 0}, "ttl_seconds must be an integer within 1..86400"),
                           ({"ttl_seconds": 10**30}, "ttl_seconds must be an integer within 1..86400"),
                           ({"idle_timeout_seconds": 86401}, "within 1..86400")):
            s, b = c.call("POST", "/v1/sandboxes", body)
            self.assertEqual(s, 400, b)
            self.assertIn(text, b["error"]["message"])
        s, b = c.call("POST", f"/v1/sandboxes/{self.sid}/fork", {"count": 100})
        self.assertIn("count must be an integer within 1..16", b["error"]["message"])
        # PATCH is all or nothing: a refused TTL leaves the metadata as it was.
        s, b = c.call("PATCH", f"/v1/sandboxes/{self.sid}", {"metadata": {"a": "b"},
                                                              "ttl_seconds": 999999})
        self.assertEqual(s, 400, b)
        self.assertEqual(c.call("GET", f"/v1/sandboxes/{self.sid}")[1]["metadata"], {})

    def test_http_details(self):
        c = self.api
        conn = c.conn()
        conn.request("PUT", "/healthz")
        r = conn.getresponse()
        r.read()
        self.assertEqual(r.status, 405)
        self.assertEqual(r.getheader("Allow"), "GET, HEAD")
        conn.request("HEAD", "/healthz")
        r = conn.getresponse()
        self.assertEqual((r.status, r.read()), (200, b""))
        conn.close()
        s, b = c.call("GET", f"/v1/sandboxes/{self.sid}", headers={"Authorization": "bearer " + c.key},
                      key="")
        self.assertEqual(s, 200, b)
        s, b = c.call("GET", "/v1/sandboxes", key="pds_short")
        self.assertEqual((s, b["error"]["code"]), (401, "unauthorized"))
        self.assertIn("malformed", b["error"]["message"])

    def test_a_refusal_reaches_a_client_still_sending_its_body(self):
        # Refused before its body is read (no key), the client still writing 1.5 MiB: it reads the
        # 401, not a reset connection (the daemon drops up to 2 MiB of an unread body first).
        import socket
        body = b"x" * (3 << 19)
        for _ in range(3):
            with socket.create_connection((self.daemon.host, self.daemon.port), timeout=30) as s:
                s.sendall(b"POST /v1/sandboxes HTTP/1.1\r\nHost: t\r\nContent-Type: application/json"
                          b"\r\nContent-Length: %d\r\n\r\n" % len(body))
                s.sendall(body)
                answer = b""
                while b"\r\n" not in answer:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    answer += chunk
                self.assertTrue(answer.startswith(b"HTTP/1.1 401"), answer[:200])

    def test_too_many_execs_says_when_to_retry(self):
        done = []
        threads = [threading.Thread(target=lambda: done.append(self.api.exec(self.sid, "sleep 2")))
                   for _ in range(2)]
        for t in threads:
            t.start()
        import time
        time.sleep(0.7)
        conn = self.api.conn()
        conn.request("POST", f"/v1/sandboxes/{self.sid}/exec", body='{"cmd":"true"}',
                     headers={"Authorization": "Bearer " + self.api.key})
        r = conn.getresponse()
        r.read()
        conn.close()
        for t in threads:
            t.join()
        self.assertEqual((r.status, r.getheader("Retry-After")), (429, "1"))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    p.add_argument("--images", default=os.environ.get("PANDASTACK_IMAGES", "var/images"))
    args, rest = p.parse_known_args()
    args.images = os.path.abspath(args.images)
    harness.ARGS = args
    harness.run_unittests(rest)
