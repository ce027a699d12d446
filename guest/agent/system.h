// The guest system the agent runs as PID 1 of: pseudo filesystems, the network, the host's port.
#pragma once

#include <string>

namespace pandastack::agent {

// Mounts /tmp, /dev/pts, /dev/shm; loopback up; the base environment (PATH, HOME, LANG, TERM).
void init_system();
// eth0 addressed and up, default route, resolver (the sandbox network, the same in every guest).
void configure_network();
// eth0 down: a sandbox without a network fails connects and lookups at once.
void take_network_down();
// The /dev node of the virtio-serial port called `name` ("" when there is none yet).
std::string find_port(const std::string& name);
// True while the host end of the port is connected (virtio-serial reports POLLHUP otherwise).
bool host_connected(int fd);

}  // namespace pandastack::agent
