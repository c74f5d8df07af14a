#include "common/interpreter.h"

#include <atomic>

namespace ringpg {

namespace {
// Set once when the bindings load, read by any thread after.
std::atomic<BlockingRunner> runner{nullptr};
} // namespace

void setBlockingRunner(BlockingRunner r) {
  runner.store(r, std::memory_order_release);
}

void runBlocking(const std::function<void()>& fn) {
  if (const BlockingRunner r = runner.load(std::memory_order_acquire)) {
    r(fn);
  } else {
    fn();
  }
}

} // namespace ringpg
