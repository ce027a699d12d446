#!/usr/bin/env python3
"""`make bench-cluster`: three hosts of a cluster on this machine (their own etcd, data folders
and ports) and `pandastack-bench cluster route|fork|migrate` between them, in one run: what a
request routed through the host that does not own its sandbox costs; a fork whose child lives on
another host against a same-host fork; a migration, without and with a volume.

Usage: bench_cluster.py N [--insecure] (from the repository's root, after make build guest).
By default etcd and the hosts speak mutual TLS (as a cluster must); --insecure measures the
plain --insecure-cluster set-up beside it."""
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
insecure = "--insecure" in sys.argv
pki = os.path.join(base, "pki")
cluster_test.make_pki(pki, ("a", "b", "c"))
etcd = cluster_test.Etcd(os.path.join(base, "etcd"), None if insecure else pki)
secret = os.path.join(base, "secret"); open(secret, "w").write("x" * 32); os.chmod(secret, 0o600)
ds = {}
try:  # noqa: E402
    for h in ("a", "b", "c"):
        auth = (("--insecure-cluster", "--cluster-secret", secret) if insecure else
                ("--cluster-tls", os.path.join(pki, "hosts", h)))
        ds[h] = harness.Daemon(os.path.join(base, h), os.path.join(base, h + "-s"),
            extra=("--cluster", etcd.url, "--host-id", h, "--advertise", "127.0.0.1:0", *auth,
                   "--pool-size", "1", "--spare-pool-size", "0"))
    n = int(sys.argv[1])
    # (a fork or a migration takes a second or two: a tenth of the rounds, at least 10)
    for scenario, via, rounds in (("route", "b", n), ("fork", "c", max(10, n // 10)),
                                  ("migrate", "c", max(10, n // 10)),
                                  ("migrate-volume", "c", max(10, n // 10))):
        subprocess.run(["build/bin/pandastack-bench", "cluster", scenario, "--url", ds["a"].url,
                        "--via", ds[via].url, "--key", ds["a"].key, "--n", str(rounds), "--json"],
                       check=True)
finally:
    for d in ds.values(): d.stop(reap=True)
    etcd.stop(); shutil.rmtree(base, ignore_errors=True)
