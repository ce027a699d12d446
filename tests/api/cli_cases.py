"""The `pandastack` CLI against the API suite's daemon (api_test.py mixes these cases into its
ApiTest: they use its daemon, `self.api` and `self.daemon`, and its --cli)."""
import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import termios
import time

import harness


class _Args:
    """harness.ARGS, read when used (main sets it after import)."""

    def __getattr__(self, name):
        return getattr(harness.ARGS, name)


ARGS = _Args()


class CliCases:
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
