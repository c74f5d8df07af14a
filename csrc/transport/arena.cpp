#include "transport/arena.h"

#include <unistd.h>

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <c10/util/StringUtil.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "common/cache_line.h"
#include "common/host.h"
#include "transport/rendezvous.h"
#include "transport/shm_segment.h"
#include "transport/store_exchange.h"

namespace ringpg {
namespace {

// "RGPGARN3": an arena starting with a SegmentHeader, its bells the links' kind.
constexpr uint64_t kArenaMagic = 0x334e524147504752ULL;
constexpr size_t kPage = 4096;

// A wait sleeps for one step: a member whose step s the others have not all reached
// sleeps on the bell of s's parity, and only an arrival that completes s (one that
// finds every member at s or past it) wakes its sleepers, who all wait for that very
// thing.  Two bells, by parity, because a member woken from step s may arrive at s + 1
// and sleep again before the waker of s has made its wake call: that call, on s's
// bell, must not end a sleep on s + 1.  It cannot reach a sleeper of s + 2 either,
// which exists only once the waker of s has arrived at s + 1, after its call.
//   bell      the futex word and its sleepers (shm_wait.h): bumped once per woken step
//   woken     the last step whose sleepers were woken: two arrivals that each find
//             the step complete (both look after both stores) wake it once
struct ArenaBell {
  Bell bell;
  std::atomic<uint64_t> woken;
};
// A sleeper waits for one thing, its step to be complete.
constexpr BellCauses kStepComplete = kBellCauseA;

// One member's lines: the step on a line of its own (waiters poll it), the stamps
// and the proof on others (written once a round / once).
struct MemberLines {
  alignas(kCacheLine) std::atomic<uint64_t> step;
  alignas(kCacheLine) ArenaStamp stamps[2];
  alignas(kCacheLine) uint64_t proof;
  // The CPU the member last waited on, which a spinning waiter compares with its own
  // (HostArena::awaitAll).
  CpuHint cpu;
  // The op the member runs now (HostArena::announce), under a sequence lock: `opSeq`
  // is odd while `op` is being written.
  alignas(kCacheLine) std::atomic<uint32_t> opSeq;
  ArenaStamp op;
};

static_assert(std::atomic<uint64_t>::is_always_lock_free, "counters must be plain memory shared between processes");
static_assert(2 * sizeof(ArenaBell) <= kCacheLine && sizeof(MemberLines) == 4 * kCacheLine);

constexpr size_t kBellOffset = kCacheLine; // after the SegmentHeader
constexpr size_t kMembersOffset = 2 * kCacheLine;

size_t roundUp(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

size_t buffersOffset(int members) {
  return roundUp(kMembersOffset + members * sizeof(MemberLines), kPage);
}

size_t segmentSize(int members, size_t bufferBytes) {
  return buffersOffset(members) + static_cast<size_t>(members) * 2 * bufferBytes;
}

} // namespace

// The mapping (a SharedSegment); the creator also holds the name until it is unlinked.
struct HostArena::Segment {
  explicit Segment(std::unique_ptr<SharedSegment> mapped) : seg(std::move(mapped)), base(seg->base()) {}
  std::unique_ptr<SharedSegment> seg;
  char* base; // seg->base()

  void unlinkName() { seg->unlinkName(); }
  // The bell of the steps of `step`'s parity.
  ArenaBell& bell(uint64_t step) const { return reinterpret_cast<ArenaBell*>(base + kBellOffset)[step % 2]; }
  MemberLines& member(int m) const { return reinterpret_cast<MemberLines*>(base + kMembersOffset)[m]; }

