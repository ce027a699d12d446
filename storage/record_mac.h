// Records a cluster keeps in etcd, sealed with the cluster's records key (actors/cluster_tls.h):
// an HMAC-SHA256 (its first 32 hex digits) over a purpose, the record's id and the record, so a
// record written by something that does not hold the key (an etcd client certificate alone), or
// copied under another id or to another purpose, does not verify. API keys
// (storage/api_keys.h) and parked hibernations (actors/cluster.h) are sealed so.
#pragma once

#include <optional>
#include <string>

namespace pandastack::storage {

// `record` with its MAC appended ("" key: an --insecure-cluster's records are unsealed).
std::string seal_record(const std::string& key, const std::string& purpose, const std::string& id,
                        const std::string& record);
// The record, when `sealed` carries its MAC for `purpose` and `id` (any record when key is "").
std::optional<std::string> open_record(const std::string& key, const std::string& purpose,
                                       const std::string& id, const std::string& sealed);

}  // namespace pandastack::storage
