// Events to and from their persisted form (wire/events.capnp, format `formatVersion`).
#pragma once

#include <optional>
#include <string>

#include "actors/sandbox.h"
#include "wire/json.h"

namespace pandastack::actors {

uint32_t event_format();
std::string encode_event(const Event& e);
// nullopt when the bytes are not a valid event (or of a kind this build does not know).
std::optional<Event> decode_event(const std::string& bytes);

}  // namespace pandastack::actors

namespace pandastack::actors {

// The event as one JSON object (for the audit log: API, CLI). Only the fields its kind uses.
std::string event_to_json(const Event& e);
// An egress policy as JSON: {"mode", "cidrs", "domains"} (events, state, the REST API).
wire::Json egress_json(const Egress& e);
// An egress policy from egress_json's form (nullopt when it is not one).
std::optional<Egress> egress_from_json(const wire::Json& j);
// A string map (metadata) as a JSON object.
wire::Json string_map_json(const std::map<std::string, std::string>& m);
// A sandbox's volumes as JSON: [{"volume", "mount", "read_only", "slot"}] (events, state, REST).
wire::Json volumes_json(const std::vector<SandboxVolume>& volumes);

}  // namespace pandastack::actors

namespace pandastack::actors {

// Sandbox state snapshots (storage::StateSnapshot::state), format `state_format()`: recovery
// starts from the newest one and applies only the events after it.
uint32_t state_format();
std::string encode_state(const SandboxState& s);
// nullopt when the bytes are not a state of this format.
std::optional<SandboxState> decode_state(const std::string& bytes);

}  // namespace pandastack::actors
