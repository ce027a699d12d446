#!/usr/bin/env python3
"""The code interpreter through the real daemon and real VMs (the base template's python3):
state kept between runs, the last expression's value, errors with tracebacks, streaming, an
interrupt that leaves the context alive, contexts, the state surviving hibernate/wake and fork,
and a guest that rewrites its client to flood the daemon (security review 3, H3: bounded).

Usage: code_test.py --daemon build/bin/pandastackd [--images DIR]
"""
import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Api, Daemon  # noqa: E402


class CodeTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.base = tempfile.mkdtemp(prefix="pst-code-", dir="/dev/shm")
        cls.daemon = Daemon(os.path.join(cls.base, "data"), os.path.join(cls.base, "state"),
                            extra=("--network", "off"))
        cls.api = Api(cls.daemon)

    @classmethod
    def tearDownClass(cls):
        code = cls.daemon.stop(reap=True)
        shutil.rmtree(cls.base, ignore_errors=True)
        assert code == 0, f"daemon exited {code}"

    def run_code(self, sid, code, **kw):
        s, b = self.api.call("POST", f"/v1/sandboxes/{sid}/code", dict(code=code, **kw))
        self.assertEqual(s, 200, b)
        return b

    def test_state_results_errors_and_streaming(self):
        sid = self.api.create()["id"]
        r = self.run_code(sid, "x = 41\nprint('hello')\nx + 1")
        self.assertEqual(r["stdout"], "hello\n")
        self.assertEqual([x["text"] for x in r["results"]], ["42"])
        self.assertIsNone(r["error"])
        self.assertEqual(r["execution_count"], 1)
        # Variables, imports and the working folder persist.
        self.run_code(sid, "import os\nos.chdir('/tmp')")
        r = self.run_code(sid, "(x, os.getcwd())")
        self.assertEqual(r["results"][0]["text"], "(41, '/tmp')")
        self.assertEqual(r["execution_count"], 3)
        r = self.run_code(sid, "{'a': [1, 2]}")
        self.assertEqual(r["results"][0]["json"], {"a": [1, 2]})
        r = self.run_code(sid, "def f():\n    return 1/0\nf()")
        self.assertEqual((r["error"]["name"], r["error"]["value"]), ("ZeroDivisionError", "division by zero"))
        self.assertIn('line 2, in f', r["error"]["traceback"])
        self.assertNotIn("pandastack", r["error"]["traceback"])  # our own frames are not shown
        # With the cell's source lines; a SyntaxError without the parser's own frame
        # (exploratory test 3 #21).
        self.assertIn("return 1/0", r["error"]["traceback"])
        r = self.run_code(sid, "x = (")
        self.assertEqual(r["error"]["name"], "SyntaxError", r)
        self.assertNotIn("ast.py", r["error"]["traceback"])
        r = self.run_code(sid, "import sys\nprint('warn', file=sys.stderr)", env={"K": "v"})
        self.assertEqual(r["stderr"], "warn\n")
        self.assertEqual(self.run_code(sid, "import os\nos.environ.get('K')", env={"K": "v"})["results"][0]["text"], "'v'")
        self.assertEqual(self.run_code(sid, "os.environ.get('K')")["results"], [])  # per run only
        # Streaming: output arrives as it is printed, then the result and the end.
        events = list(self.api.sse(f"/v1/sandboxes/{sid}/code/stream",
                                   {"code": "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.2)\n'done'"}))
        kinds = [e for e, _ in events]
        self.assertEqual([d["text"] for e, d in events if e == "stdout"], ["0\n", "1\n", "2\n"])
        self.assertEqual(kinds[-2:], ["result", "end"])
        # Bad input.
        for body, code in (({}, "invalid_argument"), ({"code": "1", "language": "r"}, "invalid_argument"),
                           ({"code": "1", "context": "../x"}, "invalid_argument")):
            s, b = self.api.call("POST", f"/v1/sandboxes/{sid}/code", body)
            self.assertEqual((s, b["error"]["code"]), (400, code), body)
        s, b = self.api.call("POST", "/v1/sandboxes/sbx_aaaaaaaaaaaaaaaa/code", {"code": "1"})
        self.assertEqual(s, 404)

    def test_a_rewritten_client_cannot_grow_the_daemon(self):
        """H3: guest root replaces the interpreter's client (a script in the guest) with one that
        writes a line that never ends, or thousands of results: the daemon holds a bounded line
        (the run fails with 413 output_too_large, its command killed) and a bounded answer."""
        sid = self.api.create()["id"]
        self.run_code(sid, "1")  # (the client is installed)
        s, r = self.api.exec(sid, "ls /run/pandastack/repl-*.py")
        self.assertEqual(s, 200, r)
        script = r["stdout"].split()[0]
        flood = ("import sys\nw = sys.stdout.buffer\nchunk = b'x' * (1 << 20)\n"
                 "for _ in range(64):\n    w.write(chunk); w.flush()\n")
        s, r = self.api.call("PUT", f"/v1/sandboxes/{sid}/files?path={script}", raw=flood)
        self.assertEqual(s, 200, r)
        def rss_mib():
            with open(f"/proc/{self.daemon.proc.pid}/status") as f:
                return next(int(x.split()[1]) for x in f if x.startswith("VmRSS:")) / 1024
        rss0 = rss_mib()
        t0 = time.time()
        s, b = self.api.call("POST", f"/v1/sandboxes/{sid}/code", {"code": "1"})
        self.assertEqual((s, b.get("error", {}).get("code")), (413, "output_too_large"), b)
        self.assertLess(time.time() - t0, 60)
        self.assertLess(rss_mib() - rss0, 40, "the daemon held the guest's 64 MiB line")
        s, r = self.api.exec(sid, "pgrep -f 'repl-[0-9a-f]*[.]py' || true")
        self.assertEqual(r["stdout"], "", r)  # (killed at the bound, not left writing)
        many = ("import json, sys\nfor i in range(3000):\n"
                "    print(json.dumps({'type': 'result', 'text': str(i), 'is_main_result': False}))\n"
                "print(json.dumps({'type': 'end', 'execution_count': 1}))\n")
        s, r = self.api.call("PUT", f"/v1/sandboxes/{sid}/files?path={script}", raw=many)
        self.assertEqual(s, 200, r)
        b = self.run_code(sid, "1")
        self.assertEqual((len(b["results"]), b["truncated"]), (1000, True), len(b["results"]))
        self.api.call("DELETE", f"/v1/sandboxes/{sid}")

    def test_a_context_that_ignores_interrupts_is_restarted_and_says_so(self):
        """Exploratory test 3, #5: a cell that catches KeyboardInterrupt and goes on does not
        wedge its context: the run waiting behind it gets a fresh context, told so on stderr;
        restart works on a busy context at once."""
        sid = self.api.create()["id"]
        self.run_code(sid, "x = 1")
        stubborn = ("import time\nfor i in range(3):\n    try:\n        time.sleep(100)\n"
                    "    except KeyboardInterrupt:\n        print('caught', i, flush=True)")
        r = self.run_code(sid, stubborn, timeout_seconds=3)
        self.assertTrue(r["timed_out"], r)
        t0 = time.monotonic()
        r = self.run_code(sid, "1+1", timeout_seconds=60)
        self.assertEqual(r["results"][0]["text"], "2", r)
        self.assertIn("fresh context", r["stderr"], r)
        self.assertLess(time.monotonic() - t0, 30)
        self.assertEqual(self.run_code(sid, "'x' in globals()")["results"][0]["text"], "False")
        # A restart of a busy context does not wait for its cell.
        busy = threading.Thread(target=self.api.call, args=(
            "POST", f"/v1/sandboxes/{sid}/code", {"code": "import time\ntime.sleep(40)",
                                                 "timeout_seconds": 60}))
        busy.start()
        time.sleep(3)
        t0 = time.monotonic()
        s, b = self.api.call("POST", f"/v1/sandboxes/{sid}/code/contexts/default/restart")
        self.assertEqual(s, 200, b)
        self.assertLess(time.monotonic() - t0, 15)
        busy.join(60)
        self.assertEqual(self.run_code(sid, "2+2")["results"][0]["text"], "4")
        self.api.call("DELETE", f"/v1/sandboxes/{sid}")

    def test_output_is_as_fast_as_exec_and_kept_up_to_its_bound(self):
        """Exploratory test 3, #11 and #12: 20,000 printed lines come within twice exec's time
        for the same lines (plus half a second: a run's fixed cost), print() going through C-level
        buffers as in a plain process; one write over 16 MiB keeps its first 16 MiB (truncated),
        as exec does."""
        sid = self.api.create()["id"]
        self.run_code(sid, "1")
        # The best of three each: one sample on this 2-core host under `make test`'s -j2 load
        # varies by more than the bound (a slow one was 3x its neighbours).
        exec_s = code_s = float("inf")
        for _ in range(3):
            t0 = time.monotonic()
            s, r = self.api.exec(sid, "python3 -c 'for i in range(20000): print(\"x\" * 99)'")
            exec_s = min(exec_s, time.monotonic() - t0)
            self.assertEqual(len(r["stdout"]), 20000 * 100)
            t0 = time.monotonic()
            r = self.run_code(sid, "for i in range(20000):\n    print('x' * 99)",
                              timeout_seconds=120)
            code_s = min(code_s, time.monotonic() - t0)
            self.assertEqual(len(r["stdout"]), 20000 * 100)
        print(f"20,000 lines (best of 3): code {code_s:.2f} s, exec {exec_s:.2f} s",
              file=sys.stderr)
        self.assertLess(code_s, 2 * exec_s + 0.5, (code_s, exec_s))
        r = self.run_code(sid, "print('\\n'.join(['x' * 99] * 170000))", timeout_seconds=300)
        self.assertEqual((len(r["stdout"]), r["truncated"]), (16 << 20, True))
        self.api.call("DELETE", f"/v1/sandboxes/{sid}")

    def test_interrupt_keeps_the_context(self):
        sid = self.api.create()["id"]
        self.run_code(sid, "kept = 'yes'")
        t0 = time.monotonic()
        r = self.run_code(sid, "while True:\n    pass", timeout_seconds=2)
        self.assertTrue(r["timed_out"], r)
        self.assertEqual(r["error"]["name"], "TimeoutError", r)  # not null (#21)
        self.assertLess(time.monotonic() - t0, 30)
        # The interrupt reached the code (KeyboardInterrupt), the context lives on.
        self.assertEqual(self.run_code(sid, "kept")["results"][0]["text"], "'yes'")

    def test_contexts(self):
        sid = self.api.create()["id"]
        self.run_code(sid, "a = 1")
        s, c = self.api.call("POST", f"/v1/sandboxes/{sid}/code/contexts", {"cwd": "/tmp"})
        self.assertEqual(s, 201, c)
        self.assertTrue(c["id"].startswith("ctx_"))
        r = self.run_code(sid, "import os\n('a' in globals(), os.getcwd())", context=c["id"])
        self.assertEqual(r["results"][0]["text"], "(False, '/tmp')")
        s, listed = self.api.call("GET", f"/v1/sandboxes/{sid}/code/contexts")
        self.assertEqual(sorted(x["id"] for x in listed["contexts"]), sorted(["default", c["id"]]))
        self.run_code(sid, "b = 2", context=c["id"])
        s, _ = self.api.call("POST", f"/v1/sandboxes/{sid}/code/contexts/{c['id']}/restart")
        self.assertEqual(s, 200)
        self.assertEqual(self.run_code(sid, "'b' in globals()", context=c["id"])["results"][0]["text"], "False")
        s, _ = self.api.call("DELETE", f"/v1/sandboxes/{sid}/code/contexts/{c['id']}")
        self.assertEqual(s, 204)
        s, b = self.api.call("DELETE", f"/v1/sandboxes/{sid}/code/contexts/{c['id']}")
        self.assertEqual((s, b["error"]["code"]), (404, "context_not_found"), b)
        s, listed = self.api.call("GET", f"/v1/sandboxes/{sid}/code/contexts")
        self.assertEqual([x["id"] for x in listed["contexts"]], ["default"])
        self.assertEqual(self.run_code(sid, "a")["results"][0]["text"], "1")
        # Every context starts in /workspace unless told (exploratory test 3, #13): the default
        # one, one made without cwd, one named by a run, a restarted one; a missing cwd is 400.
        s, plain = self.api.call("POST", f"/v1/sandboxes/{sid}/code/contexts", {})
        self.assertEqual(s, 201, plain)
        for ctx in ("default", plain["id"], "named-by-a-run"):
            r = self.run_code(sid, "import os\nos.getcwd()", context=ctx)
            self.assertEqual(r["results"][0]["text"], "'/workspace'", ctx)
        s, r = self.api.call("POST", f"/v1/sandboxes/{sid}/code/contexts/{plain['id']}/restart")
        self.assertEqual(s, 200, r)
        r = self.run_code(sid, "import os\nos.getcwd()", context=plain["id"])
        self.assertEqual(r["results"][0]["text"], "'/workspace'")
        s, r = self.api.call("POST", f"/v1/sandboxes/{sid}/code/contexts", {"cwd": "/nonexistent"})
        self.assertEqual((s, r["error"]["code"]), (400, "invalid_cwd"), r)
        # As another account of the guest: its own contexts, started in its home.
        who = "import os, pwd\n(pwd.getpwuid(os.getuid()).pw_name, os.getcwd(), 'a' in globals())"
        r = self.run_code(sid, who, user="user")
        self.assertEqual(r["results"][0]["text"], "('user', '/home/user', False)", r)
        self.run_code(sid, "a = 5", user="user")
        self.assertEqual(self.run_code(sid, "a")["results"][0]["text"], "1")  # root's is apart
        s, listed = self.api.call("GET", f"/v1/sandboxes/{sid}/code/contexts?user=user")
        self.assertEqual([x["id"] for x in listed["contexts"]], ["default"])
        self.assertEqual(self.api.call("DELETE", f"/v1/sandboxes/{sid}/code/contexts/default?user=user")[0], 204)
        self.assertEqual(self.run_code(sid, "'a' in globals()", user="user")["results"][0]["text"], "False")
        s, r = self.api.call("POST", f"/v1/sandboxes/{sid}/code", {"code": "1", "user": "No Such"})
        self.assertEqual((s, r["error"]["code"]), (400, "invalid_argument"), r)

    def test_state_survives_hibernate_wake_and_fork(self):
        sid = self.api.create()["id"]
        self.run_code(sid, "import random\nsecret = [random.random() for _ in range(3)]")
        before = self.run_code(sid, "secret")["results"][0]["text"]
        s, b = self.api.call("POST", f"/v1/sandboxes/{sid}/hibernate")
        self.assertEqual(s, 200, b)
        s, b = self.api.call("POST", f"/v1/sandboxes/{sid}/wake")
        self.assertEqual(s, 200, b)
        self.assertEqual(self.run_code(sid, "secret")["results"][0]["text"], before)
        s, kids = self.api.call("POST", f"/v1/sandboxes/{sid}/fork", {"count": 1})
        self.assertEqual(s, 201, kids)
        kid = kids["sandboxes"][0]["id"]
        self.assertEqual(self.run_code(kid, "secret")["results"][0]["text"], before)
        # They diverge from there.
        self.run_code(kid, "secret = 'child'")
        self.assertEqual(self.run_code(sid, "secret")["results"][0]["text"], before)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    p.add_argument("--images", default=os.environ.get("PANDASTACK_IMAGES", "var/images"))
    args, rest = p.parse_known_args()
    args.images = os.path.abspath(args.images)
    harness.ARGS = args
    harness.run_unittests(rest)
