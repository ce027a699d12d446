#include "tools/cli/api_options.h"

#include <cstdio>
#include <cstdlib>

namespace pandastack::cli {

using wire::Json;

const char* const kApiUsage = R"(usage:
  pandastack sandbox create [--template T] [--ttl S] [--metadata K=V]... [--persistent]
                            [--idle-timeout S] [--on-timeout kill|hibernate] [--auto-wake]
                            [--no-network | --egress deny_all|allow_all|allowlist] [--allow CIDR]...
                            [--memory MIB] [--vcpus N] [--json]
      (a sandbox has its template's memory and vCPUs: asking for more is refused)
  pandastack sandbox list [--state S | --all] [--metadata K=V]... [--json]   (live ones by default)
  pandastack sandbox get|hibernate|wake|kill|snapshot ID [--json]
  pandastack sandbox fork ID [--count N] [--inherit-secrets] [--json]
  pandastack sandbox exec ID [--timeout S] [--cwd DIR] [--env K=V]... [--no-stdin] [--json] -- CMD [ARG...]
      Streams the command's output; piped stdin (not a terminal) goes to the command (64 KiB at
      most). Exits with its exit code, 128+N when a signal N killed it, 124 when it timed out.
  pandastack sandbox shell ID [-- CMD [ARG...]]
      An interactive terminal in the sandbox (a login shell unless CMD is given); the window's
      size follows. Piped input is typed as it is, then Ctrl-D. Exits with the shell's status.
  pandastack sandbox logs ID [--json]
  pandastack sandbox egress ID deny_all|allow_all|allowlist [--allow CIDR]... [--json]
  pandastack sandbox ports ID [--json]                 exposed guest ports and their host addresses
  pandastack sandbox egress-log ID [--json]            names looked up, connections opened and refused
  pandastack sandbox expose ID PORT [--json]           forward guest TCP PORT from the host
  pandastack sandbox unexpose ID PORT
  pandastack sandbox preview ID PORT [--ttl S] [--public] [--json]   serve guest PORT at a preview
      URL of the daemon (prints it, with its token unless --public; again: a new URL)
  pandastack sandbox previews ID [--json]
  pandastack sandbox unpreview ID PORT                 revoke a preview URL
  pandastack files ls ID PATH [--json]
  pandastack files cat ID PATH
  pandastack files cp SRC DST      (one of them ID:/path in a sandbox, the other a local path;
                                    a DST ending in / or naming a folder gets SRC's file name)
  pandastack sandbox create ... [--volume VOL_ID:/mount[:ro]]...   attach volumes (at most 4)
  pandastack sandbox create ... [--secret NAME]...   its processes get placeholders; the values
                                    go into HTTPS requests to each secret's hosts only
  pandastack volume create --size MIB [--name N] [--metadata K=V]... [--json]
  pandastack volume create --from-snapshot VSNAP_ID [--size MIB] [--name N] [--json]
  pandastack volume snapshot VOL_ID [--json]         a point-in-time copy (prints its id)
  pandastack volume snapshots VOL_ID [--json]
  pandastack volume snapshot-delete VOL_ID VSNAP_ID
  pandastack db create NAME [--metadata K=V]... [--json]   prints the connection URI (with the
                                                password: shown this once)
  pandastack db list|get DB_ID [--json]
  pandastack db delete|hibernate|wake DB_ID
  pandastack db rotate-password DB_ID            prints the new connection URI
  pandastack db logs DB_ID [--lines N]
  pandastack db backup DB_ID [--json]           a pg_dump kept on the host (prints its id)
  pandastack db backups DB_ID [--json]
  pandastack db backup-delete DB_ID BACKUP_ID
  pandastack db restore BACKUP_ID NAME [--json]  a new database from a backup (prints its URI)
  pandastack db psql DB_ID [-- PSQL_ARG...]      psql in the database's guest as the superuser
                                                (piped stdin is its input: SQL)
  pandastack volume list [--metadata K=V]... [--json]
  pandastack volume get|delete VOL_ID [--json]
  pandastack volume grow VOL_ID --size MIB [--json]   (only larger; while no sandbox holds it)
  pandastack template list [--json]
  pandastack template build NAME [--from T] [--package P]... [--run CMD]... [--env K=V]...
                            [--file GUEST_PATH=LOCAL_FILE]... [--no-network]
                            [--memory MIB] [--vcpus N] [--json]
  pandastack template build NAME --dockerfile FILE [--context DIR] [--build-arg K=V]...
                            [--package P]... [--no-network] [--memory MIB] [--vcpus N] [--json]
      Builds a template of your own (Debian packages, files, commands run as root in its guest,
      or a Dockerfile's instructions with DIR as its context, uploaded as a tar and unpacked in a
      builder microVM, its .dockerignore applied; then baked): a progress bar on a terminal, its
      log lines otherwise. Exits 1 if it fails.
  pandastack template import NAME ARCHIVE [--memory MIB] [--vcpus N] [--size DISK_MIB]
                            [--no-start] [--no-network] [--json]
      Imports an image as a template of yours: ARCHIVE is `docker save IMAGE > image.tar` or an
      OCI image layout tar (unpacked in a builder microVM; its Env, WorkingDir, User kept; its
      Entrypoint/Cmd started in every sandbox when it exposes a port, unless --no-start).
  pandastack template pull NAME IMAGE [--secret S] [--memory MIB] [--vcpus N] [--size DISK_MIB]
                          [--no-start] [--no-network] [--json]
      Pulls IMAGE (python:3.12-slim, ghcr.io/org/app:1, ...) from its registry and imports it
      as above; --secret: a secret of yours ("user:password" or a token) whose hosts name the
      registry.
  pandastack template publish SANDBOX_ID NAME [--json]   a running sandbox (its disk and memory,
                                                       now) as a template of yours
  pandastack template get|delete NAME [--json]
  pandastack snapshot delete SNAPSHOT_ID            creates from it are refused afterwards
  pandastack secret create NAME --host H... [--ttl S] [--inject-into headers,query,body]
      [--allow-plain-http] [--json]   the value is read from stdin (never from the command line);
      the hosts it may be sent to ("api.example.com", "*.x.com"); where a sandbox's egress proxy
      may put it (headers only by default) and whether plain HTTP may carry it
  pandastack secret rotate NAME [--json]           a new value from stdin (version + 1)
  pandastack secret list [--json]; pandastack secret get|delete NAME [--json]   (never values)
Environment: PANDASTACK_API_KEY, PANDASTACK_BASE_URL (default http://127.0.0.1:7070); --url and
--key override them. `pandastack help`, `pandastack GROUP --help`: this text.
)";

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "pandastack: %s\n%s", why.c_str(), kApiUsage);
  std::exit(2);
}

