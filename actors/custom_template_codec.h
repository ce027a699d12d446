// Custom template events to and from their persisted form (wire/events.capnp TemplateEvent, the
// same format version as sandbox events), and as JSON for the audit log.
#pragma once

#include <optional>
#include <string>

#include "actors/custom_template.h"

namespace pandastack::actors {

std::string encode_template_event(const TemplateEvent& e);
// nullopt when the bytes are not a valid template event.
std::optional<TemplateEvent> decode_template_event(const std::string& bytes);
std::string template_event_to_json(const TemplateEvent& e);

}  // namespace pandastack::actors
