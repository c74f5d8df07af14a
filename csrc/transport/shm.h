// Same-host links (ShmLink: this rank's links to its left and right neighbours on its
// host, one Link serving both): around the ranks a group has on each host (its
// host ring, Topology::hostLeft/hostRight: on one host, the group's ring), each link
// (rank r -> the host's next rank) is a single-producer single-consumer ring of
// slots in shared memory instead of a TCP socket.  One copy into a slot, one copy
// (or reduction) out of it, no kernel in between: the same idea as NCCL's SHM
// transport.  TCP stays in place for everything else (point-to-point frames, the
// direct algorithms' other peers, goodbyes and abort notices), so a dead or failing
// peer is still noticed through its sockets and the engine's broken state.
//
// Region layout (one mapped shared-memory area per rank, created by it, mapped by it
// and both neighbours):
//   SegmentHeader   magic, a check of the creator's nonce, slot geometry (shm_segment.h)
//   RegionBell      the bell the *creator* sleeps on (shm_wait.h), which its neighbours
//                   ring for a slot it waits for, and the CPU it last waited on
//   LinkHeader      head (slots published by the creator) / tail (slots released by
//                   the right neighbour), each on its own cache line
//   slots[kSlots]   SlotHeader + slotBytes of payload each
// so rank r sends into its own region and receives from its left neighbour's.  (A
// *region* is this mapped area; a *segment* is the ring's pipeline slice of a chunk,
// algorithms/ring_plan.h, which travels through the slots as one or more fragments.)
//
// Single copy (cross-memory attach).  Where every rank of the group may read its
// left neighbour's memory (process_vm_readv: same user, and Yama's ptrace_scope or
// a container's missing CAP_SYS_PTRACE not in the way — probed at connect, agreed by
// all), a message of at least RINGPG_CMA_BYTES travels as a descriptor in one slot
// (the sender's address; no payload) and the receiver copies it straight from the
// sender's buffer into its own: one copy instead of two.  The sender's request stays
// pending until the receiver has released that slot, so the buffer outlives the read.
// A receive that reduces takes a descriptor in pieces of kPieceBytes, each reduced
// while it is in cache (readLeftInto).  Most sends to a reducing receive, and an
// allreduce's smaller gather segments, still go through the slots (postSendCopied),
// which measured faster at 2 ranks; a two-rank ring's large reduce steps are lent
// (algorithms/ring.cpp).  Where the probe fails anywhere, every link keeps the slots.
// Whether single copy pays depends on the host, and on whether the op's buffers are in
// the caches (docs/internals.md, "Single copy or the slots"): process_vm_readv pins the
// peer's pages and copies once, the slots copy twice at memcpy's speed.  So where
// RINGPG_CMA_BYTES is left unset the group measures both at creation (probeCopies:
// each way around the host rings, lent and copied, a segment with its buffers warm and
// a streaming op's step with them evicted from the caches) and keeps single copy for
// each size class of op (SameHostCopy, link.h) only where it was clearly the faster.
// When the group breaks (a timeout, a dead peer, abort) a lent send fails at once and
// its buffer goes back to the caller while the receiver may be reading it; the
// receiver's group is breaking too, and its op fails once the news arrives (the
// abort frame: milliseconds).  Only a receive that completes the receiver's last step
// inside that window could hand on bytes the caller changed meanwhile: a known limit
// of single copy (the slots hold a copy made before the break).
//
// Both directions are driven by the thread that waits (the one thread that runs the
// group's current op): a send that finds no free slot stays queued and is pushed on
// by every later wait, so a ring whose ranks all send before they receive cannot
// deadlock on slot space.  Messages larger than a slot travel as several fragments.
// What arrives is checked against the receive the local plan posted (op, sequence
// number, dtype, sizes, fragment offset) before a byte is written to a user buffer.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"
#include "transport/engine.h"
#include "transport/link.h"
#include "transport/request.h"
#include "transport/shm_wait.h"
#include "transport/socket.h"
#include "transport/store_exchange.h"
#include "transport/topology.h"
#include "transport/wire.h"

