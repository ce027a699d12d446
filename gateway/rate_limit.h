// Requests per second per API key: a token bucket per key id (refilled at the key's tenant's
// requests_per_second quota, holding up to twice that). An empty bucket is 429 too_many_requests
// with Retry-After. Shared by REST and RPC; buckets of keys unused for a minute are dropped.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace pandastack::gateway {

class RateLimiter {
 public:
  // Takes one token of `key_id`'s bucket (rate `per_second`); false when it is empty.
  bool take(const std::string& key_id, uint32_t per_second);

 private:
  using Clock = std::chrono::steady_clock;
  struct Bucket {
    double tokens;
    Clock::time_point last;
  };
  std::mutex mu_;
  std::map<std::string, Bucket> buckets_;
  Clock::time_point swept_ = Clock::now();
};

}  // namespace pandastack::gateway
