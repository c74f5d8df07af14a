// A named POSIX shared-memory segment, mapped: what the shared-memory links' regions
// (shm.h) and the host arena (arena.h) are made of.  Their waits sleep on bells in it
// (shm_wait.h).
//
// Made 0600 with O_EXCL under a name its creator chooses (an unguessable one: a pid and
// a random nonce), its bytes reserved at once (posix_fallocate: a full /dev/shm fails
// here, never as a SIGBUS on a later write), and unlinked by its creator as soon as
// every peer has mapped it; a peer maps only a segment of this user's, of exactly the
// size it expects, with no group or other permission bits, and whose first line
// (SegmentHeader) names the kind, layout and shape it expects and checks the nonce its
// creator announced.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/cache_line.h"

namespace ringpg {

// splitmix64's finalizer: what a segment holds of its creator's nonce, and the arena
// members' proofs.  Never the nonce itself: a member that leaves a proof (arena.h) had
// the nonce from the Store, not from the segment.
uint64_t mixNonce(uint64_t x);

// A segment's first line (the kinds' own layouts start on the next; a new segment reads
// as zeros): which kind and layout it is, for whom, of what shape.  Written by the
// creator before it announces the name, checked by every mapper.
struct SegmentHeader {
  uint64_t magic;    // the kind and its layout's version
  uint64_t check;    // mixNonce(the nonce the creator announced)
  uint64_t shape[2]; // the kind's geometry (a link's slots and slot bytes, the arena's members and buffer bytes)

  static SegmentHeader of(uint64_t magic, uint64_t nonce, uint64_t shape0, uint64_t shape1) {
    return SegmentHeader{magic, mixNonce(nonce), {shape0, shape1}};
  }
  bool operator==(const SegmentHeader& o) const {
    return magic == o.magic && check == o.check && shape[0] == o.shape[0] && shape[1] == o.shape[1];
  }
};
static_assert(sizeof(SegmentHeader) <= kCacheLine, "a segment's header is its first line");

class SharedSegment {
 public:
  // Creates `name` ("/..."), reserves `bytes`, maps it and writes `header` at its
  // start; null, with `why`, where the system refuses.  `what` says in `why` what the
  // bytes were for (and what sizes them).
  static std::unique_ptr<SharedSegment> create(const std::string& name, size_t bytes, const SegmentHeader& header,
                                               const std::string& what, std::string& why);
  // Maps an existing segment `name` of exactly `bytes` that starts with `expect`; null,
  // with `why`, where it is missing, of another size or user, open to others, or not
  // the segment its creator announced (another header: `kind` names it in `why`).
  static std::unique_ptr<SharedSegment> open(const std::string& name, size_t bytes, const SegmentHeader& expect,
                                             const std::string& kind, std::string& why);
  ~SharedSegment(); // unmaps, and unlinks the name if this mapping still holds it
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  // Removes the name (the creator's, once every peer has mapped it); the mappings stay.
  void unlinkName();
  char* base() const { return base_; }
  const SegmentHeader& header() const { return *reinterpret_cast<const SegmentHeader*>(base_); }
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

} // namespace ringpg
