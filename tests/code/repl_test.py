#!/usr/bin/python3
"""Unit cases of the code interpreter's guest script (guest/repl/pandastack_repl.py), run on the
host: its server and clients as in a guest, as an unprivileged account (nobody), no VM.

Run: /usr/bin/python3 tests/code/repl_test.py (as root: it drops to nobody for the script)."""
import json
import os
import shutil
import subprocess
import tempfile
import time
import unittest
import uuid

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "guest", "repl",
                      "pandastack_repl.py")
NOBODY = 65534
CONTEXTS = f"/tmp/.pandastack-code-{NOBODY}"  # the script's folder of nobody's contexts


def as_nobody():
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


class ReplTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if os.getuid() != 0:
            raise unittest.SkipTest("needs root to run the script as nobody")
        cls.dir = tempfile.mkdtemp(prefix="pst-repl-")
        os.chmod(cls.dir, 0o755)
        cls.script = os.path.join(cls.dir, "repl.py")
        shutil.copy(SCRIPT, cls.script)
        os.chmod(cls.script, 0o644)
        cls.contexts = []

    @classmethod
    def tearDownClass(cls):
        for c in cls.contexts:
            cls.client("stop", c)
        shutil.rmtree(cls.dir, ignore_errors=True)
        try:  # (when no other context is in it)
            os.rmdir(CONTEXTS)
        except OSError:
            pass

    @classmethod
    def spawn(cls, *args, **kw):
        """A client, as the gateway runs it (gateway/code_interpreter.cc): python3 -S, cwd /."""
        return subprocess.Popen(["/usr/bin/python3", "-S", cls.script, *args], cwd="/",
                                preexec_fn=as_nobody, env={"PATH": "/usr/bin:/bin", "HOME": "/"},
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, **kw)

    @classmethod
    def client(cls, *args, stdin=""):
        with cls.spawn(*args, stderr=subprocess.PIPE) as p:
            out, err = p.communicate(stdin.encode(), timeout=120)
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)

    def context(self):
        c = "t" + uuid.uuid4().hex[:12]
        self.contexts.append(c)
        return c

    @staticmethod
    def server_pid(ctx):
        with open(f"{CONTEXTS}/{ctx}.pid") as f:
            return f.read()

    def run_code(self, ctx, code):
        p = self.client("run", ctx, stdin=json.dumps({"code": code, "env": {}}))
        self.assertEqual(p.returncode, 0, p.stderr)
        return [json.loads(line) for line in p.stdout.decode().splitlines()]

    def test_a_client_that_goes_as_its_run_ends_never_interrupts_the_next_run(self):
        """CI found a KeyboardInterrupt in a cell no one interrupted (E2B's matplotlib case): the
        client ends at "end", and its server's watcher took that for a client gone mid-run when
        it woke before the run was marked done; its interrupt landed in the Event marking it
        done (so never marked) or, 5 s later, in the next run's code. A slow end (every
        Event.set sleeps, patched by the cell itself) made it happen each time."""
        ctx = self.context()
        slow = ("import threading, time\n_set = threading.Event.set\n"
                "def slow(self):\n    time.sleep(0.5)\n    _set(self)\n"
                "threading.Event.set = slow\n")
        self.assertEqual(self.run_code(ctx, slow)[-1]["type"], "end")
        pid = self.server_pid(ctx)
        # Longer than the watcher's two interrupts 5 s apart and its end of a wedged server.
        out = self.run_code(ctx, "threading.Event.set = _set\ntime.sleep(11)\n'slept'")
        self.assertEqual([m.get("text") for m in out if m["type"] == "result"], ["'slept'"], out)
        self.assertFalse([m for m in out if m["type"] in ("error", "stderr")], out)
        self.assertEqual(self.run_code(ctx, "1+1")[0]["text"], "2")
        self.assertEqual(self.server_pid(ctx), pid,
                         "the context's server was ended")

    def test_a_client_gone_mid_run_interrupts_its_code_only(self):
        """The interrupt a client's going sends reaches the code it ran (KeyboardInterrupt, the
        context kept); the next run is not interrupted."""
        ctx = self.context()
        self.run_code(ctx, "x = 1")
        p = self.spawn("run", ctx)
        p.stdin.write(json.dumps({"code": "import time\nprint('in', flush=True)\ntime.sleep(60)",
                                  "env": {}}).encode())
        p.stdin.close()
        self.assertIn(b"in", p.stdout.readline())
        p.kill()
        p.wait()
        p.stdout.close()
        t0 = time.monotonic()
        out = self.run_code(ctx, "import time\ntime.sleep(6)\nx + 1")
        self.assertLess(time.monotonic() - t0, 20)
        self.assertEqual([m.get("text") for m in out if m["type"] == "result"], ["2"], out)
        self.assertFalse([m for m in out if m["type"] == "error"], out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
