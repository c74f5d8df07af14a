#include "transport/shm.h"

#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <c10/util/StringUtil.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "common/cache_line.h"
#include "common/host.h"
#include "reduce/reduce.h"
#include "transport/rendezvous.h"
#include "transport/shm_segment.h"
#include "transport/store_exchange.h"

namespace ringpg {
namespace {

// "RGPGSHM2": a region starting with a SegmentHeader, its bell shared with the arena's.
constexpr uint64_t kRegionMagic = 0x324d485347504752ULL;
constexpr uint64_t kSlots = 8;

// The creator's bell, which its neighbours ring (ShmLink::waitUntil sleeps on it), and
// where the creator last waited, which a neighbour's spin reads (ShmLink::neighbourOn).
// A sleeping creator waits for a slot its left neighbour filled (kArrived: a receive
// is posted) or for one of its own that its right neighbour released (kReleased: a
// send waits for room, or a lent buffer to be read).
struct RegionBell {
  Bell bell;
  CpuHint cpu;
};
constexpr BellCauses kArrived = kBellCauseA;
constexpr BellCauses kReleased = kBellCauseB;

struct LinkHeader {
  alignas(kCacheLine) std::atomic<uint64_t> head; // slots published by the sender (the creator)
  alignas(kCacheLine) std::atomic<uint64_t> tail; // slots released by the receiver
};

struct SlotHeader {
  FrameHeader frame; // the whole message's header (nbytes = message length)
  uint64_t offset;   // where this fragment starts in the message
  uint64_t length;   // bytes of this fragment
  uint64_t remote;   // 0: the fragment follows in the slot; else its address in the sender
};

static_assert(std::atomic<uint64_t>::is_always_lock_free, "counters must be plain memory shared between processes");
static_assert(sizeof(RegionBell) <= kCacheLine && sizeof(SlotHeader) <= kCacheLine);

constexpr size_t kBellOffset = kCacheLine; // after the SegmentHeader
constexpr size_t kLinkOffset = 2 * kCacheLine;
constexpr size_t kSlotsOffset = kLinkOffset + sizeof(LinkHeader);

size_t slotStride(size_t slotBytes) {
  return kCacheLine + slotBytes; // SlotHeader padded to a line, then the payload
}

size_t regionBytes(size_t slotBytes) {
  return kSlotsOffset + kSlots * slotStride(slotBytes);
}

// Yama's ptrace_scope 1 lets a process read another's memory only if it is an ancestor
// or was named by prctl(PR_SET_PTRACER); a rank's readers are its right neighbours in
// every group it joins, more than the one pid PR_SET_PTRACER takes, so it admits any
// process of its user, as Open MPI does.  Scopes 2 and 3 need CAP_SYS_PTRACE: the
// probe finds out.  Only called when single copy is wanted (RINGPG_CMA_BYTES > 0).
void admitSameUserReaders() {
  std::ifstream in("/proc/sys/kernel/yama/ptrace_scope");
  int scope = 0;
  if (in >> scope && scope == 1) {
    ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  }
}

} // namespace

// One mapping of a region (a SharedSegment); the creator also holds its name until
// it is unlinked.
struct ShmLink::Region {
  explicit Region(std::unique_ptr<SharedSegment> mapped) : seg(std::move(mapped)), base(seg->base()) {
    // Its pages mapped now: a first touch of each costs microseconds on some hosts (VMs),
    // which would fall on the copy probe's timed exchanges and on the first ops.  A
    // kernel without MADV_POPULATE_WRITE refuses, and the pages fault in on first touch.
#ifdef MADV_POPULATE_WRITE
    ::madvise(base, seg->bytes(), MADV_POPULATE_WRITE);
#endif
  }
  std::unique_ptr<SharedSegment> seg;
  char* base; // seg->base()

  void unlinkName() { seg->unlinkName(); }
  RegionBell& bell() { return *reinterpret_cast<RegionBell*>(base + kBellOffset); }
  LinkHeader& link() { return *reinterpret_cast<LinkHeader*>(base + kLinkOffset); }
  char* slot(uint64_t i, size_t slotBytes) { return base + kSlotsOffset + (i % kSlots) * slotStride(slotBytes); }

