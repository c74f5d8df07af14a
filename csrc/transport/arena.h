// The host arena: one shared-memory segment that every rank of a group on one host
// maps, so that a collective reaches every same-host rank in one step instead of
// 2(N-1) ring steps; in a group across hosts, one a host, for the host phases of the
// hierarchical collectives (algorithms/hierarchical.h).  The idea of DeepSpeed's and vLLM's CPU shared-memory
// collectives, Open MPI's coll/sm and MPICH's release/gather collectives, built here
// on the group's agreed topology, so it serves every group shape it is made for and
// none it is not (Gloo merged such an allreduce once and reverted it: it guessed a
// host's ranks from LOCAL_WORLD_SIZE).
//
// Segment layout (one per group and host, created by the host's first rank, mapped by
// the host's ranks):
//   SegmentHeader  magic, a check of the nonce (mixNonce(nonce)), members, buffer size
//                  (shm_segment.h)
//   ArenaBell x 2  per step parity: the bell (shm_wait.h) the members waiting on a step
//                  of that parity sleep on, and the last step woken
//   members x MemberLines
//                  step   this member's progress (its own cache line; the only word a
//                         waiter polls)
//                  stamps the op signature of the member's last two rounds
//                  proof  mixNonce(nonce + member + 1): the member mapped this segment
//                         knowing the nonce the group's Store carried
//   members x 2 buffers of bufferBytes (page-aligned), one per round parity
//
// Rounds and steps.  A collective runs as rounds; round t uses buffer t % 2 of every
// member.  A round is one or more steps: a member writes what it contributes into its
// own buffer, then *arrives* (its step counter + 1, a release store) and waits until
// every member's step has reached its own (acquire loads); after the wait it may read
// any member's buffer of this round.  Why two buffers suffice: a member writes buffer
// t % 2 in round t only after the first step of round t - 1, and every member arrived
// there only after it had finished reading round t - 2, the last user of that buffer.
// So every round's first step waits for all members, whatever the op.  Step and
// round counters are the same on every member: all run the same ops in the same order
// (c10d's contract), and the choice of the arena is the same everywhere (choice.h).
//
// Each round's first step carries a stamp (the op's sequence number, type, dtype,
// element count, ReduceOp and root) into stamps[t % 2], written before the step is
// published; the others compare it with theirs after the wait, so ranks that call
// different collectives fail with a mismatch instead of mixing unrelated data.
//
// Waits spin for the group's spin (Config::shmSpinMicros), then sleep on the bell of
// their step's parity (ShmWaiter, as the links' waits: at most a look interval at a
// time, so that a broken group is noticed), and keep the op's deadline.  Only the
// arrival that completes a step (the last member to reach it) wakes that step's
// sleepers: an arrival that leaves others still missing wakes no one, so a member
// sleeps once per step, not once per arrival.  A member that does not arrive in time,
// a broken group (a dead peer's sockets, an abort, a failure elsewhere) or a member
// that left the group (its goodbye, or its process ended between ops: Engine::goneFrom)
// ends the wait.
//
// Security.  The segment is created 0600 under an unguessable name (pid and a random
// nonce) with O_EXCL, reserved at once (posix_fallocate: a full /dev/shm fails here,
// not with a SIGBUS later), and unlinked as soon as every member has mapped it; a
// mapper checks the header against the nonce the Store carried and leaves a proof
// that every member checks.  Segments that a crashed job left behind (its creator's
// pid gone, older than a minute, ours) are unlinked when the next arena is made.  A
// group that cannot make its arena (no /dev/shm, too little room, a refusal anywhere)
// runs on its links as before, on every rank alike (an agreement through the Store).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transport/engine.h"
#include "transport/shm_wait.h"
#include "transport/socket.h"
#include "transport/store_exchange.h"
#include "transport/topology.h"

namespace ringpg {

// What a member says about the op it runs, compared at each round's first step.
struct ArenaStamp {
  uint64_t key = 0;   // the op's sequence number
  uint64_t numel = 0; // the op's element count as this rank sees it
  uint64_t round = 0; // the round it was written in
  uint8_t opcode = 0; // c10d::OpType
  uint8_t dtype = 0;  // c10::ScalarType
  uint8_t reduceOp = 0;
  uint8_t pad = 0;
  int32_t root = -1; // a rooted op's root, else -1
};
static_assert(sizeof(ArenaStamp) == 32);

inline bool sameStamp(const ArenaStamp& a, const ArenaStamp& b) {
  return a.key == b.key && a.numel == b.numel && a.round == b.round && a.opcode == b.opcode && a.dtype == b.dtype &&
         a.reduceOp == b.reduceOp && a.root == b.root;
}

// Whether `a` and `b` are the same op (round and root aside).
inline bool sameOp(const ArenaStamp& a, const ArenaStamp& b) {
  return a.key == b.key && a.numel == b.numel && a.opcode == b.opcode && a.dtype == b.dtype && a.reduceOp == b.reduceOp;
}

// How a wait in the arena ended.
enum class ArenaWait : uint8_t {
  Done,     // every member arrived
  TimedOut, // the deadline passed first (`laggard`: a member that had not arrived)
  Broken,   // the group failed (GroupFailure::reason says why)
  Left,     // `laggard` left the group: shut it down, or its process ended (Engine::goneFrom says so)
  Mismatch, // `laggard` runs this op's sequence number as another op (runsOtherOp)
};

class HostArena {
 public:
  struct Segment; // the mapping (defined in arena.cpp)

