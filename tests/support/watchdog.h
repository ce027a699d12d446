// The per-case watchdog of the gtest suites (the Python suites have tests/api/watchdog.py).
//
// A test case that runs past its expected time is a hang until shown otherwise: after
// PANDASTACK_WATCHDOG_SECONDS (default 180) and every as many after, it prints
// `WATCHDOG: <case> still running after N s` and every thread's stack (gdb) to stderr, so a CI
// log says where it waits. scripts/ctest.sh collects those lines and every case that took a
// minute or more at the end of a run.
#pragma once

namespace pandastack::testing {

// Appends the watchdog to gtest's listeners (after InitGoogleTest, before RUN_ALL_TESTS).
void install_watchdog();

}  // namespace pandastack::testing
