// A Dockerfile as a template build's spec (actors/dockerfile.h): each instruction's translation,
// Docker's variable and quoting rules, and every refusal naming its line.
#include "actors/dockerfile.h"

#include <gtest/gtest.h>

namespace pandastack::actors {
namespace {

TemplateFromDockerfile ok(const std::string& text,
                          const std::map<std::string, std::string>& ctx = {},
                          const std::map<std::string, std::string>& args = {}) {
  auto r = template_from_dockerfile(text, ctx, args);
  EXPECT_TRUE(r) << (r ? "" : r.error().message);
  return r ? *r : TemplateFromDockerfile{};
}

Rejection refused(const std::string& text, const std::map<std::string, std::string>& ctx = {}) {
  auto r = template_from_dockerfile(text, ctx, {});
  EXPECT_FALSE(r) << text;
  return r ? Rejection{} : r.error();
}

TEST(Dockerfile, EachInstructionBecomesABuildStepInOrder) {
  auto t = ok(R"(# a comment
FROM base AS app
ARG VERSION=1
ENV MODE=prod \
    GREETING="hello world"
WORKDIR /srv/app
COPY app.py ./
COPY conf/ /etc/app/
RUN python3 app.py --version $VERSION && \
    echo done
USER user
RUN ["id", "-un"]
EXPOSE 8080/tcp 9090
LABEL org.example="x y"
)",
              {{"app.py", "print('hi')\n"},
               {"conf/a.ini", "a=1\n"},
               {"conf/sub/b.ini", "b\n"},
               {"unused.txt", "u"}});
  EXPECT_EQ(t.spec.from, "base");
  EXPECT_EQ(t.spec.env,
            (std::map<std::string, std::string>{{"GREETING", "hello world"}, {"MODE", "prod"}}));
  // The used context files are staged (the unused one is not).
  EXPECT_EQ(t.spec.files, (std::map<std::string, std::string>{
                              {"/var/lib/pandastack/build-context/app.py", "print('hi')\n"},
                              {"/var/lib/pandastack/build-context/conf/a.ini", "a=1\n"},
                              {"/var/lib/pandastack/build-context/conf/sub/b.ini", "b\n"}}));
  ASSERT_EQ(t.spec.run.size(), 6u);
  EXPECT_EQ(t.spec.run[0], "mkdir -p '/srv/app'");
  EXPECT_EQ(t.spec.run[1],
            "mkdir -p '/srv/app' && cp '/var/lib/pandastack/build-context/app.py' "
            "'/srv/app/app.py'");
  EXPECT_EQ(t.spec.run[2],
            "mkdir -p '/etc/app' && cp -R '/var/lib/pandastack/build-context/conf'/. '/etc/app'/");
  EXPECT_EQ(t.spec.run[3],
            "(set -e; cd '/srv/app'; export VERSION='1'; sh -c 'python3 app.py --version $VERSION "
            "&&     echo done')");
  EXPECT_EQ(t.spec.run[4],
            "(set -e; cd '/srv/app'; export VERSION='1'; runuser -u 'user' -- "
            "'id' '-un')");
  EXPECT_EQ(t.spec.run[5], "rm -rf '/var/lib/pandastack/build-context'");
  EXPECT_EQ(t.workdir, "/srv/app");
  EXPECT_EQ(t.user, "user");
  EXPECT_EQ(t.exposed, (std::vector<std::string>{"8080/tcp", "9090"}));
}

TEST(Dockerfile, RunSeesTheEnvDeclaredBeforeItOnly) {
  auto t = ok("FROM base\nENV A=1\nRUN one\nENV A=2 B=3\nRUN two\n");
  ASSERT_EQ(t.spec.run.size(), 2u);
  // (the build exports the final ENV to every command: the first RUN undoes what came later)
  EXPECT_EQ(t.spec.run[0], "(set -e; cd '/'; export A='1'; unset B; sh -c 'one')");
  EXPECT_EQ(t.spec.run[1], "(set -e; cd '/'; sh -c 'two')");
  EXPECT_EQ(t.spec.env, (std::map<std::string, std::string>{{"A", "2"}, {"B", "3"}}));
}

TEST(Dockerfile, VariablesQuotesAndEscapesAsDockerHasThem) {
  auto t = ok(R"(ARG BASE=base
FROM ${BASE}
ARG BASE
ARG NAME
ARG EMPTY
ENV HOME_DIR=/home/$NAME \
    DEF=${EMPTY:-fallback} ALT=${NAME:+set} SINGLE='$NAME' ESC=\$NAME DQ="a \"q\" $NAME"
ENV OLD form with spaces
WORKDIR $HOME_DIR
WORKDIR sub/../work
)",
              {}, {{"NAME", "ada"}});
  EXPECT_EQ(t.spec.from, "base");
  EXPECT_EQ(t.spec.env.at("HOME_DIR"), "/home/ada");
  EXPECT_EQ(t.spec.env.at("DEF"), "fallback");
  EXPECT_EQ(t.spec.env.at("ALT"), "set");
  EXPECT_EQ(t.spec.env.at("SINGLE"), "$NAME");
  EXPECT_EQ(t.spec.env.at("ESC"), "$NAME");
  EXPECT_EQ(t.spec.env.at("DQ"), "a \"q\" ada");
  EXPECT_EQ(t.spec.env.at("OLD"), "form with spaces");
  EXPECT_EQ(t.workdir, "/home/ada/work");
  // Build arguments are never the template's environment.
  EXPECT_FALSE(t.spec.env.count("NAME"));
}