  static SegmentHeader headerOf(uint64_t nonce, size_t slotBytes) {
    return SegmentHeader::of(kRegionMagic, nonce, kSlots, slotBytes);
  }
  // Creates and maps a fresh region (head = tail = 0, the bell quiet); null when the
  // system refuses (no /dev/shm, or not enough room for it).
  static std::unique_ptr<Region> create(const std::string& name, uint64_t nonce, size_t slotBytes, std::string& why) {
    auto seg = SharedSegment::create(name, regionBytes(slotBytes), headerOf(nonce, slotBytes),
                                     "a shared-memory link (RINGPG_TUNING segment_bytes)", why);
    if (!seg) {
      return nullptr;
    }
    auto r = std::make_unique<Region>(std::move(seg));
    r->bell().cpu.cpu.store(-1, std::memory_order_relaxed); // no wait yet
    return r;
  }
  // Maps a neighbour's region, checking that it is the one it announced.
  static std::unique_ptr<Region> open(const std::string& name, uint64_t nonce, size_t slotBytes, std::string& why) {
    auto seg = SharedSegment::open(name, regionBytes(slotBytes), headerOf(nonce, slotBytes), "region", why);
    return seg ? std::make_unique<Region>(std::move(seg)) : nullptr;
  }
};

ShmLink::ShmLink(Engine& engine, int rank, int left, int right, size_t slotBytes, int spinMicros, bool spinYields)
    : engine_(engine), failure_(engine.failure()), rank_(rank), left_(left), right_(right), slotBytes_(slotBytes),
      waiter_(spinMicros, spinYields) {}

ShmLink::~ShmLink() = default;

ShmLink::Region& ShmLink::toRight() {
  return fromRight_ ? *fromRight_ : *fromLeft_;
}

// This rank's say in the agreement, as "<links usable><single copy usable><measure it>".
struct ShmVerdict {
  bool ok = false;    // its links are set up (or it needs none)
  bool cmaOk = false; // it may read its left neighbour's memory
  std::string why;    // why not, where !ok
  std::string cmaWhy; // why not, where single copy was wanted and !cmaOk
};

namespace {

// Where a same-host neighbour's region is: its name and nonce, and its pid and the
// region's address in that process (for single copy's probe).
struct RegionAddress {
  std::string name; // "-": none
  uint64_t nonce = 0;
  int pid = 0;
  uint64_t base = 0;
};

RegionAddress parseRegionAddress(const std::string& text) {
  std::istringstream in(text);
  RegionAddress r;
  in >> r.name >> r.nonce >> r.pid >> r.base;
  return r;
}

} // namespace

std::unique_ptr<ShmLink> ShmLink::connect(GroupStore& store, Engine& engine, const Topology& topo, int rank,
                                          const ShmOptions& opt, Deadline deadline, bool* used) {
  *used = false;
  const int size = topo.size();
  // No two ranks share a host: every rank knows it from the same topology, so none
  // takes part in the agreement below.
  if (size < 2 || !topo.anyHostShared()) {
    return nullptr;
  }
  // Every rank takes part even when it will not use shared memory itself, so the
  // others learn that and nobody waits for it: the decision must be the same on all.
  // The links run around each host's ranks (Topology::hostLeft/hostRight): every hop
  // of the group's ring within a host, and the host ring's closing hop (its last rank
  // to its first), which the hierarchical collectives' host rings take.
  const size_t slotBytes = (opt.slotBytes + kCacheLine - 1) / kCacheLine * kCacheLine;
  std::unique_ptr<ShmLink> self(
      new ShmLink(engine, rank, topo.hostLeft(rank), topo.hostRight(rank), slotBytes, opt.spinMicros, opt.spinYields));
  std::string createWhy;
  const NeighbourRegions regions = self->publishRegion(store, opt, &createWhy);
  const ShmVerdict verdict = self->mapNeighbours(regions, opt, createWhy);

  // Three yes-or-no digits a rank; rank 0 decides the group's: each digit is 1 where
  // every rank's is.
  const std::string agreed = store.decide("shm/verdict", rank, size,
                                          c10::str(verdict.ok ? 1 : 0, verdict.cmaOk ? 1 : 0, opt.measureCopy ? 1 : 0),
                                          [](const std::vector<std::string>& said) {
                                            std::string all = "111";
                                            for (const auto& v : said) {
                                              for (size_t d = 0; d < all.size(); ++d) {
                                                all[d] = d < v.size() && v[d] == '1' ? all[d] : '0';
                                              }
                                            }
                                            return all;
                                          });
  const auto allSay = [&](size_t digit) { return digit < agreed.size() && agreed[digit] == '1'; };
  const bool cmaWanted = opt.wanted() && opt.cmaBytes > 0;
  if (cmaWanted && !allSay(1) && !verdict.cmaWhy.empty()) {
    LOG(INFO) << "ringpg: rank " << rank << " cannot read rank " << self->left_
              << "'s memory (cross-memory attach): " << verdict.cmaWhy << "; the group keeps two copies per byte";
  }
  // Every neighbour has mapped our region (or given up): the name is no longer
  // needed, and unlinking it now means a crash later leaks nothing in /dev/shm.
  if (self->own_) {
    self->own_->unlinkName();
  }
  if (!allSay(0)) {
    giveUp(store, rank, size, opt, verdict.why, deadline);
    return nullptr;
  }
  *used = true;
  self->sendsRight_ = self->right_ != rank;
  self->receivesLeft_ = self->left_ != rank;
  self->cmaBytes_ = allSay(1) ? opt.cmaBytes : 0;
  self->copy_ = SameHostCopy{self->cmaBytes_ > 0, self->cmaBytes_ > 0};
  if (self->cmaBytes_ > 0 && allSay(2)) {
    self->chooseCopyByMeasuring(store, size, deadline);
  } else if (self->cmaBytes_ > 0 && opt.cmaOpBytes >= 0) {
    // This rank's sends from the size it asked (no rank measured: it said so above).
    self->copy_ = SameHostCopy{false, true, static_cast<size_t>(opt.cmaOpBytes)};
  }
  // A rank alone on its host has no shared-memory link.
  return self->sendsRight_ || self->receivesLeft_ ? std::move(self) : nullptr;
}

ShmLink::NeighbourRegions ShmLink::publishRegion(GroupStore& store, const ShmOptions& opt, std::string* createWhy) {
  const uint64_t nonce = randomNonce();
  const std::string name = segmentName("", ::getpid(), nonce);
  // Our region holds our bell (the futex this rank sleeps on, which a same-host
  // neighbour rings) and the slots of the link to the right (used when it is shared).
  if (opt.wanted() && (left_ != rank_ || right_ != rank_)) {
    own_ = Region::create(name, nonce, slotBytes_, *createWhy);
    if (own_ && opt.cmaBytes > 0) {
      admitSameUserReaders();
    }
  }
  // Name and nonce of our region, and where it sits in this process (pid and address:
  // the right neighbour probes single copy by reading its header from here).
  store.publish("shm/region", rank_,
                c10::str(own_ ? name : std::string("-"), " ", nonce, " ", ::getpid(), " ",
                         reinterpret_cast<uintptr_t>(own_ ? own_->base : nullptr)));
  // Only the neighbours' (one round trip): a rank maps no other region.
  std::vector<int> shared;
  for (const int q : {left_, right_}) {
    if (q != rank_) {
      shared.push_back(q);
    }
  }
  NeighbourRegions out;
  if (!shared.empty()) {
    const std::vector<std::string> read = store.readMany("shm/region", shared);
    out.left = left_ != rank_ ? read.front() : "";
    out.right = right_ != rank_ ? read.back() : "";
  }
  return out;
}

ShmVerdict ShmLink::mapNeighbours(const NeighbourRegions& regions, const ShmOptions& opt,
                                  const std::string& createWhy) {
  ShmVerdict v;
  if (!opt.wanted()) {
    // RINGPG_TRANSPORT=tcp on this rank keeps the whole group on TCP.
    v.why = c10::str("RINGPG_TRANSPORT=", Config::transportName(opt.setting));
    return v;
  }
  // A rank with no same-host neighbour has nothing to set up; one that has them must
  // map them all.
  const bool leftShared = left_ != rank_;
  const bool rightShared = right_ != rank_;
  v.ok = !(leftShared || rightShared) || own_ != nullptr;
  v.cmaOk = opt.cmaBytes > 0;
  if (!v.ok) {
    v.why = createWhy;
  }
  const auto mapPeer = [&](int q, const RegionAddress& at) -> std::unique_ptr<Region> {
    if (at.name == "-") {
      v.why = c10::str("rank ", q, " has no shared-memory region");
      return nullptr;
    }
    return Region::open(at.name, at.nonce, slotBytes_, v.why);
  };
  if (v.ok && leftShared) {
    const RegionAddress at = parseRegionAddress(regions.left);
    fromLeft_ = mapPeer(left_, at);
    leftPid_ = at.pid;
    v.ok = fromLeft_ != nullptr;
    // Single copy: this rank reads from its left neighbour, so it probes that it may,
    // by reading the left's region header out of the left's own address space.
    if (v.ok && v.cmaOk) {
      SegmentHeader probe{};
      v.cmaOk = readLeft(reinterpret_cast<char*>(&probe), at.base, sizeof(probe), &v.cmaWhy) &&
                probe == fromLeft_->seg->header();
      if (!v.cmaOk && v.cmaWhy.empty()) {
        v.cmaWhy = "the probe read the wrong bytes";
      }
    }
  }
  if (v.ok && rightShared && right_ != left_) {
    fromRight_ = mapPeer(right_, parseRegionAddress(regions.right));
    v.ok = fromRight_ != nullptr;
  }
  return v;
}

void ShmLink::giveUp(GroupStore& store, int rank, int size, const ShmOptions& opt, const std::string& why,
                     Deadline deadline) {
  if (opt.setting == Config::Transport::Shm) {
    // Every rank raises, so the store's host may soon be gone: leave together.
    store.leaveTogether("shm/read", size, deadline);
  }
  TORCH_CHECK(opt.setting != Config::Transport::Shm, "ringpg: RINGPG_TRANSPORT=shm, but rank ", rank,
              " cannot use shared memory with its same-host ring neighbours",
              why.empty() ? std::string(" (another rank could not set it up)") : c10::str(": ", why));
  if (rank == 0 && opt.wanted()) {
    LOG(INFO) << "ringpg: shared-memory links not used"
              << (why.empty() ? std::string(" (another rank could not set them up)") : c10::str(": ", why));
  }
}

namespace {
// One wait of the probe's: within the waits' default spin (Config::kAutoShmSpinMicros).
constexpr std::chrono::microseconds kProbeLook{50};

// The cold probe's message: what a two-rank op of kStreamingOpBytes, the streaming
// class's smallest, sends a step; at least a segment.  Several segments, as that
// class's messages are: one alone times neither the slots' turn-taking nor the second
// copy's memory traffic, where single copy wins.
size_t coldProbeBytes(size_t slotBytes) {
  return std::max(slotBytes, kStreamingOpBytes / 2);
}
} // namespace

void ShmLink::chooseCopyByMeasuring(GroupStore& store, int size, Deadline deadline) {
  // Single copy only where it measured faster than the slots (shm.h), for each size
  // class of op on its own: each rank with a link times a segment each way warm, and a
  // streaming op's step cold (the host rings' links all run at once, as in a ring step);
  // rank 0 sums every rank's figures and every rank reads the same sums, so all choose
  // alike.  Keys no op reaches (an op's key is its sequence number, counted from 1), so
  // no probe frame is taken for an op's.
  constexpr uint64_t kWarmKeys = 4 * (kProbeWarmUpRounds + kProbeRounds); // probeCopies: 4 a round
  constexpr uint64_t kLastKeys = ~uint64_t{0} - kWarmKeys - 4 * kProbeRounds;
  const size_t coldBytes = coldProbeBytes(slotBytes_);
  std::pair<double, double> warm{0.0, 0.0};
  std::pair<double, double> cold{0.0, 0.0};
  if (receivesLeft_) {
    warm = probeCopies(slotBytes_, /*cold=*/false, kProbeWarmUpRounds, kLastKeys, deadline);
    // Cold: no warm-up rounds.  Every round evicts its buffers first, and each takes
    // milliseconds, which warm-up rounds would add to every creation.
    cold = probeCopies(coldBytes, /*cold=*/true, /*warmUps=*/0, kLastKeys + kWarmKeys, deadline);
  }
  const std::string sums =
      store.decide("shm/copy", rank_, size, c10::str(warm.first, " ", warm.second, " ", cold.first, " ", cold.second),
                   [](const std::vector<std::string>& times) {
                     std::array<double, 4> sum{};
                     for (const std::string& t : times) {
                       std::istringstream in(t);
                       for (double& x : sum) {
                         double v = 0.0;
                         in >> v;
                         x += v;
                       }
                     }
                     return c10::str(sum[0], " ", sum[1], " ", sum[2], " ", sum[3]);
                   });
  CopyProbe& p = copyProbe_;
  p.measured = true;
  p.bytes = slotBytes_;
  p.coldBytes = coldBytes;
  std::istringstream in(sums);
  in >> p.lentMicros >> p.copiedMicros >> p.coldLentMicros >> p.coldCopiedMicros;
  // Single copy must win clearly (kSingleCopyClearWin, common/thresholds.h).
  copy_.cached = p.lentMicros < kSingleCopyClearWin * p.copiedMicros;
  copy_.streaming = p.coldLentMicros < kSingleCopyClearWin * p.coldCopiedMicros;
  if (!copy_.any()) {
    cmaBytes_ = 0; // the receivers then refuse a descriptor as corrupt
  }
}

RequestPtr ShmLink::postSend(int peer, const FrameHeader& hdr, const void* data, size_t len) {
  return post(peer, hdr, data, len, /*lendable=*/true);
}

RequestPtr ShmLink::postSendCopied(int peer, const FrameHeader& hdr, const void* data, size_t len) {
  // Measured at 2 ranks: a reducing receive that reads the peer's pages by single copy
  // and reduces them from its stage is slower than one that reduces straight out of a
  // slot the sender filled on its own core; a receive that only copies is faster by
  // single copy, but for an allreduce's smaller gather segments (algorithms/ring.cpp;
  // docs/internals.md, "Why these constants").
  return post(peer, hdr, data, len, /*lendable=*/false);
}

RequestPtr ShmLink::post(int peer, const FrameHeader& hdr, const void* data, size_t len, bool lendable) {
  TORCH_INTERNAL_ASSERT(peer == right_ && sendsRight(),
                        "ringpg: the shared-memory ring sends to a same-host right neighbour only");
  RequestPtr req = makeRequest(hdr, data, len, right_);
  req->hdr.magic = kFrameMagic;
  req->link = this;
  req->lendable = lendable;
  // As the engine refuses a send to a peer that left: it reads nothing more.
  if (std::string why = engine_.goneFrom(right_); !why.empty()) {
    markFailed(*req, why, /*network=*/true);
    return req;
  }
  sends_.push_back(req);
  pushSends(); // eager: the first fragments leave now if there is room
  return req;
}

RequestPtr ShmLink::postRecv(int peer, const FrameHeader& expect, void* data, size_t len) {
  TORCH_INTERNAL_ASSERT(peer == left_ && receivesLeft(),
                        "ringpg: the shared-memory ring receives from a same-host left neighbour only");
  RequestPtr req = makeRequest(expect, data, len, left_);
  req->sourceRank = left_;
  req->link = this;
  recvs_.push_back(Recv{req, nullptr});
  return req;
}

RequestPtr ShmLink::postRecvInto(int peer, const FrameHeader& expect, size_t len, FragmentConsumer consume) {
  RequestPtr req = postRecv(peer, expect, nullptr, len);
  recvs_.back().consume = std::move(consume);
  return req;
}

void ShmLink::finish(const RequestPtr& req) {
  req->state.store(Request::State::Done, std::memory_order_release);
}

bool ShmLink::pushSends() {
  if (sends_.empty()) {
    return false; // also where the right neighbour is on another host (no slots to fill)
  }
  bool moved = false;
  LinkHeader& L = own_->link();
  while (!sends_.empty()) {
    const RequestPtr& req = sends_.front();
    const uint64_t head = L.head.load(std::memory_order_relaxed); // only this thread writes it
    // Acquire: the receiver is done reading the slot it released before we overwrite it.
    if (head - releasedSeen_ >= kSlots) {
      releasedSeen_ = L.tail.load(std::memory_order_acquire);
      if (head - releasedSeen_ >= kSlots) {
        break;
      }
    }
    char* slot = own_->slot(head, slotBytes_);
    auto* sh = reinterpret_cast<SlotHeader*>(slot);
    sh->frame = req->hdr;
    sh->offset = req->progress;
    // Single copy: the whole (unsent) message as a descriptor; the receiver reads it
    // from req->buf, which stays lent until it releases this slot (reapLent).
    const bool lend = cmaBytes_ > 0 && req->lendable && req->progress == 0 && req->len >= cmaBytes_;
    const size_t n = lend ? req->len : std::min(slotBytes_, req->len - req->progress);
    sh->length = n;
    sh->remote = lend ? reinterpret_cast<uintptr_t>(req->buf) : 0;
    if (!lend) {
      std::memcpy(slot + kCacheLine, req->buf + req->progress, n);
    }
    // Release: header and payload are visible before the slot is.
    L.head.store(head + 1, std::memory_order_release);
    toRight().bell().bell.ring(kArrived);
    req->progress += n;
    moved = true;
    // One fragment per pass, so a message of 0 bytes still sends its one (empty) fragment.
    if (req->progress == req->len) {
      if (lend) {
        lent_.push_back(Lent{req, head});
        lentMessages_.fetch_add(1, std::memory_order_relaxed);
      } else {
        finish(req);
      }
      sends_.pop_front();
    }
  }
  return moved;
}

bool ShmLink::pullRecvs() {
  if (recvs_.empty()) {
    return false; // also where the left neighbour is on another host (no region mapped)
  }
  bool moved = false;
  LinkHeader& L = fromLeft_->link();
  while (!recvs_.empty()) {
    const uint64_t tail = L.tail.load(std::memory_order_relaxed); // only this thread writes it
    if (L.head.load(std::memory_order_acquire) == tail) {
      break;
    }
    Recv& r = recvs_.front();
    Request& req = *r.req;
    const char* slot = fromLeft_->slot(tail, slotBytes_);
    // Copy the header out once: the peer's memory is read, never trusted.
    SlotHeader sh;
    std::memcpy(&sh, slot, sizeof(sh));
    // A descriptor (single copy) carries the rest of the message, a fragment a slot's worth.
    const bool lent = sh.remote != 0;
    const size_t want = lent ? req.len - req.progress : std::min(slotBytes_, req.len - req.progress);
    const bool ofThisReceive = sameCollective(req.hdr, sh.frame);
    // A descriptor needs single copy agreed (a reducing receive takes it in pieces).
    if (!ofThisReceive || sh.frame.kind != req.hdr.kind || sh.offset != req.progress || sh.length != want ||
        (lent && cmaBytes_ == 0)) {
      std::string msg =
          ofThisReceive
              ? c10::str("ringpg: rank ", rank_, " received a corrupt shared-memory fragment from rank ", left_,
                         " (offset ", sh.offset, ", length ", sh.length, "; expected ", req.progress, ", ", want, ")")
              : collectiveMismatch(rank_, left_, req.hdr, sh.frame);
      failure_.fail(msg, /*network=*/false);
      failAll(msg, false);
      return true;
    }
    if (lent) {
      // Straight from the sender's buffer into ours.
      std::string why;
      const bool read = r.consume ? readLeftInto(r.consume, sh.remote, req.progress, want, &why)
                                  : readLeft(req.buf + req.progress, sh.remote, want, &why);
      if (!read) {
        const std::string msg =
            c10::str("ringpg: rank ", rank_, " could not read rank ", left_, "'s message (cross-memory attach): ", why);
        failure_.fail(msg, /*network=*/true);
        failAll(msg, true);
        return true;
      }
    } else if (r.consume) {
      r.consume(slot + kCacheLine, req.progress, want);
    } else {
      copyMaybeStreaming(req.buf + req.progress, slot + kCacheLine, want, req.streaming);
    }
    // Release: we are done reading the slot before the sender may reuse it.
    L.tail.store(tail + 1, std::memory_order_release);
    fromLeft_->bell().bell.ring(kReleased);
    req.progress += want;
    moved = true;
    if (req.progress == req.len) {
      finish(r.req);
      recvs_.pop_front();
    }
  }
  return moved;
}

bool ShmLink::reapLent() {
  bool moved = false;
  if (lent_.empty()) {
    return false;
  }
  // Acquire: the receiver's read of the lent buffer happened before it released the slot.
  const uint64_t tail = own_->link().tail.load(std::memory_order_acquire);
  while (!lent_.empty() && lent_.front().slot < tail) {
    finish(lent_.front().req);
    lent_.pop_front();
    moved = true;
  }
  return moved;
}

bool ShmLink::readLeft(char* dst, uint64_t remote, size_t n, std::string* why) {
  // process_vm_readv moves at most what it can and says how much: go on from there.
  size_t done = 0;
  while (done < n) {
    iovec local{dst + done, n - done};
    iovec peer{reinterpret_cast<void*>(remote + done), n - done};
    const ssize_t got = ::process_vm_readv(leftPid_, &local, 1, &peer, 1, 0);
    if (got <= 0) {
      if (got < 0 && errno == EINTR) {
        continue;
      }
      *why =
          got < 0 ? c10::str("process_vm_readv: ", std::strerror(errno)) : std::string("process_vm_readv read nothing");
      return false;
    }
    done += static_cast<size_t>(got);
  }
  return true;
}

bool ShmLink::readLeftInto(const FragmentConsumer& consume, uint64_t remote, size_t offset, size_t n,
                           std::string* why) {
  if (pieces_.empty()) {
    pieces_.resize(kPieceBytes);
  }
  for (size_t done = 0; done < n;) {
    const size_t k = std::min(kPieceBytes, n - done);
    if (!readLeft(pieces_.data(), remote + done, k, why)) {
      return false;
    }
    consume(pieces_.data(), offset + done, k);
    done += k;
  }
  return true;
}

std::pair<double, double> ShmLink::probeCopies(size_t bytes, bool cold, int warmUps, uint64_t firstKey,
                                               Deadline deadline) {
  uint64_t key = firstKey; // per round, two ways, each a start and a timed exchange
  // From the allocator an op's tensors come from: where single copy reads a peer's
  // pages, how they were allocated (alignment, huge pages) weighs as much as the bytes.
  c10::Allocator* alloc = c10::GetCPUAllocator();
  const c10::DataPtr outBuf = alloc->allocate(bytes);
  const c10::DataPtr inBuf = alloc->allocate(bytes);
  char* const out = static_cast<char*>(outBuf.get());
  char* const in = static_cast<char*>(inBuf.get());
  std::memset(in, 0, bytes); // their pages' first touch, not in a timed exchange
  std::memset(out, 1, bytes);
  std::array<char, 8> tick{};
  std::array<char, 8> tock{};
  // Sends `n` bytes at `src` to the right while receiving as many into `dst` from the
  // left, and waits for both.
  const auto exchange = [&](const char* src, char* dst, size_t n, bool lend) {
    FrameHeader h = frameOfKind(FrameKind::Collective);
    h.key = key++;
    h.opNumel = n;
    const RequestPtr recv = postRecv(left_, h, dst, n);
    const RequestPtr send = post(right_, h, src, n, lend);
    for (const RequestPtr& req : {send, recv}) {
      // In waits short enough to end in their spin, never asleep: a sleeper's wakeup is
      // placed beside its waker, and two ranks on one CPU time the scheduler, not the
      // copy (single copy the more: the reader and the lender take turns); a spinning
      // wait moves off a CPU its neighbour waits on, as an op's waits do.
      while (!waitUntil(req, std::min(deadline, Clock::now() + kProbeLook))) {
        if (Clock::now() >= deadline) {
          throwBackend(c10::str("ringpg: rank ", rank_, " timed out at group creation measuring its same-host links",
                                " (rank ", req == send ? right_ : left_, " did not take part)"));
        }
      }
      if (req->state.load(std::memory_order_acquire) != Request::State::Done) {
        const std::string why = c10::str("ringpg: rank ", rank_, " could not measure its same-host links at group",
                                         " creation: ", req->error);
        req->networkError ? throwNetwork(why) : throwBackend(why);
      }
    }
  };
  const size_t asked = cmaBytes_;
  cmaBytes_ = 1; // both ends take descriptors while measuring; each send says whether it lends
  std::array<double, 2> best{std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
  for (const auto round : c10::irange(warmUps + kProbeRounds)) {
    for (const auto k : c10::irange(2)) {
      const bool lend = (round + k) % 2 == 0; // which goes first alternates between rounds
      // Warm: in the caches, clean (read by the rounds before), as a buffer an op sends
      // again usually is.  Not written just before each exchange: a single copy of lines
      // the sender's core holds modified took twice a clean one's time on the 2-vCPU Xeon,
      // and that probe chose the slots where every op ran as fast or faster by single
      // copy (docs/internals.md, "Single copy or the slots").  Cold: in memory, as a large
      // op's are; each end evicts both of its buffers (the left neighbour reads our `out`).
      if (cold) {
        evictFromCaches(out, bytes);
        evictFromCaches(in, bytes);
      }
      exchange(tick.data(), tock.data(), tick.size(), /*lend=*/false); // start together
      const auto t0 = Clock::now();
      exchange(out, in, bytes, lend);
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      if (round >= warmUps) {
        best[lend ? 0 : 1] = std::min(best[lend ? 0 : 1], us);
      }
    }
  }
  cmaBytes_ = asked;
  return {best[0], best[1]};
}

bool ShmLink::progress() {
  const bool sent = pushSends();
  const bool received = pullRecvs();
  const bool reaped = reapLent();
  return sent || received || reaped;
}

void ShmLink::failAll(const std::string& reason, bool network) {
  for (auto& s : sends_) {
    markFailed(*s, reason, network);
  }
  for (auto& r : recvs_) {
    markFailed(*r.req, reason, network);
  }
  for (auto& l : lent_) {
    markFailed(*l.req, reason, network);
  }
  sends_.clear();
  recvs_.clear();
  lent_.clear();
}

ShmLink::Departures ShmLink::neighboursGone() {
  if (!engine_.anyGone()) {
    return {}; // the common case: one load
  }
  return {receivesLeft_ ? engine_.goneFrom(left_) : std::string(),
          sendsRight_ ? engine_.goneFrom(right_) : std::string()};
}

bool ShmLink::failIfNeighbourLeft(const Departures& gone) {
  std::string why = recvs_.empty() ? std::string() : gone.left;
  if (why.empty() && (!sends_.empty() || !lent_.empty())) { // a lent buffer is read by no one now
    why = gone.right;
  }
  if (!why.empty()) {
    failAll(why, /*network=*/true);
  }
  return !why.empty();
}

const CpuHint* ShmLink::neighbourOn(int cpu) {
  if (receivesLeft_ && fromLeft_->bell().cpu.on(cpu)) {
    return &fromLeft_->bell().cpu;
  }
  return sendsRight_ && toRight().bell().cpu.on(cpu) ? &toRight().bell().cpu : nullptr;
}

BellCauses ShmLink::awaited() const {
  // Only this thread posts and moves these queues, so they hold still while it sleeps.
  BellCauses causes = 0;
  if (!recvs_.empty()) {
    causes += kArrived;
  }
  if (!sends_.empty() || !lent_.empty()) {
    causes += kReleased;
  }
  return causes != 0 ? causes : kArrived + kReleased; // a pending request is queued: never 0
}

bool ShmLink::waitUntil(const RequestPtr& req, Deadline deadline) {
  const auto look = [&]() -> WaitLook {
    if (failure_.failed()) {
      // A peer died or the group failed elsewhere (we hear it through the sockets).
      // Checked first: a broken group moves no byte into or out of a user buffer.
      bool network = true;
      const std::string why = failure_.reason(&network);
      failAll(why, network);
      return WaitLook::Done;
    }
    // A neighbour that left (its goodbye, or its process ended between ops) sends and
    // takes nothing more, but what it wrote before it left is in the slots (the mapping
    // outlives it): asked before progress() drains them, so a departure seen here comes
    // after every slot it filled.
    const Departures gone = neighboursGone();
    const bool moved = progress();
    if (req->state.load(std::memory_order_acquire) != Request::State::Pending || failIfNeighbourLeft(gone)) {
      return WaitLook::Done;
    }
    return moved ? WaitLook::Moved : WaitLook::Idle;
  };
  const auto nothingElse = [] { return false; }; // a broken group is in every look
  const auto peerOn = [&](int cpu) { return neighbourOn(cpu); };
  const auto causes = [&] { return awaited(); };
  RegionBell& mine = own_->bell();
  return waiter_.wait(mine.bell, mine.cpu, deadline, WaitCalls{look, nothingElse, peerOn, causes});
}

} // namespace ringpg
