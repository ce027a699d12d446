// An image pulled by reference from a registry (issue 37): `POST /v1/templates {name, image:
// "python:3.12-slim"}`. The host speaks the registry's HTTP API (the OCI distribution spec,
// which Docker Hub, GHCR, ECR, Quay and docker-registry serve) for the image's manifest (an
// index: its linux/amd64 manifest), config and layers, checks every blob against its digest and
// size as it arrives, and writes them, as opaque bytes, into an OCI image layout tar: the same
// archive an upload is (actors/image_import.h), imported the same way, in a builder microVM.
// The host never unpacks, decompresses or parses a layer.
//
// Authentication: anonymous, or a tenant's secret (`registry_secret`) whose value is
// "user:password" (or a token: "user" empty) and whose `hosts` name the registry (a secret is
// never sent to a host it does not name); Docker's token flow (401 with `WWW-Authenticate:
// Bearer realm=...`, a token from the realm, the request again) and Basic. https:// with the
// system's CAs; plain http:// only to a loopback registry (127.0.0.1, ::1, localhost) or one
// the host's operator named (--insecure-registry).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "actors/runtime.h"

namespace pandastack::actors {

// A reference as Docker reads one: [REGISTRY/]REPOSITORY[:TAG][@DIGEST]. No registry: Docker
// Hub (registry-1.docker.io, "library/" before a one-part name); no tag: latest.
struct ImageRef {
  std::string registry;    // host[:port]
  std::string repository;  // e.g. library/python
  std::string reference;   // a tag, or a digest (sha256:...)
  std::string text() const;
};
// invalid_argument (what a reference is) for anything else; at most 512 bytes.
Reply<ImageRef> parse_image_ref(const std::string& text);

// A `WWW-Authenticate` challenge: its scheme (lower-cased) and parameters.
struct AuthChallenge {
  std::string scheme;
  std::map<std::string, std::string> params;
};
std::optional<AuthChallenge> parse_auth_challenge(const std::string& header);

struct PullJob {
  ImageRef ref;
  std::string username, password;     // "" = anonymous
  std::vector<std::string> insecure;  // registries reached over plain http (host[:port])
  std::filesystem::path out;          // the OCI image layout tar written
  uint64_t max_bytes = 0;             // the blobs together at most (the upload limit)
  std::filesystem::path ca_file = "/etc/ssl/certs/ca-certificates.crt";
  std::chrono::steady_clock::time_point deadline;
  std::stop_token stop;
  std::function<void(const std::string&)> log;
};

struct PulledImage {
  std::string digest;  // the manifest's (sha256:...)
  uint64_t bytes = 0;  // the archive's
  size_t layers = 0;
};

// Pulls `job.ref` into `job.out`. build_failed with the reason (not found, unauthorized, a
// digest that does not match, over max_bytes, the registry unreachable), timeout, unavailable
// (stopped); `job.out` is removed on a failure.
Reply<PulledImage> pull_image(const PullJob& job);

}  // namespace pandastack::actors