TEST(Dockerfile, TheEscapeDirectiveAndCommentsInContinuations) {
  auto t = ok("# escape=`\nFROM base\nRUN echo a `\n# dropped\n  b\n");
  ASSERT_EQ(t.spec.run.size(), 1u);
  EXPECT_EQ(t.spec.run[0], "(set -e; cd '/'; sh -c 'echo a   b')");
}

TEST(Dockerfile, CopyGlobsChownChmodAndAddOfFiles) {
  std::map<std::string, std::string> ctx = {
      {"a.py", "1"}, {"b.py", "2"}, {"c.txt", "3"}, {"bin/run.sh", "#!/bin/sh\n"}};
  auto t =
      ok("FROM base\nCOPY --chown=user:user --chmod=755 *.py /opt/\nADD bin/run.sh "
         "/usr/local/bin/run\n",
         ctx);
  ASSERT_EQ(t.spec.run.size(), 3u);
  EXPECT_EQ(t.spec.run[0],
            "mkdir -p '/opt' && cp '/var/lib/pandastack/build-context/a.py' '/opt/a.py' && "
            "mkdir -p '/opt' && cp '/var/lib/pandastack/build-context/b.py' '/opt/b.py' && "
            "chown 'user:user' '/opt/a.py' '/opt/b.py' && chmod 755 '/opt/a.py' '/opt/b.py'");
  EXPECT_EQ(t.spec.run[1],
            "mkdir -p '/usr/local/bin' && cp '/var/lib/pandastack/build-context/bin/run.sh' "
            "'/usr/local/bin/run'");
  // The whole context.
  t = ok("FROM base\nCOPY . /src\n", ctx);
  EXPECT_EQ(t.spec.run[0],
            "mkdir -p '/src' && cp -R '/var/lib/pandastack/build-context'/. '/src'/");
  EXPECT_EQ(t.spec.files.size(), 4u);
}

