// A tenant's name as it appears in paths and ids: the first 6 bytes of its SHA-256, in hex (a
// custom template's id `<name>.<hash>`, a tenant's build contexts and step checkpoints).
#pragma once

#include <string>

namespace pandastack::actors {

std::string tenant_hash(const std::string& tenant);

}  // namespace pandastack::actors