  static SegmentHeader headerOf(uint64_t nonce, int members, size_t bufferBytes) {
    return SegmentHeader::of(kArenaMagic, nonce, static_cast<uint64_t>(members), bufferBytes);
  }
  // A new segment reads as zeros past its header: every step 0, the bells quiet (no
  // step woken: steps start at 1), no proof.
  static std::unique_ptr<Segment> create(const std::string& name, uint64_t nonce, int members, size_t bufferBytes,
                                         std::string& why) {
    auto seg = SharedSegment::create(
        name, segmentSize(members, bufferBytes), headerOf(nonce, members, bufferBytes),
        c10::str("the host arena (", members, " ranks x 2 x ", bufferBytes, " bytes: RINGPG_ARENA_BYTES)"), why);
    if (!seg) {
      return nullptr;
    }
    auto s = std::make_unique<Segment>(std::move(seg));
    for (const auto m : c10::irange(members)) {
      s->member(m).cpu.cpu.store(-1, std::memory_order_relaxed); // no wait yet
    }
    return s;
  }
  // Maps the arena its creator announced, checking that it is.
  static std::unique_ptr<Segment> open(const std::string& name, uint64_t nonce, int members, size_t bufferBytes,
                                       std::string& why) {
    auto seg = SharedSegment::open(name, segmentSize(members, bufferBytes), headerOf(nonce, members, bufferBytes),
                                   "host arena", why);
    return seg ? std::make_unique<Segment>(std::move(seg)) : nullptr;
  }
};

HostArena::HostArena(Engine& engine, int members, int me, std::vector<int> ranks, int spinMicros, bool spinYields)
    : engine_(engine), failure_(engine.failure()), members_(members), me_(me), ranks_(std::move(ranks)),
      waiter_(spinMicros, spinYields) {}

HostArena::~HostArena() {
  if (unpin_) {
    unpin_(); // while the mapping still exists
  }
}

void HostArena::setDevicePin(DevicePin pin, std::function<void()> undo) {
  pin_ = pin;
  unpin_ = std::move(undo);
}

void* HostArena::segmentBase() const {
  return seg_->base;
}

size_t HostArena::segmentBytes() const {
  return seg_->seg->bytes();
}

std::unique_ptr<HostArena> HostArena::connect(GroupStore& store, Engine& engine, const Topology& topo, int rank,
                                              bool wanted, size_t bufferBytes, int spinMicros, bool spinYields,
                                              std::string* why) {
  const int size = topo.size();
  // Facts every rank shares (the topology; the buffer size is an agreed setting), so
  // either every rank takes part in the agreement below or none does.
  if (size < 2 || bufferBytes == 0) {
    return nullptr;
  }
  // This rank's host's ranks: one arena a host, every group rank in one agreement.
  const std::vector<int>& ranks = topo.ranksOfHost(topo.hostOf(rank));
  const int members = static_cast<int>(ranks.size());
  std::unique_ptr<HostArena> self(new HostArena(engine, members, topo.localIndex(rank), ranks, spinMicros, spinYields));
  // Whole pages, and at least a line per member (a reduce-scatter piece has a block
  // of at least one element per member).
  self->bufferBytes_ = roundUp(std::max(bufferBytes, members * kCacheLine), kPage);
  std::string whyNot = wanted ? "" : "not wanted on this rank (RINGPG_TRANSPORT)";

  // 1. The host's first rank creates the segment and announces its name and nonce;
  //    the others read it.
  uint64_t nonce = 0;
  std::string announced;
  if (self->me_ == 0) {
    const std::string name = wanted ? self->createSegment(&nonce, &whyNot) : "-";
    announced = c10::str(name, " ", nonce);
    store.publish("arena/name", rank, announced);
  } else {
    announced = store.read("arena/name", ranks[0]);
  }
  // 2. The others map it, and every member proves it knew the nonce.
  const bool ok = wanted && self->mapAnnounced(announced, ranks[0], &nonce, &whyNot);
  // 3. Every rank says whether it managed, and the arena is used only if all did (rank
  //    0 decides).
  bool all = store.decide("arena/verdict", rank, size, ok ? "1" : "0", [](const std::vector<std::string>& said) {
    return std::all_of(said.begin(), said.end(), [](const std::string& v) { return v == "1"; }) ? "1" : "0";
  }) == "1";
  // Every member has mapped it or given up: the name goes (a crash from now on leaks
  // nothing in /dev/shm), and the proofs, written before the verdicts, are checked
  // alike on every member (the same memory).
  if (self->seg_) {
    self->seg_->unlinkName();
  }
  all = all && self->proofsHold(nonce, &whyNot);
  if (!all) {
    if (why) {
      *why = whyNot.empty() ? std::string("another rank could not map it") : whyNot;
    }
    return nullptr;
  }
  return self;
}

std::string HostArena::createSegment(uint64_t* nonce, std::string* whyNot) {
  // Segments a crashed job left behind go first (their creator is gone; older than a
  // minute, so no group is still mapping them).
  if (const int n = reclaimStaleSegments("/dev/shm", 60); n > 0) {
    LOG(INFO) << "ringpg: unlinked " << n << " shared-memory segment(s) left by processes that are gone";
  }
  *nonce = randomNonce();
  const std::string name = segmentName("arena", ::getpid(), *nonce);
  seg_ = Segment::create(name, *nonce, members_, bufferBytes_, *whyNot);
  return seg_ ? name : "-";
}

bool HostArena::mapAnnounced(const std::string& announced, int creator, uint64_t* nonce, std::string* whyNot) {
  std::istringstream in(announced);
  std::string name;
  uint64_t theirNonce = 0;
  in >> name >> theirNonce;
  if (name == "-") {
    if (whyNot->empty()) {
      *whyNot = c10::str("rank ", creator, " could not create it");
    }
    return false;
  }
  if (me_ != 0) {
    seg_ = Segment::open(name, theirNonce, members_, bufferBytes_, *whyNot);
    if (!seg_) {
      return false;
    }
  }
  *nonce = theirNonce;
  seg_->member(me_).proof = mixNonce(*nonce + me_ + 1);
  return true;
}

bool HostArena::proofsHold(uint64_t nonce, std::string* whyNot) const {
  for (const auto m : c10::irange(members_)) {
    if (seg_->member(m).proof != mixNonce(nonce + m + 1)) {
      *whyNot = c10::str("member ", m, " of the host arena left no proof that it is the group's");
      return false;
    }
  }
  return true;
}

char* HostArena::buffer(int m) const {
  return seg_->base + buffersOffset(members_) + (static_cast<size_t>(m) * 2 + round_ % 2) * bufferBytes_;
}

ArenaStamp HostArena::stampOf(int m) const {
  ArenaStamp s;
  // Copied out once: a peer's memory is read, never trusted in place.
  std::memcpy(&s, &seg_->member(m).stamps[round_ % 2], sizeof(s));
  return s;
}

void HostArena::announce(const ArenaStamp& op) {
  current_ = op;
  MemberLines& mine = seg_->member(me_);
  // A sequence lock: a reader that sees the same even count before and after its copy
  // read a whole stamp.
  const uint32_t seq = mine.opSeq.load(std::memory_order_relaxed);
  mine.opSeq.store(seq + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  std::memcpy(&mine.op, &op, sizeof(op));
  mine.opSeq.store(seq + 2, std::memory_order_release);
}

int HostArena::runsOtherOp(const ArenaStamp& mine, ArenaStamp* theirs) const {
  for (const auto m : c10::irange(members_)) {
    const MemberLines& line = seg_->member(m);
    const uint32_t before = line.opSeq.load(std::memory_order_acquire);
    if (m == me_ || before % 2 != 0) {
      continue; // being written: it is moving on, not stuck
    }
    ArenaStamp op;
    std::memcpy(&op, &line.op, sizeof(op));
    std::atomic_thread_fence(std::memory_order_acquire);
    if (line.opSeq.load(std::memory_order_relaxed) != before) {
      continue;
    }
    if (op.key == mine.key && !sameOp(op, mine)) {
      *theirs = op;
      return m;
    }
  }
  return -1;
}

void HostArena::arrive(const ArenaStamp* stamp) {
  MemberLines& mine = seg_->member(me_);
  if (stamp) {
    ArenaStamp s = *stamp;
    s.round = round_;
    mine.stamps[round_ % 2] = s;
  }
  // Release: the buffer's bytes and the stamp are visible to whoever sees this step.
  mine.step.store(++step_, std::memory_order_release);
  ringBell(step_);
}

void HostArena::ringBell(uint64_t step) {
  // awaited()'s fence pairs with a sleeper's (ShmWaiter::wait), after it counted itself
  // in: either its last look sees our step, or we see it counted.  And with the other
  // arrivals' at `step`: of all the fences after the stores of `step`, the last one's
  // thread sees every member there; so if a sleeper missed a member, the arrival whose
  // fence comes last sees both the sleeper and every step, and wakes it.
  ArenaBell& bell = seg_->bell(step);
  if (!bell.bell.awaited(kStepComplete)) {
    return; // no one sleeps on `step`: the one fence is all an arrival costs
  }
  int from = 0;
  if (!allArrived(step, &from)) {
    return; // a member still missing will complete the step, and wake the sleepers
  }
  // Relaxed: only which of the completing arrivals wakes is decided here; an exchange
  // for an older step of this parity happened before any arrival at `step`.
  if (bell.woken.exchange(step, std::memory_order_relaxed) == step) {
    return; // another arrival found it complete too and woke them
  }
  bell.bell.wake();
  wakes_.fetch_add(1, std::memory_order_relaxed);
}

bool HostArena::allArrived(uint64_t step, int* from) const {
  // Members before *from were seen at `step` already (steps only grow).
  while (*from < members_ && seg_->member(*from).step.load(std::memory_order_acquire) >= step) {
    ++*from;
  }
  return *from == members_;
}

ArenaWait HostArena::awaitAll(Deadline deadline, int* laggard, ArenaStamp* other) {
  int from = 0;
  if (allArrived(step_, &from)) {
    return ArenaWait::Done; // the common case once the others are ahead: no clock read
  }
  ArenaWait end = ArenaWait::Done;
  const auto look = [&]() -> WaitLook {
    if (allArrived(step_, &from)) {
      return WaitLook::Done;
    }
    *laggard = from;
    if (failure_.failed()) {
      end = ArenaWait::Broken;
      return WaitLook::Done;
    }
    // A member that left the group (its goodbye, or its process ended) arrives nowhere
    // again.  An arrival it published before it left is in the segment still, and may
    // have landed after the look above: the arrivals are looked at once more.
    if (engine_.anyGone() && !engine_.goneFrom(ranks_[from]).empty()) {
      if (allArrived(step_, &from)) {
        return WaitLook::Done;
      }
      *laggard = from;
      if (!engine_.goneFrom(ranks_[from]).empty()) {
        end = ArenaWait::Left;
        return WaitLook::Done;
      }
    }
    return WaitLook::Idle;
  };
  // A member that runs this op's sequence number as another op would never arrive here
  // (it may be waiting on a link for us), and rings no bell: looked for once a look
  // interval.
  const auto otherOp = [&] {
    const int m = runsOtherOp(current_, other);
    if (m >= 0) {
      *laggard = m;
      end = ArenaWait::Mismatch;
    }
    return m >= 0;
  };
  // As the links' waits: the member we wait for may be queued behind us on this CPU.
  const auto peerOn = [&](int cpu) -> const CpuHint* {
    const CpuHint& hint = seg_->member(from).cpu;
    return hint.on(cpu) ? &hint : nullptr;
  };
  const auto causes = [] { return kStepComplete; };
  if (!waiter_.wait(seg_->bell(step_).bell, seg_->member(me_).cpu, deadline,
                    WaitCalls{look, otherOp, peerOn, causes})) {
    return ArenaWait::TimedOut;
  }
  return end;
}

} // namespace ringpg
