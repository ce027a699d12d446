#include "actors/template_actor.h"

namespace pandastack::actors {

caf::behavior template_actor(caf::event_based_actor* self, Env* env, std::string name) {
  log_exceptions(self, "template " + name);
  return {
      [=](bake_atom) -> Answer {
        auto t = env->template_snapshot(name);
        if (!t)
          return Answer::fail({Code::start_failed, "template " + name + ": " + t.error().message});
        Answer a;
        a.text = t->dir.string();
        return a;
      },
  };
}

}  // namespace pandastack::actors
