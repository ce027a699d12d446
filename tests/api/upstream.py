"""An "upstream" network of a test's own: a network namespace joined to the host by a veth pair
(the host's end `<prefix>.1/24`), with web servers and a DNS server of the test inside it. The
only place a test's sandboxes may send traffic to (besides loopback)."""
import os
import subprocess


class Upstream:
    """Namespace `ns`, host link `link`, addresses `prefix`.1 (host) and each of `hosts` (in it,
    e.g. [".2", ".3"] -> prefix.2, prefix.3), an HTTP server on port 8080 of each (serving
    `www` or the current folder) and `dns_script` (Python) run inside it when given."""

    def __init__(self, ns, link, prefix, hosts, folder, dns_script=None, www=None):
        self.ns, self.link = ns, link
        self.addresses = [prefix + h for h in hosts]
        self.remove()
        cmd = (f"ip netns add {ns} && ip link add {link} type veth peer name eth0 netns {ns} && "
               f"ip addr add {prefix}.1/24 dev {link} && ip link set {link} up && " +
               "".join(f"ip -n {ns} addr add {a}/24 dev eth0 && " for a in self.addresses) +
               f"ip -n {ns} link set eth0 up")
        subprocess.run(cmd, shell=True, check=True)
        serve = ["--directory", www] if www else []
        self.servers = [subprocess.Popen(["ip", "netns", "exec", ns, "/usr/bin/python3", "-m",
                                          "http.server", "--bind", a, *serve, "8080"],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                        for a in self.addresses]
        if dns_script:
            path = os.path.join(folder, "dns.py")
            with open(path, "w") as f:
                f.write(dns_script)
            self.servers.append(subprocess.Popen(["ip", "netns", "exec", ns, "/usr/bin/python3",
                                                  path],
                                                 stdout=subprocess.DEVNULL,
                                                 stderr=subprocess.DEVNULL))

    def remove(self):
        for p in getattr(self, "servers", []):
            p.terminate()
            p.wait()
        self.servers = []
        subprocess.run(f"ip netns del {self.ns}; ip link del {self.link}", shell=True,
                       stderr=subprocess.DEVNULL)
