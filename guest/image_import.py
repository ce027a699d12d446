#!/usr/bin/python3
"""An OCI image made a template's root file system (issue 37).

Runs as root inside a builder microVM (actors/image_import.h), never on the host: the archive a
tenant uploaded is a read-only disk of the guest, the new root file system another, and this
script the only thing that reads the one and writes the other. Nothing here is trusted more than
the archive itself: every name is checked, every digest verified before a byte is unpacked, and
every path resolved from a directory descriptor of the new root, so no entry reaches outside it.

What it reads: a `docker save` archive (manifest.json: the classic `<hex>/layer.tar` form and
Docker 25's OCI form) or an OCI image layout tar (oci-layout, index.json, blobs/sha256/...),
plain or gzip-compressed, with uncompressed or gzip layers (zstd layers are refused).

What it checks, before anything is written:
  - exactly one image (an index of several: the linux/amd64 one);
  - every blob named by a digest hashes to it (sizes too); the config's `rootfs.diff_ids` match
    the layers' uncompressed contents, one for one;
  - the image is for linux/amd64.
What it refuses while unpacking (the whole import fails; the disk is thrown away):
  - an entry named with `..` or an absolute path, or a hard link to one;
  - an entry written through a symlink that points outside the image: an absolute one, or one
    that climbs above the root (a relative symlink inside the image is followed, as Docker does).
Whiteouts are applied as Docker's overlay layers mean them (`.wh.NAME` removes NAME of the lower
layers; `.wh..wh..opq` empties its directory of them). Owners, modes, times, devices and the
`security.capability` / `user.*` extended attributes are kept.

Then: the directories the guest's init needs (/proc /sys /dev /run /tmp /etc), the image's Env
for every process (/etc/pandastack/env, /etc/profile.d/pandastack-template.sh), its WorkingDir
made, its User resolved to numbers from the image's own /etc/passwd and /etc/group, and a
/bin/sh (a static busybox, given by the host) only where the image has none. What the host needs
(env, entrypoint, cmd, workdir, uid/gid, exposed ports, digests) is written as JSON.
"""
import argparse
import gzip
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import tarfile
import time

