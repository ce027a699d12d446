// pandastackd: the PandaStack daemon. The actor runtime (CAF) with its RocksDB event store under
// --data, and the REST gateway (kj-http) on --listen. SIGTERM or SIGINT shut it down gracefully:
// persistent sandboxes are hibernated, the others killed, all recorded.
#include <fcntl.h>
#include <kj/async-io.h>
#include <kj/async-unix.h>
#include <signal.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>

#include "actors/cluster.h"
#include "actors/runtime.h"
#include "gateway/acceptor.h"
#include "gateway/rest.h"
#include "gateway/rpc.h"

namespace fs = std::filesystem;
using namespace pandastack;

namespace {

const char* kUsage = R"(usage: pandastackd [options]
  --data DIR          event store, API key file (default ./var)
  --images DIR        guest images from `make guest` (default DATA/images)
  --state-dir DIR     VM run folders, snapshots, hibernated RAM (default /dev/shm/pandastack-<hash>)
  --disk-dir DIR      guest disks: overlays and snapshot disk layers, on a real disk (default DATA/disks)
  --listen HOST:PORT  REST API (default 127.0.0.1:7070; port 0 picks a free one)
  --tls-cert FILE, --tls-key FILE  HTTPS on --listen instead of HTTP: the certificate (PEM, then
                      any intermediates; for E2B's SDK and preview URLs a wildcard name of the
                      preview domain) and its key
  --rpc-listen HOST:PORT  Cap'n Proto RPC API (default 127.0.0.1:7071; also on DATA/rpc.sock)
  --accel auto|kvm|tcg  (default auto: KVM when a probe boot works, else TCG; env PANDASTACK_ACCEL)
  --memory MIB        guest memory (default 256)
  --vcpus N           guest vCPUs (default 1)
  --default-ttl S     sandbox TTL when a create names none (default 900)
  --max-ttl S         largest TTL a create or PATCH may ask for (default 86400)
  --ended-retention S an ended sandbox answers get/list for S seconds, then is forgotten (its
                      events stay in the audit log; at most 1000 are kept) (default 900)
  --pool-size N       QEMU processes kept pre-spawned per template (default 2; 0 = none)
  --spare-pool-size N spare QEMU processes per template for forks, wakes and creates from
                      snapshots (default 1; 0 = none)
  --memory-sharing on|off  sandboxes made from a template map its memory copy-on-write and
                      cost only the pages they write (default on); off: each copies it
  --max-concurrent-execs N  commands in flight per sandbox (default 16; more: 429)
  --max-processes N   background processes (and WebSocket commands) running per sandbox
                      (default 64; more: 429 too_many_processes)
  --network on|off    sandbox networking (default on; needs root, ip and nft)
  --subnet-pool CIDR  host subnets for sandbox networks, one /30 each (default 10.200.0.0/16)
  --network-prefix P  names of namespaces (P-N) and host links (PN), 1-5 chars (default psv)
  --default-egress deny_all|allow_all  egress of sandboxes created without a policy (default deny_all)
  --allow-private-egress CIDR[,CIDR...]  private or reserved ranges (RFC 1918, 100.64/10,
                      198.18/15, the host's own interface prefixes...) that egress policies may
                      reach; by default no sandbox reaches any of them, whatever its policy
  --ports-host ADDR   host address exposed guest ports listen on (default 127.0.0.1)
  --preview-domain D  preview URLs are http://PORT-ID.D/ (default localhost:<API port>: browsers
                      resolve *.localhost to this machine; else a wildcard DNS name of this host)
  --preview-scheme S  http or https (behind a TLS-terminating proxy) in preview URLs (default http;
                      https with --tls-cert)
  --dns-upstream IP[:PORT]  where sandbox resolvers send allowed names (default: the first IPv4
                      nameserver of /etc/resolv.conf; "off": no resolver, domain allowlists refused)
  --dns-max-names N   distinct names a sandbox's resolver forwards per VM (default 1000; past it
                      REFUSED: a bound on what DNS carries out)
  --egress-trust-ca FILE  certificates (PEM) the egress proxy trusts for secrets' hosts besides
                      the system's store (a corporate CA); may be given more than once
  --quota-sandboxes N, --quota-memory-mib N, --quota-snapshots N, --quota-snapshot-mib N,
  --quota-hibernated N, --quota-hibernated-mib N, --quota-ports N, --quota-execs N,
  --quota-rps N, --quota-volumes N, --quota-volume-mib N
                      every tenant's quotas unless an admin set its own (PUT /v1/quotas/{tenant});
                      defaults 50, 32768, 100, 65536, 50, 32768, 64, 32, 500, 100, 262144
  --quota-templates N custom templates per tenant: built, building or failed (default 10)
  --template-builds N template builds at once on this host (default 1; more: 429; 0: builds
                      are not offered, 501)
  --template-build-timeout S  the most one build may take (default 1800 s)
  --template-packages-mib N   the most .deb files one build may fetch (default 2048 MiB)
  --template-image-mib N      the largest image archive an import takes, uploaded or pulled
                              (default 4096 MiB; 413)
  --build-context-mib N       the largest Dockerfile build context archive (default 1024 MiB;
                              413)
  --max-build-contexts N      build context archives kept per tenant, the least recently used
                              dropped first (default 64)
  --insecure-registry HOST:PORT  a registry image pulls may reach over plain http (repeatable;
                              loopback ones always may)
  --object-store URL  an S3 bucket hibernations and named snapshots are uploaded to once
                      on the data disk
                      (http(s)://HOST[:PORT]/BUCKET[/PREFIX][?region=R]; http only to loopback)
  --object-store-credentials FILE  its keys: lines access_key_id = ..., secret_access_key = ...
  --object-store-gc-seconds N  chunks no manifest names are deleted N s after a manifest was
                      removed (default 60); the prefix must be this host's alone
  --host-headroom P   refuse creates, forks and wakes (503 host_full) that would leave less than
                      P% of host memory or of the state folder free (default 10; 0 = off)
  --vm-cpu-weight W   each VM's CPU and IO weight, 1-10000, against the daemon's 100 (default 50)
  --vm-cpu-max P      each VM's CPU ceiling, percent of one CPU (default 0: none)
  --metrics-interval-ms MS  how often each running sandbox's CPU, memory and disk use is sampled
                      (GET /v1/sandboxes/{id}/metrics; default 5000; 0: never)
  --egress-summary-seconds S  how often each sandbox's egress log is summed up into the audit
                      log (an egress-summary event; default 300; 0: only when it ends)
  --max-connections N connections open at once per API, REST and RPC each (default 4096; more
                      are closed at once)
  --body-timeout S    a request body must arrive within S seconds (default 60; else 408)
  --log-level LEVEL   trace|debug|info|warn|error (default info)
  --cluster URL       join a cluster coordinated by etcd at URL (https://HOST:PORT, with
                      --cluster-tls; http:// only with --insecure-cluster); off by default
  --host-id ID        this host's id in the cluster (1-64 of A-Z a-z 0-9 . _ -; needed with --cluster)
  --advertise HOST:PORT  where peers reach this host (Cap'n Proto; needed with --cluster; port 0
                      picks a free one, advertised as chosen)
  --cluster-tls DIR   this host's cluster credentials (scripts/cluster-certs.sh host DIR ID):
                      etcd and peers over mutual TLS under the cluster CA; needed with --cluster
  --insecure-cluster  local experiments only: plain-HTTP etcd and plain peer connections
                      authenticated by a shared secret (--cluster-secret FILE, >= 16 bytes);
                      anyone on the network can read and forge cluster traffic
  --lease-ttl S       this host's membership lease (default 5): a host silent that long is down
  --no-jail           run QEMU without the jail (development only)
)";

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "pandastackd: " << msg << "\n" << kUsage;
  std::exit(2);
}

