#!/usr/bin/env python3
"""`make bench-cluster`: two hosts of a cluster on this machine (their own etcd, data folders and
ports) and `pandastack-bench cluster route` between them: what a request routed through the host
that does not own its sandbox costs, against the same request at the owner.

Usage: bench_cluster.py N (from the repository's root, after make build guest)"""
import os
import shutil
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "api"))
import cluster_test  # noqa: E402
import harness  # noqa: E402


class A:
    daemon = "build/bin/pandastackd"
    images = os.path.abspath("var/images")


harness.ARGS = A
base = tempfile.mkdtemp(prefix="pst-cb-", dir="/dev/shm")
etcd = cluster_test.Etcd(os.path.join(base, "etcd"))
secret = os.path.join(base, "secret"); open(secret, "w").write("x" * 32)
ds = {}
try:  # noqa: E402
    for h in ("a", "b"):
        ds[h] = harness.Daemon(os.path.join(base, h), os.path.join(base, h + "-s"),
            extra=("--cluster", etcd.url, "--host-id", h, "--advertise", "127.0.0.1:0",
                   "--cluster-secret", secret, "--pool-size", "1", "--spare-pool-size", "0"))
    subprocess.run(["build/bin/pandastack-bench", "cluster", "route", "--url", ds["a"].url,
                    "--via", ds["b"].url, "--key", ds["a"].key, "--n", sys.argv[1], "--json"])
finally:
    for d in ds.values(): d.stop(reap=True)
    etcd.stop(); shutil.rmtree(base, ignore_errors=True)
