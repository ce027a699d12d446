#!/usr/bin/env python3
"""The postgres template through the real daemon, real VMs, the real `psql` client and a real
driver (Debian's python3-psycopg2): a template baked with its cluster made and its server running
on a data volume, so a sandbox of it is a restore with a copy of that volume, serving at once.

Usage: postgres_test.py --daemon build/bin/pandastackd --cli build/bin/pandastack [--images DIR]
Traffic goes only to loopback (the host addresses of the sandboxes' exposed ports).
"""
import argparse
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import psycopg2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Api, Daemon  # noqa: E402


def server_cert(host, port):
    """The certificate a PostgreSQL server presents (its SSLRequest, then TLS), DER bytes."""
    import socket
    import ssl
    with socket.create_connection((host, port), timeout=30) as raw:
        raw.sendall((8).to_bytes(4, "big") + (80877103).to_bytes(4, "big"))
        assert raw.recv(1) == b"S", "the server does not speak TLS"
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        with ctx.wrap_socket(raw) as tls:
            return tls.getpeercert(binary_form=True)


class PostgresTemplateTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.base = tempfile.mkdtemp(prefix="pst-pg-", dir="/var/tmp")
        cls.data = os.path.join(cls.base, "data")
        cls.state = tempfile.mkdtemp(prefix="pst-pg-state-", dir="/dev/shm")
        cls.daemon = Daemon(cls.data, cls.state)
        cls.api = Api(cls.daemon)

    @classmethod
    def tearDownClass(cls):
        code = cls.daemon.stop(reap=True)
        shutil.rmtree(cls.base, ignore_errors=True)
        shutil.rmtree(cls.state, ignore_errors=True)
        assert code == 0, f"daemon exited {code}"

    def database(self, **create):
        """A postgres sandbox with a role and database of its own (a fresh random password) and
        its port exposed: (sandbox id, connection parameters)."""
        s, b = self.api.call("POST", "/v1/sandboxes", {"template": "postgres", **create})
        self.assertEqual(s, 201, b)
        sid = b["id"]
        self.assertEqual([v["mount"] for v in b["volumes"]], ["/var/lib/postgresql"])
        password = secrets.token_hex(16)
        # One psql (a process start is slow in a guest under TCG): two statements, each its own
        # transaction.
        s, r = self.api.exec(sid, "runuser -u postgres -- psql -v ON_ERROR_STOP=1 -qc "
                                  f"\"CREATE ROLE app LOGIN PASSWORD '{password}'\" "
                                  "-c 'CREATE DATABASE app OWNER app'",
                             timeout_seconds=120)
        self.assertEqual((s, r.get("exit_code")), (200, 0), r)
        s, p = self.api.call("POST", f"/v1/sandboxes/{sid}/ports", {"port": 5432})
        self.assertEqual(s, 201, p)
        return sid, dict(host=p["host"], port=p["host_port"], user="app", password=password,
                         dbname="app", connect_timeout=30)

    def connect(self, params):
        deadline = time.time() + 60
        while True:
            try:
                return psycopg2.connect(**params)
            except psycopg2.OperationalError as e:
                if "password authentication failed" in str(e) or time.time() > deadline:
                    raise
                time.sleep(0.5)

    def test_sandboxes_of_the_template_serve_their_own_database(self):
        a, pa = self.database()
        b, pb = self.database()
        self.assertNotEqual(pa["password"], pb["password"])
        # The real psql client through the exposed port.
        env = {**os.environ, "PGPASSWORD": pa["password"]}
        out = subprocess.run(["psql", "-h", pa["host"], "-p", str(pa["port"]), "-U", "app", "-d",
                              "app", "-Atc", "select 1"], env=env, capture_output=True,
                             text=True, timeout=120)
        self.assertEqual((out.returncode, out.stdout), (0, "1\n"), out.stderr)
        with self.connect(pa) as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
            cur.execute("INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 10000) g")
        with self.connect(pa) as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*), max(id) FROM t")
            self.assertEqual(cur.fetchone(), (10000, 10000))
        # The other sandbox has a copy of the baked volume of its own: no table t there.
        with self.connect(pb) as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_tables WHERE tablename = 't'")
            self.assertEqual(cur.fetchone(), (0,))
        # A wrong password is refused; one sandbox's password opens nothing in the other.
        for bad in (dict(pa, password="wrong"), dict(pb, password=pa["password"])):
            with self.assertRaises(psycopg2.OperationalError) as e:
                psycopg2.connect(**bad)
            self.assertIn("password authentication failed", str(e.exception))
        for sid in (a, b):
            vol = self.api.call("GET", f"/v1/sandboxes/{sid}")[1]["volumes"][0]["volume"]
            s, v = self.api.call("GET", f"/v1/volumes/{vol}")
            self.assertEqual(v["origin"], "template:postgres", v)
            self.api.call("DELETE", f"/v1/sandboxes/{sid}")
            self.assertEqual(self.api.call("DELETE", f"/v1/volumes/{vol}")[0], 204)

    def test_rows_survive_hibernate_and_a_daemon_restart(self):
        sid, p = self.database(persistent=True)
        with self.connect(p) as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE kept AS SELECT g AS id FROM generate_series(1, 10000) g")
        self.assertEqual(self.api.call("POST", f"/v1/sandboxes/{sid}/hibernate", {})[0], 200)
        cls = self.__class__
        cls.daemon.stop(sig=signal.SIGKILL)
        cls.daemon = Daemon(cls.data, cls.state)
        cls.api = self.api = Api(cls.daemon)
        s, b = self.api.call("POST", f"/v1/sandboxes/{sid}/wake", {})
        self.assertEqual(s, 200, b)
        s, ports = self.api.call("GET", f"/v1/sandboxes/{sid}/ports")
        p = dict(p, host=ports["ports"][0]["host"], port=ports["ports"][0]["host_port"])
        with self.connect(p) as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM kept")
            self.assertEqual(cur.fetchone(), (10000,))
        vol = self.api.call("GET", f"/v1/sandboxes/{sid}")[1]["volumes"][0]["volume"]
        self.api.call("DELETE", f"/v1/sandboxes/{sid}")
        self.assertEqual(self.api.call("DELETE", f"/v1/volumes/{vol}")[0], 204)


    def test_python_sdk(self):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                        "sdk", "python"))
        import pandastack
        from pandastack import Database
        kw = dict(api_key=self.daemon.key, base_url=self.daemon.url)
        db = Database.create("sdk", metadata={"via": "sdk"}, **kw)
        try:
            self.assertTrue(db.info.password and db.info.password in db.connection_uri)
            with self.connect_uri(db.connection_uri) as conn, conn.cursor() as cur:
                cur.execute("SELECT current_user, current_database()")
                self.assertEqual(cur.fetchone(), ("sdk", "sdk"))
            old = db.connection_uri
            db.rotate_password()
            self.assertNotEqual(db.connection_uri, old)
            with self.connect_uri(db.connection_uri) as conn:
                pass
            self.assertIn(db.id, [d.id for d in Database.list(**kw)])
            self.assertEqual(Database.get(db.id, **kw).info.password, "")
            self.assertIn("database system is ready", db.logs(1000))
            with self.connect_uri(db.connection_uri) as conn, conn.cursor() as cur:
                cur.execute("CREATE TABLE notes AS SELECT 'kept'::text AS v")
            bk = db.backup()
            self.assertEqual([b.id for b in db.backups()], [bk.id])
            copy = Database.create("sdkcopy", from_backup=bk.id, **kw)
            try:
                self.assertEqual(copy.info.restored_from, bk.id)
                with self.connect_uri(copy.connection_uri) as conn, conn.cursor() as cur:
                    cur.execute("SELECT v FROM notes")
                    self.assertEqual(cur.fetchall(), [("kept",)])
            finally:
                copy.delete()
            db.delete_backup(bk.id)
            self.assertEqual(db.backups(), [])
        finally:
            db.delete()
        with self.assertRaises(pandastack.DatabaseNotFound):
            Database.get(db.id, **kw)

    def test_cli(self):
        env = {**os.environ, "PANDASTACK_API_KEY": self.daemon.key,
               "PANDASTACK_BASE_URL": self.daemon.url}

        def cli(*a, code=0):
            r = subprocess.run([harness.ARGS.cli, *a], env=env, capture_output=True, text=True,
                               timeout=300)
            self.assertEqual(r.returncode, code, (a, r.stdout, r.stderr))
            return r.stdout
        uri = cli("db", "create", "clidb").strip()
        self.assertTrue(uri.startswith("postgresql://clidb:"), uri)
        with self.connect_uri(uri) as conn, conn.cursor() as cur:
            cur.execute("SELECT 1")
        listed = cli("db", "list")
        self.assertIn("clidb", listed)
        did = [line.split()[0] for line in listed.splitlines() if " clidb " in line][0]
        new = cli("db", "rotate-password", did).strip()
        self.assertNotEqual(new, uri)
        self.assertIn("database system is ready", cli("db", "logs", did, "--lines", "1000"))
        r = subprocess.run([harness.ARGS.cli, "db", "psql", did, "--", "-qAt"], env=env,
                           input="CREATE TABLE t AS SELECT 42 AS x; SELECT x FROM t;",
                           capture_output=True, text=True, timeout=300)
        self.assertEqual((r.returncode, r.stdout.strip()), (0, "42"), r.stderr)
        bk = cli("db", "backup", did).strip()
        self.assertTrue(bk.startswith("bk_"), bk)
        self.assertIn(bk, cli("db", "backups", did))
        copy = cli("db", "restore", bk, "clicopy").strip()
        with self.connect_uri(copy) as conn, conn.cursor() as cur:
            cur.execute("SELECT x FROM t")
            self.assertEqual(cur.fetchall(), [(42,)])
        cli("db", "backup-delete", did, bk)
        self.assertNotIn(bk, cli("db", "backups", did))
        copy_id = [line.split()[0] for line in cli("db", "list").splitlines()
                   if " clicopy " in line][0]
        cli("db", "delete", copy_id)
        cli("db", "delete", did)
        cli("db", "get", did, code=1)

    def connect_uri(self, uri):
        return psycopg2.connect(uri, connect_timeout=30)

    def assertError(self, got, status, code):
        s, b = got
        self.assertEqual((s, b.get("error", {}).get("code")), (status, code), b)

    def test_managed_databases(self):
        s, a = self.api.call("POST", "/v1/databases", {"name": "shop", "metadata": {"team": "x"}})
        self.assertEqual(s, 201, a)
        self.assertTrue(a["id"].startswith("db_") and len(a["id"]) == 19, a)
        self.assertEqual((a["status"], a["user"], a["database"], a["port"] > 0),
                         ("running", "shop", "shop", True), a)
        self.assertIn(":" + a["password"] + "@", a["connection_uri"])
        # A SQL keyword is a name like any other (quoted in SQL; exploratory test 3 #8).
        s, b = self.api.call("POST", "/v1/databases", {"name": "user"})
        self.assertEqual(s, 201, b)
        self.assertEqual((b["user"], b["database"]), ("user", "user"), b)
        self.assertNotEqual(a["password"], b["password"])
        # Each database presents a TLS key of its own (security review 3, L4), named for it.
        certs = [server_cert(d["host"], d["port"]) for d in (a, b)]
        self.assertNotEqual(certs[0], certs[1])
        self.assertIn(a["id"].encode(), certs[0])  # its CN
        # GET never shows the password again.
        s, got = self.api.call("GET", f"/v1/databases/{a['id']}")
        self.assertNotIn("password", got)
        self.assertNotIn(a["password"], got["connection_uri"])
        self.assertEqual(got["connection_uri"],
                         f"postgresql://shop@{a['host']}:{a['port']}/shop")
        with psycopg2.connect(a["connection_uri"], connect_timeout=30) as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE t AS SELECT g AS id FROM generate_series(1, 10000) g")
        with psycopg2.connect(b["connection_uri"], connect_timeout=30) as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_tables WHERE tablename = 't'")
            self.assertEqual(cur.fetchone(), (0,))
        # Another database's password, a wrong one, the superuser: refused.
        for uri in (a["connection_uri"].replace(a["password"], b["password"]),
                    a["connection_uri"].replace(a["password"], "wrong"),
                    a["connection_uri"].replace("shop:", "postgres:", 1)):
            with self.assertRaises(psycopg2.OperationalError):
                psycopg2.connect(uri, connect_timeout=30)
        # A new password: the old one stops working.
        s, r = self.api.call("POST", f"/v1/databases/{a['id']}/rotate-password", {})
        self.assertEqual(s, 200, r)
        with self.assertRaises(psycopg2.OperationalError):
            psycopg2.connect(a["connection_uri"], connect_timeout=30)
        with psycopg2.connect(r["connection_uri"], connect_timeout=30) as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM t")
            self.assertEqual(cur.fetchone(), (10000,))
        s, logs = self.api.call("GET", f"/v1/databases/{a['id']}/logs?lines=50")
        self.assertEqual(s, 200, logs)
        self.assertIn("password authentication failed", logs["log"])
        # Hibernated, the daemon killed and restarted, woken: the rows are there, the URI works.
        s, h = self.api.call("POST", f"/v1/databases/{a['id']}/hibernate", {})
        self.assertEqual((s, h["status"], h["host"]), (200, "hibernated", ""), h)
        self.assertError(self.api.call("POST", f"/v1/databases/{a['id']}/rotate-password", {}),
                         409, "database_hibernated")
        cls = self.__class__
        cls.daemon.stop(sig=signal.SIGKILL)
        cls.daemon = Daemon(cls.data, cls.state)
        cls.api = self.api = Api(cls.daemon)
        s, w = self.api.call("POST", f"/v1/databases/{a['id']}/wake", {})
        self.assertEqual(s, 200, w)
        self.assertEqual(w["status"], "running", w)
        uri = w["connection_uri"].replace("shop@", f"shop:{r['password']}@", 1)
        with psycopg2.connect(uri, connect_timeout=30) as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM t")
            self.assertEqual(cur.fetchone(), (10000,))
        self.assertEqual([d["id"] for d in self.api.call("GET", "/v1/databases")[1]["databases"]],
                         sorted([a["id"], b["id"]]) if a["id"] < b["id"] else [b["id"], a["id"]])
        # No password reached the event log.
        s, ev = self.api.call("GET", "/v1/audit?limit=10000")
        text = str(ev)
        for pw in (a["password"], b["password"], r["password"]):
            self.assertNotIn(pw, text)
        kinds = [e["type"] for e in ev["events"] if e["stream"] == a["id"]]
        self.assertEqual(kinds, ["database-created", "database-credentials-rotated",
                                 "database-hibernated", "database-woken"])
        # Bad input.
        self.assertError(self.api.call("POST", "/v1/databases", {"name": "Bad-Name"}), 400,
                         "invalid_argument")
        self.assertError(self.api.call("POST", "/v1/databases", {}), 400, "invalid_argument")
        # PostgreSQL's own names: refused before anything starts.
        for kept in ("postgres", "pg_x", "template1", "public"):
            self.assertError(self.api.call("POST", "/v1/databases", {"name": kept}), 400,
                             "invalid_argument")
        self.assertError(self.api.call("GET", "/v1/databases/db_aaaaaaaaaaaaaaaa"), 404,
                         "database_not_found")
        self.assertError(self.api.call("GET", f"/v1/databases/{a['id']}/logs?lines=0"), 400,
                         "invalid_argument")
        for bk in ("b", "bk_aaaaaaaaaaaaaaaa"):
            self.assertError(self.api.call("POST", "/v1/databases",
                                           {"name": "x", "from_backup": bk}),
                             404, "backup_not_found")
        self.assertError(self.api.call("DELETE", f"/v1/databases/{a['id']}/backups/bk_x"), 404,
                         "backup_not_found")
        self.assertError(self.api.call("POST", f"/v1/databases/{a['id']}/backups", {"x": 1}), 400,
                         "invalid_argument")
        s, k = self.api.call("POST", "/v1/keys", {"tenant": "dbother"})
        other = Api(self.daemon, key=k["key"])
        self.assertError(other.call("GET", f"/v1/databases/{a['id']}"), 404, "database_not_found")
        self.assertEqual(other.call("GET", "/v1/databases")[1]["databases"], [])
        # Delete: its sandbox and its data volume go.
        for d in (a, b):
            self.assertEqual(self.api.call("DELETE", f"/v1/databases/{d['id']}")[0], 204)
            self.assertError(self.api.call("GET", f"/v1/databases/{d['id']}"), 404,
                             "database_not_found")
            self.assertError(self.api.call("GET", f"/v1/volumes/{d['volume']}"), 404,
                             "volume_not_found")
            self.assertEqual(self.api.call("GET", f"/v1/sandboxes/{d['sandbox']}")[1]["state"],
                             "stopped")

    def test_a_database_reports_what_its_sandbox_is(self):
        """exploratory-test-3 defects 1 and 2: a database said `running` on port 0 after a
        graceful restart (and its wake did nothing), or after its sandbox was killed, hibernated
        through /v1/sandboxes or its QEMU killed. Now the sandbox routes refuse a database's
        sandbox, and the database's status is its sandbox's real state."""
        s, a = self.api.call("POST", "/v1/databases", {"name": "honest"})
        self.assertEqual(s, 201, a)
        sbx = a["sandbox"]
        for method, path, body in (("DELETE", f"/v1/sandboxes/{sbx}", None),
                                   ("POST", f"/v1/sandboxes/{sbx}/hibernate", {}),
                                   ("POST", f"/v1/sandboxes/{sbx}/wake", {}),
                                   ("PATCH", f"/v1/sandboxes/{sbx}", {"ttl_seconds": 60}),
                                   ("PATCH", f"/v1/sandboxes/{sbx}", {"metadata": {}}),
                                   ("DELETE", f"/v1/sandboxes/{sbx}/ports/5432", None)):
            s, b = self.api.call(method, path, body)
            self.assertEqual((s, b.get("error", {}).get("code")), (409, "managed_by_database"),
                             (method, path, b))
            self.assertIn(a["id"], b["error"]["message"])
        self.assertEqual(self.api.call("GET", f"/v1/sandboxes/{sbx}")[1]["state"], "running")
        # A sandbox that only claims to be a database's is not one.
        s, fake = self.api.call("POST", "/v1/sandboxes",
                                {"template": "base", "metadata": {"pandastack.database": a["id"]}})
        self.assertEqual(s, 201, fake)
        self.assertEqual(self.api.call("DELETE", f"/v1/sandboxes/{fake['id']}")[0], 200)
        # A graceful restart hibernates it: it says so, and a wake brings it back on a new port.
        cls = self.__class__
        self.assertEqual(cls.daemon.stop(), 0)
        cls.daemon = Daemon(cls.data, cls.state)
        cls.api = self.api = Api(cls.daemon)
        s, got = self.api.call("GET", f"/v1/databases/{a['id']}")
        self.assertEqual((s, got["status"], got["host"], got["port"], got["connection_uri"]),
                         (200, "hibernated", "", 0, ""), got)
        self.assertError(self.api.call("POST", f"/v1/databases/{a['id']}/rotate-password", {}),
                         409, "database_hibernated")
        s, w = self.api.call("POST", f"/v1/databases/{a['id']}/wake", {})
        self.assertEqual((s, w["status"], w["port"] > 0), (200, "running", True), w)
        uri = w["connection_uri"].replace("honest@", f"honest:{a['password']}@", 1)
        with psycopg2.connect(uri, connect_timeout=30) as conn, conn.cursor() as cur:
            cur.execute("SELECT 1")
            self.assertEqual(cur.fetchone(), (1,))
        # Its VM dies: failed, with the reason; nothing answers success; delete still cleans up.
        pid = harness.qemu_pid(self.state, sbx)
        self.assertIsNotNone(pid)
        os.kill(pid, signal.SIGKILL)
        deadline = time.time() + 30
        while time.time() < deadline:
            got = self.api.call("GET", f"/v1/databases/{a['id']}")[1]
            if got["status"] != "running":
                break
            time.sleep(0.2)
        self.assertEqual(got["status"], "failed", got)
        self.assertIn("QEMU was killed by signal 9", got["failure_reason"])
        self.assertEqual((got["host"], got["port"]), ("", 0), got)
        for path in ("wake", "hibernate", "rotate-password", "backups"):
            s, b = self.api.call("POST", f"/v1/databases/{a['id']}/{path}", {})
            self.assertEqual((s, b["error"]["code"]), (409, "database_failed"), (path, b))
            self.assertIn(a["volume"], b["error"]["message"])
        self.assertError(self.api.call("GET", f"/v1/databases/{a['id']}/logs"), 409,
                         "database_failed")
        self.assertEqual(self.api.call("GET", f"/v1/volumes/{a['volume']}")[0], 200)
        self.assertEqual(self.api.call("DELETE", f"/v1/databases/{a['id']}")[0], 204)
        self.assertError(self.api.call("GET", f"/v1/volumes/{a['volume']}"), 404,
                         "volume_not_found")

    def test_backup_and_restore(self):
        s, a = self.api.call("POST", "/v1/databases", {"name": "orig"})
        self.assertEqual(s, 201, a)
        with psycopg2.connect(a["connection_uri"], connect_timeout=30) as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE items (id serial PRIMARY KEY, v text NOT NULL)")
            cur.execute("INSERT INTO items (v) SELECT md5(g::text) FROM generate_series(1, 10000) g")
            cur.execute("SELECT md5(string_agg(v, ',' ORDER BY id)) FROM items")
            digest = cur.fetchone()[0]
        s, bk = self.api.call("POST", f"/v1/databases/{a['id']}/backups", {})
        self.assertEqual(s, 201, bk)
        self.assertTrue(bk["id"].startswith("bk_") and len(bk["id"]) == 19, bk)
        self.assertGreater(bk["bytes"], 1000, bk)
        self.assertEqual((bk["database"], bk["format"]), (a["id"], "pg_dump-custom"))
        dump = os.path.join(self.data, "backups", a["id"], bk["id"] + ".dump")
        self.assertEqual(os.path.getsize(dump), bk["bytes"])
        s, listed = self.api.call("GET", f"/v1/databases/{a['id']}/backups")
        self.assertEqual([b["id"] for b in listed["backups"]], [bk["id"]])
        self.assertEqual([b["id"] for b in
                          self.api.call("GET", f"/v1/databases/{a['id']}")[1]["backups"]],
                         [bk["id"]])
        # Rows written after the backup are not in it.
        with psycopg2.connect(a["connection_uri"], connect_timeout=30) as conn, conn.cursor() as cur:
            cur.execute("INSERT INTO items (v) VALUES ('later')")
        # Restored into a new database: its own role owns the rows, which match the backup's.
        s, c = self.api.call("POST", "/v1/databases", {"name": "copy", "from_backup": bk["id"]})
        self.assertEqual(s, 201, c)
        self.assertEqual(c["restored_from"], bk["id"])
        self.assertNotEqual(c["password"], a["password"])
        with psycopg2.connect(c["connection_uri"], connect_timeout=30) as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*), md5(string_agg(v, ',' ORDER BY id)) FROM items")
            self.assertEqual(cur.fetchone(), (10000, digest))
            cur.execute("SELECT tableowner FROM pg_tables WHERE tablename = 'items'")
            self.assertEqual(cur.fetchone(), ("copy",))
            cur.execute("INSERT INTO items (v) VALUES ('mine') RETURNING id")
            self.assertEqual(cur.fetchone(), (10001,))  # the sequence came along
        # Another tenant cannot restore it; a hibernated database cannot be backed up.
        s, k = self.api.call("POST", "/v1/keys", {"tenant": "bkother"})
        other = Api(self.daemon, key=k["key"])
        self.assertError(other.call("POST", "/v1/databases", {"name": "steal",
                                                              "from_backup": bk["id"]}),
                         404, "backup_not_found")
        self.assertError(other.call("POST", f"/v1/databases/{a['id']}/backups", {}), 404,
                         "database_not_found")
        self.assertEqual(self.api.call("POST", f"/v1/databases/{a['id']}/hibernate", {})[0], 200)
        self.assertError(self.api.call("POST", f"/v1/databases/{a['id']}/backups", {}), 409,
                         "database_hibernated")
        self.assertEqual(self.api.call("POST", f"/v1/databases/{a['id']}/wake", {})[0], 200)
        s, bk2 = self.api.call("POST", f"/v1/databases/{a['id']}/backups", {})
        self.assertEqual(s, 201, bk2)
        self.assertGreater(bk2["bytes"], 0)
        # Deleting a backup; deleting the database takes the rest.
        self.assertEqual(
            self.api.call("DELETE", f"/v1/databases/{a['id']}/backups/{bk['id']}")[0], 204)
        self.assertFalse(os.path.exists(dump))
        self.assertError(self.api.call("DELETE", f"/v1/databases/{a['id']}/backups/{bk['id']}"),
                         404, "backup_not_found")
        self.assertEqual([b["id"] for b in self.api.call(
            "GET", f"/v1/databases/{a['id']}/backups")[1]["backups"]], [bk2["id"]])
        s, ev = self.api.call("GET", "/v1/audit?limit=10000")
        kinds = [e["type"] for e in ev["events"] if e["stream"] == a["id"]]
        self.assertEqual(kinds.count("database-backed-up"), 2, kinds)
        self.assertEqual(kinds.count("database-backup-deleted"), 1, kinds)
        for d in (a, c):
            self.assertEqual(self.api.call("DELETE", f"/v1/databases/{d['id']}")[0], 204)
        self.assertFalse(os.path.exists(os.path.join(self.data, "backups", a["id"])))
        self.assertError(self.api.call("POST", "/v1/databases",
                                       {"name": "late", "from_backup": bk2["id"]}),
                         404, "backup_not_found")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    p.add_argument("--cli", required=True)
    p.add_argument("--images", default=os.environ.get("PANDASTACK_IMAGES", "var/images"))
    args, rest = p.parse_known_args()
    args.images = os.path.abspath(args.images)
    harness.ARGS = args
    harness.run_unittests(rest)
