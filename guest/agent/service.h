// The agent's RPC face (wire/agent.capnp `Agent`): one instance per host session; processes live
// in `Processes` and outlive it.
#pragma once

#include <kj/memory.h>

#include <functional>
#include <string>

#include "wire/agent.capnp.h"

namespace pandastack::agent {

class Processes;

// `end_session()` ends the session once the reply to endSession has gone out.
kj::Own<wire::agent::Agent::Server> make_service(Processes& procs, std::string boot_id,
                                                 std::function<void()> end_session);

}  // namespace pandastack::agent
