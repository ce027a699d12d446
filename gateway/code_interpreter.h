// The code interpreter's host side: runs Python in a sandbox context that keeps its variables,
// imports and working folder between runs (guest/repl/pandastack_repl.py is the guest side, put in
// the guest at first use). A run is one command in the guest (a small client that talks to the
// context's server), so it streams, times out and is cancelled like any command; cancelling it
// interrupts the code (KeyboardInterrupt) and the context lives on, through hibernate, wake and
// fork too (the server is a process of the guest).
#pragma once

#include <functional>
#include <map>
#include <stop_token>
#include <string>
#include <vector>

#include "actors/runtime.h"
#include "wire/json.h"

namespace pandastack::gateway::code {

struct RunRequest {
  std::string code;
  std::string context = "default";
  std::map<std::string, std::string> env;  // for this run only
  uint32_t timeout_ms = 60000;             // then the run is interrupted
  // The guest account it runs as ("" = root): its contexts are its own (a context of root's is
  // not one of the user's), started in its home.
  std::string user;
};

// What a run produced (the events, gathered).
struct RunResult {
  std::string stdout_text, stderr_text;
  std::vector<wire::Json> results;  // {"text", "png"?, "json"?, "is_main_result"}
  std::optional<wire::Json> error;  // {"name", "value", "traceback"}
  int64_t execution_count = 0;
  bool timed_out = false;
};

// The most one line of the guest's client may hold (an event: a result's image included). The
// client is a script in the guest, which guest root can rewrite: a longer line fails the run
// with output_too_large (the command is killed) rather than grow the daemon (security review 3,
// H3).
constexpr size_t kMaxEventLineBytes = size_t(8) << 20;

// Context names: 1..64 of [A-Za-z0-9_-].
bool valid_context(const std::string& c);

// Runs `request` in the sandbox; each event of the interpreter goes to `on_event` as it comes
// ({"type": "stdout"|"stderr"|"result"|"error"|"end", ...}). Errors: the runtime's, and
// invalid_state when the sandbox has no python3.
actors::Reply<RunResult> run(actors::Runtime& rt, const std::string& tenant, const std::string& id,
                             const RunRequest& request,
                             const std::function<void(const wire::Json&)>& on_event,
                             std::stop_token stop = {});

// The contexts whose servers run in the sandbox.
// `user` as for RunRequest::user.
actors::Reply<std::vector<std::string>> contexts(actors::Runtime& rt, const std::string& tenant,
                                                 const std::string& id,
                                                 const std::string& user = "");
// Starts a context's server (its working folder `cwd`, "" = /workspace for root, else the
// user's home).
actors::Reply<bool> start(actors::Runtime& rt, const std::string& tenant, const std::string& id,
                          const std::string& context, const std::string& cwd,
                          const std::string& user = "");
// Ends a context's server (its variables go); a later run starts it afresh.
actors::Reply<bool> stop(actors::Runtime& rt, const std::string& tenant, const std::string& id,
                         const std::string& context, const std::string& user = "");

}  // namespace pandastack::gateway::code
