// Every request between actors has a deadline (deadlines.h): a reply that never comes is an error
// that names who did not answer and for how long, not a caller that waits for ever.
#include "actors/deadlines.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace pandastack::actors {
namespace {

// An actor that takes a request and never answers it (its promise is dropped unanswered). (An
// argument of its own: CAF 0.17 binds a null reference for an actor spawned with none, which
// UBSan reports.)
caf::behavior silent(caf::event_based_actor* self, int) {
  return {[self](int) -> caf::result<int> {
    auto rp = self->make_response_promise<int>();
    return rp;  // never delivered
  }};
}

TEST(Deadlines, AReplyThatNeverComesIsATimeoutThatNamesWhoAndHowLong) {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto quiet = sys.spawn(silent, 0);
  constexpr deadline::Deadline kShort{"the test's actor", std::chrono::seconds(1)};
  caf::scoped_actor self{sys};
  std::optional<Rejection> got;
  self->request(quiet, kShort.limit, 1)
      .receive([&](int) { FAIL() << "answered"; },
               [&](caf::error& e) { got = deadline::missed(e, kShort, sys); });
  ASSERT_TRUE(got);
  EXPECT_EQ(got->code, Code::timeout);
  EXPECT_EQ(got->message, "the test's actor did not answer within 1 s");
  self->send_exit(quiet, caf::exit_reason::user_shutdown);
}

TEST(Deadlines, AnActorThatDiedIsAnInternalErrorThatNamesIt) {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto quiet = sys.spawn(silent, 0);
  caf::scoped_actor self{sys};
  self->send_exit(quiet, caf::exit_reason::kill);
  std::optional<Rejection> got;
  self->request(quiet, deadline::kQuery.limit, 1)
      .receive([&](int) { FAIL() << "answered"; },
               [&](caf::error& e) { got = deadline::missed(e, deadline::kQuery, sys); });
  ASSERT_TRUE(got);
  EXPECT_EQ(got->code, Code::internal);
  EXPECT_EQ(got->message.rfind("a query: ", 0), 0u) << got->message;
}

// Inner waits are shorter than the waits around them (the caller hears the inner one's name).
TEST(Deadlines, NestInsideTheRuntimesOwn) {
  using namespace deadline;
  EXPECT_LT(kDatabaseCommand.limit, kApiCall.limit);
  EXPECT_LT(kSandboxCommand.limit, kDatabaseCommand.limit);
  EXPECT_LT(kVolumeCommand.limit, kApiCall.limit);
  EXPECT_LT(kVmEffect.limit, kSandboxCommand.limit);
  EXPECT_LT(kBake.limit, kSandboxCommand.limit);
  EXPECT_LT(kVolumeCopy.limit, kVolumeCommand.limit);
}

// No request of the runtime waits for ever: no caf::infinite (written nowhere) in its sources.
TEST(Deadlines, NoActorRequestWaitsForEver) {
  namespace fs = std::filesystem;
  fs::path root = PANDASTACK_SOURCE_DIR;
  int files = 0;
  for (auto dir : {"actors", "gateway"})
    for (auto& f : fs::recursive_directory_iterator(root / dir)) {
      auto ext = f.path().extension();
      if (ext != ".cc" && ext != ".h") continue;
      if (f.path().filename() == "deadlines_test.cc") continue;
      ++files;
      std::ifstream in(f.path());
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      EXPECT_EQ(text.find("caf::"
                          "infinite"),
                std::string::npos)
          << f.path();
    }
  EXPECT_GT(files, 20);
}

}  // namespace
}  // namespace pandastack::actors
