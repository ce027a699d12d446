#include "actors/quotas.h"

#include "actors/runtime.h"
#include "wire/json.h"

namespace pandastack::actors {

using wire::Json;

Rejection quota_exceeded(const std::string& name, uint64_t limit, uint64_t used, uint64_t asked) {
  return {Code::quota_exceeded,
          "quota '" + name + "' exceeded: limit " + std::to_string(limit) + ", in use " +
              std::to_string(used) + ", asked " + std::to_string(asked),
          QuotaDetail{name, limit, used, asked}};
}

std::optional<Rejection> check_quotas(const Quotas& q, const QuotaUse& u, const QuotaAsk& a) {
  struct Row {
    const char* name;
    uint64_t limit, used, asked;
  };
  for (Row r :
       {Row{"sandboxes", q.sandboxes, u.sandboxes, a.sandboxes},
        Row{"memory_mib", q.memory_mib, u.memory_mib, a.memory_mib},
        Row{"snapshots", q.snapshots, u.snapshots, a.snapshots},
        Row{"snapshot_mib", q.snapshot_mib, u.snapshot_mib, a.snapshot_mib},
        Row{"hibernated", q.hibernated, u.hibernated, a.hibernated},
        Row{"hibernated_mib", q.hibernated_mib, u.hibernated_mib, a.hibernated_mib},
        Row{"ports", q.ports, u.ports, a.ports}, Row{"volumes", q.volumes, u.volumes, a.volumes},
        Row{"volume_mib", q.volume_mib, u.volume_mib, a.volume_mib}})
    if (r.asked > 0 && r.used + r.asked > r.limit)
      return quota_exceeded(r.name, r.limit, r.used, r.asked);
  return std::nullopt;
}

void count_volume_use(const VolumeInfo& v, QuotaUse& u) {
  if (v.status == "deleted" || v.status == "moved") return;
  ++u.volumes;
  u.volume_mib += v.size_mib;
  for (auto& sn : v.snapshots) u.volume_mib += sn.size_mib;  // their copies take disk too
  for (auto& at : v.attachments)
    if (at.read_only) u.volume_mib += v.size_mib;
}

uint64_t backups_mib(const std::vector<DatabaseBackup>& backups) {
  uint64_t bytes = 0;
  for (auto& b : backups) bytes += b.bytes;
  return (bytes + (1 << 20) - 1) >> 20;
}

void count_use(const SandboxInfo& i, uint64_t default_mem, QuotaUse& u) {
  uint64_t mem = i.memory_mib != 0 ? i.memory_mib : default_mem;
  bool live = i.status != SandboxStatus::none && i.status != SandboxStatus::stopped &&
              i.status != SandboxStatus::failed && i.status != SandboxStatus::hibernated;
  if (live) {
    ++u.sandboxes;
    u.memory_mib += mem;
    u.ports += uint32_t(i.ports.size());
  }
  if (i.status == SandboxStatus::hibernated || (live && i.persistent)) {
    ++u.hibernated;
    u.hibernated_mib += mem;
  }
  u.snapshots += uint32_t(i.snapshots.size());
  u.snapshot_mib += mem * i.snapshots.size();
}

namespace {
template <typename F>
void each_field(F f) {
  f("sandboxes", &Quotas::sandboxes, nullptr);
  f("memory_mib", nullptr, &Quotas::memory_mib);
  f("snapshots", &Quotas::snapshots, nullptr);
  f("snapshot_mib", nullptr, &Quotas::snapshot_mib);
  f("hibernated", &Quotas::hibernated, nullptr);
  f("hibernated_mib", nullptr, &Quotas::hibernated_mib);
  f("ports", &Quotas::ports, nullptr);
  f("execs", &Quotas::execs, nullptr);
  f("requests_per_second", &Quotas::requests_per_second, nullptr);
  f("volumes", &Quotas::volumes, nullptr);
  f("volume_mib", nullptr, &Quotas::volume_mib);
}
}  // namespace

Json quotas_json(const Quotas& q) {
  Json j = Json::object();
  each_field([&](const char* name, uint32_t Quotas::*small, uint64_t Quotas::*big) {
    j.set(name, small ? int64_t(q.*small) : int64_t(q.*big));
  });
  return j;
}

Json use_json(const QuotaUse& u) {
  Json j = Json::object();
  j.set("sandboxes", int64_t(u.sandboxes));
  j.set("memory_mib", int64_t(u.memory_mib));
  j.set("snapshots", int64_t(u.snapshots));
  j.set("snapshot_mib", int64_t(u.snapshot_mib));
  j.set("hibernated", int64_t(u.hibernated));
  j.set("hibernated_mib", int64_t(u.hibernated_mib));
  j.set("ports", int64_t(u.ports));
  j.set("execs", int64_t(u.execs));
  j.set("volumes", int64_t(u.volumes));
  j.set("volume_mib", int64_t(u.volume_mib));
  j.set("templates", int64_t(u.templates));
  return j;
}

std::variant<Quotas, Rejection> quotas_from_json(const Json& j, Quotas q) {
  if (!j.is_object()) return Rejection{Code::invalid_argument, "quotas are a JSON object"};
  for (auto& [k, v] : j.as_object()) {
    bool known = false;
    std::optional<Rejection> bad;
    each_field([&](const char* name, uint32_t Quotas::*small, uint64_t Quotas::*big) {
      if (k != name) return;
      known = true;
      uint64_t max = small ? UINT32_MAX : (uint64_t(1) << 40);
      if (!v.is_number() || v.as_double() < 1 || v.as_double() > double(max) ||
          v.as_double() != double(int64_t(v.as_double()))) {
        bad = Rejection{Code::invalid_argument, std::string("quota '") + name +
                                                    "' must be a whole number from 1 to " +
                                                    std::to_string(max)};
        return;
      }
      if (small)
        q.*small = uint32_t(v.as_int());
      else
        q.*big = uint64_t(v.as_int());
    });
    if (bad) return *bad;
    if (!known) return Rejection{Code::invalid_argument, "unknown quota '" + k + "'"};
  }
  return q;
}

}  // namespace pandastack::actors
