// pandastack-rpc-example: a small client of the Cap'n Proto RPC API (wire/pandastack.capnp).
//
//   pandastack-rpc-example [--connect unix:var/rpc.sock | HOST:PORT] [--key KEY] [--template T]
//   [--from-snapshot SNAP] [--fork] [--sandbox ID] -- CMD...
//
// Login, create and exec are sent in one network round trip (promise pipelining): the exec is
// addressed to the sandbox the create will return before that answer exists. With --fork the
// command runs in a fork of the new sandbox instead (create, forkOne and exec in the same flight).
// With --sandbox the command runs in an existing sandbox (get instead of create; it is kept);
// with --from-snapshot in a new sandbox made from that named snapshot.
// Prints the command's output, kills the sandboxes it made and exits with the command's exit code.
#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "wire/pandastack.capnp.h"

namespace api = pandastack::wire::api;

int main(int argc, char** argv) {
  std::string connect = "unix:var/rpc.sock", key, template_name = "base", existing, snapshot;
  if (const char* k = std::getenv("PANDASTACK_API_KEY")) key = k;
  std::vector<std::string> cmd;
  bool fork = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--connect" && i + 1 < argc)
      connect = argv[++i];
    else if (a == "--key" && i + 1 < argc)
      key = argv[++i];
    else if (a == "--template" && i + 1 < argc)
      template_name = argv[++i];
    else if (a == "--sandbox" && i + 1 < argc)
      existing = argv[++i];
    else if (a == "--from-snapshot" && i + 1 < argc)
      snapshot = argv[++i];
    else if (a == "--fork")
      fork = true;
    else if (a == "--") {
      for (++i; i < argc; ++i) cmd.push_back(argv[i]);
    } else {
      std::fprintf(stderr,
                   "usage: pandastack-rpc-example [--connect ADDR] [--key KEY] [--template T] "
                   "[--from-snapshot SNAP] [--fork] [--sandbox ID] -- CMD...\n");
      return 2;
    }
  }
  if (cmd.empty()) cmd = {"uname", "-a"};
  auto io = kj::setupAsyncIo();
  auto& ws = io.waitScope;
  auto stream = io.provider->getNetwork().parseAddress(connect).wait(ws)->connect().wait(ws);
  capnp::TwoPartyClient client(*stream);
  auto login = client.bootstrap().castAs<api::Login>();

  auto t0 = std::chrono::steady_clock::now();
  auto l = login.loginRequest();
  l.setApiKey(key);
  auto platform = l.send().getPlatform();  // pipelined
  api::Sandbox::Client parent = nullptr;
  kj::Promise<kj::String> id = nullptr;
  if (existing.empty()) {
    auto c = platform.createRequest();
    if (snapshot.empty())
      c.initRequest().setTemplate(template_name);
    else
      c.initRequest().setFromSnapshot(snapshot);
    auto created = c.send();
    parent = created.getSandbox();  // pipelined
    id = created.then([](auto r) { return kj::str(r.getInfo().getId()); });
  } else {
    auto g = platform.getRequest();
    g.setId(existing);
    auto got = g.send();
    parent = got.getSandbox();
    id = got.then([](auto r) { return kj::str(r.getInfo().getId()); });
  }
  auto sandbox = parent;
  if (fork) sandbox = parent.forkOneRequest().send().getSandbox();  // pipelined too
  auto e = sandbox.execRequest();
  auto argv_list = e.initRequest().initArgv(cmd.size());
  for (size_t i = 0; i < cmd.size(); ++i) argv_list.set(i, cmd[i]);
  int code = 1;
  try {
    auto response = e.send().wait(ws);  // (it owns what r reads)
    auto r = response.getResult();
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    auto out = r.getStdout(), err = r.getStderr();
    std::fwrite(out.begin(), 1, out.size(), stdout);
    std::fwrite(err.begin(), 1, err.size(), stderr);
    auto sid = id.wait(ws);
    std::fprintf(stderr, "[%s: exit %d; login + %s + %sexec in one round trip: %.1f ms]\n",
                 sid.cStr(), r.getExitCode(), existing.empty() ? "create" : "get",
                 fork ? "fork + " : "", ms);
    code = r.getExitCode();
    if (fork) sandbox.killRequest().send().wait(ws);
    if (existing.empty()) parent.killRequest().send().wait(ws);
  } catch (const kj::Exception& ex) {
    std::fprintf(stderr, "pandastack-rpc-example: %s\n", ex.getDescription().cStr());
    return 1;
  }
  return code;
}