Opts parse(int argc, char** argv, int from) {
  Opts o;
  for (int i = from; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--") {
      for (++i; i < argc; ++i) o.cmd.push_back(argv[i]);
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--persistent") {
      o.persistent = true;
    } else if (a == "--auto-wake") {
      o.auto_wake = true;
    } else if (a == "--all") {
      o.all = true;
    } else if (a == "--no-stdin") {
      o.no_stdin = true;
    } else if (a == "--help" || a == "-h" || a == "help") {
      std::fputs(kApiUsage, stdout);
      std::exit(0);
    } else if (a == "--metadata") {
      o.metadata.push_back(value());
    } else if (a == "--env") {
      o.env.push_back(value());
    } else if (a == "--allow") {
      o.allow.push_back(value());
    } else if (a == "--host") {
      o.hosts.push_back(value());
    } else if (a == "--volume") {
      o.volumes.push_back(value());
    } else if (a == "--package") {
      o.packages.push_back(value());
    } else if (a == "--run") {
      o.runs.push_back(value());
    } else if (a == "--file") {
      o.files.push_back(value());
    } else if (a == "--build-arg") {
      o.build_args.push_back(value());
    } else if (a == "--secret") {
      o.secrets.push_back(value());
    } else if (a == "--inherit-secrets") {
      o.inherit_secrets = true;
    } else if (a == "--allow-plain-http") {
      o.flags[a] = "true";
    } else if (a == "--no-network") {
      o.no_network = true;
    } else if (a == "--no-start") {
      o.flags[a] = "true";
    } else if (a == "--public") {
      o.is_public = true;
    } else if (a.rfind("--", 0) == 0) {
      static const char* known[] = {
          "--template",     "--ttl",    "--state", "--count",         "--timeout",
          "--cwd",          "--url",    "--key",   "--egress",        "--on-timeout",
          "--idle-timeout", "--size",   "--name",  "--from-snapshot", "--lines",
          "--from",         "--memory", "--vcpus", "--inject-into",   "--dockerfile",
          "--context"};
      bool ok = false;
      for (auto* k : known) ok |= a == k;
      if (!ok) usage("unknown option " + a);
      o.flags[a] = value();
    } else {
      o.pos.push_back(a);
    }
  }
  return o;
}

// A flag that must be a whole number of seconds, MiB (--size, --memory) or vCPUs (a usage error
// otherwise, not a request).
int64_t seconds_flag(const Opts& o, const char* flag) {
  const std::string& v = o.flags.at(flag);
  std::string f = flag;
  if (v.empty() || v.size() > 9 || v.find_first_not_of("0123456789") != std::string::npos)
    usage(f + " needs a whole number of " +
          (f == "--size" || f == "--memory" ? "MiB"
           : f == "--vcpus"                 ? "vCPUs"
                                            : "seconds") +
          ", not '" + v + "'");
  return std::atoll(v.c_str());
}

void set_shape(Json& body, const Opts& o) {
  if (o.flags.count("--memory")) body.set("memory_mib", seconds_flag(o, "--memory"));
  if (o.flags.count("--vcpus")) body.set("vcpus", seconds_flag(o, "--vcpus"));
}

std::map<std::string, std::string> pairs(const std::vector<std::string>& kvs, const char* what) {
  std::map<std::string, std::string> out;
  for (auto& kv : kvs) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      usage(std::string(what) + " needs KEY=VALUE, not " + kv);
    out[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return out;
}

}  // namespace pandastack::cli
