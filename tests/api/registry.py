"""A registry the tests run on loopback (the OCI distribution API's read side), for what
Debian's docker-registry does not show: Docker's token sign-in (401 with a Bearer challenge, a
token for Basic credentials), blob downloads redirected to another host (a CDN, which must not
see the registry's credentials) and a blob whose bytes do not match its digest.

    r = Registry(manifest, blobs, repo="test/app", tag="1", user="u", password="p")
    r.start(); ...; r.stop()
"""
import base64
import hashlib
import http.server
import json
import secrets
import threading


class Registry:
    def __init__(self, manifest, blobs, repo, tag, user=None, password=None, tamper=None):
        self.manifest, self.blobs, self.repo, self.tag = manifest, blobs, repo, tag
        self.user, self.password, self.tamper = user, password, tamper
        self.token = secrets.token_hex(16)
        self.log = []  # (path, the Authorization header or "")
        self.cdn_saw_credentials = False
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.port = self.server.server_address[1]

    def start(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        reg = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def send(self, code, body=b"", headers=None):
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                auth = self.headers.get("Authorization", "")
                reg.log.append((self.path, auth))
                if self.path.startswith("/token"):
                    want = "Basic " + base64.b64encode(
                        f"{reg.user}:{reg.password}".encode()).decode()
                    if auth != want:
                        return self.send(401, b"{}")
                    return self.send(200, json.dumps({"token": reg.token}).encode())
                if self.path.startswith("/cdn/"):  # (another host: never the credentials)
                    if auth:
                        reg.cdn_saw_credentials = True
                    digest = self.path[len("/cdn/"):].split("?")[0]
                    data = reg.blobs.get(digest)
                    if data is None:
                        return self.send(404)
                    if reg.tamper == digest:
                        data = data[:-1] + bytes([data[-1] ^ 1])
                    return self.send(200, data)
                if reg.user and auth != "Bearer " + reg.token:
                    return self.send(401, b"{}", {"WWW-Authenticate":
                                                  f'Bearer realm="http://127.0.0.1:{reg.port}/token"'
                                                  f',service="test",scope="repository:'
                                                  f'{reg.repo}:pull"'})
                base = f"/v2/{reg.repo}/"
                if self.path in (base + "manifests/" + reg.tag,
                                 base + "manifests/sha256:" +
                                 hashlib.sha256(reg.manifest).hexdigest()):
                    return self.send(200, reg.manifest, {
                        "Content-Type": "application/vnd.oci.image.manifest.v1+json"})
                if self.path.startswith(base + "blobs/sha256:"):
                    digest = self.path[len(base + "blobs/sha256:"):]
                    if digest not in reg.blobs:
                        return self.send(404)
                    # Redirected to "another host" (localhost, not 127.0.0.1), as registries
                    # send their blobs to a CDN.
                    return self.send(307, b"", {
                        "Location": f"http://localhost:{reg.port}/cdn/{digest}?sig=x"})
                return self.send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')

        return H
