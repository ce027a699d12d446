"""PandaStack's code interpreter, inside the guest (python3, standard library only).

One server process per context keeps the context's globals between runs; it listens on a unix
socket under /run/pandastack/code (root's contexts) or /tmp/.pandastack-code-UID (another
account's: it runs as that account, its contexts apart from root's). Each run is one client process (an exec from the host):

    python3 -S pandastack_repl.py run CONTEXT [CWD]   < {"code": "...", "env": {...}}   (stdin)
    python3 -S pandastack_repl.py start CONTEXT [CWD]
    python3 -S pandastack_repl.py stop CONTEXT
    python3 -S pandastack_repl.py list

`run` starts the context's server if it is not running, sends the code, and copies the server's
JSON lines to stdout as they come: {"type": "stdout"|"stderr", "text"}, {"type": "result", "text",
"png"?, "json"?, "is_main_result"}, {"type": "error", "name", "value", "traceback"}, and last
{"type": "end", "execution_count"}. When the client dies (the host cancelled the run), the server
interrupts the code (KeyboardInterrupt); the context survives. Code that ignores the interrupt
(it catches KeyboardInterrupt and goes on) gets a second one after INTERRUPT_GRACE seconds, and
after as long again its server ends: the context's state is lost, and the next run (a fresh
server) says so on stderr first. `stop` kills the server by its pid file, so a busy context
restarts or goes at once. The value of the last expression is the main result; matplotlib
figures left open are results with a PNG (Agg backend).
"""
# A run is one client process (started with `python3 -S`, no site): under TCG each module
# imported costs the run's latency (all of the server's took ~0.8 s of a 1.2 s trivial run), so
# the client imports only these (io and codecs are loaded before any script) and talks through
# _socket (socket imports enum and selectors); the server imports the rest (server_imports()).
import _socket
import codecs
import io
import os
import sys
import time


def server_imports():
    global ast, base64, json, signal, socket, threading, linecache, traceback
    import ast
    import base64
    import json
    import linecache
    import signal
    import socket
    import threading
    import traceback

DIR = "/run/pandastack/code" if os.getuid() == 0 else "/tmp/.pandastack-code-%d" % os.getuid()
INTERRUPT_GRACE = 5  # seconds an interrupted run has to end before the next step


def sock_path(ctx):
    return os.path.join(DIR, ctx + ".sock")


def pid_path(ctx):
    return os.path.join(DIR, ctx + ".pid")


def lost_path(ctx):
    return os.path.join(DIR, ctx + ".lost")


def remove(*paths):
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


def valid(ctx):
    return 0 < len(ctx) <= 64 and all(c.isalnum() or c in "-_" for c in ctx)


# ---------------------------------------------------------------------------------- server ----

class Sink(io.RawIOBase):
    """The raw end of a run's sys.stdout / sys.stderr (see stream()). print() and write() go
    through C-level buffers, so a loop of prints costs what it costs in a plain process (a
    Python-level write per print made 20,000 lines four times slower than exec); bytes reach
    here a buffer at a time. Whole lines go to the client as JSON messages once GATHER characters
    gathered; drain() sends the rest, a partial line too (the flusher's, after DELAY, and the
    run's end). A message holds at most CHUNK characters (a large write is several)."""

    CHUNK = 65536
    GATHER = 8192
    DELAY = 0.05

    def __init__(self, send, kind):
        self.send, self.kind, self.buf = send, kind, ""
        self.decode = codecs.getincrementaldecoder("utf-8")("replace").decode
        self.lock = threading.Lock()
        self.last = time.monotonic()

    def writable(self):
        return True

    def write(self, b):
        text = self.decode(bytes(b))
        with self.lock:
            self.buf += text
            if len(self.buf) >= self.GATHER:
                cut = self.buf.rfind("\n") + 1
                if len(self.buf) > self.CHUNK:
                    cut = len(self.buf)
                self._send(cut)
        return len(b)

    def _send(self, n):  # (under the lock) the first n characters, in messages of CHUNK at most
        while n > 0:
            k = min(n, self.CHUNK)
            self.send({"type": self.kind, "text": self.buf[:k]})
            self.buf = self.buf[k:]
            n -= k
        self.last = time.monotonic()

    def drain(self, waited=0.0):  # what is held, if it has waited `waited` seconds or more
        with self.lock:
            if self.buf and time.monotonic() - self.last >= waited:
                self._send(len(self.buf))