namespace ringpg {

// How a group's same-host links are set up (ShmLink::connect).
struct ShmOptions {
  Config::Transport setting = Config::Transport::Auto; // RINGPG_TRANSPORT on this rank
  size_t slotBytes = 0; // payload bytes of a slot (rounded up to whole cache lines)
  // How long a waiter polls before it sleeps on its futex; whether a spinning wait
  // yields its core between looks (this host's ranks outnumber its CPUs, and
  // RINGPG_TUNING spin_us asked for a spin anyway) instead of pausing on it.
  int spinMicros = 0;
  bool spinYields = false;
  // The smallest message sent as a descriptor (RINGPG_CMA_BYTES; 0: this rank never
  // does, and the group does not probe for it).
  size_t cmaBytes = 0;
  // This rank leaves single copy to a measurement (RINGPG_CMA_BYTES unset); the group
  // measures where every rank does, and else takes single copy wherever the kernel
  // allows it.
  bool measureCopy = false;
  // Ops from this many bytes lend, smaller ones copy (Config::cmaOpBytes); negative: as measured.
  int64_t cmaOpBytes = -1;
  // Whether this rank's setting lets it use shared memory at all.
  bool wanted() const { return setting == Config::Transport::Auto || setting == Config::Transport::Shm; }
};

struct ShmVerdict; // what a rank managed of its set-up (shm.cpp)

class ShmLink final : public Link {
 public:
  struct Region; // one mapped region (defined in shm.cpp)

  // Collective over the group: shared memory on every link of each host's ring
  // (`topo`: who shares a host), in named steps: each rank with a same-host neighbour
  // creates its region (its bell, and the slots of its link to the right) and
  // publishes where it is (publishRegion), maps its neighbours' regions and probes
  // single copy (mapNeighbours), says what it managed; the links are used only if every
  // rank succeeded (all ranks then agree, so both ends of every link use the same
  // transport; else giveUp), and `*used` says so on every rank; single copy stays
  // where every rank may use it and, if asked, it measured faster
  // (chooseCopyByMeasuring).  Returns this rank's links, or null: no rank shares a
  // host, setting Tcp on some rank, shared memory unavailable, or this rank alone on
  // its host.  Setting Shm raises instead of falling back.  `engine`: the group's
  // failure state, which outlives the links.
  static std::unique_ptr<ShmLink> connect(GroupStore& store, Engine& engine, const Topology& topo, int rank,
                                          const ShmOptions& options, Deadline deadline, bool* used);
  ~ShmLink() override;
  ShmLink(const ShmLink&) = delete;
  ShmLink& operator=(const ShmLink&) = delete;

  int left() const { return left_; }
  int right() const { return right_; }
  // Whether the link to the right neighbour / from the left one (on the host's ring)
  // is shared memory.
  bool sendsRight() const { return sendsRight_; }
  bool receivesLeft() const { return receivesLeft_; }
  // Which ops' large messages go by single copy (cross-memory attach) on this group's
  // links, by size class: the same on every rank.
  SameHostCopy copyPlan() const { return copy_; }
  // Messages this rank has lent to its right neighbour (single copy) so far.
  uint64_t lentMessages() const { return lentMessages_.load(std::memory_order_relaxed); }
  // What the group measured at creation to choose between single copy and the slots,
  // the same on every rank: microseconds summed over the ranks with a shared-memory
  // link, each rank's best of kProbeRounds exchanges each way: of `bytes` (a segment)
  // with the buffers in the caches (as an op's below kStreamingOpBytes mostly are), and
  // of `coldBytes` (what a two-rank op of kStreamingOpBytes sends a step) evicted from
  // them before each exchange (cold: as an op's from there on are).
  struct CopyProbe {
    bool measured = false; // false: no measurement (RINGPG_CMA_BYTES set, or single copy refused)
    size_t bytes = 0;
    size_t coldBytes = 0;
    double lentMicros = 0;       // single copy
    double copiedMicros = 0;     // through the slots
    double coldLentMicros = 0;   // single copy, cold
    double coldCopiedMicros = 0; // through the slots, cold
  };
  const CopyProbe& copyProbe() const { return copyProbe_; }

