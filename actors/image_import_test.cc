// An image import's pure parts: the importer's answer read and bounded, the start command made
// of the image's Entrypoint/Cmd, and an import's lifecycle (its spec, its end with the image's
// facts, their persisted form).
#include "actors/image_import.h"

#include <gtest/gtest.h>

#include "actors/custom_template_codec.h"

namespace pandastack::actors {
namespace {

constexpr int64_t kNow = 7'000;

const std::string kDigest =
    "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

std::string answer(const std::string& extra = "") {
  return R"({"format": "docker-archive", "config_digest": ")" + kDigest +
         R"(", "tags": ["web:1"], "layers": 2, "entries": 40, "bytes": 2000000,
  "env": {"PATH": "/bin", "GREETING": "hi"}, "entrypoint": [], "cmd": ["httpd", "-f", "-p",
  "8080"], "workdir": "/srv", "user": "app", "uid": 1000, "gid": 1000,
  "exposed": ["8080/tcp"])" +
         extra + "}";
}

TEST(ImageImport, TheAnswerBecomesTheTemplatesFacts) {
  auto r = imported_image(answer(), true);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->facts.ref, "web:1@" + kDigest);
  EXPECT_EQ(r->facts.env.at("GREETING"), "hi");
  EXPECT_EQ(r->facts.ready_port, 8080);
  EXPECT_EQ(r->facts.start,
            "cd '/srv' && exec /run/pandastack/agent --run-as 1000 1000 - /bin/sh sh -c 'exec "
            "\"$@\"' sh 'httpd' '-f' '-p' '8080'");
  EXPECT_EQ(r->layers, 2u);
  // start=false, or an image exposing no TCP port: its Cmd is not started (a base image's
  // `bash` would end at once).
  EXPECT_EQ(imported_image(answer(), false)->facts.start, "");
  auto udp = answer();
  udp.replace(udp.find("8080/tcp"), 8, "53/udp");
  EXPECT_EQ(imported_image(udp, true)->facts.start, "");
  EXPECT_EQ(imported_image(udp, true)->facts.ready_port, 0);
}

TEST(ImageImport, DockersEntrypointTakesTheCmdAsItsArguments) {
  EXPECT_EQ(image_start_command({"nginx", "-g", "daemon off;"}, "", 0, 0),
            "cd '/' && exec 'nginx' '-g' 'daemon off;'");
  auto r = imported_image(
      answer().replace(answer().find(R"("entrypoint": [])"), 16, R"("entrypoint": ["/entry.sh"])"),
      true);
  ASSERT_TRUE(r);
  EXPECT_NE(r->facts.start.find("sh '/entry.sh' 'httpd' '-f'"), std::string::npos)
      << r->facts.start;
}

TEST(ImageImport, AMalformedAnswerIsRefused) {
  for (auto bad :
       {std::string("[]"), std::string("{}"), std::string("not json"),
        answer().replace(answer().find(R"("uid": 1000)"), 11, R"("uid": -1)"),
        answer().replace(answer().find(R"("uid": 1000)"), 11, R"("uid": "0")"),
        answer().replace(answer().find(R"("cmd": [)"), 8, R"("cmd": [1, )"),
        answer().replace(answer().find(kDigest), kDigest.size(), "sha256:short"),
        answer().replace(answer().find(R"("workdir": "/srv")"), 17, "\"workdir\": \"/a\\nb\"")}) {
    auto r = imported_image(bad, true);
    EXPECT_FALSE(r) << bad;
    if (!r) {
      EXPECT_EQ(r.error().code, Code::build_failed);
    }
  }
}

TEST(ImageImport, AnImportsSpecAndItsEndAreCheckedAndPersisted) {
  TemplateSpec spec;
  spec.from = "";
  spec.image = "upload of 2048 bytes";
  TemplateState s;
  s.id = "web.t1";
  auto d = decide(s, tcmd::Build{"t1", "web", spec}, kNow);
  ASSERT_TRUE(std::holds_alternative<std::vector<TemplateEvent>>(d));
  for (auto& e : std::get<std::vector<TemplateEvent>>(d)) {
    auto back = decode_template_event(encode_template_event(e));
    ASSERT_TRUE(back);
    EXPECT_EQ(back->spec, e.spec);
    s = apply(s, *back);
  }
  EXPECT_EQ(s.status, TemplateStatus::building);
  // An import takes nothing of a build's steps.
  for (auto change :
       {+[](TemplateSpec& t) { t.from = "base"; }, +[](TemplateSpec& t) { t.run = {"true"}; },
        +[](TemplateSpec& t) { t.packages = {"jq"}; },
        +[](TemplateSpec& t) {
          t.env = {{"A", "1"}};
        }}) {
    TemplateSpec bad = spec;
    change(bad);
    auto r = decide(TemplateState{}, tcmd::Build{"t1", "web", bad}, kNow);
    ASSERT_TRUE(std::holds_alternative<Rejection>(r));
    EXPECT_EQ(std::get<Rejection>(r).code, Code::invalid_argument);
  }
  // Its end carries the image's facts (checked like a build's env and start), persisted.
  ImageFacts facts{"web:1@" + kDigest, "cd '/' && exec 'httpd'", 8080, {{"GREETING", "hi"}}};
  auto no_facts = decide(s, tcmd::Finish{100, 4096, {}}, kNow);
  EXPECT_TRUE(std::holds_alternative<Rejection>(no_facts));
  auto bad_env = facts;
  bad_env.env["1BAD"] = "x";
  EXPECT_TRUE(std::holds_alternative<Rejection>(decide(s, tcmd::Finish{100, 4096, bad_env}, kNow)));
  auto end = decide(s, tcmd::Finish{100, 4096, facts}, kNow);
  ASSERT_TRUE(std::holds_alternative<std::vector<TemplateEvent>>(end));
  for (auto& e : std::get<std::vector<TemplateEvent>>(end)) {
    auto back = decode_template_event(encode_template_event(e));
    ASSERT_TRUE(back);
    EXPECT_EQ(back->image, facts);
    s = apply(s, *back);
  }
  EXPECT_EQ(s.status, TemplateStatus::ready);
  EXPECT_EQ(s.spec.image, facts.ref);
  EXPECT_EQ(s.spec.start, facts.start);
  EXPECT_EQ(s.spec.ready_port, 8080);
  EXPECT_EQ(s.spec.env, facts.env);
  // A build that is not an import never ends with an image's facts.
  TemplateState b;
  b.id = "b.t1";
  TemplateSpec plain;
  auto started = decide(b, tcmd::Build{"t1", "b", plain}, kNow);
  for (auto& e : std::get<std::vector<TemplateEvent>>(started)) b = apply(b, e);
  EXPECT_TRUE(std::holds_alternative<Rejection>(decide(b, tcmd::Finish{1, 1, facts}, kNow)));
}

}  // namespace
}  // namespace pandastack::actors