def stream(send, kind):
    """A run's sys.stdout or sys.stderr: a text stream over a 64 KiB buffer (both in C) over a
    Sink; sys.stdout.buffer takes bytes as in any process."""
    sink = Sink(send, kind)
    text = io.TextIOWrapper(io.BufferedWriter(sink, 65536), encoding="utf-8",
                            errors="backslashreplace", write_through=False)
    return text, sink


def figures():
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return []
    out = []
    for n in plt.get_fignums():
        fig = plt.figure(n)
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        out.append({"type": "result", "text": repr(fig), "png": base64.b64encode(buf.getvalue()).decode(),
                    "is_main_result": False})
    plt.close("all")
    return out


def result_of(value):
    r = {"type": "result", "text": repr(value), "is_main_result": True}
    if isinstance(value, (dict, list)):
        try:
            r["json"] = json.loads(json.dumps(value))
        except (TypeError, ValueError):
            pass
    png = getattr(value, "_repr_png_", None)
    if callable(png):
        try:
            data = png()
            if data:
                r["png"] = base64.b64encode(data).decode()
        except Exception:
            pass
    if type(value).__name__ == "Figure" and hasattr(value, "savefig"):
        buf = io.BytesIO()
        value.savefig(buf, format="png")
        r["png"] = base64.b64encode(buf.getvalue()).decode()
    return r


