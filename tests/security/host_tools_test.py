#!/usr/bin/env python3
"""Root never processes tenant data (security review 3: C1, H4, H5, M3, L5), attacked through the
real daemon. The daemon runs in a private mount namespace of this test's own, where
- canary files are bound over the host files that the absolute symlinks of a Debian tree
  resolve to on the host (/usr/bin/awk -> /etc/alternatives/awk -> /usr/bin/mawk, the
  sitecustomize.py of the host's Python, the zone file of /etc/localtime): a build that wrote
  a tenant's files through the tree on the host would change them;
- debootstrap, chroot, e2fsck and resize2fs are a script that records that it ran and fails:
  builds and volume grows must work without them and never run them.
Builds here take no packages (no mirror traffic: make test sends nothing off the machine); the
long `templates` suite builds base + jq the same way under the same namespace.

Usage: host_tools_test.py --daemon build/bin/pandastackd [--images var/images]
"""
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "api"))
import harness  # noqa: E402
from harness import Api, Daemon  # noqa: E402
from host_guard import wrapper  # noqa: E402

# Tree paths that are absolute symlinks in a Debian root file system: a tenant's file at each.
TENANT_FILES = {
    "/usr/bin/awk": "#!/bin/sh\necho tenant-awk\n",
    "/etc/alternatives/awk": "#!/bin/sh\necho tenant-alternative\n",
    "/etc/localtime": "tenant-localtime\n",
    "/usr/lib/python3.11/sitecustomize.py": "print('tenant')\n",
}
FLAGS = ("--network", "off", "--pool-size", "0", "--spare-pool-size", "0")


class HostToolsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.base = tempfile.mkdtemp(prefix="pst-hosttools-", dir="/var/tmp")
        os.chmod(cls.base, 0o755)
        cls.launcher, cls.canaries, cls.marker = wrapper(cls.base, harness.ARGS.daemon, TENANT_FILES)
        cls.real_daemon = harness.ARGS.daemon
        harness.ARGS.daemon = cls.launcher
        cls.data = os.path.join(cls.base, "data")
        cls.daemon = Daemon(cls.data, os.path.join("/dev/shm", os.path.basename(cls.base)),
                            extra=FLAGS)
        cls.api = Api(cls.daemon)

    @classmethod
    def tearDownClass(cls):
        code = cls.daemon.stop(reap=True)
        harness.ARGS.daemon = cls.real_daemon
        shutil.rmtree(cls.base, ignore_errors=True)
        shutil.rmtree(os.path.join("/dev/shm", os.path.basename(cls.base)), ignore_errors=True)
        assert code == 0, f"daemon exited {code}"

    def assertNoHostToolRan(self):
        ran = ""
        if os.path.exists(self.marker):
            with open(self.marker) as f:
                ran = f.read()
        self.assertEqual(ran, "", "a forbidden host tool ran")

    def assertCanariesIntact(self):
        for target, (canary, content) in self.canaries.items():
            with open(canary) as f:
                self.assertEqual(f.read(), content, f"{target} was written")

    def build(self, api, name, **spec):
        s, t = api.call("POST", "/v1/templates", dict(name=name, **spec))
        self.assertEqual(s, 202, t)
        end = None
        for event, data in api.sse(f"/v1/templates/{name}/build", timeout=600):
            if event == "end":
                end = data
        self.assertEqual(end and end["status"], "ready", end)
        return end

    def sh(self, api, sid, cmd):
        s, r = api.exec(sid, cmd)
        self.assertEqual((s, r.get("exit_code")), (200, 0), r)
        return r["stdout"]

    def test_1_files_at_symlinked_paths_stay_in_the_guest(self):
        """C1/H5: a tenant (not admin) key's build puts files at paths that are absolute
        symlinks of the tree; the host's files they resolve to are untouched, the guest has the
        tenant's content, and no debootstrap or chroot ran."""
        self.assertTrue(self.canaries, "no host target to guard (no /usr/bin/mawk?)")
        s, k = self.api.call("POST", "/v1/keys", {"tenant": "mallory"})
        tenant = Api(self.daemon, key=k["key"])
        self.build(tenant, "pwn", files=TENANT_FILES, env={"WHO": "tenant"},
                   run=["echo ran-in-the-guest > /opt/ran", "ls -l /usr/bin/awk > /opt/awk-link"])
        self.assertCanariesIntact()
        self.assertNoHostToolRan()
        s, sbx = tenant.call("POST", "/v1/sandboxes", {"template": "pwn"})
        self.assertEqual(s, 201, sbx)
        out = self.sh(tenant, sbx["id"], "cat /usr/bin/mawk /etc/localtime /opt/ran; "
                                         "cat /usr/lib/python3.11/sitecustomize.py")
        # (awk -> alternatives/awk -> mawk: the last write through that chain wins, in the guest)
        self.assertIn("echo tenant-", out.splitlines()[1])
        self.assertIn("tenant-localtime\nran-in-the-guest\nprint('tenant')\n", out)
        self.assertIn("/etc/alternatives/awk", self.sh(tenant, sbx["id"], "cat /opt/awk-link"))
        # The template's env reaches every command (exploratory test 3, #16); a request's wins.
        self.assertEqual(self.sh(tenant, sbx["id"], "echo $WHO"), "tenant\n")
        s, r = tenant.exec(sbx["id"], "echo $WHO", env={"WHO": "request"})
        self.assertEqual(r.get("stdout"), "request\n", r)
        tenant.call("DELETE", f"/v1/sandboxes/{sbx['id']}")
        # The template's root file system is a layer on the shipped one, the daemon's file.
        d = os.path.join(self.data, "templates")
        (tid,) = [x for x in os.listdir(d) if x.startswith("pwn.")]
        st = os.stat(os.path.join(d, tid, "rootfs.qcow2"))
        self.assertEqual((st.st_uid, stat.S_IMODE(st.st_mode)), (0, 0o644))
        self.assertEqual(tenant.call("DELETE", "/v1/templates/pwn")[0], 200)
        self.assertCanariesIntact()

    def test_2_same_spec_of_two_tenants_shares_nothing(self):
        """M3: two tenants build the same spec under the same name; each one's sandboxes still
        come from its own build after the other's, and their bakes are keyed apart."""
        spec = {"files": {"/etc/which": "same\n"}, "run": ["echo built > /opt/built-on"]}
        keys = [self.api.call("POST", "/v1/keys", {"tenant": t})[1]["key"] for t in ("ta", "tb")]
        a, b = (Api(self.daemon, key=k) for k in keys)
        self.build(a, "same", **spec)
        s, sa = a.call("POST", "/v1/sandboxes", {"template": "same"})
        self.assertEqual(s, 201, sa)
        self.sh(a, sa["id"], "echo a > /opt/mine && sync")
        self.build(b, "same", **spec)
        # A's creates after B's build: A's template, working.
        for api in (a, b):
            s, sb = api.call("POST", "/v1/sandboxes", {"template": "same"})
            self.assertEqual(s, 201, sb)
            self.assertEqual(self.sh(api, sb["id"], "cat /etc/which /opt/built-on"),
                             "same\nbuilt\n")
            api.call("DELETE", f"/v1/sandboxes/{sb['id']}")
        d = os.path.join(self.data, "templates")
        ids = [x for x in os.listdir(d) if x.startswith("same.")]
        self.assertEqual(len(ids), 2, ids)
        keys = []
        for i in ids:
            with open(os.path.join(d, i, "key")) as f:
                keys.append(f.read())
        k1, k2 = keys
        self.assertNotEqual(k1, k2)
        a.call("DELETE", f"/v1/sandboxes/{sa['id']}")
        for api in (a, b):
            self.assertEqual(api.call("DELETE", "/v1/templates/same")[0], 200)
        self.assertNoHostToolRan()

    def test_3_volumes_grow_in_the_guest(self):
        """H4/L5: a grow extends the file only; the guest's kernel grows the file system at the
        next mount. A file system the guest corrupted fails its next attach cleanly; the host
        ran no e2fsck or resize2fs at any point."""
        s, v = self.api.call("POST", "/v1/volumes", {"size_mib": 64})
        self.assertEqual(s, 201, v)
        vid = v["id"]
        s, g = self.api.call("PATCH", f"/v1/volumes/{vid}", {"size_mib": 128})
        self.assertEqual((s, g.get("size_mib")), (200, 128), g)
        self.assertEqual(os.path.getsize(os.path.join(self.data, "volumes", vid + ".img")),
                         128 << 20)
        att = {"volumes": [{"volume": vid, "mount": "/data"}]}
        s, sbx = self.api.call("POST", "/v1/sandboxes", att)
        self.assertEqual(s, 201, sbx)
        kib = int(self.sh(self.api, sbx["id"], "df -k /data | awk 'NR==2 {print $2}'"))
        self.assertGreater(kib, 100 * 1024, "the file system did not grow with its volume")
        self.sh(self.api, sbx["id"], "echo kept > /data/f && sync")
        # The guest (root in it) writes garbage over its file system's superblock and metadata.
        dev = self.sh(self.api, sbx["id"], "awk '$2==\"/data\" {print $1}' /proc/mounts").strip()
        self.assertTrue(dev.startswith("/dev/vd"), dev)
        self.sh(self.api, sbx["id"],
                f"dd if=/dev/urandom of={dev} bs=1024 seek=1 count=63 conv=notrunc,fsync 2>/dev/null")
        self.api.call("DELETE", f"/v1/sandboxes/{sbx['id']}")
        s, g = self.api.call("PATCH", f"/v1/volumes/{vid}", {"size_mib": 192})
        self.assertEqual((s, g.get("size_mib")), (200, 192), g)  # (the file: nothing parsed)
        s, bad = self.api.call("POST", "/v1/sandboxes", att)
        self.assertNotEqual(s, 201, bad)
        self.assertIn("error", bad)
        s, h = self.api.call("GET", "/healthz")
        self.assertEqual(s, 200, h)
        # The volume is not held by the failed create.
        s, vv = self.api.call("GET", f"/v1/volumes/{vid}")
        self.assertEqual((s, vv.get("attachments")), (200, []), vv)
        self.assertEqual(self.api.call("DELETE", f"/v1/volumes/{vid}")[0], 204)
        self.assertNoHostToolRan()

    def wait_for_line(self, name, text):
        for event, data in self.api.sse(f"/v1/templates/{name}/build", timeout=300):
            if event == "log" and text in data["line"]:
                return
            if event == "end":
                self.fail(f"the build ended before '{text}': {data}")

    def qemus(self):
        out = subprocess.run(["pgrep", "-f", "qemu-system"], capture_output=True, text=True)
        mine = []
        for p in out.stdout.split():
            try:
                with open(f"/proc/{p}/cmdline") as f:
                    if os.path.basename(self.base) in f.read():
                        mine.append(p)
            except OSError:
                pass  # (ended meanwhile)
        return mine

    def test_4_a_build_is_cancelled_by_delete_and_by_a_stop(self):
        """A build can be cancelled (DELETE kills its guest command; exploratory test 3, #19);
        a daemon stopped mid-build stops at once and leaves no work folder, mount or QEMU (#7);
        a shipped template cannot be deleted (409, not 404)."""
        s, b = self.api.call("DELETE", "/v1/templates/base")
        self.assertEqual((s, b["error"]["code"]), (409, "conflict"), b)
        slow = {"run": ["echo sleeping", "sleep 600"]}
        s, t = self.api.call("POST", "/v1/templates", dict(name="slow", **slow))
        self.assertEqual(s, 202, t)
        self.wait_for_line("slow", "+ sleep 600")
        t0 = time.time()
        s, d = self.api.call("DELETE", "/v1/templates/slow")
        self.assertEqual((s, d.get("status")), (200, "deleted"), d)
        self.assertLess(time.time() - t0, 30)
        self.assertEqual(os.listdir(os.path.join(self.data, "templates")), [])
        self.assertEqual(self.qemus(), [])
        # A stop mid-build.
        s, t = self.api.call("POST", "/v1/templates", dict(name="cut", **slow))
        self.assertEqual(s, 202, t)
        self.wait_for_line("cut", "+ sleep 600")
        t0 = time.time()
        self.__class__.daemon.stop()
        self.assertLess(time.time() - t0, 30)
        self.assertEqual(self.qemus(), [])
        mounts = open("/proc/self/mounts").read()
        self.assertNotIn(self.base, mounts)
        self.__class__.daemon = Daemon(self.data, self.daemon.state, extra=FLAGS)
        self.__class__.api = self.api = Api(self.__class__.daemon)
        s, t = self.api.call("GET", "/v1/templates/cut")
        self.assertEqual(t.get("status"), "failed", t)
        self.assertNotIn(self.base, json.dumps(t))  # (no host folder in what a tenant reads)
        self.assertFalse(os.path.exists(os.path.join(self.data, "template-builds", "cut")))
        self.assertEqual(os.listdir(os.path.join(self.data, "template-builds"))
                         if os.path.isdir(os.path.join(self.data, "template-builds")) else [], [])
        self.assertEqual(self.api.call("DELETE", "/v1/templates/cut")[0], 200)
        self.assertNoHostToolRan()


if __name__ == "__main__":
    harness.main()