  // Collective over the group: every rank calls it alike.  Makes the arena of this
  // rank's host's ranks (each host its own; the group of two ranks or more), with
  // buffers of `bufferBytes` (rounded up to whole pages) per member and parity; null,
  // on every rank of every host alike, where it cannot (`wanted` false on some rank,
  // no room in /dev/shm, a refused mapping: `*why` says so on the rank that saw it).
  // `spinMicros`, `spinYields`: as the shared-memory links' (ShmLink::connect).
  static std::unique_ptr<HostArena> connect(GroupStore& store, Engine& engine, const Topology& topo, int rank,
                                            bool wanted, size_t bufferBytes, int spinMicros, bool spinYields,
                                            std::string* why);
  ~HostArena();
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  int members() const { return members_; }
  int me() const { return me_; }
  // The group rank of member m.
  int rankOf(int m) const { return ranks_[m]; }
  size_t bufferBytes() const { return bufferBytes_; }
  size_t segmentBytes() const;

  // Starts the next round; its buffers are buffer(m) until the next beginRound().
  void beginRound() { ++round_; }
  uint64_t round() const { return round_; }
  // Member m's buffer of the current round: its own is written before arrive(), the
  // others' are read after a wait.
  char* buffer(int m) const;
  // Publishes this member's next step: everything it wrote before is visible to a
  // member whose wait sees it.  `stamp` (first step of a round): written first.
  void arrive(const ArenaStamp* stamp = nullptr);
  // Waits until every member has arrived at this member's step, or `deadline`.
  // Mismatch: `*other` is the op member `*laggard` runs.
  ArenaWait awaitAll(Deadline deadline, int* laggard, ArenaStamp* other);
  // Member m's stamp of the current round (read after a wait).
  ArenaStamp stampOf(int m) const;

  // Publishes the op this member runs now (every op, on the links too): a member whose
  // op waits long looks at the others' (runsOtherOp), so ranks that call different
  // collectives fail with a mismatch even where one waits on a link and the other in
  // the arena, which never see each other's frames or stamps.
  void announce(const ArenaStamp& op);
  // A member that announced an op with `mine`'s sequence number but another signature
  // (op, dtype, size, ReduceOp): its index, and that op in `*theirs`; -1 if none.
  int runsOtherOp(const ArenaStamp& mine, ArenaStamp* theirs) const;
  // A wait that sleeps looks at the others' ops about this often (the look interval
  // of every same-host wait).
  static constexpr std::chrono::milliseconds kMismatchLook = ShmWaiter::kLookEvery;

  // Whether this member's mapping is registered with a device runtime, so that device
  // copies reach the buffers directly (algorithms/staged_ring.cpp asks once, on the
  // first staged op, and says so here).  A per-member matter: the rounds are the same
  // either way.
  enum class DevicePin : uint8_t { Unasked, Pinned, Refused };
  DevicePin devicePin() const { return pin_; }
  // `undo` (Pinned): runs before the segment is unmapped.
  void setDevicePin(DevicePin pin, std::function<void()> undo = {});
  // The whole mapping, for the registration (segmentBytes(): its size).
  void* segmentBase() const;

  // How often this member woke the others (FUTEX_WAKE calls) and slept (FUTEX_WAIT
  // calls) since the arena was made: for the tests and benchmarks/wakeups.py.
  struct Counts {
    uint64_t wakes = 0;
    uint64_t sleeps = 0;
  };
  Counts counts() const { return {wakes_.load(std::memory_order_relaxed), waiter_.sleeps()}; }

 private:
  HostArena(Engine& engine, int members, int me, std::vector<int> ranks, int spinMicros, bool spinYields);
  // connect's steps.  createSegment (the host's first rank): creates the segment and
  // returns its name ("-": it could not; `*whyNot` says why) and `*nonce`;
  // mapAnnounced: maps the segment `announced` by rank `creator` ("name nonce"), the
  // creator's own too, and leaves this member's proof; false where it cannot (`*nonce`:
  // the announced one where it can); proofsHold: every member left its proof.
  std::string createSegment(uint64_t* nonce, std::string* whyNot);
  bool mapAnnounced(const std::string& announced, int creator, uint64_t* nonce, std::string* whyNot);
  bool proofsHold(uint64_t nonce, std::string* whyNot) const;
  bool allArrived(uint64_t step, int* from) const;
  // After this member's arrival at `step`: wakes the members sleeping on it if this
  // arrival completed it.
  void ringBell(uint64_t step);

  Engine& engine_;         // who has left the group (goneFrom)
  GroupFailure& failure_;  // the group's failure state (the engine's)
  const int members_;
  const int me_;
  const std::vector<int> ranks_; // member -> group rank
  ShmWaiter waiter_; // awaitAll's spin and sleep, on the bells of the steps
  size_t bufferBytes_ = 0;
  std::unique_ptr<Segment> seg_;
  uint64_t round_ = 0; // rounds begun (round_ % 2: the buffers in use)
  ArenaStamp current_; // the op this member announced last
  uint64_t step_ = 0;  // steps arrived at
  DevicePin pin_ = DevicePin::Unasked;
  std::function<void()> unpin_; // undoes a Pinned registration
  // This member's futex wakes in the arena (counts(); its sleeps: waiter_'s).
  std::atomic<uint64_t> wakes_{0};
};

} // namespace ringpg
