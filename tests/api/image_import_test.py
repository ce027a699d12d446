#!/usr/bin/python3
"""The image importer (guest/image_import.py) alone, on archives the test makes: what the
builder microVM runs to unpack an image into a template's root file system. Here it unpacks
into a temporary folder (the daemon runs it only inside a guest); each case checks what lands
in the folder and that nothing lands beside it.

Run: /usr/bin/python3 tests/api/image_import_test.py
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import oci_archives as oa  # noqa: E402

IMPORTER = os.path.join(HERE, "..", "..", "guest", "image_import.py")


class ImageImportTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.root = os.path.join(self.dir, "root")
        os.mkdir(self.root)
        # What an escape would write (beside the root): must stay absent.
        self.outside = os.path.join(self.dir, "outside")

    def tearDown(self):
        self.tmp.cleanup()

    def run_import(self, archive, busybox=None):
        path = os.path.join(self.dir, "image.tar")
        with open(path, "wb") as f:
            f.write(archive)
        out = os.path.join(self.dir, "result.json")
        args = ["/usr/bin/python3", IMPORTER, "--archive", path, "--root", self.root,
                "--out", out]
        if busybox:
            args += ["--busybox", busybox]
        p = subprocess.run(args, capture_output=True, text=True, timeout=120)
        result = None
        if p.returncode == 0:
            with open(out) as f:
                result = json.load(f)
        return p, result

    def refused(self, archive, words):
        p, _ = self.run_import(archive)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        for w in words:
            self.assertIn(w, p.stderr)
        self.assertFalse(os.path.lexists(self.outside), "something was written outside")
        return p.stderr

    def read(self, rel):
        with open(os.path.join(self.root, rel)) as f:
            return f.read()

    def test_docker_save_busybox_image_with_whiteouts(self):
        layers = oa.busybox_layers()
        p, r = self.run_import(oa.docker_save(layers, oa.BUSYBOX_CONFIG))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(r["format"], "docker-archive")
        self.assertEqual(r["layers"], 2)
        self.assertEqual(r["tags"], ["pandastack-test:latest"])
        self.assertEqual(r["cmd"], ["httpd", "-f", "-p", "8080", "-h", "/www"])
        self.assertEqual(r["workdir"], "/srv")
        self.assertEqual((r["user"], r["uid"], r["gid"]), ("app", 1000, 1000))
        self.assertEqual(r["exposed"], ["8080/tcp"])
        self.assertFalse(r["shell_added"])
        self.assertEqual(r["env"]["GREETING"], "hello from the image config")
        # Layer two's files, its whiteouts (a file, an opaque directory keeping its own file).
        self.assertEqual(self.read("srv/hello.txt"), "hello from the image\n")
        self.assertEqual(os.stat(os.path.join(self.root, "srv/hello-link.txt")).st_ino,
                         os.stat(os.path.join(self.root, "srv/hello.txt")).st_ino)
        self.assertFalse(os.path.lexists(os.path.join(self.root, "etc/motd")))
        self.assertEqual(sorted(os.listdir(os.path.join(self.root, "opt"))), ["new"])
        self.assertEqual(os.readlink(os.path.join(self.root, "bin/sh")), "busybox")
        self.assertTrue(os.access(os.path.join(self.root, "bin/busybox"), os.X_OK))
        # The guest's init needs these; every process gets the image's Env.
        for d in ("proc", "sys", "dev", "run", "tmp"):
            self.assertTrue(os.path.isdir(os.path.join(self.root, d)), d)
        with open(os.path.join(self.root, "etc/pandastack/env"), "rb") as f:
            self.assertIn(b"GREETING=hello from the image config\0", f.read())
        if os.geteuid() == 0:
            self.assertEqual(os.stat(os.path.join(self.root, "home/app")).st_uid, 1000)

    def test_oci_layout_with_gzip_layers(self):
        layers = oa.busybox_layers()
        p, r = self.run_import(oa.oci_layout(layers, oa.BUSYBOX_CONFIG))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(r["format"], "oci-layout")
        self.assertEqual(r["tags"], ["latest"])
        self.assertEqual(self.read("www/index.html"), "<h1>served by busybox</h1>\n")

    def test_an_image_without_a_shell_gets_busybox(self):
        layers = [oa.layer([oa.entry("app/", "dir"), oa.entry("app/data", data="x")])]
        p, r = self.run_import(oa.docker_save(layers), busybox="/bin/busybox")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(r["shell_added"])
        self.assertTrue(os.access(os.path.join(self.root, "bin/sh"), os.X_OK))
        shutil.rmtree(self.root)
        os.mkdir(self.root)
        p, _ = self.run_import(oa.docker_save(layers))  # (and without one to give: refused)
        self.assertIn("no /bin/sh", p.stderr)

    def test_a_tampered_layer_is_refused_before_anything_is_written(self):
        layers = oa.busybox_layers()
        wrong = ["sha256:" + oa.sha(layers[0]), "sha256:" + "0" * 64]
        err = self.refused(oa.docker_save(layers, diff_ids=wrong),
                           ["layer 2", "does not match", "diff_id"])
        self.assertIn("tampered", err)
        self.assertEqual(os.listdir(self.root), [], "unpacked before the digests were checked")

    def test_a_tampered_config_is_refused(self):
        archive = bytearray(oa.docker_save([oa.layer([oa.entry("a", data="a")])],
                                           {"Env": ["A=1"]}))
        at = archive.find(b'"A=1"')
        archive[at + 3] = ord("2")  # the config changed after it was named by its digest
        self.refused(bytes(archive), ["does not match its digest"])
        self.assertEqual(os.listdir(self.root), [])

    def test_an_oci_blob_with_the_wrong_digest_is_refused(self):
        import io
        import tarfile
        good = oa.oci_layout([oa.layer([oa.entry("a", data="a")])], compress=False)
        src = tarfile.open(fileobj=io.BytesIO(good))
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as out:
            for m in src:
                data = src.extractfile(m).read()
                if m.name.startswith("blobs/") and b'"a"' not in data and \
                        data[:1] != b"{":  # the layer blob: one byte changed
                    data = data[:-1] + b"!"
                m.size = len(data)
                out.addfile(m, io.BytesIO(data))
        self.refused(buf.getvalue(), ["does not match its digest"])

    def test_dot_dot_and_absolute_entries_are_refused(self):
        for name in ("../outside", "a/../../outside", "/outside"):
            with self.subTest(name=name):
                layers = [oa.layer([oa.entry(name, data="escaped")])]
                self.refused(oa.docker_save(layers), ["layer 1"])

    def test_writing_through_an_escaping_symlink_is_refused(self):
        for link in (self.dir, "/tmp", "../../..", ".."):
            with self.subTest(link=link):
                layers = [oa.layer([oa.entry("escape", "symlink", link=link)]),
                          oa.layer([oa.entry("escape/outside", data="escaped")])]
                self.refused(oa.docker_save(layers), ["escape", "outside the image"]
                             if link.startswith("/") else ["climbs out"])
                for e in os.listdir(self.root):
                    os.unlink(os.path.join(self.root, e))

    def test_a_hard_link_out_of_the_image_is_refused(self):
        layers = [oa.layer([oa.entry("x", "hardlink", link="../../etc/passwd")])]
        self.refused(oa.docker_save(layers), ["climbs out"])

    def test_a_relative_symlink_inside_the_image_is_followed(self):
        layers = [oa.layer([oa.entry("usr/", "dir"), oa.entry("usr/lib/", "dir"),
                            oa.entry("lib", "symlink", link="usr/lib")]),
                  oa.layer([oa.entry("lib/libx.so", data="x")])]
        p, _ = self.run_import(oa.docker_save(layers), busybox="/bin/busybox")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.read("usr/lib/libx.so"), "x")

    def test_not_an_image(self):
        self.refused(b"not a tar at all" * 100, ["not a tar archive"])
        self.refused(oa.layer([oa.entry("hello", data="x")]),
                     ["neither a `docker save` archive"])
        two = oa.docker_save([oa.layer([oa.entry("a", data="a")])])
        import io
        import tarfile
        src = tarfile.open(fileobj=io.BytesIO(two))
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as out:
            for m in src:
                data = src.extractfile(m).read()
                if m.name == "manifest.json":
                    data = json.dumps(json.loads(data) * 2).encode()
                    m.size = len(data)
                out.addfile(m, io.BytesIO(data))
        self.refused(buf.getvalue(), ["holds 2 images"])

    def test_another_architecture_is_refused(self):
        layers = [oa.layer([oa.entry("a", data="a")])]
        cfg = oa.config_of(layers)
        cfg["architecture"] = "arm64"
        import io
        import tarfile
        archive = oa.docker_save(layers)
        src = tarfile.open(fileobj=io.BytesIO(archive))
        buf = io.BytesIO()
        cb = json.dumps(cfg).encode()
        with tarfile.open(fileobj=buf, mode="w") as out:
            for m in src:
                data = src.extractfile(m).read()
                if m.name.endswith(".json") and m.name != "manifest.json":
                    m.name, data = oa.sha(cb) + ".json", cb
                elif m.name == "manifest.json":
                    man = json.loads(data)
                    man[0]["Config"] = oa.sha(cb) + ".json"
                    data = json.dumps(man).encode()
                m.size = len(data)
                out.addfile(m, io.BytesIO(data))
        self.refused(buf.getvalue(), ["linux/arm64"])


def bundle(archives):
    """The bundle the host writes for a build context (actors/build_context.cc,
    write_context_bundle): a JSON header in the first 4096 bytes, then each archive at a
    512-byte boundary."""
    body, offsets, at = b"", [], 4096
    for a in archives:
        offsets.append({"offset": at, "bytes": len(a)})
        pad = (-len(a)) % 512
        body += a + b"\0" * pad
        at += len(a) + pad
    head = json.dumps({"archives": offsets}).encode()
    return head + b"\0" * (4096 - len(head)) + body


class ContextUnpackTest(unittest.TestCase):
    """--context: a Dockerfile build's context archives (actors/build_context.h)."""

    setUp = ImageImportTest.setUp
    tearDown = ImageImportTest.tearDown

    def unpack(self, archives):
        path = os.path.join(self.dir, "bundle")
        with open(path, "wb") as f:
            f.write(bundle(archives))
        out = os.path.join(self.dir, "result.json")
        p = subprocess.run(["/usr/bin/python3", IMPORTER, "--context", "--archive", path,
                            "--root", self.root, "--out", out],
                           capture_output=True, text=True, timeout=120)
        result = None
        if p.returncode == 0:
            with open(out) as f:
                result = json.load(f)
        return p, result

    def tree(self):
        out = []
        for d, dirs, files in os.walk(self.root):
            rel = os.path.relpath(d, self.root)
            for n in dirs + files:
                out.append(os.path.normpath(os.path.join(rel, n)))
        return sorted(out)

    def test_archives_unpack_in_order_plain_and_gzip(self):
        import gzip
        first = oa.layer([oa.entry("src/", "dir"), oa.entry("src/app.py", data="print(1)\n"),
                          oa.entry("README", data="one"), oa.entry(".wh.kept", data="a file"),
                          oa.entry("link", "symlink", link="/etc/passwd")])
        second = gzip.compress(oa.layer([oa.entry("README", data="two"),
                                         oa.entry("src/lib.py", data="x = 2\n")]))
        p, result = self.unpack([first, second])
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual(result["archives"], 2)
        with open(os.path.join(self.root, "README")) as f:
            self.assertEqual(f.read(), "two")  # the later archive wins
        self.assertTrue(os.path.isfile(os.path.join(self.root, ".wh.kept")))  # not a whiteout
        self.assertEqual(os.readlink(os.path.join(self.root, "link")), "/etc/passwd")
        self.assertIn("src/lib.py", self.tree())

    def test_dockerignore_with_exceptions(self):
        ignore = "# comment\n*.log\n**/__pycache__\nbuild/\n!build/keep.txt\n/secret?\n"
        archive = oa.layer([
            oa.entry(".dockerignore", data=ignore), oa.entry("app.py", data="x"),
            oa.entry("debug.log", data="x"), oa.entry("sub/", "dir"),
            oa.entry("sub/trace.log", data="kept: *.log is for the root only"),
            oa.entry("sub/__pycache__/", "dir"), oa.entry("sub/__pycache__/a.pyc", data="x"),
            oa.entry("build/", "dir"), oa.entry("build/out.o", data="x"),
            oa.entry("build/keep.txt", data="x"), oa.entry("secret1", data="x"),
            oa.entry("secret12", data="x, kept: ? is one character")])
        p, result = self.unpack([archive])
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual(self.tree(), [".dockerignore", "app.py", "build", "build/keep.txt",
                                       "secret12", "sub", "sub/trace.log"])
        self.assertEqual(result["ignored"], 5)  # (the __pycache__ folder and its file)

    def test_escapes_are_refused(self):
        for entries, words in (
                ([oa.entry("../outside", data="x")], ["context archive 1", "climbs out"]),
                ([oa.entry("/outside", data="x")], ["absolute"]),
                ([oa.entry("esc", "symlink", link=self.dir),
                  oa.entry("esc/outside", data="x")], ["outside the image"]),
                ([oa.entry("x", "hardlink", link="../outside")], ["climbs out"])):
            with self.subTest(entries=[e["name"] for e in entries]):
                p, _ = self.unpack([oa.layer(entries)])
                self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
                for w in words:
                    self.assertIn(w, p.stderr)
                self.assertFalse(os.path.lexists(self.outside), "something was written outside")
                shutil.rmtree(self.root)
                os.mkdir(self.root)

    def test_not_a_tar_and_a_bad_header(self):
        p, _ = self.unpack([b"this is not a tar archive" * 100])
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertIn("not a valid tar", p.stderr)
        path = os.path.join(self.dir, "bundle")
        with open(path, "wb") as f:
            f.write(json.dumps({"archives": [{"offset": 4096, "bytes": 1 << 30}]}).encode()
                    + b"\0" * 5000)
        p = subprocess.run(["/usr/bin/python3", IMPORTER, "--context", "--archive", path,
                            "--root", self.root, "--out", os.path.join(self.dir, "r.json")],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertIn("names bytes it does not have", p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
