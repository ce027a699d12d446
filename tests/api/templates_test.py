#!/usr/bin/env python3
"""Custom templates through the real daemon: a real build (`base` plus jq, fetched from the
machine's Debian mirror as .deb files and installed in a builder microVM with the files,
environment and commands, then the bake) with a shape of its own
(384 MiB, 2 vCPUs: its sandboxes', their wakes' and forks' guests, the quota use, creates asking
for more refused), its progress as server-sent events, sandboxes made from it, tenancy, a
restart, delete (refused while a sandbox of it runs), failed builds that leave nothing (a
failing command, an unknown package), two builds of one name, publish, a Dockerfile's build, and
bad input.

Usage: templates_test.py --daemon build/bin/pandastackd [--images DIR]
The data folder (template images, the package cache) is on a real disk (/var/tmp).
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import oci_archives as oa  # noqa: E402
from harness import Api, Daemon  # noqa: E402
from host_guard import wrapper  # noqa: E402

FLAGS = ("--network", "off", "--pool-size", "1", "--spare-pool-size", "0",
         "--quota-templates", "3", "--template-image-mib", "64", "--build-context-mib", "8")


class TemplateTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.base = tempfile.mkdtemp(prefix="pst-tpl-", dir="/var/tmp")
        os.chmod(cls.base, 0o755)
        # The whole suite runs without debootstrap, chroot, e2fsck or resize2fs on the host, and
        # with a canary over the host file a symlinked path of the build's files names.
        cls.launcher, cls.canaries, cls.marker = wrapper(cls.base, harness.ARGS.daemon,
                                                         ["/etc/localtime"])
        cls.real_daemon, harness.ARGS.daemon = harness.ARGS.daemon, cls.launcher
        cls.data = os.path.join(cls.base, "data")
        cls.state = tempfile.mkdtemp(prefix="pst-tpl-state-", dir="/dev/shm")
        cls.daemon = Daemon(cls.data, cls.state, extra=FLAGS)
        cls.api = Api(cls.daemon)

    @classmethod
    def tearDownClass(cls):
        code = cls.daemon.stop(reap=True)
        harness.ARGS.daemon = cls.real_daemon
        ran = open(cls.marker).read() if os.path.exists(cls.marker) else ""
        intact = all(open(c).read() == content for c, content in cls.canaries.values())
        shutil.rmtree(cls.base, ignore_errors=True)
        assert ran == "", f"a forbidden host tool ran: {ran}"
        assert intact, "a host file under a canary was written"
        shutil.rmtree(cls.state, ignore_errors=True)
        assert code == 0, f"daemon exited {code}"

    def assertError(self, got, status, code):
        s, b = got
        self.assertEqual((s, b.get("error", {}).get("code") if isinstance(b, dict) else b),
                         (status, code), b)

    def follow(self, name):
        """The build's events: (stages [(stage, percent)], log lines, the end's template)."""
        stages, lines, end = [], [], None
        for event, data in self.api.sse(f"/v1/templates/{name}/build", timeout=900):
            if event == "stage":
                stages.append((data["stage"], data["percent"]))
            elif event == "log":
                lines.append(data["line"])
            elif event == "end":
                end = data
        return stages, lines, end

    def check_shape(self, sid):
        """The sandbox's guest has 2 vCPUs and 384 MiB (less what the kernel keeps), as its
        record says."""
        s, b = self.api.call("GET", f"/v1/sandboxes/{sid}")
        self.assertEqual((b["memory_mib"], b["vcpus"]), (384, 2), b)
        s, r = self.api.exec(sid, "nproc; awk '/MemTotal/ {print $2}' /proc/meminfo")
        self.assertEqual(s, 200, r)
        cpus, kib = r["stdout"].split()
        self.assertEqual(cpus, "2", r)
        self.assertTrue(300 * 1024 < int(kib) <= 384 * 1024, r)

    def custom_dirs(self):
        d = os.path.join(self.data, "templates")
        return os.listdir(d) if os.path.isdir(d) else []

    def test_1_a_build_its_progress_and_its_sandboxes(self):
        spec = {"name": "jq-tools", "packages": ["jq"],
                "files": {"/etc/pandastack-test": "hello from a file\n",
                          "/etc/localtime": "a symlink of the tree\n"},
                "env": {"MODE": "it's on"},
                "run": ["echo built: $MODE > /workspace/marker", "jq --version > /workspace/jqv"],
                "memory_mib": 384, "vcpus": 2}
        s, t = self.api.call("POST", "/v1/templates", spec)
        self.assertEqual((s, t["status"], t["name"]), (202, "building", "jq-tools"), t)
        # One build of a name at a time; one build on this host at a time.
        self.assertError(self.api.call("POST", "/v1/templates", spec), 409, "conflict")
        self.assertError(self.api.call("POST", "/v1/templates", dict(spec, name="other")),
                         429, "too_many_requests")
        stages, lines, end = self.follow("jq-tools")
        self.assertEqual(end["status"], "ready", (end, lines[-30:]))
        names = [st for st, _ in stages]
        for st in ("packages", "builder", "bake", "ready"):
            self.assertIn(st, names, stages)
        percents = [p for _, p in stages]
        self.assertEqual(percents, sorted(percents), stages)
        self.assertEqual(percents[-1], 100)
        self.assertTrue(any(l.startswith("packages: installing") and "jq_" in l for l in lines),
                        lines[:40])  # dpkg's, in the builder
        self.assertIn("+ echo built: $MODE > /workspace/marker", lines)  # the commands'
        self.assertGreater(end["size_bytes"], 1 << 20)
        self.assertGreater(end["build_ms"], 0)
        self.assertEqual((end["memory_mib"], end["vcpus"]), (384, 2), end)
        # Listed with the shipped ones.
        s, b = self.api.call("GET", "/v1/templates")
        kinds = {t["name"]: t["kind"] for t in b["templates"]}
        self.assertEqual((kinds.get("base"), kinds.get("jq-tools")), ("shipped", "custom"), b)
        # A sandbox of it: its package, its files, what its commands left, its environment.
        s, sbx = self.api.call("POST", "/v1/sandboxes", {"template": "jq-tools"})
        self.assertEqual((s, sbx.get("template")), (201, "jq-tools"), sbx)
        sid = sbx["id"]
        s, r = self.api.exec(sid, "jq -n '1+1'; cat /etc/pandastack-test /workspace/marker; "
                                  ". /etc/profile.d/pandastack-template.sh; echo $MODE; "
                                  "cat /etc/localtime")
        self.assertEqual((s, r["stdout"]), (200, "2\nhello from a file\nbuilt: it's on\nit's on\n"
                                                 "a symlink of the tree\n"), r)
        self.check_shape(sid)
        # A create may not ask for more than the template's shape; asking for less gets it.
        self.assertError(self.api.call("POST", "/v1/sandboxes",
                                       {"template": "jq-tools", "memory_mib": 512}),
                         400, "exceeds_template")
        self.assertError(self.api.call("POST", "/v1/sandboxes",
                                       {"template": "jq-tools", "vcpus": 3}),
                         400, "exceeds_template")
        self.assertError(self.api.call("POST", "/v1/sandboxes", {"memory_mib": 4096}),
                         400, "exceeds_template")  # (base: the host's 256 MiB)
        s, small = self.api.call("POST", "/v1/sandboxes",
                                 {"template": "jq-tools", "memory_mib": 256, "vcpus": 1})
        self.assertEqual((s, small.get("memory_mib"), small.get("vcpus")), (201, 384, 2), small)
        # The quota counts each sandbox's own memory.
        s, q = self.api.call("GET", "/v1/quotas")
        self.assertEqual(q["use"]["memory_mib"], 2 * 384, q)
        self.api.call("DELETE", f"/v1/sandboxes/{small['id']}")
        # Its fork's children and its wakes have its shape too.
        s, f = self.api.call("POST", f"/v1/sandboxes/{sid}/fork", {"count": 1})
        self.assertEqual(s, 201, f)
        child = f["sandboxes"][0]["id"]
        self.check_shape(child)
        self.api.call("DELETE", f"/v1/sandboxes/{child}")
        s, h = self.api.call("POST", f"/v1/sandboxes/{sid}/hibernate")
        self.assertEqual((s, h.get("state")), (200, "hibernated"), h)
        s, w = self.api.call("POST", f"/v1/sandboxes/{sid}/wake")
        self.assertEqual((s, w.get("state")), (200, "running"), w)
        self.check_shape(sid)
        # Published, its sandbox's shape is the new template's.
        s, pub = self.api.call("POST", f"/v1/sandboxes/{sid}/template", {"name": "jq-pub"})
        self.assertEqual((s, pub.get("memory_mib"), pub.get("vcpus")), (201, 384, 2), pub)
        s, ps = self.api.call("POST", "/v1/sandboxes", {"template": "jq-pub"})
        self.assertEqual(s, 201, ps)
        self.check_shape(ps["id"])
        self.api.call("DELETE", f"/v1/sandboxes/{ps['id']}")
        self.assertEqual(self.api.call("DELETE", "/v1/templates/jq-pub")[0], 200)
        # Another tenant neither sees it nor makes sandboxes of it.
        s, k = self.api.call("POST", "/v1/keys", {"tenant": "other"})
        other = Api(self.daemon, key=k["key"])
        self.assertError(other.call("POST", "/v1/sandboxes", {"template": "jq-tools"}),
                         404, "template_not_found")
        self.assertError(other.call("GET", "/v1/templates/jq-tools"), 404, "template_not_found")
        s, b = other.call("GET", "/v1/templates")
        self.assertNotIn("jq-tools", [t["name"] for t in b["templates"]])
        # A restart keeps it (its stream is replayed).
        self.__class__.daemon.stop()
        self.__class__.daemon = Daemon(self.data, self.state, extra=FLAGS)
        self.__class__.api = self.api = Api(self.__class__.daemon)
        s, t = self.api.call("GET", "/v1/templates/jq-tools")
        self.assertEqual((s, t["status"]), (200, "ready"), t)
        s, sbx = self.api.call("POST", "/v1/sandboxes", {"template": "jq-tools"})
        self.assertEqual(s, 201, sbx)
        s, r = self.api.exec(sbx["id"], "jq -n '2*3'")
        self.assertEqual(r["stdout"], "6\n", r)
        # Deleted only once no sandbox of it is left.
        self.assertError(self.api.call("DELETE", "/v1/templates/jq-tools"), 409, "template_in_use")
        self.api.call("DELETE", f"/v1/sandboxes/{sbx['id']}")
        s, t = self.api.call("DELETE", "/v1/templates/jq-tools")
        self.assertEqual((s, t["status"]), (200, "deleted"), t)
        self.assertError(self.api.call("GET", "/v1/templates/jq-tools"), 404, "template_not_found")
        self.assertError(self.api.call("POST", "/v1/sandboxes", {"template": "jq-tools"}),
                         404, "template_not_found")
        self.assertEqual(self.custom_dirs(), [])
        # Its life is in the audit log.
        s, ev = self.api.call("GET", "/v1/audit?limit=10000")
        kinds = [e["type"] for e in ev["events"] if e["stream"].startswith("tpl_jq-tools.")]
        self.assertEqual(kinds, ["template-build-started", "template-built", "template-deleted"])

    def test_2_failed_builds_leave_nothing(self):
        s, t = self.api.call("POST", "/v1/templates",
                             {"name": "bad-run", "run": ["echo about to fail", "exit 3"]})
        self.assertEqual(s, 202, t)
        stages, lines, end = self.follow("bad-run")
        self.assertEqual(end["status"], "failed", end)
        self.assertIn("the template's commands failed (exit 3): + exit 3", end["error"])
        self.assertIn("about to fail", end["log_tail"])
        self.assertEqual(stages[-1][0], "failed")
        self.assertEqual(self.custom_dirs(), [])
        self.assertError(self.api.call("POST", "/v1/sandboxes", {"template": "bad-run"}),
                         404, "template_not_found")
        # An unknown package: apt on the host knows no such package.
        s, t = self.api.call("POST", "/v1/templates",
                             {"name": "bad-pkg", "packages": ["no-such-package-pandastack"]})
        self.assertEqual(s, 202, t)
        stages, lines, end = self.follow("bad-pkg")
        self.assertEqual(end["status"], "failed", end)
        self.assertIn("Unable to locate package no-such-package-pandastack", end["error"])
        self.assertNotIn(self.base, json.dumps([end, lines]))  # (no host folder shown)
        self.assertEqual(self.custom_dirs(), [])
        # A failed template is listed with why, and may be built again (or deleted).
        s, t = self.api.call("GET", "/v1/templates/bad-pkg")
        self.assertEqual((t["status"], bool(t["error"])), ("failed", True), t)
        s, t = self.api.call("DELETE", "/v1/templates/bad-pkg")
        self.assertEqual(s, 200, t)

    def test_4_publish_a_sandbox(self):
        s, src = self.api.call("POST", "/v1/sandboxes", {})
        self.assertEqual(s, 201, src)
        s, r = self.api.exec(src["id"], "echo on-disk > /opt/marker; echo in-memory > /tmp/mem; "
                                        "nohup sleep 900 >/dev/null 2>&1 & echo ok")
        self.assertEqual(r["stdout"], "ok\n", r)
        s, t = self.api.call("POST", f"/v1/sandboxes/{src['id']}/template", {"name": "mine"})
        self.assertEqual((s, t.get("status"), t.get("sandbox"), t.get("from")),
                         (201, "ready", src["id"], "base"), t)
        # Its sandboxes start from that instant: disk, tmpfs and the running process.
        kids = []
        for _ in range(2):
            s, k = self.api.call("POST", "/v1/sandboxes", {"template": "mine"})
            self.assertEqual((s, k.get("template")), (201, "mine"), k)
            kids.append(k["id"])
        check = "cat /opt/marker /tmp/mem; cat /proc/[0-9]*/comm | grep -c '^sleep$'"
        for k in kids:
            s, r = self.api.exec(k, check)
            self.assertEqual(r["stdout"], "on-disk\nin-memory\n1\n", r)
        self.api.exec(kids[0], "echo changed > /opt/marker")
        s, r = self.api.exec(kids[1], "cat /opt/marker")
        self.assertEqual(r["stdout"], "on-disk\n")  # each its own
        s, r = self.api.exec(src["id"], "cat /tmp/mem")
        self.assertEqual((s, r["stdout"]), (200, "in-memory\n"), r)  # the source runs on
        s, b = self.api.call("GET", f"/v1/sandboxes/{src['id']}")
        self.assertEqual(b["snapshots"], [])  # (the snapshot it took is gone)
        self.assertError(self.api.call("POST", f"/v1/sandboxes/{src['id']}/template",
                                       {"name": "mine"}), 409, "conflict")
        self.assertError(self.api.call("POST", f"/v1/sandboxes/{src['id']}/template",
                                       {"name": "No"}), 400, "invalid_argument")
        self.assertError(self.api.call("POST", f"/v1/sandboxes/{src['id']}/template",
                                       {"name": "base"}), 409, "conflict")
        # One published from a sandbox of it keeps it.
        s, t2 = self.api.call("POST", f"/v1/sandboxes/{kids[0]}/template", {"name": "mine2"})
        self.assertEqual((s, t2.get("from")), (201, "mine"), t2)
        # At most 3 templates per tenant here (--quota-templates 3).
        def customs():
            s, b = self.api.call("GET", "/v1/templates")
            return [t["name"] for t in b["templates"] if t["kind"] == "custom"]
        fillers = []
        while len(customs()) < 3:
            fillers.append(f"fill-{len(fillers)}")
            s, t = self.api.call("POST", f"/v1/sandboxes/{kids[1]}/template", {"name": fillers[-1]})
            self.assertEqual(s, 201, t)
        self.assertError(self.api.call("POST", f"/v1/sandboxes/{kids[1]}/template",
                                       {"name": "one-more"}), 429, "quota_exceeded")
        self.assertError(self.api.call("POST", "/v1/templates", {"name": "one-more"}),
                         429, "quota_exceeded")
        for f in fillers:
            self.assertEqual(self.api.call("DELETE", f"/v1/templates/{f}")[0], 200)
        for k in kids + [src["id"]]:
            self.api.call("DELETE", f"/v1/sandboxes/{k}")
        self.assertError(self.api.call("DELETE", "/v1/templates/mine"), 409, "template_in_use")
        s, k = self.api.call("POST", "/v1/sandboxes", {"template": "mine2"})
        s, r = self.api.exec(k["id"], "cat /opt/marker")
        self.assertEqual(r["stdout"], "changed\n", r)
        self.api.call("DELETE", f"/v1/sandboxes/{k['id']}")
        for name in ("mine2", "mine"):
            s, t = self.api.call("DELETE", f"/v1/templates/{name}")
            self.assertEqual(s, 200, t)
        self.assertEqual(self.custom_dirs(), [])

    def test_5_a_build_over_its_time_fails_and_leaves_nothing(self):
        """A build's bound: past --template-build-timeout its guest command is killed, the build
        fails with why, and nothing of it is left."""
        self.__class__.daemon.stop()
        self.__class__.daemon = Daemon(self.data, self.state,
                                       extra=FLAGS + ("--template-build-timeout", "30"))
        self.__class__.api = self.api = Api(self.__class__.daemon)
        try:
            s, t = self.api.call("POST", "/v1/templates",
                                 {"name": "slow", "run": ["echo sleeping", "sleep 600"]})
            self.assertEqual(s, 202, t)
            stages, lines, end = self.follow("slow")
            self.assertEqual(end["status"], "failed", end)
            self.assertIn("did not finish before the build's deadline", end["error"])
            self.assertLess(end["ended_at_ms"] - end["created_at_ms"], 120_000, end)
            self.assertEqual(self.custom_dirs(), [])
            self.assertEqual(self.api.call("DELETE", "/v1/templates/slow")[0], 200)
        finally:
            self.__class__.daemon.stop()
            self.__class__.daemon = Daemon(self.data, self.state, extra=FLAGS)
            self.__class__.api = self.api = Api(self.__class__.daemon)

    def test_6_a_dockerfile_build(self):
        """A Dockerfile's build: each instruction it serves (FROM, ARG with a build argument,
        ENV, WORKDIR, COPY of files, a directory and --chmod, RUN in its WORKDIR with its ARGs,
        USER, CMD with EXPOSE: a web server every sandbox of it has running) in a real builder,
        and a sandbox of it."""
        dockerfile = (
            "# syntax=docker/dockerfile:1\n"
            "FROM base\n"
            "ARG GREETING=hi\n"
            "ENV APP_MODE=\"docker mode\" \\\n"
            "    APP_HOME=/srv/app\n"
            "WORKDIR $APP_HOME\n"
            "COPY app.py ./\n"
            "COPY --chmod=755 bin/hello.sh /usr/local/bin/hello\n"
            "COPY conf/ /etc/app/\n"
            "RUN echo \"$GREETING from $APP_MODE in $(pwd)\" > built.txt\n"
            "USER user\n"
            "RUN id -un > /home/user/who-built\n"
            "EXPOSE 8080\n"
            "CMD [\"python3\", \"-m\", \"http.server\", \"8080\", \"--directory\", "
            "\"/srv/app\"]\n")
        context = {"app.py": "print('app')\n", "bin/hello.sh": "#!/bin/sh\necho hello $1\n",
                   "conf/a.ini": "a=1\n", "conf/sub/b.ini": "b=2\n"}
        # Through the CLI: the Dockerfile and its context folder read locally, the log streamed.
        folder = tempfile.mkdtemp(prefix="pst-docker-", dir=self.base)
        for rel, text in context.items():
            os.makedirs(os.path.dirname(os.path.join(folder, "ctx", rel)), exist_ok=True)
            with open(os.path.join(folder, "ctx", rel), "w") as f:
                f.write(text)
        with open(os.path.join(folder, "Dockerfile"), "w") as f:
            f.write(dockerfile)
        cli = os.path.join(os.path.dirname(self.real_daemon), "pandastack")
        env = dict(os.environ, PANDASTACK_API_KEY=self.api.key,
                   PANDASTACK_BASE_URL=self.daemon.url)
        r = subprocess.run([cli, "template", "build", "from-docker", "--dockerfile",
                            os.path.join(folder, "Dockerfile"), "--context",
                            os.path.join(folder, "ctx"), "--build-arg", "GREETING=hello"],
                           capture_output=True, text=True, timeout=900, env=env,
                           stdin=subprocess.DEVNULL)
        self.assertEqual(r.returncode, 0, (r.stdout[-3000:], r.stderr))
        lines = r.stdout.splitlines()
        s, end = self.api.call("GET", "/v1/templates/from-docker")
        self.assertEqual(end["status"], "ready", (end, lines[-30:]))
        self.assertEqual(end["from"], "base", end)
        self.assertEqual((end["start"], end["ready_port"]),
                         ("cd '/srv/app' && export HOME=\"$(getent passwd 'user' | cut -d: "
                          "-f6)\" USER='user' LOGNAME='user' && exec setpriv --reuid='user' "
                          "--regid=\"$(id -g 'user')\" --init-groups -- 'python3' '-m' "
                          "'http.server' '8080' '--directory' '/srv/app'", 8080), end)
        self.assertIn("start: listening on port 8080", "\n".join(lines))
        s, sbx = self.api.call("POST", "/v1/sandboxes", {"template": "from-docker"})
        self.assertEqual(s, 201, sbx)
        s, r = self.api.exec(sbx["id"],
                             "cd /srv/app && cat app.py built.txt /etc/app/a.ini "
                             "/etc/app/sub/b.ini /home/user/who-built; hello there; "
                             "echo $APP_MODE; test -e /var/lib/pandastack/build-context || "
                             "echo staged-context-gone; python3 -c \"import urllib.request as u; "
                             "print(u.urlopen('http://127.0.0.1:8080/built.txt').read().decode()"
                             ", end='')\"; for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | "
                             "grep -q 'http[.]server 8080' && stat -c %U $p; done | sort -u")
        self.assertEqual((s, r.get("stdout")),
                         (200, "print('app')\nhello from docker mode in /srv/app\na=1\nb=2\n"
                               "user\nhello there\ndocker mode\nstaged-context-gone\n"
                               "hello from docker mode in /srv/app\nuser\n"), r)
        self.api.call("DELETE", f"/v1/sandboxes/{sbx['id']}")
        self.assertEqual(self.api.call("DELETE", "/v1/templates/from-docker")[0], 200)

    def test_7_an_image_import(self):
        """An image imported (issue 37): a `docker save` archive the test makes (busybox from
        the host's busybox-static; two layers with a file and an opaque whiteout, a user, a web
        root; no registry, no network) through the CLI; the template's record (the image's
        tag and digest, its Env, its Cmd as the start command run as its User on its exposed
        port); a sandbox of it (the layers' files, the whiteouts applied, the Env, busybox's
        httpd started by the Cmd as uid 1000 and serving). Then archives refused: a tampered
        layer, an entry through a symlink out of the image, not an archive, an empty body, one
        over --template-image-mib (413)."""
        for t in self.api.call("GET", "/v1/templates")[1]["templates"]:
            if t["kind"] == "custom":  # (the quota: 3 templates)
                self.api.call("DELETE", f"/v1/templates/{t['name']}")
        folder = tempfile.mkdtemp(prefix="pst-image-", dir=self.base)
        archive = os.path.join(folder, "busybox.tar")
        with open(archive, "wb") as f:
            f.write(oa.docker_save(oa.busybox_layers(), oa.BUSYBOX_CONFIG))
        cli = os.path.join(os.path.dirname(self.real_daemon), "pandastack")
        env = dict(os.environ, PANDASTACK_API_KEY=self.api.key,
                   PANDASTACK_BASE_URL=self.daemon.url)
        r = subprocess.run([cli, "template", "import", "from-image", archive],
                           capture_output=True, text=True, timeout=900, env=env,
                           stdin=subprocess.DEVNULL)
        self.assertEqual(r.returncode, 0, (r.stdout[-3000:], r.stderr))
        out = r.stdout
        self.assertIn("digests verified", out)
        self.assertIn("layer 2/2 unpacked", out)
        self.assertIn("start: listening on port 8080", out)
        s, t = self.api.call("GET", "/v1/templates/from-image")
        self.assertEqual(t["status"], "ready", t)
        self.assertRegex(t["image"], r"^pandastack-test:latest@sha256:[0-9a-f]{64}$")
        self.assertEqual(t["env"]["GREETING"], "hello from the image config")
        self.assertEqual((t["start"], t["ready_port"]),
                         ("cd '/srv' && exec /run/pandastack/agent --run-as 1000 1000 - /bin/sh "
                          "sh -c 'exec \"$@\"' sh 'httpd' '-f' '-p' '8080' '-h' '/www'", 8080))
        print(f"\n  image import: {t['build_ms']} ms to ready, {t['size_bytes'] >> 20} MiB",
              file=sys.stderr)
        s, sbx = self.api.call("POST", "/v1/sandboxes", {"template": "from-image"})
        self.assertEqual(s, 201, sbx)
        s, r = self.api.exec(
            sbx["id"],
            "cat /srv/hello.txt; echo \"$GREETING\"; ls /opt; test -e /etc/motd || "
            "echo motd-gone; for p in /proc/[0-9]*; do grep -q ^httpd $p/cmdline 2>/dev/null && "
            "stat -c %u $p; done; printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | "
            "nc 127.0.0.1 8080 | tail -1")
        self.assertEqual((s, r.get("stdout")),
                         (200, "hello from the image\nhello from the image config\nnew\n"
                               "motd-gone\n1000\n<h1>served by busybox</h1>\n"), r)
        self.api.call("DELETE", f"/v1/sandboxes/{sbx['id']}")

        # A Dockerfile FROM the imported image: built on its disk (no resize2fs, no dpkg: only
        # busybox), its Env and Cmd carried over as a Docker image's are. Its context is an
        # archive uploaded first (gzip; a binary file, a folder, a .dockerignore), unpacked in a
        # builder microVM and copied by busybox's sh and cp in the image's guest.
        import gzip
        blob = bytes(range(256)) * 4
        context = gzip.compress(oa.layer([
            oa.entry(".dockerignore", data="*.secret\n"), oa.entry("site/", "dir"),
            oa.entry("site/page.html", data="<p>copied</p>\n"), oa.entry("bin.dat", data=blob),
            oa.entry("x.secret", data="never copied")]))
        s, cx = self.api.call("POST", "/v1/build-contexts", raw=context,
                              headers={"Content-Type": "application/gzip"})
        self.assertEqual(s, 201, cx)
        self.assertEqual((cx["context"], cx["bytes"]),
                         ("sha256:" + hashlib.sha256(context).hexdigest(), len(context)))
        self.assertEqual(self.api.call("GET", f"/v1/build-contexts/{cx['context']}")[0], 200)
        s, b = self.api.call("POST", "/v1/templates", {
            "name": "on-image", "context": cx["context"],
            "dockerfile": "FROM from-image\nENV EXTRA=added\n"
            "COPY site /www/\nCOPY --chown=1000:1000 bin.dat /srv/data/\n"
            "RUN echo \"built on the image by $(id -u)\" > /srv/extra.txt\n"})
        self.assertEqual(s, 202, b)
        _, lines, end = self.follow("on-image")
        self.assertEqual(end["status"], "ready", (end, lines[-30:]))
        end = self.api.call("GET", "/v1/templates/on-image")[1]
        self.assertEqual((end["from"], end["start"], end["ready_port"]),
                         ("from-image", t["start"], 8080), end)
        self.assertEqual(end["env"]["GREETING"], "hello from the image config")
        # The image cannot go while a template is built on it.
        self.assertError(self.api.call("DELETE", "/v1/templates/from-image"),
                         409, "template_in_use")
        s, sbx = self.api.call("POST", "/v1/sandboxes", {"template": "on-image"})
        self.assertEqual(s, 201, sbx)
        s, r = self.api.exec(
            sbx["id"], "cat /srv/extra.txt /srv/hello.txt; echo \"$GREETING / $EXTRA\"; "
            "printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | nc 127.0.0.1 8080 | tail -1; "
            "printf 'GET /page.html HTTP/1.0\\r\\n\\r\\n' | nc 127.0.0.1 8080 | tail -1; "
            "md5sum /srv/data/bin.dat | cut -c1-32; stat -c %u:%g /srv/data/bin.dat; "
            "ls /srv/data; ls /var/lib/pandastack 2>/dev/null | grep build || echo no-context")
        self.assertEqual((s, r.get("stdout")),
                         (200, "built on the image by 0\nhello from the image\n"
                               "hello from the image config / added\n"
                               "<h1>served by busybox</h1>\n<p>copied</p>\n"
                               + hashlib.md5(blob).hexdigest() + "\n1000:1000\nbin.dat\n"
                               "no-context\n"), r)
        self.api.call("DELETE", f"/v1/sandboxes/{sbx['id']}")
        self.assertEqual(self.api.call("DELETE", "/v1/templates/on-image")[0], 200)

        # A COPY of what .dockerignore left out fails the build, naming its line; a context
        # archive with an entry climbing out is refused by the unpacker (nothing written on the
        # host: it never opens the archive); an unknown context is 404 before any build.
        s, b = self.api.call("POST", "/v1/templates", {
            "name": "ignored", "context": [cx["context"]],
            "dockerfile": "FROM from-image\nCOPY site /www/\nCOPY x.secret /srv/\n"})
        self.assertEqual(s, 202, b)
        _, lines, end = self.follow("ignored")
        self.assertEqual(end["status"], "failed", end)
        self.assertIn("Dockerfile line 3: no file of the build context matches 'x.secret'",
                      end["error"])
        self.assertEqual(self.api.call("DELETE", "/v1/templates/ignored")[0], 200)
        s, bad = self.api.call("POST", "/v1/build-contexts", raw=oa.layer(
            [oa.entry("../pandastack-escaped", data="x")]))
        self.assertEqual(s, 201, bad)
        s, b = self.api.call("POST", "/v1/templates", {
            "name": "escaping-context", "context": bad["context"],
            "dockerfile": "FROM base\nCOPY . /x/\n"})
        self.assertEqual(s, 202, b)
        _, lines, end = self.follow("escaping-context")
        self.assertEqual(end["status"], "failed", end)
        self.assertIn("climbs out with '..'", end["error"])
        self.assertEqual(self.api.call("DELETE", "/v1/templates/escaping-context")[0], 200)
        self.assertError(self.api.call("POST", "/v1/templates", {
            "name": "no-context", "context": "sha256:" + "0" * 64,
            "dockerfile": "FROM base\nCOPY . /x/\n"}), 404, "context_not_found")
        self.assertEqual(self.api.call("DELETE", f"/v1/build-contexts/{bad['context']}")[0], 204)
        self.assertError(self.api.call("GET", f"/v1/build-contexts/{bad['context']}"),
                         404, "context_not_found")
        self.assertEqual(self.api.call("DELETE", "/v1/templates/from-image")[0], 200)

        def refused(name, body, words):
            s, b = self.api.call("PUT", f"/v1/templates/{name}/image", raw=body,
                                 headers={"Content-Type": "application/x-tar"})
            self.assertEqual(s, 202, b)
            _, lines, end = self.follow(name)
            self.assertEqual(end["status"], "failed", end)
            for w in words:
                self.assertIn(w, end["error"])
            self.assertEqual(self.api.call("DELETE", f"/v1/templates/{name}")[0], 200)

        layers = oa.busybox_layers()
        refused("tampered", oa.docker_save(layers, oa.BUSYBOX_CONFIG,
                                           diff_ids=["sha256:" + oa.sha(layers[0]),
                                                     "sha256:" + "0" * 64]),
                ["layer 2", "does not match the config's diff_id"])
        refused("escaping", oa.docker_save(
            [oa.layer([oa.entry("escape", "symlink", link="/etc")]),
             oa.layer([oa.entry("escape/pandastack-escaped", data="x")])]),
            ["escape/pandastack-escaped", "outside the image"])
        self.assertFalse(os.path.exists("/etc/pandastack-escaped"))
        refused("not-an-archive", b"hello" * 1000, ["not a tar archive"])
        # Through the Python SDK: Template.import_image raises with the reason.
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                        "sdk", "python"))
        import pandastack
        with self.assertRaises(pandastack.TemplateBuildFailed) as raised:
            pandastack.Template.import_image(
                "sdk-import", oa.docker_save([oa.layer([oa.entry("../x", data="x")])]),
                api_key=self.api.key, base_url=self.daemon.url)
        self.assertIn("climbs out with '..'", str(raised.exception))
        self.assertEqual(self.api.call("DELETE", "/v1/templates/sdk-import")[0], 200)
        self.assertError(self.api.call("PUT", "/v1/templates/empty/image", raw=b""),
                         400, "invalid_argument")
        self.assertError(self.api.call("PUT", "/v1/templates/big/image",
                                       raw=b"\0" * ((64 << 20) + 1)), 413, "file_too_large")
        self.assertError(self.api.call("PUT", "/v1/templates/Bad_Name/image", raw=b"x" * 512),
                         400, "invalid_argument")
        # At most eight uploads arrive at once: a ninth is 429 (the disk is not filled faster
        # than builds take archives); those cut short leave no file.
        import socket
        import time
        host, port = self.daemon.url.split("//")[1].split(":")
        slow = []
        for i in range(8):
            c = socket.create_connection((host, int(port)))
            c.sendall((f"PUT /v1/templates/slow{i}/image HTTP/1.1\r\nHost: x\r\n"
                       f"Authorization: Bearer {self.api.key}\r\nContent-Length: 1000000\r\n"
                       "\r\n").encode() + b"\0" * 1000)
            slow.append(c)
        time.sleep(1)
        self.assertError(self.api.call("PUT", "/v1/templates/third/image", raw=b"\0" * 1024),
                         429, "too_many_requests")
        for c in slow:
            c.close()
        time.sleep(1)
        s, left = self.api.call("GET", "/v1/templates")
        self.assertEqual([t["name"] for t in left["templates"] if t["kind"] == "custom"], [])
        self.assertEqual(os.listdir(os.path.join(self.data, "template-uploads")), [])

    def test_8_an_image_pulled_from_a_registry(self):
        """An image pulled by reference (issue 37) from a registry the test runs on loopback
        (Debian's docker-registry, the busybox image pushed to it by skopeo: gzip layers, a
        Docker v2 manifest): the template ready, a sandbox of it serving; a tag the registry
        lacks fails with 404 named; a secret that does not name the registry and a malformed
        reference are 400 before anything starts."""
        import socket
        for t in self.api.call("GET", "/v1/templates")[1]["templates"]:
            if t["kind"] == "custom":
                self.api.call("DELETE", f"/v1/templates/{t['name']}")
        folder = tempfile.mkdtemp(prefix="pst-registry-", dir=self.base)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with open(os.path.join(folder, "config.yml"), "w") as f:
            f.write(f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
                    f"    rootdirectory: {folder}/data\nhttp:\n  addr: 127.0.0.1:{port}\n")
        registry = subprocess.Popen(["docker-registry", "serve", os.path.join(folder,
                                                                              "config.yml")],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            archive = os.path.join(folder, "busybox.tar")
            with open(archive, "wb") as f:
                f.write(oa.docker_save(oa.busybox_layers(), oa.BUSYBOX_CONFIG))
            ref = f"127.0.0.1:{port}/test/busybox:1"
            for _ in range(50):  # (the registry listening)
                r = subprocess.run(["skopeo", "--insecure-policy", "copy", "--dest-tls-verify=false",
                                    f"docker-archive:{archive}", f"docker://{ref}"],
                                   capture_output=True, text=True, timeout=60)
                if r.returncode == 0:
                    break
                import time
                time.sleep(0.2)
            self.assertEqual(r.returncode, 0, r.stderr)
            # Through the Python SDK: Template.pull, its progress lines.
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                            "..", "sdk", "python"))
            import pandastack
            lines = []
            tpl = pandastack.Template.pull("pulled", ref, api_key=self.api.key,
                                           base_url=self.daemon.url,
                                           on_progress=lambda p: p.line and lines.append(p.line))
            self.assertEqual(tpl.info.status, "ready")
            text = "\n".join(lines)
            self.assertIn("layers, ", text)
            self.assertIn("every blob verified", text)
            s, t = self.api.call("GET", "/v1/templates/pulled")
            self.assertTrue(t["image"].startswith(ref + "@sha256:"), t)
            self.assertEqual(t["ready_port"], 8080, t)
            print(f"\n  image pull: {t['build_ms']} ms to ready", file=sys.stderr)
            s, sbx = self.api.call("POST", "/v1/sandboxes", {"template": "pulled"})
            self.assertEqual(s, 201, sbx)
            s, r = self.api.exec(
                sbx["id"], "cat /srv/hello.txt; printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n'"
                " | nc 127.0.0.1 8080 | tail -1")
            self.assertEqual((s, r.get("stdout")),
                             (200, "hello from the image\n<h1>served by busybox</h1>\n"), r)
            self.api.call("DELETE", f"/v1/sandboxes/{sbx['id']}")
            self.assertEqual(self.api.call("DELETE", "/v1/templates/pulled")[0], 200)
            # A Dockerfile FROM the image's reference: the build pulls and imports it itself,
            # then runs its steps on it (the image's Env and Cmd carried over).
            s, b = self.api.call("POST", "/v1/templates", {
                "name": "on-pull", "dockerfile": f"FROM {ref}\nENV EXTRA=on-pull\n"
                "RUN echo \"$GREETING, then $EXTRA\" > /srv/run.txt\n"})
            self.assertEqual(s, 202, b)
            _, lines, end = self.follow("on-pull")
            self.assertEqual(end["status"], "ready", (end, lines[-30:]))
            self.assertIn("the Dockerfile's steps run on it", "\n".join(lines))
            s, t = self.api.call("GET", "/v1/templates/on-pull")
            self.assertEqual((t["from"], t["ready_port"]), (f"docker://{ref}", 8080), t)
            self.assertTrue(t["image"].startswith(ref + "@sha256:"), t)
            self.assertEqual((t["env"]["GREETING"], t["env"]["EXTRA"]),
                             ("hello from the image config", "on-pull"), t)
            print(f"\n  Dockerfile FROM a registry image: {t['build_ms']} ms to ready",
                  file=sys.stderr)
            s, sbx = self.api.call("POST", "/v1/sandboxes", {"template": "on-pull"})
            self.assertEqual(s, 201, sbx)
            s, r = self.api.exec(
                sbx["id"], "cat /srv/run.txt; echo $EXTRA; printf 'GET /index.html HTTP/1.0"
                "\\r\\n\\r\\n' | nc 127.0.0.1 8080 | tail -1")
            self.assertEqual((s, r.get("stdout")),
                             (200, "hello from the image config, then on-pull\non-pull\n"
                                   "<h1>served by busybox</h1>\n"), r)
            self.api.call("DELETE", f"/v1/sandboxes/{sbx['id']}")
            self.assertEqual(self.api.call("DELETE", "/v1/templates/on-pull")[0], 200)
            # A tag it lacks: the build fails naming it.
            s, b = self.api.call("POST", "/v1/templates",
                                 {"name": "missing", "image": f"127.0.0.1:{port}/test/busybox:2"})
            self.assertEqual(s, 202, b)
            _, _, end = self.follow("missing")
            self.assertEqual(end["status"], "failed", end)
            self.assertIn("not found (404)", end["error"])
            self.assertEqual(self.api.call("DELETE", "/v1/templates/missing")[0], 200)
            # Refused before anything starts.
            self.assertEqual(self.api.call("POST", "/v1/secrets", {
                "name": "REGISTRY", "value": "u:p", "hosts": ["ghcr.io"]})[0], 201)
            self.assertError(self.api.call("POST", "/v1/templates", {
                "name": "x", "image": ref, "registry_secret": "REGISTRY"}), 400,
                "invalid_argument")
            self.assertError(self.api.call("POST", "/v1/templates", {
                "name": "x", "image": ref, "registry_secret": "NOPE"}), 404, "secret_not_found")
            self.api.call("DELETE", "/v1/secrets/REGISTRY")
            for bad in ("UPPER/case", "a b", "x@sha256:12", "x:" + "t" * 200):
                self.assertError(self.api.call("POST", "/v1/templates",
                                               {"name": "x", "image": bad}),
                                 400, "invalid_argument")
            self.assertError(self.api.call("POST", "/v1/templates",
                                           {"name": "x", "image": ref, "run": ["true"]}),
                             400, "invalid_argument")
        finally:
            registry.terminate()
            registry.wait(timeout=10)

    def test_9_a_pull_signs_in_and_checks_every_blob(self):
        """A pull from a registry that wants sign-in (Docker's token flow: the 401's Bearer
        challenge, a token for the secret's user:password) and redirects its blobs to another
        host (which never sees the credentials): ready. Without the secret: failed, the token
        service's refusal named. A blob whose bytes do not match its digest: failed, nothing
        imported."""
        from registry import Registry
        for t in self.api.call("GET", "/v1/templates")[1]["templates"]:
            if t["kind"] == "custom":
                self.api.call("DELETE", f"/v1/templates/{t['name']}")
        manifest, blobs = oa.oci_blobs(oa.busybox_layers(), oa.BUSYBOX_CONFIG)
        reg = Registry(manifest, blobs, "team/app", "1", user="puller", password="s3cret").start()
        try:
            ref = f"127.0.0.1:{reg.port}/team/app:1"
            self.assertEqual(self.api.call("POST", "/v1/secrets", {
                "name": "REGISTRY", "value": "puller:s3cret", "hosts": ["127.0.0.1"]})[0], 201)
            s, b = self.api.call("POST", "/v1/templates", {"name": "signed-in", "image": ref,
                                                           "registry_secret": "REGISTRY"})
            self.assertEqual(s, 202, b)
            _, lines, end = self.follow("signed-in")
            self.assertEqual(end["status"], "ready", (end, lines[-30:]))
            paths = [p for p, _ in reg.log]
            self.assertTrue(any(p.startswith("/token") for p in paths), paths)
            self.assertTrue(any(p.startswith("/cdn/") for p in paths), paths)
            self.assertFalse(reg.cdn_saw_credentials, "the CDN got the registry's credentials")
            self.assertEqual(self.api.call("DELETE", "/v1/templates/signed-in")[0], 200)

            s, b = self.api.call("POST", "/v1/templates", {"name": "anonymous", "image": ref})
            self.assertEqual(s, 202, b)
            _, _, end = self.follow("anonymous")
            self.assertEqual(end["status"], "failed", end)
            self.assertIn("token service answered 401 (anonymous)", end["error"])
            self.assertEqual(self.api.call("DELETE", "/v1/templates/anonymous")[0], 200)

            layer = json.loads(manifest)["layers"][1]["digest"][7:]
            reg.tamper = layer
            s, b = self.api.call("POST", "/v1/templates", {"name": "tampered", "image": ref,
                                                           "registry_secret": "REGISTRY"})
            self.assertEqual(s, 202, b)
            _, _, end = self.follow("tampered")
            self.assertEqual(end["status"], "failed", end)
            self.assertIn(f"blob sha256:{layer[:12]} does not match its digest", end["error"])
            self.assertEqual(self.api.call("DELETE", "/v1/templates/tampered")[0], 200)
            self.api.call("DELETE", "/v1/secrets/REGISTRY")
        finally:
            reg.stop()

    def test_10_the_step_cache(self):
        """A build of an unchanged prefix resumes where the last one left off (issue 37): the
        same Dockerfile again runs nothing (no context unpacked either); its last command
        changed runs that command only (after the slow first one, from its checkpoint); a
        changed context file resumes before its COPY. Each template is whole on its own: its
        sandboxes see exactly what its Dockerfile says, and a template survives the cache's
        checkpoints being dropped."""
        import gzip
        for t in self.api.call("GET", "/v1/templates")[1]["templates"]:
            if t["kind"] == "custom":
                self.api.call("DELETE", f"/v1/templates/{t['name']}")

        def context(text):
            s, cx = self.api.call("POST", "/v1/build-contexts", raw=gzip.compress(oa.layer(
                [oa.entry("a.txt", data=text)])))
            self.assertEqual(s, 201, cx)
            return cx["context"]

        def dockerfile(last):
            return ("FROM base\nRUN sleep 3 && echo one > /one\nCOPY a.txt /a.txt\n"
                    f"RUN echo {last} > /last\n")

        def build(name, last, ctx):
            s, b = self.api.call("POST", "/v1/templates", {
                "name": name, "context": ctx, "dockerfile": dockerfile(last)})
            self.assertEqual(s, 202, b)
            _, lines, end = self.follow(name)
            self.assertEqual(end["status"], "ready", (end, lines[-30:]))
            t = self.api.call("GET", f"/v1/templates/{name}")[1]
            return t, "\n".join(lines)

        def sees(name, expected):
            s, sbx = self.api.call("POST", "/v1/sandboxes", {"template": name})
            self.assertEqual(s, 201, sbx)
            s, r = self.api.exec(sbx["id"], "cat /one /a.txt /last")
            self.assertEqual((s, r.get("stdout")), (200, expected), r)
            self.api.call("DELETE", f"/v1/sandboxes/{sbx['id']}")

        ctx1 = context("context one\n")
        first, log = build("cached", "two", ctx1)
        self.assertNotIn("from the step cache", log)
        # (the checkpoints taken: after `sleep 3`, and after the last command)
        kept = [line for line in log.splitlines() if "step checkpoint" in line]
        self.assertEqual(len(kept), 2, log)
        print("\n  " + "\n  ".join(kept), file=sys.stderr)
        sees("cached", "one\ncontext one\ntwo\n")
        self.assertEqual(self.api.call("DELETE", "/v1/templates/cached")[0], 200)
        again, log = build("cached", "two", ctx1)
        self.assertIn("4 of its 4 commands from the step cache", log)
        self.assertNotIn("unpack the build context", log)
        self.assertNotIn("booting", log)  # (its disk is the last checkpoint's: no builder)
        self.assertNotIn("sleep 3", log)
        self.assertNotIn("echo two", log)
        sees("cached", "one\ncontext one\ntwo\n")
        changed, log = build("cached-2", "three", ctx1)
        self.assertIn("1 of its 4 commands from the step cache", log)
        self.assertNotIn("sleep 3", log)
        sees("cached-2", "one\ncontext one\nthree\n")
        # Through the Python SDK: a folder as the context (a tar made and uploaded by it).
        folder = tempfile.mkdtemp(prefix="pst-ctx-", dir=self.base)
        with open(os.path.join(folder, "a.txt"), "w") as f:
            f.write("context two\n")
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                        "sdk", "python"))
        import pandastack
        lines = []
        pandastack.Template.build("cached-3", dockerfile=dockerfile("two"), context=folder,
                                  api_key=self.api.key, base_url=self.daemon.url,
                                  on_progress=lambda p: p.line and lines.append(p.line))
        other, log = self.api.call("GET", "/v1/templates/cached-3")[1], "\n".join(lines)
        self.assertIn("1 of its 4 commands from the step cache", log)
        self.assertIn("unpack the build context", log)
        sees("cached-3", "one\ncontext two\ntwo\n")
        print(f"\n  step cache: first build {first['build_ms']} ms, the same again "
              f"{again['build_ms']} ms, its last command changed {changed['build_ms']} ms, its "
              f"context changed {other['build_ms']} ms", file=sys.stderr)
        # The checkpoints dropped (the cache is the host's to trim): the templates stand.
        shutil.rmtree(os.path.join(self.data, "template-cache", "steps"))
        sees("cached", "one\ncontext one\ntwo\n")
        sees("cached-2", "one\ncontext one\nthree\n")
        for name in ("cached", "cached-2", "cached-3"):
            self.assertEqual(self.api.call("DELETE", f"/v1/templates/{name}")[0], 200)

    def test_3_bad_input(self):
        bad = [({"name": "Bad"}, 400, "invalid_argument"),
               ({}, 400, "invalid_argument"),
               ({"name": "x", "packages": ["jq; reboot"]}, 400, "invalid_argument"),
               ({"name": "x", "files": {"etc/x": "y"}}, 400, "invalid_argument"),
               ({"name": "x", "files": {"/proc/x": "y"}}, 400, "invalid_argument"),
               ({"name": "x", "from": "postgres"}, 400, "invalid_argument"),
               ({"name": "x", "from": "nothing"}, 400, "invalid_argument"),
               ({"name": "x", "env": {"1A": "b"}}, 400, "invalid_argument"),
               ({"name": "x", "run": ["true"] * 33}, 400, "invalid_argument"),
               ({"name": "x", "memory_mib": 64}, 400, "invalid_argument"),
               ({"name": "x", "memory_mib": 1 << 21}, 400, "invalid_argument"),
               ({"name": "x", "vcpus": 33}, 400, "invalid_argument"),
               ({"name": "x", "vcpus": 0}, 400, "invalid_argument"),
               ({"name": "x", "memory_mib": 65536}, 503, "host_full"),  # (more than this host)
               ({"name": "base"}, 409, "conflict"),
               ({"name": "x", "surprise": 1}, 400, "invalid_argument"),
               # Dockerfiles: what is not served (501) and what is wrong (400), each by its line
               ({"name": "x", "dockerfile": "FROM base\nRUN --mount=type=cache,target=/c true\n"},
                501, "not_implemented"),
               ({"name": "x", "dockerfile": "FROM base\nHEALTHCHECK CMD true\n"}, 400,
                "invalid_argument"),
               ({"name": "x", "dockerfile": "FROM base\n", "start": "x"}, 400, "invalid_argument"),
               ({"name": "x", "ready_port": 80}, 400, "invalid_argument"),  # (no start command)
               ({"name": "x", "dockerfile": "FROM scratch\n"}, 501, "not_implemented"),
               ({"name": "x", "dockerfile": "FROM Bad_Registry:5000/x:1\n"}, 400,
                "invalid_argument"),  # (an image reference, checked before any build)
               ({"name": "x", "dockerfile": "FROM base\nCOPY nope /x\n"}, 400,
                "invalid_argument"),
               ({"name": "x", "dockerfile": "FROM base\n", "run": ["true"]}, 400,
                "invalid_argument"),
               ({"name": "x", "context": {"a": "b"}}, 400, "invalid_argument")]
        for body, status, code in bad:
            self.assertError(self.api.call("POST", "/v1/templates", body), status, code)
        # Build contexts: their own size limit (--build-context-mib 8 here, the image one 64),
        # a context that is not a key, too many archives, an empty upload, an unknown key.
        self.assertError(self.api.call("POST", "/v1/build-contexts", raw=b"\0" * ((8 << 20) + 1)),
                         413, "file_too_large")
        self.assertError(self.api.call("POST", "/v1/build-contexts", raw=b""), 400,
                         "invalid_argument")
        for ctx in ("sha256:xyz", ["sha256:" + "a" * 64] * 65, 5):
            self.assertError(self.api.call("POST", "/v1/templates", {
                "name": "x", "dockerfile": "FROM base\n", "context": ctx}), 400,
                "invalid_argument")
        self.assertError(self.api.call("GET", "/v1/build-contexts/sha256:" + "a" * 64), 404,
                         "context_not_found")
        self.assertError(self.api.call("DELETE", "/v1/build-contexts/nonsense"), 404,
                         "context_not_found")
        self.assertError(self.api.call("GET", "/v1/templates/nothing/build"), 404,
                         "template_not_found")
        self.assertError(self.api.call("DELETE", "/v1/templates/nothing"), 404,
                         "template_not_found")
        self.assertEqual(self.custom_dirs(), [])


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    p.add_argument("--images", default=os.environ.get("PANDASTACK_IMAGES", "var/images"))
    args, rest = p.parse_known_args()
    args.images = os.path.abspath(args.images)
    harness.ARGS = args
    harness.run_unittests(rest)