MAX_JSON = 4 << 20          # a manifest, index or config
MAX_LAYERS = 128
MAX_ENTRIES = 2_000_000     # entries of all layers together
MAX_SYMLINK_FOLLOWS = 40
CHUNK = 1 << 20
HEX64 = re.compile(r"^[0-9a-f]{64}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Refused(Exception):
    """The archive is not one this import takes: the reason, for the tenant."""


def log(msg):
    print(msg, flush=True)


# ---------------------------------------------------------------------------------------------
# The archive: its members, JSON documents, blobs and their digests.


def parts_of(name, what):
    """An archive or layer name as its components; refuses absolute names and `..`."""
    if name.startswith("/"):
        raise Refused(f"{what}: the entry {name!r} is an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise Refused(f"{what}: the entry {name!r} climbs out with '..'")
    return parts


class Archive:
    def __init__(self, path):
        try:
            self.tar = tarfile.open(path, "r:*")
        except (tarfile.TarError, OSError):
            raise Refused("the upload is not a tar archive (plain or gzip-compressed)")
        self.members = {}
        for m in self.tar:
            if m.isfile():
                self.members["/".join(parts_of(m.name, "the archive"))] = m

    def member(self, name):
        key = "/".join(parts_of(name, "the archive"))
        m = self.members.get(key)
        if m is None:
            raise Refused(f"the archive has no file {name!r}")
        return m

    def has(self, name):
        return name in self.members

    def read_json(self, name, digest=None):
        m = self.member(name)
        if m.size > MAX_JSON:
            raise Refused(f"{name}: larger than {MAX_JSON} bytes")
        data = self.tar.extractfile(m).read()
        if digest is not None and hashlib.sha256(data).hexdigest() != digest:
            raise Refused(f"{name}: its content does not match its digest sha256:{digest}")
        try:
            return json.loads(data)
        except ValueError as e:
            raise Refused(f"{name}: not JSON ({e})")

    def hash_member(self, name):
        h = hashlib.sha256()
        f = self.tar.extractfile(self.member(name))
        while True:
            b = f.read(CHUNK)
            if not b:
                return h.hexdigest()
            h.update(b)

    def open_layer(self, name):
        """The layer's tar stream, decompressed."""
        f = self.tar.extractfile(self.member(name))
        magic = f.read(4)
        f.seek(0)
        if magic[:2] == b"\x1f\x8b":
            return gzip.GzipFile(fileobj=f, mode="rb")
        if magic == b"\x28\xb5\x2f\xfd":
            raise Refused(f"{name}: a zstd-compressed layer (not supported: save the image "
                          "with `docker save`, whose layers are plain tar)")
        return f


def digest_hex(digest, what):
    if not isinstance(digest, str) or not digest.startswith("sha256:") or \
            not HEX64.match(digest[7:]):
        raise Refused(f"{what}: {digest!r} is not a sha256 digest")
    return digest[7:]


def blob_name(digest, what):
    return "blobs/sha256/" + digest_hex(digest, what)


def platform_ok(p):
    return isinstance(p, dict) and p.get("os") == "linux" and p.get("architecture") == "amd64"


def pick_manifest(archive, index, what, depth=0):
    """The one image manifest an OCI index names (the linux/amd64 one of several)."""
    ms = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(ms, list) or not ms:
        raise Refused(f"{what}: names no image")
    if len(ms) > 1:
        ms = [m for m in ms if isinstance(m, dict) and platform_ok(m.get("platform"))]
        if len(ms) != 1:
            raise Refused(f"{what}: holds several images and not exactly one for linux/amd64 "
                          "(export one image)")
    desc = ms[0]
    name = blob_name(desc.get("digest"), what)
    doc = archive.read_json(name, digest_hex(desc["digest"], what))
    if "size" in desc and archive.member(name).size != desc["size"]:
        raise Refused(f"{name}: its size does not match its descriptor's")
    mt = doc.get("mediaType", desc.get("mediaType", ""))
    if "index" in mt or "manifest.list" in mt or "manifests" in doc:
        if depth > 2:
            raise Refused(f"{what}: indexes nested too deep")
        return pick_manifest(archive, doc, name, depth + 1)
    return doc


def read_image(archive):
    """(format, config, config digest, [(layer member name)], tags), every digest checked."""
    if archive.has("manifest.json"):
        manifest = archive.read_json("manifest.json")
        if not isinstance(manifest, list) or len(manifest) != 1 or \
                not isinstance(manifest[0], dict):
            n = len(manifest) if isinstance(manifest, list) else 0
            raise Refused(f"manifest.json: the archive holds {n} images (import one: "
                          "`docker save` one image)")
        entry = manifest[0]
        cname = entry.get("Config")
        layers = entry.get("Layers")
        if not isinstance(cname, str) or not isinstance(layers, list):
            raise Refused("manifest.json: no Config or Layers")
        # Its config is named by its digest (`<hex>.json`, or `blobs/sha256/<hex>`).
        m = re.match(r"^(?:blobs/sha256/)?([0-9a-f]{64})(?:\.json)?$", cname)
        if not m:
            raise Refused(f"manifest.json: the config {cname!r} is not named by its digest")
        config = archive.read_json(cname, m.group(1))
        for ln in layers:
            if not isinstance(ln, str):
                raise Refused("manifest.json: a layer that is not a file name")
            lm = re.match(r"^blobs/sha256/([0-9a-f]{64})$", ln)
            if lm and archive.hash_member(ln) != lm.group(1):
                raise Refused(f"{ln}: its content does not match its digest")
        tags = [t for t in entry.get("RepoTags") or [] if isinstance(t, str)]
        return "docker-archive", config, m.group(1), list(layers), tags
    if archive.has("index.json"):
        index = archive.read_json("index.json")
        manifest = pick_manifest(archive, index, "index.json")
        cdesc = manifest.get("config")
        if not isinstance(cdesc, dict):
            raise Refused("the image manifest has no config")
        chex = digest_hex(cdesc.get("digest"), "the config")
        config = archive.read_json("blobs/sha256/" + chex, chex)
        layers = []
        for d in manifest.get("layers") or []:
            if not isinstance(d, dict):
                raise Refused("the image manifest: a layer that is not a descriptor")
            if "zstd" in str(d.get("mediaType", "")):
                raise Refused("a zstd-compressed layer (not supported: use gzip or plain tar)")
            name = blob_name(d.get("digest"), "a layer")
            if "size" in d and archive.member(name).size != d["size"]:
                raise Refused(f"{name}: its size does not match its descriptor's")
            if archive.hash_member(name) != name[len("blobs/sha256/"):]:
                raise Refused(f"{name}: its content does not match its digest")
            layers.append(name)
        tags = []
        for d in index.get("manifests") or []:
            ref = (d.get("annotations") or {}).get("org.opencontainers.image.ref.name") \
                if isinstance(d, dict) else None
            if isinstance(ref, str):
                tags.append(ref)
        return "oci-layout", config, chex, layers, tags
    raise Refused("the upload is neither a `docker save` archive (manifest.json) nor an OCI "
                  "image layout (index.json)")


def check_layers(archive, config, layers):
    """Every layer's uncompressed content against the config's diff_ids, before any is used."""
    if not isinstance(config, dict):
        raise Refused("the image config is not an object")
    if config.get("os", "linux") != "linux" or config.get("architecture", "amd64") != "amd64":
        raise Refused(f"the image is for {config.get('os')}/{config.get('architecture')}: "
                      "sandboxes run linux/amd64")
    diff_ids = (config.get("rootfs") or {}).get("diff_ids")
    if not isinstance(diff_ids, list) or len(diff_ids) != len(layers):
        raise Refused(f"the config names {len(diff_ids) if isinstance(diff_ids, list) else 0} "
                      f"layers, the manifest {len(layers)}")
    if len(layers) > MAX_LAYERS:
        raise Refused(f"{len(layers)} layers: at most {MAX_LAYERS}")
    for i, (name, want) in enumerate(zip(layers, diff_ids)):
        want = digest_hex(want, f"diff_id {i}")
        h = hashlib.sha256()
        f = archive.open_layer(name)
        try:
            while True:
                b = f.read(CHUNK)
                if not b:
                    break
                h.update(b)
        except (OSError, EOFError) as e:
            raise Refused(f"{name}: cannot be read ({e})")
        if h.hexdigest() != want:
            raise Refused(f"layer {i + 1} ({name}): its content does not match the config's "
                          f"diff_id sha256:{want} (a tampered or truncated archive)")


# ---------------------------------------------------------------------------------------------
# The new root: every path resolved from its directory descriptor.


class Root:
    def __init__(self, path):
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        self.entries = 0
        self.bytes = 0

    def open_dir(self, parts, what, create=True, in_scope=False):
        """A descriptor of the directory `parts` names. Symlinks on the way are followed inside
        the image; one that leaves it (absolute, or `..` above the root) is refused, unless
        `in_scope` (reading only: it is then resolved against the image's root, as the guest
        will see it)."""
        stack = []
        fd = os.dup(self.fd)
        todo = list(parts)
        follows = 0
        try:
            while todo:
                c = todo.pop(0)
                if c in ("", "."):
                    continue
                if c == "..":
                    if not stack:
                        raise Refused(f"{what}: goes through a symlink that climbs out of the "
                                      "image")
                    os.close(fd)
                    fd = stack.pop()
                    continue
                try:
                    st = os.stat(c, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(c, 0o755, dir_fd=fd)
                    st = os.stat(c, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    follows += 1
                    if follows > MAX_SYMLINK_FOLLOWS:
                        raise Refused(f"{what}: too many symlinks (a loop?)")
                    target = os.readlink(c, dir_fd=fd)
                    if target.startswith("/"):
                        if not in_scope:
                            raise Refused(f"{what}: goes through the symlink {c!r} to "
                                          f"{target!r}, outside the image")
                        while stack:
                            os.close(fd)
                            fd = stack.pop()
                    todo = target.split("/") + todo
                    continue
                if not stat.S_ISDIR(st.st_mode):
                    raise Refused(f"{what}: {c!r} is not a directory")
                nfd = os.open(c, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                stack.append(fd)
                fd = nfd
            return fd
        except BaseException:
            os.close(fd)
            raise
        finally:
            for f in stack:
                os.close(f)

    def remove(self, dirfd, name):
        """Removes `name` in `dirfd` (a directory with its tree), never following a symlink."""
        try:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dirfd)
            try:
                self.empty(sub)
            finally:
                os.close(sub)
            os.rmdir(name, dir_fd=dirfd)
        else:
            os.unlink(name, dir_fd=dirfd)

    def empty(self, dirfd, keep=()):
        for e in list(os.scandir(dirfd)):
            if e.name not in keep:
                self.remove(dirfd, e.name)


def set_meta(dirfd, name, m, is_link):
    if os.geteuid() == 0:
        os.chown(name, m.uid, m.gid, dir_fd=dirfd, follow_symlinks=False)
    if not is_link:
        os.chmod(name, stat.S_IMODE(m.mode), dir_fd=dirfd)
        for k, v in m.pax_headers.items():
            if k.startswith("SCHILY.xattr."):
                attr = k[len("SCHILY.xattr."):]
                if attr == "security.capability" or attr.startswith("user."):
                    try:
                        os.setxattr(f"/proc/self/fd/{dirfd}/{name}", attr,
                                    v.encode("utf-8", "surrogateescape"),
                                    follow_symlinks=False)
                    except OSError as e:
                        log(f"image: {m.name}: extended attribute {attr} not kept ({e})")
    try:
        os.utime(name, ns=(int(m.mtime * 1e9),) * 2, dir_fd=dirfd, follow_symlinks=False)
    except (OSError, OverflowError, ValueError):
        pass


def unpack_layer(root, archive, name, number):
    unpack_tar(root, archive.open_layer(name), f"layer {number}", name)


def unpack_tar(root, stream, what, name, whiteouts=True):
    """Unpacks the tar `stream` into `root`: an image's layer (`whiteouts`), or a build
    context's archive (its `.wh.` names are files like any other; devices are skipped)."""
    created = set()  # the paths this layer made (an opaque whiteout keeps them)
    try:
        tar = tarfile.open(fileobj=stream, mode="r|")
        for m in tar:
            root.entries += 1
            if root.entries > MAX_ENTRIES:
                raise Refused(f"more than {MAX_ENTRIES} entries")
            parts = parts_of(m.name, what)
            if not parts:
                continue  # the root itself
            where = f"{what}: {'/'.join(parts)}"
            base = parts[-1]
            dirfd = root.open_dir(parts[:-1], where)
            try:
                if not whiteouts and (m.ischr() or m.isblk()):
                    log(f"context: {where}: a device node skipped")
                    continue
                if whiteouts and base == ".wh..wh..opq":
                    keep = {p[-1] for p in created if p[:-1] == tuple(parts[:-1])}
                    root.empty(dirfd, keep)
                    continue
                if whiteouts and base.startswith(".wh."):
                    root.remove(dirfd, base[4:])
                    continue
                try:
                    st = os.stat(base, dir_fd=dirfd, follow_symlinks=False)
                except FileNotFoundError:
                    st = None
                if st is not None and not (m.isdir() and stat.S_ISDIR(st.st_mode)):
                    root.remove(dirfd, base)
                if m.isdir():
                    if st is None or not stat.S_ISDIR(st.st_mode):
                        os.mkdir(base, 0o700, dir_fd=dirfd)
                    set_meta(dirfd, base, m, False)
                elif m.isreg():
                    fd = os.open(base, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                                 os.O_CLOEXEC, 0o600, dir_fd=dirfd)
                    with os.fdopen(fd, "wb") as out:
                        src = tar.extractfile(m)
                        while True:
                            b = src.read(CHUNK)
                            if not b:
                                break
                            out.write(b)
                            root.bytes += len(b)
                    set_meta(dirfd, base, m, False)
                elif m.issym():
                    os.symlink(m.linkname, base, dir_fd=dirfd)
                    set_meta(dirfd, base, m, True)
                elif m.islnk():
                    lparts = parts_of(m.linkname, f"{where} (a hard link)")
                    if not lparts:
                        raise Refused(f"{where}: a hard link to the root")
                    ldir = root.open_dir(lparts[:-1], f"{where} (a hard link)", create=False)
                    try:
                        lst = os.stat(lparts[-1], dir_fd=ldir, follow_symlinks=False)
                        if stat.S_ISDIR(lst.st_mode):
                            raise Refused(f"{where}: a hard link to a directory")
                        os.link(lparts[-1], base, src_dir_fd=ldir, dst_dir_fd=dirfd,
                                follow_symlinks=False)
                    except FileNotFoundError:
                        raise Refused(f"{where}: a hard link to {m.linkname!r}, which the image "
                                      "does not have")
                    finally:
                        os.close(ldir)
                elif m.ischr() or m.isblk() or m.isfifo():
                    kind = stat.S_IFCHR if m.ischr() else stat.S_IFBLK if m.isblk() \
                        else stat.S_IFIFO
                    os.mknod(base, kind | 0o600, os.makedev(m.devmajor, m.devminor),
                             dir_fd=dirfd)
                    set_meta(dirfd, base, m, False)
                else:
                    log(f"image: {where}: an entry of type {m.type!r} skipped")
                    continue
                created.add(tuple(parts))
            finally:
                os.close(dirfd)
    except tarfile.TarError as e:
        raise Refused(f"{what} ({name}): not a valid tar ({e})")
    except OSError as e:
        if e.errno == 28:
            raise Refused("the image does not fit in the disk it was given (ask for a larger "
                          "disk_mib)" if whiteouts else
                          "the build context unpacks to more than its disk holds (8x its "
                          "archives' size, at least 1 GiB)")
        raise Refused(f"{what}: {e}")


# ---------------------------------------------------------------------------------------------
# The image's configuration, as a sandbox of it needs it.


def read_small(root, path):
    parts = parts_of(path, path)
    try:
        d = root.open_dir(parts[:-1], path, create=False, in_scope=True)
    except (FileNotFoundError, Refused):
        return ""
    try:
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=d)
        with os.fdopen(fd, "rb") as f:
            return f.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return ""
    finally:
        os.close(d)


def resolve_user(root, user):
    """(uid, gid) of a Docker USER (`name`, `uid`, `name:group`, `uid:gid`) in the image."""
    if not user:
        return 0, 0
    name, _, group = user.partition(":")
    uid = gid = None
    if name.isdigit():
        uid = int(name)
    for line in read_small(root, "etc/passwd").splitlines():
        f = line.split(":")
        if len(f) >= 4 and (f[0] == name or (uid is not None and f[2] == str(uid))):
            if f[2].isdigit() and f[3].isdigit():
                uid, gid = int(f[2]), int(f[3])
            break
    if uid is None:
        raise Refused(f"the image's User {name!r} is not in its /etc/passwd")
    if group:
        if group.isdigit():
            gid = int(group)
        else:
            gid = None
            for line in read_small(root, "etc/group").splitlines():
                f = line.split(":")
                if len(f) >= 3 and f[0] == group and f[2].isdigit():
                    gid = int(f[2])
                    break
            if gid is None:
                raise Refused(f"the image's group {group!r} is not in its /etc/group")
    if gid is None:
        gid = uid
    return uid, gid


def exists_in_scope(root, path, depth=0):
    """Whether `path` names something in the image as its guest will see it (symlinks followed,
    absolute ones from the image's root, `..` stopping at it)."""
    parts = []
    for c in path.split("/"):
        if c == "..":
            if parts:
                parts.pop()
        elif c not in ("", "."):
            parts.append(c)
    if depth > MAX_SYMLINK_FOLLOWS:
        return False
    if not parts:
        return True  # the root
    try:
        d = root.open_dir(parts[:-1], path, create=False, in_scope=True)
    except (Refused, OSError):
        return False
    try:
        st = os.stat(parts[-1], dir_fd=d, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            t = os.readlink(parts[-1], dir_fd=d)
            return exists_in_scope(root, t if t.startswith("/") else
                                   "/".join(parts[:-1] + [t]), depth + 1)
        return True
    except OSError:
        return False
    finally:
        os.close(d)


def write_file(root, path, data, mode=0o644):
    parts = parts_of(path, path)
    d = root.open_dir(parts[:-1], path)
    try:
        try:
            os.unlink(parts[-1], dir_fd=d)
        except FileNotFoundError:
            pass
        fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode,
                     dir_fd=d)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(parts[-1], mode, dir_fd=d)
    finally:
        os.close(d)


def sh_quote(v):
    return "'" + v.replace("'", "'\\''") + "'"


def finish(root, config, busybox):
    c = config.get("config") or config.get("container_config") or {}
    if not isinstance(c, dict):
        c = {}
    # What the guest's init mounts on, and where its agent lives.
    for d, mode in (("proc", 0o555), ("sys", 0o555), ("dev", 0o755), ("run", 0o755),
                    ("tmp", 0o1777), ("etc", 0o755), ("root", 0o700)):
        try:
            os.stat(d, dir_fd=root.fd, follow_symlinks=False)
        except FileNotFoundError:
            os.mkdir(d, mode, dir_fd=root.fd)
            os.chmod(d, mode, dir_fd=root.fd)
    env = {}
    for e in c.get("Env") or []:
        if isinstance(e, str) and "=" in e:
            k, v = e.split("=", 1)
            if ENV_NAME.match(k) and "\0" not in v:
                env[k] = v
    if env:
        write_file(root, "etc/pandastack/env",
                   b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
        write_file(root, "etc/profile.d/pandastack-template.sh",
                   "".join(f"export {k}={sh_quote(v)}\n" for k, v in env.items()).encode())
    workdir = c.get("WorkingDir") or ""
    if not isinstance(workdir, str) or (workdir and not workdir.startswith("/")):
        workdir = ""
    if workdir:
        os.close(root.open_dir(parts_of(workdir.lstrip("/"), "WorkingDir"), "WorkingDir"))
    user = c.get("User") or ""
    uid, gid = resolve_user(root, user if isinstance(user, str) else "")
    shell_added = False
    if not exists_in_scope(root, "bin/sh"):
        if not busybox:
            raise Refused("the image has no /bin/sh")
        with open(busybox, "rb") as f:
            write_file(root, "bin/sh", f.read(), 0o755)
        shell_added = True
        log("image: it has no /bin/sh: a static busybox is its shell")

    def strings(v):
        return [x for x in v if isinstance(x, str)] if isinstance(v, list) else []

    exposed = sorted(k for k in (c.get("ExposedPorts") or {}) if isinstance(k, str))
    return {"env": env, "entrypoint": strings(c.get("Entrypoint")), "cmd": strings(c.get("Cmd")),
            "workdir": workdir, "user": user if isinstance(user, str) else "", "uid": uid,
            "gid": gid, "exposed": exposed, "shell_added": shell_added}


def import_image(archive_path, root_path, busybox):
    t0 = time.monotonic()
    archive = Archive(archive_path)
    fmt, config, config_hex, layers, tags = read_image(archive)
    check_layers(archive, config, layers)
    log(f"image: {fmt}{' ' + tags[0] if tags else ''}, config sha256:{config_hex[:12]}, "
        f"{len(layers)} layers, digests verified")
    root = Root(root_path)
    try:
        for i, name in enumerate(layers):
            unpack_layer(root, archive, name, i + 1)
            log(f"image: layer {i + 1}/{len(layers)} unpacked ({root.entries} entries, "
                f"{root.bytes >> 20} MiB so far)")
        out = finish(root, config, busybox)
    finally:
        os.close(root.fd)  # (the disk is unmounted next)
    out.update({"format": fmt, "config_digest": "sha256:" + config_hex, "tags": tags,
                "layers": len(layers), "entries": root.entries, "bytes": root.bytes,
                "seconds": round(time.monotonic() - t0, 3)})
    return out


# ---------------------------------------------------------------------------------------------
# A Dockerfile build's context (actors/build_context.h): the archives of a bundle the host made
# (a JSON header naming each one's offset and size, then their bytes), unpacked in order into
# one tree, then `.dockerignore` applied.

BUNDLE_HEADER = 4096
MAX_ARCHIVES = 64


class Region:
    """`size` bytes of the file `f` from `offset`, as a read-only stream."""

    def __init__(self, f, offset, size):
        self.f, self.at, self.end = f, offset, offset + size

    def read(self, n=-1):
        left = self.end - self.at
        if n is None or n < 0 or n > left:
            n = left
        if n <= 0:
            return b""
        self.f.seek(self.at)
        b = self.f.read(n)
        self.at += len(b)
        return b

    def readable(self):
        return True


def bundle_archives(f, size):
    """The archives of the bundle the host wrote: [(offset, size)], checked against its size."""
    head = f.read(BUNDLE_HEADER)
    try:
        header = json.loads(head.rstrip(b"\0"))
        out = [(int(a["offset"]), int(a["bytes"])) for a in header["archives"]]
    except (ValueError, KeyError, TypeError):
        raise Refused("the context bundle's header is not readable")
    if len(out) > MAX_ARCHIVES:
        raise Refused(f"more than {MAX_ARCHIVES} context archives")
    for off, n in out:
        if off < BUNDLE_HEADER or n < 0 or off + n > size:
            raise Refused("the context bundle's header names bytes it does not have")
    return out


def open_context_archive(region, number):
    magic = region.read(4)
    region.at -= len(magic)
    if magic[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=region, mode="rb")
    if magic == b"\x28\xb5\x2f\xfd":
        raise Refused(f"context archive {number}: zstd is not taken (a tar, plain or gzip)")
    return region


def ignore_patterns(root):
    """`.dockerignore` at the context's root, as (regex, exclude) pairs (Docker's rules: Go's
    filepath.Match per component, `**` any number of them, `!` an exception, the last match
    wins, a leading / or ./ ignored)."""
    try:
        fd = os.open(".dockerignore", os.O_RDONLY | os.O_NOFOLLOW, dir_fd=root.fd)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as f:
        text = f.read(1 << 20).decode("utf-8", "replace")
    out = []
    for line in text.splitlines()[:10000]:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exclude = not line.startswith("!")
        if not exclude:
            line = line[1:].strip()
        line = "/".join(p for p in line.split("/") if p not in ("", "."))
        if not line:
            continue
        rx, i = "", 0
        while i < len(line):
            c = line[i]
            if line.startswith("**", i):
                i += 2
                if line.startswith("/", i):
                    i += 1
                    rx += "(?:.*/)?"
                else:
                    rx += ".*"
                continue
            if c == "*":
                rx += "[^/]*"
            elif c == "?":
                rx += "[^/]"
            elif c == "[":
                j = line.find("]", i + 1)
                if j < 0:
                    rx += re.escape(c)
                else:
                    body = line[i + 1:j]
                    neg = body[:1] in ("!", "^")
                    body = (body[1:] if neg else body).replace("\\", "\\\\")
                    rx += "[" + ("^" if neg else "") + body + "]"
                    i = j
            elif c == "\\" and i + 1 < len(line):
                i += 1
                rx += re.escape(line[i])
            else:
                rx += re.escape(c)
            i += 1
        out.append((re.compile(rx + "$", re.S), exclude))
    return out


def ignored(patterns, rel):
    """Whether `rel` (a path in the context) is excluded: the last pattern matching it or one
    of its parents decides."""
    parents = rel.split("/")
    out = False
    for rx, exclude in patterns:
        for k in range(len(parents), 0, -1):
            if rx.match("/".join(parents[:k])):
                out = exclude
                break
    return out


def apply_dockerignore(root):
    """Removes what `.dockerignore` excludes; a directory stays while it holds an exception."""
    patterns = ignore_patterns(root)
    if not patterns:
        return 0
    removed = 0

    def walk(dirfd, rel):
        nonlocal removed
        left = 0
        for e in list(os.scandir(dirfd)):
            path = e.name if not rel else rel + "/" + e.name
            st = os.stat(e.name, dir_fd=dirfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                sub = os.open(e.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dirfd)
                try:
                    kept = walk(sub, path)
                finally:
                    os.close(sub)
                if kept == 0 and ignored(patterns, path):
                    os.rmdir(e.name, dir_fd=dirfd)
                    removed += 1
                else:
                    left += 1
            elif ignored(patterns, path):
                os.unlink(e.name, dir_fd=dirfd)
                removed += 1
            else:
                left += 1
        return left

    walk(root.fd, "")
    return removed


def unpack_context(bundle_path, bundle_size, root_path):
    t0 = time.monotonic()
    root = Root(root_path)
    try:
        with open(bundle_path, "rb") as f:
            archives = bundle_archives(f, bundle_size)
            for i, (off, n) in enumerate(archives):
                stream = open_context_archive(Region(f, off, n), i + 1)
                unpack_tar(root, stream, f"context archive {i + 1}", f"archive {i + 1}",
                           whiteouts=False)
        removed = apply_dockerignore(root)
    finally:
        os.close(root.fd)
    log(f"context: {len(archives)} archive(s) unpacked: {root.entries} entries, "
        f"{root.bytes >> 20} MiB" + (f", {removed} excluded by .dockerignore" if removed else ""))
    return {"archives": len(archives), "entries": root.entries, "bytes": root.bytes,
            "ignored": removed, "seconds": round(time.monotonic() - t0, 3)}


def disk_by_serial(serial, size):
    """The disk whose serial is `serial`, once the guest sees it at `size` bytes (the host binds
    a slot, then grows it: the kernel applies that asynchronously)."""
    for _ in range(400):
        for name in sorted(os.listdir("/sys/block")):
            try:
                with open(f"/sys/block/{name}/serial") as f:
                    if f.read().strip() != serial:
                        continue
                with open(f"/sys/block/{name}/size") as f:
                    if int(f.read()) * 512 == size:
                        return "/dev/" + name
            except (OSError, ValueError):
                pass
        time.sleep(0.05)
    raise SystemExit(f"image: no disk {serial} of {size} bytes")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--archive", help="the archive (a file or disk)")
    p.add_argument("--archive-serial", help="the archive's disk, by its serial")
    p.add_argument("--archive-bytes", type=int, default=0, help="... and its size")
    p.add_argument("--root", help="an empty directory to unpack into")
    p.add_argument("--disk-serial", help="the new root disk, by its serial (formatted here)")
    p.add_argument("--disk-bytes", type=int, default=0, help="... and its size")
    p.add_argument("--busybox", help="a static busybox, the shell of an image with none")
    p.add_argument("--out", required=True, help="where the result (JSON) goes")
    p.add_argument("--context", action="store_true",
                   help="the archive is a bundle of a build context's archives (not an image)")
    a = p.parse_args()
    archive = a.archive or disk_by_serial(a.archive_serial, a.archive_bytes)
    what = "context" if a.context else "image"
    root = a.root
    disk = None
    if a.disk_serial:
        disk = disk_by_serial(a.disk_serial, a.disk_bytes)
        root = "/run/pandastack-image-root"
        try:
            subprocess.run(["mkfs.ext4", "-q", "-F", "-L", what, "-E",
                            "lazy_itable_init=1,lazy_journal_init=1", disk], check=True)
            os.makedirs(root, exist_ok=True)
            subprocess.run(["mount", "-t", "ext4", "-o", "noatime", disk, root], check=True)
        except subprocess.CalledProcessError as e:
            print(f"{what}: the new disk: {e}", file=sys.stderr, flush=True)
            return 1
    try:
        if a.context:
            size = a.archive_bytes or os.path.getsize(archive)
            result = unpack_context(archive, size, root)
        else:
            result = import_image(archive, root, a.busybox)
    except Refused as e:
        # (one line: the build's error is the last line printed)
        print(f"{what}: " + " ".join(str(e).split()), file=sys.stderr, flush=True)
        return 2
    finally:
        if disk:
            subprocess.run(["sync"], check=False)
            if subprocess.run(["umount", root], check=False).returncode != 0:
                print(f"{what}: the new disk could not be unmounted", file=sys.stderr,
                      flush=True)
                return 1
    with open(a.out, "w") as f:
        json.dump(result, f)
    if a.context:
        return 0
    log(f"image: unpacked in {result['seconds']} s: {result['entries']} entries, "
        f"{result['bytes'] >> 20} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
