// Database events to and from their persisted form (wire/events.capnp DatabaseEvent, the same
// format version as sandbox events), and as JSON for the audit log.
#pragma once

#include <optional>
#include <string>

#include "actors/database.h"

namespace pandastack::actors {

std::string encode_database_event(const DatabaseEvent& e);
// nullopt when the bytes are not a valid database event.
std::optional<DatabaseEvent> decode_database_event(const std::string& bytes);
std::string database_event_to_json(const DatabaseEvent& e);

}  // namespace pandastack::actors
