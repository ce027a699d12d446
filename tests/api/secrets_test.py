#!/usr/bin/env python3
"""Secrets through the real daemon: stored sealed (the value never in an answer, the daemon's
log, or any file of the data folder in the clear), listed by name, rotated, deleted, expired,
kept across a restart, per tenant, with their limits; a create naming secrets without a network
is refused. No VM is started (their use by sandboxes: egress_test.py).

Usage: secrets_test.py --daemon build/bin/pandastackd [--images DIR]
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Api, Daemon  # noqa: E402

VALUE = "ghp_s3cr3t-VALUE-7a1b2c3d4e5f"


class SecretsTest(harness.LogOnFailure, unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.base = tempfile.mkdtemp(prefix="pst-secrets-", dir="/var/tmp")
        cls.data = os.path.join(cls.base, "data")
        cls.flags = ("--network", "off", "--pool-size", "0")
        cls.daemon = Daemon(cls.data, os.path.join(cls.base, "state"), cls.flags)
        cls.api = Api(cls.daemon)

    @classmethod
    def tearDownClass(cls):
        code = cls.daemon.stop(reap=True)
        shutil.rmtree(cls.base, ignore_errors=True)
        assert code == 0, f"daemon exited {code}"

    def assertError(self, reply, status, code):
        s, b = reply
        self.assertEqual((s, b["error"]["code"] if isinstance(b, dict) and "error" in b else b),
                         (status, code), b)

    def test_a_secret_is_stored_sealed_and_never_answered(self):
        c = self.api
        answers = []
        def call(*a, **kw):
            r = c.call(*a, **kw)
            answers.append(repr(r[1]))
            return r
        s, b = call("POST", "/v1/secrets", {"name": "GITHUB_TOKEN", "value": VALUE,
                                             "hosts": ["API.github.com", "*.githubusercontent.com"]})
        self.assertEqual(s, 201, b)
        self.assertEqual((b["name"], b["hosts"], b["version"], b["expires_at_ms"]),
                         ("GITHUB_TOKEN", ["*.githubusercontent.com", "api.github.com"], 1, None))
        self.assertNotIn("value", b)
        self.assertError(call("POST", "/v1/secrets", {"name": "GITHUB_TOKEN", "value": "x",
                                                       "hosts": ["a.test"]}), 409, "already_exists")
        s, b = call("GET", "/v1/secrets")
        self.assertEqual([x["name"] for x in b["secrets"]], ["GITHUB_TOKEN"])
        s, b = call("GET", "/v1/secrets/GITHUB_TOKEN")
        self.assertEqual((s, b["version"]), (200, 1))
        # Rotation: a new version; hosts alone keep it.
        s, b = call("PATCH", "/v1/secrets/GITHUB_TOKEN", {"value": VALUE + "-2"})
        self.assertEqual((s, b["version"]), (200, 2), b)
        s, b = call("PATCH", "/v1/secrets/GITHUB_TOKEN", {"hosts": ["api.github.com"]})
        self.assertEqual((s, b["version"], b["hosts"]), (200, 2, ["api.github.com"]), b)
        self.assertGreaterEqual(b["updated_at_ms"], b["created_at_ms"])
        # Nowhere in the clear: no answer, not the daemon's log, no file of the data folder.
        self.assertFalse([a for a in answers if VALUE in a])
        for root, _, files in os.walk(self.data):
            for f in files:
                if not os.path.isfile(os.path.join(root, f)) or f.endswith(".sock"):
                    continue
                with open(os.path.join(root, f), "rb") as fh:
                    self.assertNotIn(VALUE.encode(), fh.read(), os.path.join(root, f))
        key = os.path.join(self.data, "secrets.key")
        self.assertEqual((os.stat(key).st_mode & 0o777, os.path.getsize(key)), (0o600, 32))
        # Another tenant sees none of it.
        s, b = c.call("POST", "/v1/keys", {"tenant": "other-secrets"})
        other = Api(self.daemon, b["key"])
        self.assertEqual(other.call("GET", "/v1/secrets")[1]["secrets"], [])
        for method, body in (("GET", None), ("PATCH", {"value": "x"}), ("DELETE", None)):
            self.assertError(other.call(method, "/v1/secrets/GITHUB_TOKEN", body), 404,
                             "secret_not_found")
        # Kept across a restart.
        self.daemon.stop()
        type(self).daemon = Daemon(self.data, os.path.join(self.base, "state"), self.flags)
        c = type(self).api = Api(self.daemon)
        s, b = c.call("GET", "/v1/secrets/GITHUB_TOKEN")
        self.assertEqual((s, b["version"], b["hosts"]), (200, 2, ["api.github.com"]), b)
        # A sandbox uses secrets through its network's egress proxy (tests/api/egress_test.py):
        # without a network (this daemon has none), refused, not ignored.
        self.assertError(c.call("POST", "/v1/sandboxes", {"secrets": ["GITHUB_TOKEN"]}), 400,
                         "invalid_argument")
        self.assertEqual(c.call("DELETE", "/v1/secrets/GITHUB_TOKEN")[0], 204)
        self.assertError(c.call("GET", "/v1/secrets/GITHUB_TOKEN"), 404, "secret_not_found")
        self.assertError(c.call("DELETE", "/v1/secrets/GITHUB_TOKEN"), 404, "secret_not_found")

    def test_the_cli_reads_the_value_from_stdin(self):
        cli = os.path.join(os.path.dirname(harness.ARGS.daemon), "pandastack")
        env = dict(os.environ, PANDASTACK_API_KEY=self.api.key,
                   PANDASTACK_BASE_URL=self.daemon.url)
        run = lambda *a, stdin="": subprocess.run([cli, "secret", *a], env=env, input=stdin,
                                                  capture_output=True, text=True, timeout=60)
        r = run("create", "CLI_TOKEN", "--host", "api.example.com", "--host", "*.example.org",
                "--ttl", "600", "--json", stdin="cli-value-1\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        made = json.loads(r.stdout)
        self.assertEqual((made["name"], made["hosts"]), ("CLI_TOKEN",
                                                         ["*.example.org", "api.example.com"]))
        self.assertNotIn("cli-value-1", r.stdout)
        r = run("rotate", "CLI_TOKEN", stdin="cli-value-2")
        self.assertEqual((r.returncode, r.stdout.strip()), (0, "CLI_TOKEN version 2"), r.stderr)
        r = run("list")
        self.assertRegex(r.stdout, r"CLI_TOKEN +2 +\*\.example\.org, api\.example\.com")
        self.assertEqual(run("create", "NOHOST", stdin="x").returncode, 2)
        self.assertEqual(run("create", "EMPTY", "--host", "a.test", stdin="").returncode, 2)
        self.assertEqual(run("delete", "CLI_TOKEN").returncode, 0)
        r = run("get", "CLI_TOKEN")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("secret_not_found", r.stderr)
        # Where a sandbox's egress proxy may put it, and plain HTTP (headers over HTTPS only by
        # default); a PATCH of one leaves the other.
        r = run("create", "OPTED", "--host", "a.test", "--inject-into", "headers,query",
                "--allow-plain-http", "--json", stdin="v")
        self.assertEqual(r.returncode, 0, r.stderr)
        made = json.loads(r.stdout)
        self.assertEqual((made["inject_into"], made["allow_plain_http"]),
                         (["headers", "query"], True), made)
        s, b = self.api.call("PATCH", "/v1/secrets/OPTED", {"allow_plain_http": False})
        self.assertEqual((s, b["inject_into"], b["allow_plain_http"]),
                         (200, ["headers", "query"], False), b)
        r = run("create", "BADINTO", "--host", "a.test", "--inject-into", "cookies", stdin="v")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("invalid_argument", r.stderr)
        s, b = self.api.call("GET", "/v1/secrets/BADINTO")
        self.assertEqual(s, 404, b)
        self.assertEqual(run("delete", "OPTED").returncode, 0)

    def test_bad_input_limits_and_expiry(self):
        # (a tenant of its own: the quota counts only its secrets)
        s, b = self.api.call("POST", "/v1/keys", {"tenant": "limits"})
        self.assertEqual(s, 201, b)
        c = Api(self.daemon, b["key"])
        good = {"name": "T", "value": "v", "hosts": ["a.test"]}
        for bad in ({"name": "1ABC"}, {"name": "A-B"}, {"name": "A" * 65}, {"name": ""},
                    {"value": ""}, {"value": "x" * 16385}, {"hosts": []},
                    {"hosts": ["a b.test"]}, {"hosts": ["h%d.test" % i for i in range(33)]},
                    {"ttl_seconds": 0}, {"ttl_seconds": 30 * 86400 + 1}, {"bogus": 1}):
            self.assertError(c.call("POST", "/v1/secrets", {**good, **bad}), 400,
                             "invalid_argument")
        for missing in ("name", "value", "hosts"):
            body = {k: v for k, v in good.items() if k != missing}
            self.assertError(c.call("POST", "/v1/secrets", body), 400, "invalid_argument")
        self.assertEqual(c.call("GET", "/v1/secrets")[1]["secrets"], [])
        # The limits themselves are accepted.
        s, b = c.call("POST", "/v1/secrets", {"name": "B" * 64, "value": "x" * 16384,
                                              "hosts": ["h%d.test" % i for i in range(32)],
                                              "ttl_seconds": 30 * 86400})
        self.assertEqual(s, 201, b)
        self.assertError(c.call("PATCH", "/v1/secrets/" + "B" * 64, {}), 400, "invalid_argument")
        self.assertError(c.call("PATCH", "/v1/secrets/NOPE", {"value": "x"}), 404,
                         "secret_not_found")
        self.assertEqual(c.call("DELETE", "/v1/secrets/" + "B" * 64)[0], 204)
        # Expiry: gone once its ttl passed.
        s, b = c.call("POST", "/v1/secrets", {**good, "name": "SHORT", "ttl_seconds": 1})
        self.assertEqual(s, 201, b)
        self.assertAlmostEqual(b["expires_at_ms"] - b["created_at_ms"], 1000, delta=50)
        time.sleep(1.2)
        self.assertError(c.call("GET", "/v1/secrets/SHORT"), 404, "secret_not_found")
        self.assertEqual(c.call("GET", "/v1/secrets")[1]["secrets"], [])
        # At most 100 per tenant.
        for i in range(100):
            s, b = c.call("POST", "/v1/secrets", {**good, "name": f"Q{i}"})
            self.assertEqual(s, 201, b)
        s, b = c.call("POST", "/v1/secrets", {**good, "name": "Q100"})
        self.assertError((s, b), 429, "quota_exceeded")
        self.assertEqual((b["error"]["quota"], b["error"]["limit"], b["error"]["used"]),
                         ("secrets", 100, 100), b)
        for i in range(100):
            self.assertEqual(c.call("DELETE", f"/v1/secrets/Q{i}")[0], 204)


if __name__ == "__main__":
    harness.main()
