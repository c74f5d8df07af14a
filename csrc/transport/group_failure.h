// A group's failure state: whether the group has failed, why (the first reason wins),
// whether the cause was a peer or connection, and which BreakCause c10d's getError()
// reports.  One object per group (GroupLinks owns it), shared by everything that moves
// or waits: the TCP engine, the shared-memory links, the host arena, Gloo's pairs, the
// in-process links and the op context all ask it in their waits (`failed()`: one load)
// and report to it (`fail`).
//
// What must act on a failure listens: the engine (tell every peer, fail every queued
// request, wake its waiters), the backend (abort hooks, getError), the Gloo link's
// waits.  Listeners run once, after the first failure is recorded, on the thread that
// recorded it and outside every lock of this class.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace ringpg {

// Why a group failed, as far as c10d's ErrorType tells causes apart (RingBackend::getError).
// The first cause wins, like the first reason.
enum class BreakCause : uint8_t {
  Local,   // this rank found it: a lost or corrupt connection, a mismatch, an op that threw
  Timeout, // an op of this rank passed its deadline
  Remote,  // another rank's group failed first and said why (its Abort frame)
  Aborted, // abort() on this rank
};

class GroupFailure {
 public:
  using Listener = std::function<void()>;

  GroupFailure() = default;
  GroupFailure(const GroupFailure&) = delete;
  GroupFailure& operator=(const GroupFailure&) = delete;

  // Records the failure (first reason wins) and, if this call was the first, runs every
  // listener before it returns.  `network`: a peer or connection failure, as opposed to
  // a mismatch or a timeout.  Call with no lock held that a listener takes (the engine's).
  void fail(const std::string& reason, bool network = false, BreakCause cause = BreakCause::Local);
  // The first half of fail(): records, runs nothing; true if this call was the first, and
  // then the caller owes one notify() once it holds no lock a listener takes (the engine
  // records with its own lock held).
  bool record(const std::string& reason, bool network, BreakCause cause);
  void notify();

  // The question every wait asks; no lock.
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // Empty while healthy; `network` and `cause` as recorded (meaningless while healthy).
  std::string reason(bool* network = nullptr, BreakCause* cause = nullptr) const;

  // Adds a listener; returns its token for unlisten().  A listener added after the
  // failure is not run: the caller asks failed() after adding it.
  int listen(Listener fn);
  // Removes a listener.  The caller makes sure no notify() is running it (the engine
  // unlistens after its thread has stopped).
  void unlisten(int token);

 private:
  // mu_ guards every field but failed_.  Never held while a listener runs.
  mutable std::mutex mu_;
  std::string reason_;
  bool network_ = true;
  BreakCause cause_ = BreakCause::Local;
  std::atomic<bool> failed_{false}; // reason_ is set (once, under mu_)
  std::vector<std::pair<int, Listener>> listeners_;
  int nextToken_ = 0;
};

} // namespace ringpg