// CMD and ENTRYPOINT: the start command (Docker's rules for the two), in the last WORKDIR as the
// last USER, ready on the first EXPOSEd TCP port.
TEST(Dockerfile, AnArchivedContextIsMatchedByTheGuest) {
  auto r = template_from_dockerfile(R"(FROM base
WORKDIR /srv
COPY . app/
COPY --chown=user:user --chmod=640 src/*.py conf.d ./lib/
ADD README /doc
COPY --chmod=600 ["a b", "/c d/"]
)",
                                    {}, {}, {}, true);
  ASSERT_TRUE(r) << r.error().message;
  auto& spec = r->spec;
  EXPECT_EQ(spec.files.at(kBuildCopyPath), kBuildCopyScript);
  ASSERT_EQ(spec.run.size(), 6u);
  const std::string copy = "/var/lib/pandastack/busybox sh /var/lib/pandastack/build-copy ";
  EXPECT_EQ(spec.run[1], copy + "3 '/srv/app' 1 '' '' '.'");
  EXPECT_EQ(spec.run[2], copy + "4 '/srv/lib' 1 'user:user' '640' 'src/*.py' 'conf.d'");
  EXPECT_EQ(spec.run[3], copy + "5 '/doc' 0 '' '' 'README'");
  EXPECT_EQ(spec.run[4], copy + "6 '/c d' 1 '' '600' 'a b'");
  EXPECT_EQ(spec.run[5],
            "/var/lib/pandastack/busybox rm -f /var/lib/pandastack/build-copy "
            "/var/lib/pandastack/busybox");
  // Still refused before any build: what climbs out, URLs, archives to extract, both kinds.
  for (auto* bad : {"FROM base\nCOPY ../x /y\n", "FROM base\nADD https://x.org/a /a\n",
                    "FROM base\nADD a.tar.gz /a\n"})
    EXPECT_FALSE(template_from_dockerfile(bad, {}, {}, {}, true)) << bad;
  auto both = template_from_dockerfile("FROM base\n", {{"a", "b"}}, {}, {}, true);
  ASSERT_FALSE(both);
  EXPECT_NE(both.error().message.find("not both"), std::string::npos);
}

TEST(Dockerfile, CmdAndEntrypointMakeTheStartCommand) {
  auto t =
      ok("FROM base\nWORKDIR /srv\nEXPOSE 53/udp 8080\nUSER user\n"
         "CMD [\"python3\", \"-m\", \"http.server\", \"8080\"]\n");
  EXPECT_EQ(t.spec.start,
            "cd '/srv' && export HOME=\"$(getent passwd 'user' | cut -d: -f6)\" USER='user' "
            "LOGNAME='user' && exec setpriv --reuid='user' --regid=\"$(id -g 'user')\" "
            "--init-groups -- 'python3' '-m' 'http.server' '8080'");
  EXPECT_EQ(t.spec.ready_port, 8080);
  t = ok("FROM base\nUSER 1000:100\nCMD [\"x\"]\n");
  EXPECT_EQ(t.spec.start, "cd '/' && exec setpriv --reuid=1000 --regid=100 --clear-groups -- 'x'");
  t = ok("FROM base\nENTRYPOINT [\"/app/run\", \"--flag\"]\nCMD [\"serve\"]\nCMD [\"last\"]\n");
  EXPECT_EQ(t.spec.start, "cd '/' && exec '/app/run' '--flag' 'last'");
  EXPECT_EQ(t.spec.ready_port, 0);
  t = ok("FROM base\nENTRYPOINT exec server --port 1\nCMD [\"ignored\"]\n");
  EXPECT_EQ(t.spec.start, "cd '/' && exec '/bin/sh' '-c' 'exec server --port 1'");
  t = ok("FROM base\nCMD echo $HOME\n");
  EXPECT_EQ(t.spec.start, "cd '/' && exec '/bin/sh' '-c' 'echo $HOME'");
  EXPECT_TRUE(ok("FROM base\nEXPOSE 8080\n").spec.start.empty());
  EXPECT_EQ(refused("FROM base\nCMD\n").code, Code::invalid_argument);
}

TEST(Dockerfile, WhatIsNotServedIsRefusedWithItsLine) {
  Rejection r = refused("FROM scratch\n");
  EXPECT_EQ(r.code, Code::not_implemented);
  EXPECT_NE(r.message.find("line 1 (FROM)"), std::string::npos) << r.message;
  // An image reference is the build's to pull (checked there).
  for (auto image : {"python:3.12", "docker.io/library/debian", "ubuntu@sha256:00"})
    EXPECT_EQ(ok(std::string("FROM ") + image + "\n").spec.from, std::string("docker://") + image);
  EXPECT_EQ(refused("FROM base\nRUN true\nFROM base\n").code, Code::not_implemented);
  EXPECT_EQ(refused("FROM base\nCOPY --from=build /a /b\n").code, Code::not_implemented);
  EXPECT_EQ(refused("FROM base\nADD https://example.com/x /x\n").code, Code::not_implemented);
  EXPECT_EQ(refused("FROM base\nADD x.tar.gz /x/\n", {{"x.tar.gz", "t"}}).code,
            Code::not_implemented);
  EXPECT_EQ(refused("FROM base\nRUN <<EOF\necho hi\nEOF\n").code, Code::not_implemented);
  EXPECT_EQ(refused("FROM base\nRUN --mount=type=cache,target=/x true\n").code,
            Code::not_implemented);
  for (auto k : {"HEALTHCHECK CMD true", "VOLUME /data", "SHELL [\"bash\", \"-c\"]",
                 "ONBUILD RUN x", "STOPSIGNAL SIGTERM", "FOO bar"}) {
    r = refused(std::string("FROM base\n") + k + "\n");
    EXPECT_EQ(r.code, Code::invalid_argument) << k;
    EXPECT_NE(r.message.find("line 2"), std::string::npos) << r.message;
  }
}

TEST(Dockerfile, BadInputIsRefused) {
  auto bad = [](const std::string& text, const std::map<std::string, std::string>& ctx = {}) {
    auto r = template_from_dockerfile(text, ctx, {});
    return !r && r.error().code == Code::invalid_argument;
  };
  EXPECT_TRUE(bad(""));
  EXPECT_TRUE(bad("# only a comment\n"));
  EXPECT_TRUE(bad("RUN true\nFROM base\n"));  // FROM first
  EXPECT_TRUE(bad("FROM --platform=linux/arm64 base\n"));
  EXPECT_TRUE(bad("FROM base\nCOPY missing.txt /x\n"));
  EXPECT_TRUE(bad("FROM base\nCOPY ../secret /x\n", {{"a", "1"}}));
  EXPECT_TRUE(bad("FROM base\nCOPY a\n", {{"a", "1"}}));
  EXPECT_TRUE(bad("FROM base\nWORKDIR /../..\n"));
  EXPECT_TRUE(bad("FROM base\nENV A=\"unclosed\n"));
  EXPECT_TRUE(bad("FROM base\nENV 1A=x\n"));
  EXPECT_TRUE(bad("FROM base\nUSER bad;name\n"));
  EXPECT_TRUE(bad("FROM base\nEXPOSE 70000\n"));
  EXPECT_TRUE(bad("FROM base\nCOPY --chmod=u+x a /a\n", {{"a", "1"}}));
  EXPECT_TRUE(bad("FROM base\n", {{"/etc/passwd", "x"}}));  // (context paths are relative)
  EXPECT_TRUE(bad("FROM base\n", {{"a/../../b", "x"}}));
  EXPECT_TRUE(bad(std::string("FROM base\nRUN a\0b\n", 18)));
  // Words that a variable left empty (found by fuzz_dockerfile: an empty destination was read
  // past its end; an empty FROM named no template).
  EXPECT_TRUE(bad("FROM $NOTHING\n"));
  EXPECT_TRUE(bad("FROM base\nCOPY a $NOTHING\n", {{"a", "1"}}));
  EXPECT_TRUE(bad("FROM base\nCOPY $NOTHING /x\n", {{"a", "1"}}));
  EXPECT_TRUE(bad("FROM base\nCOPY a \"\"\n", {{"a", "1"}}));
  // Limits: the text, the build commands (one per RUN, COPY, WORKDIR), a command's bytes.
  EXPECT_TRUE(bad("FROM base\n" + std::string(70000, '#')));
  std::string many = "FROM base\n";
  for (int i = 0; i < 33; ++i) many += "RUN step" + std::to_string(i) + "\n";
  auto r = template_from_dockerfile(many, {}, {});
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("at most 32"), std::string::npos) << r.error().message;
  EXPECT_TRUE(bad("FROM base\nRUN " + std::string(5000, 'x') + "\n"));
}

}  // namespace
}  // namespace pandastack::actors