// A flag's on|off value.
bool on_off(const std::string& flag, const std::string& v) {
  if (v != "on" && v != "off") usage_error(flag + ": on or off");
  return v == "on";
}

// A credential file's text (at most 1 MiB), or nullopt.
std::optional<std::string> read_small_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::nullopt;
  std::string text(1 << 20, '\0');
  f.read(text.data(), std::streamsize(text.size()));
  if (f.bad() || !f.eof()) return std::nullopt;  // (unreadable, or larger)
  text.resize(size_t(f.gcount()));
  return text;
}

uint32_t parse_u32(const std::string& flag, const std::string& v) {
  try {
    size_t pos = 0;
    unsigned long n = std::stoul(v, &pos);
    if (pos != v.size() || n > UINT32_MAX) throw std::out_of_range(v);
    return uint32_t(n);
  } catch (...) {
    usage_error(flag + " needs a non-negative integer, not '" + v + "'");
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Logs go to stderr; stdout carries only the URL and key lines.
  spdlog::set_default_logger(spdlog::stderr_logger_mt("pandastackd"));
  fs::path data = "var", images, state_dir, disk_dir;
  std::string listen = "127.0.0.1:7070", rpc_listen = "127.0.0.1:7071", accel = "auto",
              level = "info";
  actors::RuntimeConfig config;
  gateway::Limits api_limits;
  gateway::PreviewSettings preview;
  bool jail = true;
  config.network = true;
  actors::ClusterConfig cluster;
  std::string cluster_secret_file, cluster_tls_dir;
  bool insecure_cluster = false;
  std::string dns_upstream;  // "" = from /etc/resolv.conf
  std::string tls_cert_file, tls_key_file;
  bool preview_scheme_given = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--data")
      data = value();
    else if (a == "--cluster")
      cluster.etcd = value();
    else if (a == "--host-id")
      cluster.host_id = value();
    else if (a == "--advertise")
      cluster.peer = value();
    else if (a == "--cluster-secret")
      cluster_secret_file = value();
    else if (a == "--cluster-tls")
      cluster_tls_dir = value();
    else if (a == "--insecure-cluster")
      insecure_cluster = true;
    else if (a == "--lease-ttl")
      cluster.lease_ttl = std::chrono::seconds(parse_u32(a, value()));
    else if (a == "--images")
      images = value();
    else if (a == "--template-build-timeout")
      config.template_build_timeout = std::chrono::seconds(parse_u32(a, value()));
    else if (a == "--template-packages-mib")
      config.template_packages_max_mib = parse_u32(a, value());
    else if (a == "--template-image-mib")
      config.template_image_max_mib = parse_u32(a, value());
    else if (a == "--build-context-mib")
      config.build_context_max_mib = parse_u32(a, value());
    else if (a == "--max-build-contexts")
      config.max_build_contexts = parse_u32(a, value());
    else if (a == "--insecure-registry")
      config.insecure_registries.push_back(value());
    else if (a == "--object-store")
      config.object_store = value();
    else if (a == "--object-store-credentials")
      config.object_store_credentials = value();
    else if (a == "--object-store-gc-seconds")
      config.object_store_gc_delay = std::chrono::seconds(parse_u32(a, value()));
    else if (a == "--state-dir")
      state_dir = value();
    else if (a == "--disk-dir")
      disk_dir = value();
    else if (a == "--listen")
      listen = value();
    else if (a == "--rpc-listen")
      rpc_listen = value();
    else if (a == "--tls-cert")
      tls_cert_file = value();
    else if (a == "--tls-key")
      tls_key_file = value();
    else if (a == "--accel")
      accel = value();
    else if (a == "--memory")
      config.memory_mib = parse_u32(a, value());
    else if (a == "--vcpus")
      config.vcpus = parse_u32(a, value());
    else if (a == "--default-ttl")
      config.limits.default_ttl_seconds = parse_u32(a, value());
    else if (a == "--max-ttl")
      config.limits.max_ttl_seconds = parse_u32(a, value());
    else if (a == "--ended-retention")
      config.ended_retention = std::chrono::seconds(parse_u32(a, value()));
    else if (a == "--pool-size")
      config.pool_size = parse_u32(a, value());
    else if (a == "--spare-pool-size")
      config.spare_pool_size = parse_u32(a, value());
    else if (a == "--memory-sharing")
      config.share_memory = on_off("--memory-sharing", value());
    else if (a == "--max-concurrent-execs")
      config.limits.max_concurrent_execs = parse_u32(a, value());
    else if (a == "--max-processes")
      config.limits.max_processes = parse_u32(a, value());
    else if (a == "--log-level")
      level = value();
    else if (a == "--quota-sandboxes")
      config.quotas.sandboxes = parse_u32(a, value());
    else if (a == "--quota-memory-mib")
      config.quotas.memory_mib = parse_u32(a, value());
    else if (a == "--quota-snapshots")
      config.quotas.snapshots = parse_u32(a, value());
    else if (a == "--quota-snapshot-mib")
      config.quotas.snapshot_mib = parse_u32(a, value());
    else if (a == "--quota-hibernated")
      config.quotas.hibernated = parse_u32(a, value());
    else if (a == "--quota-hibernated-mib")
      config.quotas.hibernated_mib = parse_u32(a, value());
    else if (a == "--quota-ports")
      config.quotas.ports = parse_u32(a, value());
    else if (a == "--quota-execs")
      config.quotas.execs = parse_u32(a, value());
    else if (a == "--quota-volumes")
      config.quotas.volumes = parse_u32(a, value());
    else if (a == "--quota-volume-mib")
      config.quotas.volume_mib = parse_u32(a, value());
    else if (a == "--quota-rps")
      config.quotas.requests_per_second = parse_u32(a, value());
    else if (a == "--quota-templates")
      config.max_templates = parse_u32(a, value());
    else if (a == "--template-builds")
      config.max_template_builds = parse_u32(a, value());
    else if (a == "--host-headroom")
      config.host_headroom_percent = parse_u32(a, value());
    else if (a == "--vm-cpu-weight")
      config.vm_cpu_weight = parse_u32(a, value());
    else if (a == "--metrics-interval-ms")
      config.metrics_interval = std::chrono::milliseconds(parse_u32(a, value()));
    else if (a == "--egress-summary-seconds")
      config.egress_summary_interval = std::chrono::seconds(parse_u32(a, value()));
    else if (a == "--vm-cpu-max")
      config.vm_cpu_max_percent = parse_u32(a, value());
    else if (a == "--max-connections")
      api_limits.max_connections = parse_u32(a, value());
    else if (a == "--body-timeout")
      api_limits.body_timeout = std::chrono::seconds(parse_u32(a, value()));
    else if (a == "--network") {
      auto v = value();
      if (v != "on" && v != "off") usage_error("--network: on or off");
      config.network = v == "on";
    } else if (a == "--subnet-pool")
      config.net.pool_cidr = value();
    else if (a == "--network-prefix")
      config.net.prefix = value();
    else if (a == "--allow-private-egress") {
      std::string v = value(), item;
      std::istringstream in(v);
      while (std::getline(in, item, ','))
        if (!item.empty()) config.net.reserved_allowed.push_back(item);
    } else if (a == "--ports-host")
      config.ports_host = value();
    else if (a == "--preview-domain")
      preview.domain = value();
    else if (a == "--preview-scheme") {
      preview.scheme = value();
      preview_scheme_given = true;
      if (preview.scheme != "http" && preview.scheme != "https")
        usage_error("--preview-scheme: http or https");
    } else if (a == "--egress-trust-ca") {
      std::string path = value();
      std::ifstream f(path);
      std::stringstream text;
      text << f.rdbuf();
      if (!f || text.str().find("-----BEGIN CERTIFICATE-----") == std::string::npos)
        usage_error("--egress-trust-ca: " + path + " is not a readable PEM certificate file");
      // One entry per certificate (a bundle holds several).
      std::string all = text.str(), end = "-----END CERTIFICATE-----";
      size_t at = 0;
      while ((at = all.find("-----BEGIN CERTIFICATE-----", at)) != std::string::npos) {
        size_t e = all.find(end, at);
        if (e == std::string::npos)
          usage_error("--egress-trust-ca: " + path + ": a certificate is cut short");
        e += end.size();
        config.egress_trusted_cas.push_back(all.substr(at, e - at) + "\n");
        at = e;
      }
    } else if (a == "--dns-upstream")
      dns_upstream = value();
    else if (a == "--dns-max-names") {
      config.net.dns_max_names = parse_u32(a, value());
      if (config.net.dns_max_names == 0 || config.net.dns_max_names > 100000)
        usage_error("--dns-max-names is 1..100000");
    } else if (a == "--default-egress") {
      config.default_egress.mode = value();
      if (config.default_egress.mode != "deny_all" && config.default_egress.mode != "allow_all")
        usage_error("--default-egress: deny_all or allow_all");
    } else if (a == "--no-jail")
      jail = false;
    else if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    } else
      usage_error("unknown option " + a);
  }
  spdlog::set_level(spdlog::level::from_str(level));
  if (accel != "auto" && accel != "kvm" && accel != "tcg") usage_error("--accel: auto, kvm or tcg");
  if (config.limits.default_ttl_seconds == 0 ||
      config.limits.default_ttl_seconds > config.limits.max_ttl_seconds)
    usage_error("--default-ttl must be within 1..--max-ttl");
  auto split = [](const std::string& flag, const std::string& v) {
    auto colon = v.rfind(':');
    if (colon == std::string::npos) usage_error(flag + " needs HOST:PORT");
    uint32_t port = parse_u32(flag, v.substr(colon + 1));
    if (port > 65535) usage_error(flag + ": port out of range");
    return std::make_pair(v.substr(0, colon), port);
  };
  auto [host, port] = split("--listen", listen);
  if (tls_cert_file.empty() != tls_key_file.empty())
    usage_error("--tls-cert and --tls-key go together");
  const std::string scheme = tls_cert_file.empty() ? "http" : "https";
  auto [rpc_host, rpc_port] = split("--rpc-listen", rpc_listen);
  gateway::PeerAuth peer_auth;
  std::pair<std::string, uint32_t> peer_addr;
  if (cluster.etcd.empty()) {
    if (!cluster.host_id.empty() || !cluster.peer.empty() || !cluster_secret_file.empty() ||
        !cluster_tls_dir.empty() || insecure_cluster)
      usage_error(
          "--host-id, --advertise, --cluster-tls, --cluster-secret and --insecure-cluster go "
          "with --cluster");
  } else {
    if (!actors::valid_host_id(cluster.host_id))
      usage_error("--host-id needs 1-64 of A-Z a-z 0-9 . _ -");
    if (cluster.peer.empty()) usage_error("--cluster needs --advertise HOST:PORT");
    peer_addr = split("--advertise", cluster.peer);
    peer_auth.self = cluster.host_id;
    bool https = cluster.etcd.rfind("https://", 0) == 0;
    if (insecure_cluster) {
      if (https || !cluster_tls_dir.empty())
        usage_error(
            "--insecure-cluster is plain http:// etcd and a shared secret; with TLS, "
            "leave it out");
      if (cluster_secret_file.empty())
        usage_error("--insecure-cluster needs --cluster-secret FILE");
      std::ifstream f(cluster_secret_file);
      std::string secret((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
      if (!f.good() && !f.eof()) usage_error("cannot read " + cluster_secret_file);
      if (secret.size() < 16) usage_error("the cluster secret must be at least 16 bytes");
      peer_auth.secret = secret;
      spdlog::warn(
          "cluster: INSECURE: etcd over plain HTTP and peers authenticated by a shared "
          "secret sent in the clear; anyone on the network can read and forge cluster "
          "traffic (local experiments only; use --cluster-tls)");
    } else {
      if (!https)
        usage_error(
            "--cluster needs https://HOST:PORT and --cluster-tls DIR (plain http:// "
            "etcd only with --insecure-cluster)");
      if (cluster_tls_dir.empty()) usage_error("--cluster needs --cluster-tls DIR");
      if (!cluster_secret_file.empty())
        usage_error("--cluster-secret goes with --insecure-cluster (TLS needs no shared secret)");
      auto tls = actors::ClusterTls::load(cluster_tls_dir, cluster.host_id);
      if (!tls) usage_error("--cluster-tls: " + tls.error().message);
      cluster.tls = *tls;
      peer_auth.tls = *tls;
    }
    if (cluster.lease_ttl.count() < 2 || cluster.lease_ttl.count() > 60)
      usage_error("--lease-ttl must be within 2..60 seconds");
  }

  fs::create_directories(data);
  data = fs::absolute(data);
  if (images.empty()) images = data / "images";
  images = fs::absolute(images);
  if (!fs::exists(images / "kernel" / "vmlinux"))
    spdlog::warn("no guest kernel under {}: build the images with `make guest`", images.string());

  if (api_limits.max_connections == 0) usage_error("--max-connections must be at least 1");
  for (uint64_t q : {uint64_t(config.quotas.sandboxes), config.quotas.memory_mib,
                     uint64_t(config.quotas.snapshots), config.quotas.snapshot_mib,
                     uint64_t(config.quotas.hibernated), config.quotas.hibernated_mib,
                     uint64_t(config.quotas.ports), uint64_t(config.quotas.execs),
                     uint64_t(config.quotas.requests_per_second)})
    if (q == 0) usage_error("quotas must be at least 1");
  if (config.host_headroom_percent > 99) usage_error("--host-headroom is a percentage up to 99");
  if (config.vm_cpu_weight < 1 || config.vm_cpu_weight > 10000)
    usage_error("--vm-cpu-weight must be within 1..10000");
  if (api_limits.body_timeout.count() == 0) usage_error("--body-timeout must be at least 1");
  // Every sandbox holds a few descriptors (QMP, agent, pidfd, namespace, resolver): the default
  // soft limit of 1024 would end accepting at about 150 networked sandboxes.
  spdlog::info("descriptor limit: {}", gateway::raise_fd_limit());
  // Signals are taken by the event loop; block them before any thread starts.
  kj::UnixEventPort::captureSignal(SIGTERM);
  kj::UnixEventPort::captureSignal(SIGINT);
  ::signal(SIGPIPE, SIG_IGN);
  auto io = kj::setupAsyncIo();

  config.data_dir = data;
  config.images_dir = images;
  config.template_builds = config.max_template_builds > 0;
  api_limits.max_upload_bytes = config.template_image_max_mib << 20;
  api_limits.max_context_bytes = config.build_context_max_mib << 20;
  config.state_dir = state_dir;
  config.disk_dir = disk_dir.empty() ? fs::path() : fs::absolute(disk_dir);
  config.jail = jail;
  actors::settle_host(config, accel, dns_upstream);

  auto started = actors::Runtime::start(config);
  if (!started) {
    spdlog::critical("cannot start: {}: {}", to_string(started.error().code),
                     started.error().message);
    return 1;
  }
  auto runtime = std::move(*started);

  auto addr = io.provider->getNetwork().parseAddress(host, port).wait(io.waitScope);
  auto listener = addr->listen();

  // Cluster mode: the peer listener first (its port is what this host advertises), then the
  // membership. Keys are shared through etcd from here on.
  kj::Own<kj::ConnectionReceiver> peer_listener;
  std::shared_ptr<actors::Cluster> member;
  if (!cluster.etcd.empty()) {
    auto peer = io.provider->getNetwork()
                    .parseAddress(peer_addr.first, peer_addr.second)
                    .wait(io.waitScope);
    peer_listener = peer->listen();
    cluster.peer = peer_addr.first + ":" + std::to_string(peer_listener->getPort());
    cluster.url = scheme + "://" + host + ":" + std::to_string(listener->getPort());
    auto* rt = runtime.get();
    auto accel_name = actors::accel_name(config);
    auto joined = actors::Cluster::join(cluster, [rt, accel_name]() {
      actors::HostInfo h;
      auto memory = actors::host_memory();
      h.total_mib = memory.total_kib / 1024;
      h.free_mib = memory.available_kib / 1024;
      auto counts = rt->counts();
      h.sandboxes = uint32_t(counts.by_status["running"]);
      for (auto& t : rt->templates())
        if (t.baked) h.templates.push_back(t.name);
      // Tenants' own templates live here alone: creates of them are placed here (by their id).
      for (auto& t : rt->custom_templates("*"))
        if (t.status == actors::TemplateStatus::ready) h.templates.push_back(t.id);
      h.accel = accel_name;
      return h;
    });
    if (!joined) {
      spdlog::critical("cannot join the cluster at {}: {}", cluster.etcd, joined.error().message);
      return 1;
    }
    member = std::shared_ptr<actors::Cluster>(std::move(*joined));
    runtime->join_cluster(member);
  }

  // First start: an admin key, written to DATA/api-key (0600) and printed.
  fs::path key_file = data / "api-key";
  std::string key;
  auto keys = runtime->list_keys();
  if (!keys) {
    spdlog::critical("cannot read API keys: {}", keys.error().message);
    return 1;
  }
  if (keys->empty()) {  // (in a cluster: the first host to start)
    auto k = runtime->create_key("default", true);
    if (!k) {
      spdlog::critical("cannot create the admin key: {}", k.error().message);
      return 1;
    }
    key = k->first;
    int fd = ::open(key_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    std::string line = key + "\n";
    if (fd < 0 || ::write(fd, line.data(), line.size()) != ssize_t(line.size())) {
      spdlog::critical("cannot write {}: {}", key_file.string(), strerror(errno));
      return 1;
    }
    ::close(fd);
    spdlog::info("created admin key {} for tenant 'default' in {}", k->second.id,
                 key_file.string());
  }  // (a key made before is in the key file: it is not printed, nor logged, again)

  auto gw = std::make_unique<gateway::Gateway>(*runtime, io.provider->getTimer(), api_limits);
  if (!tls_cert_file.empty()) {
    auto cert = read_small_file(tls_cert_file), tls_key = read_small_file(tls_key_file);
    if (!cert || !tls_key) {
      spdlog::critical("cannot read {}", !cert ? tls_cert_file : tls_key_file);
      return 1;
    }
    KJ_IF_MAYBE (e, kj::runCatchingExceptions([&] { gw->serve_tls(*cert, *tls_key); })) {
      spdlog::critical("--tls-cert/--tls-key: {}", e->getDescription().cStr());
      return 1;
    }
    if (!preview_scheme_given) preview.scheme = "https";
  }
  if (preview.domain.empty()) preview.domain = "localhost:" + std::to_string(listener->getPort());
  gw->serve_previews(*io.lowLevelProvider, preview);
  auto serving = gw->listen(*listener).eagerlyEvaluate([](kj::Exception&& e) {
    spdlog::critical("gateway stopped: {}", e.getDescription().cStr());
  });
  std::string url = scheme + "://" + host + ":" + std::to_string(listener->getPort());
  kj::Promise<void> peers_serving = kj::NEVER_DONE;
  if (member) {
    peers_serving = gw->serve_peers(*io.provider, *peer_listener, std::move(peer_auth))
                        .eagerlyEvaluate([](kj::Exception&& e) {
                          spdlog::critical("peer service stopped: {}", e.getDescription().cStr());
                        });
  }

  // Cap'n Proto RPC: TCP and a unix socket in the data folder (owner only).
  auto rpc = std::make_unique<gateway::RpcServer>(*runtime, io.provider->getTimer(), api_limits);
  auto rpc_addr = io.provider->getNetwork().parseAddress(rpc_host, rpc_port).wait(io.waitScope);
  auto rpc_listener = rpc_addr->listen();
  fs::path sock = data / "rpc.sock";
  fs::remove(sock);
  auto unix_addr =
      io.provider->getNetwork().parseAddress(kj::str("unix:", sock.c_str())).wait(io.waitScope);
  auto unix_listener = unix_addr->listen();
  fs::permissions(sock, fs::perms::owner_read | fs::perms::owner_write);
  auto rpc_serving = rpc->listen(*rpc_listener)
                         .exclusiveJoin(rpc->listen(*unix_listener))
                         .eagerlyEvaluate([](kj::Exception&& e) {
                           spdlog::critical("RPC stopped: {}", e.getDescription().cStr());
                         });
  std::string rpc_url = rpc_host + ":" + std::to_string(rpc_listener->getPort());
  gw->connect_rpc(rpc.get());  // (cluster mode: RPC clients reach every host's sandboxes)

  std::printf(
      "PandaStack is running.\n  URL:     %s\n  RPC:     %s (and unix:%s)\n  State:   %s\n"
      "  API key: %s\n%s  (key file: %s)\n",
      url.c_str(), rpc_url.c_str(), sock.c_str(), runtime->config().state_dir.c_str(),
      key.empty() ? "(in the key file)" : key.c_str(),
      member ? ("  Cluster: host " + cluster.host_id + " at " + cluster.etcd + ", peers on " +
                cluster.peer + "\n")
                   .c_str()
             : "",
      key_file.c_str());
  std::fflush(stdout);
  spdlog::info("listening on {} (accelerator {}, images {})", url, actors::accel_name(config),
               images.string());

  auto& port_ = io.unixEventPort;
  auto sig = port_.onSignal(SIGTERM).exclusiveJoin(port_.onSignal(SIGINT)).wait(io.waitScope);
  spdlog::info("signal {}: shutting down", strsignal(sig.si_signo));
  // Stop serving, then the runtime: persistent sandboxes hibernate, the others are killed.
  { auto drop = kj::mv(serving); }
  { auto drop = kj::mv(rpc_serving); }
  { auto drop = kj::mv(peers_serving); }
  if (member) member->leave();  // down for the other hosts at once, not after the lease TTL
  gw->connect_rpc(nullptr);
  rpc.reset();
  unix_listener = nullptr;
  fs::remove(sock);
  gw.reset();  // cancels commands in flight, joins the gateway's workers
  runtime.reset();
  spdlog::info("stopped");
  return 0;
}