  const char* transport() const override { return "shm"; }
  // Collective frames to the right neighbour / from the left one (the only peers a
  // LinkTable routes here), matched in order.
  RequestPtr postSend(int peer, const FrameHeader& hdr, const void* data, size_t len) override;
  RequestPtr postRecv(int peer, const FrameHeader& expect, void* data, size_t len) override;
  RequestPtr postSendCopied(int peer, const FrameHeader& hdr, const void* data, size_t len) override;
  // A receive whose fragments are handed to `consume` straight from shared memory
  // (recvReduce without a staging copy).
  bool fusesReceive(int peer) const override { return peer == left_ && receivesLeft(); }
  RequestPtr postRecvInto(int peer, const FrameHeader& expect, size_t len, FragmentConsumer consume) override;

  // Drives both directions until `req` is no longer pending (true) or `deadline`
  // passes (false).  When the engine is broken, every queued request fails with its
  // reason.  Only the thread running the group's current op calls this.
  bool waitUntil(const RequestPtr& req, Deadline deadline) override;
  // Only the waiting thread moves shared memory, so a wait on another link of the
  // group drives this one meanwhile (LinkTable::waitUntil).
  bool hasQueued() const override { return !sends_.empty() || !recvs_.empty() || !lent_.empty(); }
  bool progress() override;

 private:
  struct Recv {
    RequestPtr req;
    FragmentConsumer consume; // null: copy into req->buf
  };

  // A send whose descriptor went out in slot `slot`: its buffer is lent to the right
  // neighbour until that slot is released.
  struct Lent {
    RequestPtr req;
    uint64_t slot;
  };

