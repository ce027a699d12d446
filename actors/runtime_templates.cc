// The runtime facade's custom templates (actors/template_builds.h does the work).
#include "actors/image_pull.h"
#include "actors/runtime_impl.h"

namespace pandastack::actors {

Reply<TemplateState> Runtime::build_template(const std::string& tenant, const std::string& name,
                                             const TemplateSpec& spec) {
  return impl_->builds->build(tenant, name, spec);
}

Reply<TemplateState> Runtime::import_template(const std::string& tenant, const std::string& name,
                                              const TemplateSpec& shape,
                                              const ImageUpload& upload) {
  return impl_->builds->import(tenant, name, shape, upload);
}

Reply<TemplateState> Runtime::pull_template(const std::string& tenant, const std::string& name,
                                            const TemplateSpec& shape, const std::string& ref,
                                            const std::string& registry_secret, uint64_t disk_mib,
                                            bool start) {
  auto parsed = parse_image_ref(ref);
  if (!parsed) return parsed.error();
  ImageUpload upload;
  upload.ref = ref;
  upload.disk_mib = disk_mib;
  upload.start = start;
  if (!registry_secret.empty()) {
    auto host = parsed->registry.substr(0, parsed->registry.rfind(':'));
    if (host == "registry-1.docker.io") host = "docker.io";  // (as users name Docker Hub)
    auto value = impl_->secrets->value_for_host(tenant, registry_secret, host);
    if (!value && parsed->registry == "registry-1.docker.io")
      value = impl_->secrets->value_for_host(tenant, registry_secret, parsed->registry);
    if (!value) return value.error();
    auto colon = value->find(':');
    if (colon == std::string::npos) {
      upload.password = *value;  // a registry token
    } else {
      upload.username = value->substr(0, colon);
      upload.password = value->substr(colon + 1);
    }
  }
  return impl_->builds->pull(tenant, name, shape, upload);
}

std::filesystem::path Runtime::template_upload_dir() const { return impl_->builds->upload_dir(); }

Reply<BuildContextInfo> Runtime::put_build_context(const std::string& tenant,
                                                   const std::filesystem::path& upload,
                                                   const std::string& key) {
  return impl_->builds->contexts().put(tenant, upload, key);
}

Reply<BuildContextInfo> Runtime::build_context(const std::string& tenant, const std::string& key) {
  return impl_->builds->contexts().get(tenant, key);
}

std::optional<Rejection> Runtime::delete_build_context(const std::string& tenant,
                                                       const std::string& key) {
  return impl_->builds->contexts().remove(tenant, key);
}

Reply<TemplateState> Runtime::custom_template(const std::string& tenant, const std::string& name) {
  return impl_->builds->get(tenant, name);
}

std::vector<TemplateState> Runtime::custom_templates(const std::string& tenant) {
  return impl_->builds->list(tenant);
}

Reply<TemplateState> Runtime::delete_template(const std::string& tenant, const std::string& name) {
  if (impl_->builds->shipped(name))
    return Rejection{Code::conflict, "'" + name + "' is a shipped template: it cannot be deleted"};
  auto t = impl_->builds->get(tenant, name);
  if (!t) return t;
  auto all = list(tenant);
  if (!all) return all.error();
  size_t in_use = 0;
  for (auto& s : *all)
    if (s.template_name == t->id && s.status != SandboxStatus::stopped &&
        s.status != SandboxStatus::failed)
      ++in_use;
  return impl_->builds->remove(tenant, name, in_use);
}

Reply<TemplateState> Runtime::publish_template(const std::string& tenant, const std::string& id,
                                               const std::string& name) {
  auto info = get(tenant, id);
  if (!info) return info.error();
  if (!info->volumes.empty())
    return Rejection{Code::not_implemented,
                     "publishing a sandbox with volumes as a template is not built: its volumes "
                     "are data of their own (copy what the template needs onto its disk)"};
  // Its guest holds placeholders and trusts a CA of its own: never a template's (secrets are per
  // sandbox and per run).
  if (auto bound = impl_->secrets->binding(id); bound && *bound)
    return Rejection{Code::invalid_argument,
                     "a sandbox with secrets is not published as a template (its processes hold "
                     "the secrets' placeholders): publish one made without secrets"};
  if (auto no = impl_->builds->check_publish(tenant, name)) return *no;
  // A named snapshot (its memory and disk at one instant), copied into the template, then gone.
  auto snap = snapshot(tenant, id);
  if (!snap) return snap.error();
  auto drop = [&] { (void)delete_snapshot(tenant, *snap); };
  auto loaded = vmm::Snapshot::load(impl_->env->snapshot_dir(*snap));
  if (!loaded) {
    drop();
    return Rejection{Code::internal, "the sandbox's snapshot: " + loaded.error().message};
  }
  auto published =
      impl_->builds->publish(tenant, name, id, info->template_name, info->network, *loaded);
  drop();
  return published;
}

std::shared_ptr<BuildProgress> Runtime::template_build(const std::string& tenant,
                                                       const std::string& name) {
  return impl_->builds->progress(tenant, name);
}

}  // namespace pandastack::actors
