// The API's error vocabulary: every code a request can fail with, its HTTP status and what it
// means, in one table (the X-macro below). The REST and RPC APIs, the SDKs, the OpenAPI document
// and the docs all take their codes from here; a code is a value (enum class Code), never a
// string, until it is written to the wire. RocksDB's Status code is the model: one enum, one
// message beside it.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace pandastack {

// X(code, HTTP status, summary)
#define PANDASTACK_ERROR_CODES(X)                                                                \
  X(invalid_json, 400, "the body is not JSON")                                                   \
  X(invalid_argument, 400, "a field is missing, malformed or out of its documented range")       \
  X(invalid_path, 400, "a guest path is not absolute, too long or has . or .. segments")         \
  X(invalid_cwd, 400, "an exec's working directory does not exist in the guest")                 \
  X(command_not_found, 400, "an exec's program does not exist or is not executable")             \
  X(unknown_user, 400, "an exec's user is not an account of the guest")                          \
  X(exceeds_template, 400, "a create asks for more memory or vCPUs than its template has")       \
  X(unauthorized, 401, "no API key, or one that does not verify")                                \
  X(forbidden, 403, "the key may not do this (another tenant's, or an admin route)")             \
  X(permission_denied, 403, "the guest refused a file operation")                                \
  X(route_not_found, 404, "no such route")                                                       \
  X(sandbox_not_found, 404, "no such sandbox (or another tenant's)")                             \
  X(snapshot_not_found, 404, "no such snapshot")                                                 \
  X(template_not_found, 404, "no such template")                                                 \
  X(file_not_found, 404, "no such file in the guest or volume")                                  \
  X(context_not_found, 404, "no such code interpreter context")                                  \
  X(key_not_found, 404, "no such API key")                                                       \
  X(secret_not_found, 404, "no such secret (or another tenant's, or expired)")                   \
  X(process_not_found, 404, "no such process in the guest")                                      \
  X(port_not_found, 404, "the port is not exposed")                                              \
  X(preview_not_found, 404, "the port has no preview URL (or it was revoked)")                   \
  X(volume_not_found, 404, "no such volume")                                                     \
  X(database_not_found, 404, "no such database")                                                 \
  X(backup_not_found, 404, "no such database backup")                                            \
  X(host_not_found, 404, "no such host in the cluster")                                          \
  X(method_not_allowed, 405, "the route does not take this method")                              \
  X(request_timeout, 408, "the request's body did not arrive in time")                           \
  X(offset_mismatch, 409, "an upload's offset is not where the file ends")                       \
  X(database_hibernated, 409, "the database is hibernated")                                      \
  X(database_failed, 409, "the database failed (its reason says why)")                           \
  X(database_not_running, 409, "the database is not running")                                    \
  X(managed_by_database, 409, "the sandbox or volume belongs to a database")                     \
  X(is_a_directory, 409, "the path is a directory")                                              \
  X(not_a_directory, 409, "a path component is not a directory")                                 \
  X(file_exists, 409, "the path exists")                                                         \
  X(directory_not_empty, 409, "the directory is not empty")                                      \
  X(sandbox_hibernated, 409, "the sandbox is hibernated (wake it, or create it with auto_wake)") \
  X(sandbox_stopped, 409, "the sandbox was killed")                                              \
  X(sandbox_failed, 409, "the sandbox failed (its failure_reason says why)")                     \
  X(sandbox_busy, 409, "a lifecycle transition of the sandbox is in progress")                   \
  X(sandbox_not_running, 409, "the sandbox is not running")                                      \
  X(invalid_state, 409, "the resource is not in a state that allows this")                       \
  X(conflict, 409, "the resource changed or exists already")                                     \
  X(already_exists, 409, "a resource with this id exists")                                       \
  X(not_expired, 409, "(the reaper's) the sandbox expires later")                                \
  X(network_disabled, 409, "the sandbox was created without a network")                          \
  X(volume_in_use, 409, "the volume is attached read-write elsewhere")                           \
  X(volume_attached, 409, "the volume is attached to a sandbox")                                 \
  X(volume_grow_failed, 409, "the volume could not grow")                                        \
  X(template_in_use, 409, "sandboxes run from the template")                                     \
  X(cancelled, 409, "the operation was cancelled")                                               \
  X(client_too_slow, 409, "the client did not read a stream's output in time")                   \
  X(cluster_disabled, 409, "a cluster route on a daemon without --cluster")                      \
  X(body_too_large, 413, "the request body is over its limit")                                   \
  X(file_too_large, 413, "the file is over the transfer limit")                                  \
  X(output_too_large, 413, "the output is over its limit")                                       \
  X(backup_too_large, 413, "the backup is over its limit")                                       \
  X(io_error, 422, "the guest or volume could not read or write")                                \
  X(too_many_directories, 422, "a volume holds too many directories")                            \
  X(too_many_execs, 429, "the sandbox runs its maximum of concurrent execs")                     \
  X(too_many_requests, 429, "the tenant's rate limit, or the host's workers, are exhausted")     \
  X(too_many_ports, 429, "the sandbox exposes its maximum of ports")                             \
  X(too_many_previews, 429, "the sandbox has its maximum of preview URLs")                       \
  X(too_many_processes, 429, "the sandbox runs its maximum of background processes")             \
  X(quota_exceeded, 429, "a tenant quota would be exceeded (quota, limit, used, asked)")         \
  X(internal, 500, "a failure of the host (the message says which)")                             \
  X(storage_error, 500, "the event store failed")                                                \
  X(start_failed, 500, "the VM did not start")                                                   \
  X(snapshot_failed, 500, "the snapshot was not taken")                                          \
  X(fork_failed, 500, "the fork was not made")                                                   \
  X(backup_failed, 500, "the backup was not made")                                               \
  X(restore_failed, 500, "the restore did not complete")                                         \
  X(hibernate_failed, 500, "the hibernation was not taken")                                      \
  X(wake_failed, 500, "the sandbox did not wake")                                                \
  X(network_error, 500, "the sandbox's network could not be set up")                             \
  X(build_failed, 500, "a template build step failed (the message has its output)")              \
  X(not_implemented, 501, "not built (the message says what is missing)")                        \
  X(agent_error, 502, "the guest agent did not answer")                                          \
  X(upstream_unreachable, 502, "(preview) nothing answers on the port in the sandbox")           \
  X(peer_error, 502, "(cluster) another host did not answer as it should")                       \
  X(exec_failed, 503, "the exec could not start")                                                \
  X(host_full, 503, "the host has no memory for another sandbox")                                \
  X(host_unavailable, 503, "(cluster) the owner host's lease expired or it cannot be reached")   \
  X(cluster_unavailable, 503, "(cluster) etcd cannot be reached")                                \
  X(unavailable, 503, "the daemon is stopping")                                                  \
  X(timeout, 504, "a deadline passed")                                                           \
  X(no_space, 507, "the host's disk is full")

enum class Code : uint8_t {
#define PANDASTACK_ERROR_ENUM(code, status, summary) code,
  PANDASTACK_ERROR_CODES(PANDASTACK_ERROR_ENUM)
#undef PANDASTACK_ERROR_ENUM
};

// The code's name on the wire ("sandbox_not_found").
const char* to_string(Code code);
// The HTTP status a REST answer with this code has.
unsigned http_status(Code code);
// What the code means, one line (the OpenAPI document and docs/api.md).
const char* summary(Code code);
// The code named `name` (as another host or an SDK wrote it): nullopt for none of ours.
std::optional<Code> code_from_string(std::string_view name);
// Every code, in the table's order.
const std::vector<Code>& all_codes();

inline std::ostream& operator<<(std::ostream& os, Code code) { return os << to_string(code); }

// quota_exceeded's details, answered as fields beside the code and message.
struct QuotaDetail {
  std::string quota;
  uint64_t limit = 0, used = 0, asked = 0;
  bool operator==(const QuotaDetail&) const = default;
};

}  // namespace pandastack