class Server:
    def __init__(self, ctx):
        self.ctx = ctx
        self.globals = {"__name__": "__main__", "__builtins__": __builtins__}
        self.count = 0
        self.main = threading.main_thread().ident
        # Whether the code of the run being served is running: only it is interrupted. An
        # interrupt sent as a run ended (its client went just as it finished) is dropped, never
        # raised in whatever the server runs next: the next run's code, or the Event that says
        # the run is done (which would leave it unset, and the watcher interrupting the next run).
        self.interruptible = False
        self.lock = threading.Lock()  # the watcher's interrupt vs. the run's end (one())

    def on_interrupt(self, signum, frame):  # (the main thread, between two bytecodes)
        if self.interruptible:
            raise KeyboardInterrupt

    def run(self, code, send, env):
        self.count += 1
        old = sys.stdout, sys.stderr
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update({str(k): str(v) for k, v in env.items()})
        outs = stream(send, "stdout"), stream(send, "stderr")
        sys.stdout, sys.stderr = outs[0][0], outs[1][0]
        ended = threading.Event()

        def flush_all(waited=0.0):
            for text, sink in outs:
                try:
                    text.flush()
                except (ValueError, OSError):  # the code closed it
                    pass
                sink.drain(waited)

        def flusher():
            while not ended.wait(Sink.DELAY):
                flush_all(Sink.DELAY)

        flushing = threading.Thread(target=flusher, daemon=True)
        flushing.start()
        # (As a Jupyter kernel does: each run starts with the server's handler, whatever an
        # earlier cell installed.)
        signal.signal(signal.SIGINT, self.on_interrupt)
        # Its source lines for tracebacks (a function defined here and failing in a later
        # cell shows its own line: each cell has its own name).
        name = f"<cell {self.count}>"
        linecache.cache[name] = (len(code), None, code.splitlines(True), name)
        try:
            self.interruptible = True
            tree = ast.parse(code, name, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, name, "exec"), self.globals)
            value = eval(compile(last, name, "eval"), self.globals) if last else None
            flush_all()  # what it printed goes before its figures and its value
            for f in figures():
                send(f)
            if value is not None:
                self.globals["_"] = value
                send(result_of(value))
            self.interruptible = False
        except BaseException as e:  # KeyboardInterrupt too: the context lives on
            self.interruptible = False
            flush_all()  # what it printed goes before its error
            tb = traceback.format_exception(type(e), e, e.__traceback__)
            # Drop this file's own frame, and the parser's (a SyntaxError), from the traceback.
            tb = [t for t in tb if __file__ not in t and ast.__file__ not in t]
            send({"type": "error", "name": type(e).__name__, "value": str(e), "traceback": "".join(tb)})
        finally:
            ended.set()
            flushing.join()
            flush_all()
            sys.stdout, sys.stderr = old
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def serve(self, listener):
        while True:
            try:
                self.one(listener)
            except KeyboardInterrupt:  # an interrupt that came as a run ended
                pass

    def one(self, listener):
        if True:
            conn, _ = listener.accept()
            with conn:
                f = conn.makefile("rwb")
                line = f.readline()
                try:
                    req = json.loads(line)
                except ValueError:
                    return
                if req.get("op") == "stop":
                    remove(sock_path(self.ctx), pid_path(self.ctx))
                    os._exit(0)
                lock = threading.Lock()
                gone = threading.Event()

                def send(msg):
                    with lock:
                        if gone.is_set():
                            return
                        try:
                            f.write((json.dumps(msg) + "\n").encode())
                            f.flush()
                        except OSError:
                            gone.set()

                def watch():  # the client went away: interrupt the code
                    try:
                        while conn.recv(1):
                            pass
                    except OSError:
                        pass
                    if done.is_set():
                        return
                    gone.set()
                    for _ in range(2):
                        with self.lock:  # (never after the run's end: see interruptible)
                            if done.is_set():
                                return
                            signal.pthread_kill(self.main, signal.SIGINT)
                        if done.wait(INTERRUPT_GRACE):
                            return
                    # It ignores interrupts: the context ends, its state lost (and said so).
                    with open(lost_path(self.ctx), "w") as m:
                        m.write("the context's code ignored interrupts: its server was ended\n")
                    remove(sock_path(self.ctx), pid_path(self.ctx))
                    os._exit(1)

                done = threading.Event()
                threading.Thread(target=watch, daemon=True).start()
                try:
                    self.run(req.get("code", ""), send, req.get("env") or {})
                except KeyboardInterrupt:  # (not raised outside the code: see interruptible)
                    pass
                # Done before the client is told: it ends at "end", and its watcher must then
                # find the run done, not interrupt the next one.
                with self.lock:
                    done.set()
                send({"type": "end", "execution_count": self.count})


def serve(ctx, cwd):
    os.makedirs(DIR, mode=0o700, exist_ok=True)
    path = sock_path(ctx)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.unlink(path + ".tmp")
    except FileNotFoundError:
        pass
    listener.bind(path + ".tmp")
    listener.listen(8)
    with open(pid_path(ctx), "w") as f:
        f.write(str(os.getpid()))
    os.environ.setdefault("MPLBACKEND", "Agg")
    # Where commands and the files API are: a context starts there however it was started.
    home = "/workspace" if os.getuid() == 0 else os.environ.get("HOME", "/")
    os.chdir(cwd or (home if os.path.isdir(home) else "/"))
    os.rename(path + ".tmp", path)  # ready: clients connect from now on
    Server(ctx).serve(listener)


def start_server(ctx, cwd):
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        try:  # a fresh interpreter: nothing of this client's state, site-packages included
            os.execv(sys.executable, [sys.executable, "-u", os.path.abspath(__file__), "serve", ctx, cwd or ""])
        finally:
            os._exit(1)
    os.waitpid(pid, 0)


# ---------------------------------------------------------------------------------- client ----

def try_connect_quietly(ctx):
    s = try_connect(ctx)
    if s is not None:
        s.close()
    return s


