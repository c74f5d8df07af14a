// A group's failure state (group_failure.h).
#include "transport/group_failure.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace ringpg {

void GroupFailure::fail(const std::string& reason, bool network, BreakCause cause) {
  if (record(reason, network, cause)) {
    notify();
  }
}

bool GroupFailure::record(const std::string& reason, bool network, BreakCause cause) {
  TORCH_INTERNAL_ASSERT(!reason.empty(), "ringpg: a group failure needs a reason");
  std::lock_guard<std::mutex> lk(mu_); // reason_, network_, cause_
  if (!reason_.empty()) {
    return false;
  }
  reason_ = reason;
  network_ = network;
  cause_ = cause;
  failed_.store(true, std::memory_order_release);
  return true;
}

void GroupFailure::notify() {
  std::vector<std::pair<int, Listener>> listeners;
  {
    std::lock_guard<std::mutex> lk(mu_); // listeners_: copied, so that they run unlocked
    listeners = listeners_;
  }
  for (auto& entry : listeners) {
    entry.second();
  }
}

std::string GroupFailure::reason(bool* network, BreakCause* cause) const {
  std::lock_guard<std::mutex> lk(mu_); // reason_, network_, cause_
  if (network) {
    *network = network_;
  }
  if (cause) {
    *cause = cause_;
  }
  return reason_;
}

int GroupFailure::listen(Listener fn) {
  std::lock_guard<std::mutex> lk(mu_); // listeners_
  listeners_.emplace_back(nextToken_, std::move(fn));
  return nextToken_++;
}

void GroupFailure::unlisten(int token) {
  std::lock_guard<std::mutex> lk(mu_); // listeners_
  listeners_.erase(
      std::remove_if(listeners_.begin(), listeners_.end(), [token](const auto& entry) { return entry.first == token; }),
      listeners_.end());
}

} // namespace ringpg
