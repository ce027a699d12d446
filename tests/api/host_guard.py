"""A daemon launcher that proves root never processes tenant data (security review 3, C1/H4/H5):
the daemon runs in a private mount namespace where canary files are bound over the host files
that given guest paths (absolute symlinks in a Debian tree) resolve to on the host, and
debootstrap, chroot, e2fsck, resize2fs and tar are a script that records that it ran and fails.
"""
import os

# Host tools the daemon must never need for tenant data.
FORBIDDEN = ["/usr/sbin/debootstrap", "/usr/sbin/chroot", "/sbin/e2fsck", "/sbin/resize2fs",
             "/usr/sbin/e2fsck", "/usr/sbin/resize2fs", "/bin/tar", "/usr/bin/tar"]


def host_targets(paths):
    """Where `paths` resolve on this host (existing regular files only)."""
    out = set()
    for p in paths:
        r = os.path.realpath(p)
        if os.path.isfile(r):
            out.add(r)
    return sorted(out)


def wrapper(base, daemon, paths):
    """A launcher for the daemon in a private mount namespace with the canaries and the
    recording stand-ins bound in. Returns (launcher, {host file: (canary, content)}, the file
    a stand-in writes when it runs)."""
    marker = os.path.join(base, "forbidden-tool-ran")
    stand_in = os.path.join(base, "forbidden-tool")
    with open(stand_in, "w") as f:
        f.write(f"#!/bin/sh\necho \"$0 $*\" >> {marker}\nexit 1\n")
    os.chmod(stand_in, 0o755)
    binds, canaries = [], {}
    for i, target in enumerate(host_targets(paths)):
        c = os.path.join(base, f"canary-{i}")
        content = f"canary {i} over {target}\n"
        with open(c, "w") as f:
            f.write(content)
        os.chmod(c, 0o644)
        binds.append((c, target))
        canaries[target] = (c, content)
    for tool in FORBIDDEN:
        if os.path.exists(tool) and not os.path.islink(tool):
            binds.append((stand_in, tool))
    launcher = os.path.join(base, "launch.sh")
    with open(launcher, "w") as f:
        f.write("#!/bin/sh\nset -e\n")
        for src, dst in binds:
            f.write(f"mount --bind '{src}' '{dst}'\n")
        f.write(f"exec '{daemon}' \"$@\"\n")
    os.chmod(launcher, 0o755)
    ns = os.path.join(base, "launch-ns.sh")
    with open(ns, "w") as f:
        f.write(f"#!/bin/sh\nexec unshare --mount --propagation private '{launcher}' \"$@\"\n")
    os.chmod(ns, 0o755)
    return ns, canaries, marker
