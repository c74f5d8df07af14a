// A named POSIX shared-memory segment, mapped: what the shared-memory links' regions
// (shm.h) and the host arena (arena.h) are made of, and the futex calls their waits
// sleep and wake on.
//
// Made 0600 with O_EXCL under a name its creator chooses (an unguessable one: a pid and
// a random nonce), its bytes reserved at once (posix_fallocate: a full /dev/shm fails
// here, never as a SIGBUS on a later write), and unlinked by its creator as soon as
// every peer has mapped it; a peer maps only a segment of this user's, of exactly the
// size it expects, with no group or other permission bits.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace ringpg {

class SharedSegment {
 public:
  // Creates `name` ("/..."), reserves `bytes` and maps it; null, with `why`, where the
  // system refuses.  `what` says in `why` what the bytes were for (and what sizes them).
  static std::unique_ptr<SharedSegment> create(const std::string& name, size_t bytes, const std::string& what,
                                               std::string& why);
  // Maps an existing segment `name` of exactly `bytes`; null, with `why`, where it is
  // missing, of another size or user, or open to others.
  static std::unique_ptr<SharedSegment> open(const std::string& name, size_t bytes, std::string& why);
  ~SharedSegment(); // unmaps, and unlinks the name if this mapping still holds it
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  // Removes the name (the creator's, once every peer has mapped it); the mappings stay.
  void unlinkName();
  char* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  SharedSegment(std::string name, char* base, size_t bytes, bool named)
      : name_(std::move(name)), base_(base), bytes_(bytes), named_(named) {}
  std::string name_;
  char* base_;
  size_t bytes_;
  bool named_; // this mapping created the name and has not unlinked it yet
};

// The name of a segment of kind `kind` ("" for the links' regions, "arena") that
// process `pid` creates with `nonce`: "/ringpg-[<kind>-]<pid>-<nonce in hex>".
std::string segmentName(const std::string& kind, int pid, uint64_t nonce);
// The pid in the name of a ringpg segment (a /dev/shm entry, without the leading '/'),
// or 0 for any other name.  Pure, for the tests.
int segmentCreatorPid(const std::string& name);
// Unlinks ringpg's segments in `dir` (/dev/shm) whose creator is gone, that belong to
// this user and are older than `minAgeSeconds` (a group may be mapping a younger one);
// returns how many.
int reclaimStaleSegments(const std::string& dir, int minAgeSeconds);

// Sleeps while `*word` == `expected`, at most `timeout`, on a futex shared between
// processes.  Returns on a wake, a change, a signal or the timeout alike: callers look
// again.
void futexWaitShared(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout);
// Wakes every sleeper on `word`.
void futexWakeShared(std::atomic<uint32_t>* word);

} // namespace ringpg