  ShmLink(Engine& engine, int rank, int left, int right, size_t slotBytes, int spinMicros, bool spinYields);
  RequestPtr post(int peer, const FrameHeader& hdr, const void* data, size_t len, bool lendable);
  bool pushSends();
  bool pullRecvs();
  // Completes lent sends whose slots the right neighbour has released.
  bool reapLent();
  // Copies `n` bytes at `remote` in the left neighbour's memory to `dst`; false (and
  // `*why`) when the kernel refuses or the peer is gone.
  bool readLeft(char* dst, uint64_t remote, size_t n, std::string* why);
  // A lent message to a receive that reduces: `n` bytes at `remote` read in pieces of
  // kPieceBytes into pieces_, each handed to `consume` (at `offset` + its place) while
  // it is still in cache, so the peer's bytes are read once and never stored here whole.
  bool readLeftInto(const FragmentConsumer& consume, uint64_t remote, size_t offset, size_t n, std::string* why);
  static constexpr size_t kPieceBytes = 256 * 1024;
  // This rank's best times (microseconds) to send `bytes` to the right neighbour while
  // receiving as many from the left one, as a ring step does, lent and then copied:
  // collective over the group's shared-memory ranks (all of them run it at once, after
  // the agreement).  {lent, copied}; throws if a neighbour fails to take part.
  // The best of kProbeRounds exchanges of `bytes` each way (single copy, the slots),
  // microseconds, after `warmUps` rounds that are not timed; `cold`: with both buffers
  // evicted from the caches before each.  Its frames' keys are `firstKey` and the
  // 4 * (warmUps + kProbeRounds) - 1 after it.
  std::pair<double, double> probeCopies(size_t bytes, bool cold, int warmUps, uint64_t firstKey, Deadline deadline);
  // connect's steps.  publishRegion: creates our region (where we have a same-host
  // neighbour; `*createWhy` says why it could not), publishes where it is and reads
  // where its same-host neighbours' are; mapNeighbours: maps the neighbours' regions and probes that we may read
  // the left's memory; giveUp: where some rank could not (raises under setting Shm);
  // chooseCopyByMeasuring: keeps single copy only where it measured faster.
  struct NeighbourRegions { // the neighbours' region addresses ("" where not shared)
    std::string left, right;
  };
  NeighbourRegions publishRegion(GroupStore& store, const ShmOptions& opt, std::string* createWhy);
  ShmVerdict mapNeighbours(const NeighbourRegions& regions, const ShmOptions& opt, const std::string& createWhy);
  static void giveUp(GroupStore& store, int rank, int size, const ShmOptions& opt, const std::string& why,
                     Deadline deadline);
  void chooseCopyByMeasuring(GroupStore& store, int size, Deadline deadline);
  static constexpr int kProbeRounds = 3;
  // Rounds each way the warm class runs untimed before its kProbeRounds: the first
  // exchanges over fresh buffers and slot pages pay for their first use (page tables,
  // pins, a VM's first touch of a page), which an op that sends its buffers again does
  // not, and single copy pays more of it, so timed from the start the probe kept the
  // slots where the ops ran faster by single copy (docs/internals.md, "Single copy or
  // the slots").
  static constexpr int kProbeWarmUpRounds = 3;
  void failAll(const std::string& reason, bool network);
  // Why each neighbour has left the group (Engine::goneFrom; "" while it is present),
  // asked before a look at the slots: what it wrote before it left is there.
  struct Departures {
    std::string left, right;
  };
  Departures neighboursGone();
  // Fails every pending request if a neighbour they need had left (`gone`, asked before
  // the last look at the slots, so that nothing it wrote is still unread).
  bool failIfNeighbourLeft(const Departures& gone);
  void finish(const RequestPtr& req);
  // The hint of a same-host neighbour that last waited on `cpu`, the one this thread runs
  // on (null if none): then it is queued behind us (or asleep), and a spin that pauses
  // keeps it from running.
  const CpuHint* neighbourOn(int cpu);
  // What a sleep in waitUntil waits for (a slot filled for a posted receive, or one
  // released for a queued send or a lent buffer): a neighbour's other movements ring
  // no bell for it.
  BellCauses awaited() const;
  // The right neighbour's region, whose bell we ring: the left one's when they are
  // the same rank (world size 2).
  Region& toRight();

  Engine& engine_;         // who has left the group (goneFrom)
  GroupFailure& failure_;  // the group's failure state (the engine's)
  const int rank_;
  const int left_, right_;
  const size_t slotBytes_;
  ShmWaiter waiter_; // waitUntil's spin and sleep, on our region's bell
  std::unique_ptr<Region> own_;   // we send into it; our bell is in it
  std::unique_ptr<Region> fromLeft_;  // we receive from it and ring the left's bell
  std::unique_ptr<Region> fromRight_; // mapped for its bell only; null when right == left
  bool sendsRight_ = false;   // the right neighbour shares this host: own_'s slots carry to it
  bool receivesLeft_ = false; // the left one does: fromLeft_'s slots carry from it
  size_t cmaBytes_ = 0;  // single copy from this size on (0: never; agreed at connect)
  SameHostCopy copy_;    // which ops lend (copyPlan); none where cmaBytes_ is 0
  std::atomic<uint64_t> lentMessages_{0}; // written by the waiting thread, read by any
  CopyProbe copyProbe_;
  int leftPid_ = 0;      // the left neighbour's process, which readLeft() reads
  // Our link's tail as last read: the slots the right neighbour had released then.  A
  // push reads the shared `tail` (a line the neighbour writes) only when this count
  // says the slots are full, not on every fragment.
  uint64_t releasedSeen_ = 0;
  std::deque<RequestPtr> sends_;
  std::deque<Recv> recvs_;
  std::deque<Lent> lent_; // in slot order
  std::vector<char> pieces_; // readLeftInto's piece, allocated on first use
};

} // namespace ringpg
