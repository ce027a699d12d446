// Template actor: one per template, spawned by the registry on first use (detached: a bake is a
// cold boot). Its mailbox serializes the requests, so the first bakes (once, through the VMM
// driver's TemplateStore) and every later one, concurrent or not, gets the staged snapshot.
//   bake_atom -> Answer{text: the staged snapshot's folder} | start_failed
#pragma once

#include <string>

#include "actors/messages.h"

namespace pandastack::actors {

caf::behavior template_actor(caf::event_based_actor* self, Env* env, std::string name);

}  // namespace pandastack::actors