def kill_server(ctx):
    """Ends the context's server; False when it had none (no such context)."""
    found = False
    try:
        with open(pid_path(ctx)) as f:
            pid = int(f.read().strip() or 0)
    except (FileNotFoundError, ValueError):
        pid = 0
    if pid > 0:
        try:  # (only our server of this context: a pid the kernel gave to another is left alone)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if b"serve" in argv and ctx.encode() in argv:
                found = True
                os.kill(pid, 9)  # SIGKILL
                for _ in range(500):
                    if not os.path.exists(f"/proc/{pid}"):
                        break
                    time.sleep(0.01)
        except (FileNotFoundError, ProcessLookupError):
            pass
    else:  # (a server from before pid files: ask it)
        s = try_connect(ctx)
        if s is not None:
            found = True
            s.sendall(b'{"op": "stop"}\n')
            s.recv(1)
    found = found or os.path.exists(lost_path(ctx))  # one that ended wedged: still a context
    remove(sock_path(ctx), pid_path(ctx), lost_path(ctx))
    return found


def try_connect(ctx):
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.connect(sock_path(ctx))
        return s
    except (FileNotFoundError, ConnectionRefusedError):
        s.close()
        return None


def connect(ctx, cwd, start):
    s = try_connect(ctx)
    if s is not None or not start:
        return s
    # (Started outside any `except`: the server would inherit the exception being handled and
    # chain it to every error of the code it runs.)
    if os.path.exists(sock_path(ctx)):
        os.unlink(sock_path(ctx))  # a server that died left it
    start_server(ctx, cwd)
    deadline = time.monotonic() + 60
    while True:
        s = try_connect(ctx)
        if s is not None:
            return s
        if time.monotonic() > deadline:
            raise SystemExit("the context's server did not start")
        time.sleep(0.01)


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "list":
        import json
        names = sorted(n[:-5] for n in os.listdir(DIR) if n.endswith(".sock")) if os.path.isdir(DIR) else []
        print(json.dumps(names))
        return
    ctx = args[0]
    if not valid(ctx):
        raise SystemExit("bad context name")
    if cmd == "serve":
        server_imports()
        serve(ctx, args[1] if len(args) > 1 else "")
        return
    if cmd == "start":  # the context's server, with its working folder
        cwd = args[1] if len(args) > 1 else None
        if cwd and not os.path.isdir(cwd):
            sys.stderr.write(f"no folder {cwd}\n")
            sys.exit(3)
        connect(ctx, cwd, True).close()
        return
    if cmd == "stop":  # at once, busy or not: the server is killed by its pid
        if not kill_server(ctx):
            sys.stderr.write(f"no context {ctx}\n")
            sys.exit(4)
        return
    if cmd != "run":
        raise SystemExit("usage: run|stop|list")
    req = sys.stdin.read()
    out = sys.stdout.buffer
    for attempt in range(2):
        # A server that ended because its code ignored interrupts: this run gets a fresh one and
        # is told so (once).
        if os.path.exists(lost_path(ctx)) and try_connect_quietly(ctx) is None:
            with open(lost_path(ctx)) as f:
                lost = f.read().strip()
            os.unlink(lost_path(ctx))
            import json
            msg = {"type": "stderr", "text": f"[pandastack] {lost}; this run has a fresh context "
                                             "(its variables and imports are gone)\n"}
            out.write((json.dumps(msg) + "\n").encode())
            out.flush()
        s = connect(ctx, args[1] if len(args) > 1 else None, True)
        s.sendall(req.replace("\n", " ").encode() + b"\n")
        buf, got = b"", 0
        while True:
            try:
                chunk = s.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            got += len(chunk)
            out.write(chunk)
            out.flush()
            buf = (buf + chunk)[-4096:]
            if b'"type": "end"' in buf:
                return
        # The server went before answering: a run that waited behind a wedged cell tries once
        # more on the fresh server.
        if got or not os.path.exists(lost_path(ctx)):
            return

if __name__ == "__main__":
    main()
