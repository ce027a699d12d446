// Volume events to and from their persisted form (wire/events.capnp VolumeEvent, the same format
// version as sandbox events), and as JSON for the audit log.
#pragma once

#include <optional>
#include <string>

#include "actors/volume.h"

namespace pandastack::actors {

std::string encode_volume_event(const VolumeEvent& e);
// nullopt when the bytes are not a valid volume event.
std::optional<VolumeEvent> decode_volume_event(const std::string& bytes);
std::string volume_event_to_json(const VolumeEvent& e);

}  // namespace pandastack::actors
