// A value in single quotes for a POSIX shell (a `'` inside as '\''): how the daemon writes every
// word of a command a guest's shell runs (builds, bakes, Dockerfile steps).
#pragma once

#include <string>

namespace pandastack::actors {

std::string sh_quote(const std::string& v);

}  // namespace pandastack::actors
