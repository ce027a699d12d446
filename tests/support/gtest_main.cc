// The main of every gtest binary without a main of its own: gtest with the per-case watchdog.
#include <gtest/gtest.h>

#include "tests/support/watchdog.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  pandastack::testing::install_watchdog();
  return RUN_ALL_TESTS();
}
