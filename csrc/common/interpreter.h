// Blocking work on a thread that may hold Python's interpreter lock (the GIL).  A
// group's teardown joins its worker, whose Python callbacks (a Future's, a hook) need
// that lock; a child group's creation blocks in its rendezvous.  ringpg's C++ knows
// nothing of Python: the bindings install, once, how to release the lock around such
// work (bindings/module.cpp); without them the work runs as it is.
#pragma once

#include <functional>

namespace ringpg {

using BlockingRunner = void (*)(const std::function<void()>& fn);
void setBlockingRunner(BlockingRunner runner);

// Runs `fn`, outside the interpreter's lock where the caller held it.
void runBlocking(const std::function<void()>& fn);

} // namespace ringpg
