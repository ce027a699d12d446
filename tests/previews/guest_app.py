"""The web app the preview tests run inside a sandbox (Python's standard library only): a page
that opens a WebSocket back to its own origin, request headers as JSON, an upload checksum, a large
streamed download, server-sent events and a WebSocket echo."""
import base64
import hashlib
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PAGE = b"""<!doctype html><html><head><title>preview app</title></head><body>
<h1 id="title">hello from the sandbox</h1><p id="ws">waiting</p>
<script>
const ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host +
                         location.pathname.replace(/[^/]*$/, "") + "ws");
ws.onopen = () => ws.send("ping-from-browser");
ws.onmessage = (e) => { document.getElementById("ws").textContent = "echo:" + e.data; };
ws.onerror = () => { document.getElementById("ws").textContent = "error"; };
</script></body></html>"""
CHUNK = bytes(range(256)) * 4096  # 1 MiB


class App(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body, ctype="application/json", extra=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        path = self.path.split("?")[0]
        if path == "/":
            return self.reply(200, PAGE, "text/html")
        if path == "/headers":
            return self.reply(200, json.dumps({"path": self.path, "headers": dict(self.headers)})
                              .encode(), extra=[("Set-Cookie", "app=1; Path=/")])
        if path == "/big":
            mib = int(self.path.split("mib=")[1]) if "mib=" in self.path else 100
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(mib * len(CHUNK)))
            self.end_headers()
            for _ in range(mib):
                self.wfile.write(CHUNK)
            return
        if path == "/sse":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.close_connection = True
            for i in range(3):
                self.wfile.write(f"data: tick {i}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.3)
            return
        if path == "/ws":
            return self.websocket()
        self.reply(404, b'{"error": "no such page"}')

    def do_POST(self):
        h = hashlib.sha256()
        n = 0
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    break
                data = self.rfile.read(size)
                h.update(data)
                n += len(data)
                self.rfile.readline()
        else:
            left = int(self.headers.get("Content-Length", 0))
            while left:
                data = self.rfile.read(min(left, 1 << 20))
                h.update(data)
                n += len(data)
                left -= len(data)
        self.reply(200, json.dumps({"bytes": n, "sha256": h.hexdigest()}).encode())

    def websocket(self):
        key = self.headers["Sec-WebSocket-Key"]
        accept = base64.b64encode(hashlib.sha1(
            (key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            opcode, n = head[0] & 0x0F, head[1] & 0x7F
            if n == 126:
                n = int.from_bytes(self.rfile.read(2), "big")
            elif n == 127:
                n = int.from_bytes(self.rfile.read(8), "big")
            mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
            if opcode == 8:
                self.wfile.write(b"\x88\x02\x03\xe8")
                return
            if opcode in (1, 2):
                out = data if n < 126 else data[:125]
                self.wfile.write(bytes([0x80 | opcode, len(out)]) + out)
                self.wfile.flush()


if __name__ == "__main__":
    ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), App).serve_forever()
