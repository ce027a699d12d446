"""Image archives made by the tests themselves (no registry, no network, no docker): a
`docker save` archive or an OCI image layout, from layers described as lists of entries, and a
busybox image made from the host's static busybox. Used by image_import_test.py (the importer
alone) and templates_test.py (an import through the daemon)."""
import gzip
import hashlib
import io
import json
import tarfile


def entry(name, kind="file", data=b"", mode=None, link="", uid=0, gid=0):
    return {"name": name, "kind": kind, "data": data, "mode": mode, "link": link, "uid": uid,
            "gid": gid}


def layer(entries):
    """A layer's tar (uncompressed) from entries."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for e in entries:
            ti = tarfile.TarInfo(e["name"])
            ti.uid, ti.gid, ti.mtime = e["uid"], e["gid"], 1700000000
            data = e["data"] if isinstance(e["data"], bytes) else e["data"].encode()
            if e["kind"] == "dir":
                ti.type, ti.mode = tarfile.DIRTYPE, e["mode"] or 0o755
                t.addfile(ti)
            elif e["kind"] == "symlink":
                ti.type, ti.linkname, ti.mode = tarfile.SYMTYPE, e["link"], 0o777
                t.addfile(ti)
            elif e["kind"] == "hardlink":
                ti.type, ti.linkname, ti.mode = tarfile.LNKTYPE, e["link"], e["mode"] or 0o644
                t.addfile(ti)
            else:
                ti.size, ti.mode = len(data), e["mode"] or 0o644
                t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def sha(b):
    return hashlib.sha256(b).hexdigest()


def config_of(layers, config=None):
    return {"architecture": "amd64", "os": "linux", "config": config or {},
            "rootfs": {"type": "layers", "diff_ids": ["sha256:" + sha(t) for t in layers]},
            "history": [{"created_by": "tests/api/oci_archives.py"} for _ in layers]}


def _add(t, name, data):
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode, ti.mtime = len(data), 0o644, 1700000000
    t.addfile(ti, io.BytesIO(data))


def docker_save(layers, config=None, tag="pandastack-test:latest", diff_ids=None):
    """A classic `docker save` archive (<hex>/layer.tar, <hex>.json, manifest.json).
    `diff_ids`: the config's, when a test means them to be wrong."""
    cfg = config_of(layers, config)
    if diff_ids is not None:
        cfg["rootfs"]["diff_ids"] = diff_ids
    cbytes = json.dumps(cfg).encode()
    chex = sha(cbytes)
    names = []
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for i, l in enumerate(layers):
            d = sha(l + bytes([i]))  # (a directory name per layer, as docker's are ids)
            names.append(f"{d}/layer.tar")
            _add(t, f"{d}/VERSION", b"1.0")
            _add(t, f"{d}/layer.tar", l)
        _add(t, f"{chex}.json", cbytes)
        _add(t, "manifest.json", json.dumps(
            [{"Config": f"{chex}.json", "RepoTags": [tag] if tag else None,
              "Layers": names}]).encode())
    return buf.getvalue()


def oci_blobs(layers, config=None, compress=True):
    """An image as a registry holds it: (its manifest's bytes, {hex digest: blob bytes})."""
    blobs = {}

    def blob(b):
        blobs[sha(b)] = b
        return {"digest": "sha256:" + sha(b), "size": len(b)}

    cfg = json.dumps(config_of(layers, config)).encode()
    lds = []
    for l in layers:
        b = gzip.compress(l, mtime=0) if compress else l
        d = blob(b)
        d["mediaType"] = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if compress else "")
        lds.append(d)
    cd = blob(cfg)
    cd["mediaType"] = "application/vnd.oci.image.config.v1+json"
    manifest = json.dumps({"schemaVersion": 2,
                           "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": cd, "layers": lds}).encode()
    return manifest, blobs


def oci_layout(layers, config=None, compress=True, ref="latest"):
    """An OCI image layout tar (oci-layout, index.json, blobs/sha256), gzip layers."""
    manifest, blobs = oci_blobs(layers, config, compress)

    def blob(b):
        blobs[sha(b)] = b
        return {"digest": "sha256:" + sha(b), "size": len(b)}

    md = blob(manifest)
    md["mediaType"] = "application/vnd.oci.image.manifest.v1+json"
    md["annotations"] = {"org.opencontainers.image.ref.name": ref}
    index = {"schemaVersion": 2, "manifests": [md]}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        _add(t, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        _add(t, "index.json", json.dumps(index).encode())
        for h, b in blobs.items():
            _add(t, f"blobs/sha256/{h}", b)
    return buf.getvalue()


BUSYBOX_APPLETS = ["sh", "ls", "cat", "echo", "id", "env", "pwd", "httpd", "sleep", "wc",
                   "grep", "tail", "setsid", "printf", "kill", "mkdir", "touch", "stat", "test",
                   "head", "sync", "true", "false", "rm", "uname", "nc"]


def busybox_layers(busybox_path="/bin/busybox"):
    """Two layers of a small image: busybox with its applets, then a user, a web root, a file
    and two whiteouts (a file and an opaque directory of the first layer removed)."""
    with open(busybox_path, "rb") as f:
        bb = f.read()
    one = [entry("bin/", "dir"), entry("bin/busybox", data=bb, mode=0o755)]
    one += [entry(f"bin/{a}", "symlink", link="busybox") for a in BUSYBOX_APPLETS]
    one += [entry("etc/", "dir"), entry("etc/motd", data="from layer one\n"),
            entry("opt/", "dir"), entry("opt/old", data="old\n"),
            entry("opt/keep-not", data="gone\n"),
            entry("usr/", "dir"), entry("usr/bin/", "dir"),
            entry("usr/bin/env", "symlink", link="/bin/busybox")]
    two = [entry("etc/passwd", data="root:x:0:0:root:/root:/bin/sh\n"
                                    "app:x:1000:1000:app:/home/app:/bin/sh\n"),
           entry("etc/group", data="root:x:0:\napp:x:1000:\n"),
           entry("etc/.wh.motd"),
           entry("opt/", "dir"), entry("opt/new", data="new\n"), entry("opt/.wh..wh..opq"),
           entry("home/", "dir"), entry("home/app/", "dir", uid=1000, gid=1000),
           entry("srv/", "dir"), entry("srv/hello.txt", data="hello from the image\n"),
           entry("srv/hello-link.txt", "hardlink", link="srv/hello.txt"),
           entry("www/", "dir"), entry("www/index.html", data="<h1>served by busybox</h1>\n")]
    return [layer(one), layer(two)]


BUSYBOX_CONFIG = {
    "Env": ["PATH=/bin:/usr/bin", "GREETING=hello from the image config"],
    "WorkingDir": "/srv",
    "User": "app",
    "Cmd": ["httpd", "-f", "-p", "8080", "-h", "/www"],
    "ExposedPorts": {"8080/tcp": {}},
}
