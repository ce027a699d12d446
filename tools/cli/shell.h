// `pandastack sandbox shell`: an interactive terminal in a sandbox (WebSocket /pty).
#pragma once

#include <string>
#include <vector>

#include "tools/http_client.h"

namespace pandastack::cli {

// Runs a terminal session in sandbox `id` (`cmd` empty: a login shell); returns the exit status
// (128+N for a signal N, 1 when the terminal could not be opened).
int shell(tools::HttpClient& http, const std::string& id, const std::vector<std::string>& cmd);

}  // namespace pandastack::cli
