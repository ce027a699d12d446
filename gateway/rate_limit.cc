#include "gateway/rate_limit.h"

#include <algorithm>

namespace pandastack::gateway {

bool RateLimiter::take(const std::string& key_id, uint32_t per_second) {
  auto now = Clock::now();
  double burst = 2.0 * per_second;
  std::lock_guard l(mu_);
  if (now - swept_ > std::chrono::minutes(1)) {
    std::erase_if(buckets_, [&](auto& kv) { return now - kv.second.last > std::chrono::minutes(1); });
    swept_ = now;
  }
  auto [it, fresh] = buckets_.try_emplace(key_id, Bucket{burst, now});
  auto& b = it->second;
  if (!fresh) {
    double elapsed = std::chrono::duration<double>(now - b.last).count();
    b.tokens = std::min(burst, b.tokens + elapsed * per_second);
    b.last = now;
  }
  if (b.tokens < 1.0) return false;
  b.tokens -= 1.0;
  return true;
}

}  // namespace pandastack::gateway
