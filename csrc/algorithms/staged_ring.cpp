#include "algorithms/staged_ring.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <initializer_list>
#include <string>
#include <vector>

#include "algorithms/arena_collectives.h"
#include "algorithms/ring.h"
#include "algorithms/ring_plan.h"
#include "cuda/host_register.h"
#include "transport/arena.h"

namespace ringpg {
namespace {

// The side streams of one staged op on the device of its tensors: copies to the host
// on one, copies back on another (high priority: a final piece should not queue behind
// the next piece's copy out).
class Staging {
 public:
  // `tensors`: the op's device tensors, whose memory the caching allocator must not
  // hand out before our copies end.
  Staging(const c10::Device& device, std::initializer_list<const at::Tensor*> tensors)
      : impl_(device.type()), device_(device), d2h_(impl_.getStreamFromGlobalPool(device, /*isHighPriority=*/false)),
        h2d_(impl_.getStreamFromGlobalPool(device, /*isHighPriority=*/true)) {
    // The copies start after whatever this thread queued on its current stream (the
    // PREMUL_SUM scaling, say); the caller's own stream was waited for already.
    c10::Event queued(device.type());
    queued.record(impl_.getStream(device));
    queued.block(d2h_);
    queued.block(h2d_);
    for (const at::Tensor* t : tensors) {
      impl_.recordDataPtrOnStream(t->storage().data_ptr(), d2h_);
      impl_.recordDataPtrOnStream(t->storage().data_ptr(), h2d_);
    }
  }

  // Copies the p chunks of `dev` (chunkRange over `count`) into `host`, in the order
  // the ring first reads them: chunk r-1 leaves at step 0, then chunks r-2, r-3, ...,
  // r are reduced.  One event per chunk, which awaitOut(chunk) waits for.
  void copyChunksOut(const at::Tensor& dev, const at::Tensor& host, int64_t count, int p, int r) {
    out_.clear();
    out_.reserve(p);
    for (const auto i : c10::irange(p)) {
      (void)i;
      out_.emplace_back(device_.type());
    }
    c10::StreamGuard onD2h(d2h_);
    for (const auto k : c10::irange(p)) {
      const int chunk = mod(static_cast<int64_t>(r) - 1 - k, p);
      const Range R = chunkRange(count, p, chunk);
      if (!R.empty()) {
        host.narrow(0, R.offset, R.length).copy_(dev.narrow(0, R.offset, R.length), /*non_blocking=*/true);
      }
      out_[chunk].record(d2h_);
    }
  }
  void awaitOut(int chunk) { out_[chunk].synchronize(); }

  // Issues `stages` groups of copies to the host (`issue(j)` makes group j's), in order,
  // one event after each, which awaitOut(j) waits for.
  void copyOutStages(int64_t stages, const std::function<void(int64_t)>& issue) {
    out_.clear();
    out_.reserve(stages);
    c10::StreamGuard onD2h(d2h_);
    for (int64_t j = 0; j < stages; ++j) {
      issue(j);
      out_.emplace_back(device_.type());
      out_.back().record(d2h_);
    }
  }

  // `dst` (device) = `src` (host or device), on the copy-back stream.
  void back(const at::Tensor& dst, const at::Tensor& src) {
    c10::StreamGuard onH2d(h2d_);
    dst.copy_(src, /*non_blocking=*/true);
  }

  // `dst` (pinned host) = `src` (device), on the copy-out stream.
  void out(const at::Tensor& dst, const at::Tensor& src) {
    c10::StreamGuard onD2h(d2h_);
    dst.copy_(src, /*non_blocking=*/true);
  }

  // Returns once every copy issued so far, both ways, has finished.
  void drain() {
    for (const c10::Stream& s : {d2h_, h2d_}) {
      c10::Event e(device_.type());
      e.record(s);
      e.synchronize();
    }
  }

  // Orders this thread's current stream (where the op's completion event is recorded)
  // after every copy back.
  void finish() {
    c10::Event back(device_.type());
    back.record(h2d_);
    back.block(impl_.getStream(device_));
  }

 private:
  c10::impl::VirtualGuardImpl impl_;
  c10::Device device_;
  c10::Stream d2h_;
  c10::Stream h2d_;
  std::vector<c10::Event> out_;
};

at::Tensor pinnedLike(const at::Tensor& dev, int64_t count) {
  return at::empty({count}, dev.options().device(at::kCPU).pinned_memory(true));
}

// The arena moves a buffer's worth a round (a megabyte by default); copies to and from
// the device go in groups of about this many bytes, so that each copy's fixed cost (a
// few microseconds) stays small beside what it moves.
constexpr size_t kStageBytes = 4 * 1024 * 1024;

int64_t ceilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Copies back to `dev` the ranges of `host` the arena reports final, merging each with
// the range it continues until kStageBytes are pending (a gather reports one range per
// member and piece; an allreduce one per piece).
class CopyBack {
 public:
  CopyBack(Staging& staging, const at::Tensor& dev, const at::Tensor& host)
      : staging_(staging), dev_(dev), host_(host),
        minElems_(std::max<int64_t>(1, static_cast<int64_t>(kStageBytes / dev.element_size()))) {}
  void add(int64_t offset, int64_t n) {
    for (Range& p : pending_) {
      if (p.offset + p.length == offset) {
        p.length += n;
        if (p.length >= minElems_) {
          flush(p);
        }
        return;
      }
    }
    pending_.push_back(Range{offset, n});
    if (n >= minElems_) {
      flush(pending_.back());
    }
  }
  void flushAll() {
    for (Range& p : pending_) {
      flush(p);
    }
  }

 private:
  // Copies `p` back and leaves it empty where it ended, to be continued.
  void flush(Range& p) {
    if (p.length > 0) {
      staging_.back(dev_.narrow(0, p.offset, p.length), host_.narrow(0, p.offset, p.length));
    }
    p.offset += p.length;
    p.length = 0;
  }
  Staging& staging_;
  const at::Tensor& dev_;
  const at::Tensor& host_;
  const int64_t minElems_;
  std::vector<Range> pending_;
};

// An all-gather's own chunk (`input`, chunk `index` of `output`): copied into its place
// in `host` now (blocking: the collective reads it next), and into the output on the
// device, where it needs no trip through the host (unless in place, FSDP's call: there
// already).  Returns its place in `host`.
at::Tensor stageOwnChunk(Staging& staging, const at::Tensor& input, const at::Tensor& output, const at::Tensor& host,
                         int index) {
  const int64_t chunk = input.numel();
  const at::Tensor mine = host.narrow(0, chunk * index, chunk);
  mine.copy_(input);
  const at::Tensor ownOut = output.narrow(0, chunk * index, chunk);
  if (ownOut.data_ptr() != input.data_ptr()) {
    staging.back(ownOut, input);
  }
  return mine;
}

// Pieces a stage of copies to the host holds: at least one, about kStageBytes.
int64_t piecesPerStage(int64_t pieceElems, size_t elemSize, int parts) {
  return std::max<int64_t>(1, static_cast<int64_t>(kStageBytes / (pieceElems * elemSize * parts)));
}

// A host tensor over `n` elements at `p` (an arena buffer), for copies to and from `like`'s device.
at::Tensor hostView(const char* p, int64_t n, const at::Tensor& like) {
  return at::from_blob(const_cast<char*>(p), {n}, at::TensorOptions().dtype(like.scalar_type()));
}

} // namespace

bool arenaReachesDevice(OpContext& c, const c10::Device& device) {
  if (c.arena() == nullptr) {
    return false;
  }
  HostArena& a = *c.arena();
  if (a.devicePin() == HostArena::DevicePin::Unasked) {
    std::string why;
    const c10::DeviceGuard onDevice(device); // the runtime registers on the current device
    void* base = a.segmentBase();
    const bool mine = registerHostMemory(base, a.segmentBytes(), &why);
    // Agreed before anyone acts on it: a member whose registration was refused while
    // another's held would otherwise take the staged ring at two ranks while the other
    // waited in the arena, each until the op's deadline.
    bool all = false;
    try {
      all = arenaEveryMemberSays(c, mine);
    } catch (...) { // the group broke meanwhile: nothing stays pinned for it
      if (mine) {
        unregisterHostMemory(base);
      }
      throw;
    }
    if (all) {
      a.setDevicePin(HostArena::DevicePin::Pinned, [base] { unregisterHostMemory(base); });
    } else {
      if (mine) {
        unregisterHostMemory(base); // pinned for nothing: another member's was refused
      }
      a.setDevicePin(HostArena::DevicePin::Refused);
      TORCH_WARN_ONCE("ringpg: the host arena's buffers could not be registered with the device ",
                      mine ? "on another rank of the group" : c10::str("(", why, ")"),
                      ": device tensors are staged through pinned host copies instead");
    }
  }
  return a.devicePin() == HostArena::DevicePin::Pinned;
}

void stagedRingAllreduce(OpContext& c, const at::Tensor& dev, RedOp op,
                         const std::function<void(char*, int64_t)>& finalize) {
  TORCH_INTERNAL_ASSERT(dev.is_contiguous() && !dev.device().is_cpu());
  const int64_t count = dev.numel();
  Staging staging(dev.device(), {&dev});
  at::Tensor host = pinnedLike(dev, count);
  staging.copyChunksOut(dev, host, count, c.size(), c.rank());

  RingJob job;
  job.count = count;
  job.elemSize = dev.element_size();
  job.reduceScatter = job.allGather = true;
  job.op = op;
  job.finalize = finalize;
  job.awaitInput = [&](int chunk) { staging.awaitOut(chunk); };
  job.onFinal = [&](const Range& R) {
    // Final values never change again, so the copy back can start at once.
    staging.back(dev.narrow(0, R.offset, R.length), host.narrow(0, R.offset, R.length));
  };
  char* h = static_cast<char*>(host.data_ptr());
  ringCollective(c, job, RingBuffers{h, h, nullptr});
  staging.finish();
}

void stagedRingReduceScatter(OpContext& c, const at::Tensor& input, const at::Tensor& output, RedOp op,
                             const std::function<void(char*, int64_t)>& finalize, char* work) {
  TORCH_INTERNAL_ASSERT(input.is_contiguous() && output.is_contiguous() && !input.device().is_cpu());
  const int p = c.size();
  const int64_t count = input.numel();
  TORCH_INTERNAL_ASSERT(count == output.numel() * p);
  Staging staging(input.device(), {&input, &output});
  at::Tensor hostIn = pinnedLike(input, count);
  at::Tensor hostOut = pinnedLike(output, output.numel());
  staging.copyChunksOut(input, hostIn, count, p, c.rank());
  // The reduce-scatter leaves rank r chunk r (RingView::ofGroup), in `hostOut`.
  const Range own = chunkRange(count, p, c.rank());

  RingJob job;
  job.count = count;
  job.elemSize = input.element_size();
  job.reduceScatter = true;
  job.op = op;
  job.finalize = finalize;
  job.awaitInput = [&](int chunk) { staging.awaitOut(chunk); };
  job.onFinal = [&](const Range& R) {
    const int64_t at = R.offset - own.offset;
    staging.back(output.narrow(0, at, R.length), hostOut.narrow(0, at, R.length));
  };
  ringCollective(
      c, job, RingBuffers{static_cast<const char*>(hostIn.data_ptr()), work, static_cast<char*>(hostOut.data_ptr())});
  staging.finish();
}

void stagedRingAllGather(OpContext& c, const at::Tensor& input, const at::Tensor& output) {
  TORCH_INTERNAL_ASSERT(input.is_contiguous() && output.is_contiguous() && !input.device().is_cpu());
  const int p = c.size();
  const int64_t chunk = input.numel();
  const int64_t count = output.numel();
  TORCH_INTERNAL_ASSERT(count == chunk * p);
  Staging staging(input.device(), {&input, &output});
  at::Tensor host = pinnedLike(output, count);
  // The own chunk: on the host before the ring starts (it sends it first).
  stageOwnChunk(staging, input, output, host, c.rank());

  RingJob job;
  job.count = count;
  job.elemSize = output.element_size();
  job.allGather = true;
  job.onFinal = [&](const Range& R) {
    staging.back(output.narrow(0, R.offset, R.length), host.narrow(0, R.offset, R.length));
  };
  ringCollective(c, job, RingBuffers{nullptr, static_cast<char*>(host.data_ptr()), nullptr});
  staging.finish();
}

void stagedArenaAllreduce(OpContext& c, const at::Tensor& dev, RedOp op,
                          const std::function<void(char*, int64_t)>& finalize, bool oneShot) {
  TORCH_INTERNAL_ASSERT(dev.is_contiguous() && !dev.device().is_cpu());
  const int64_t count = dev.numel();
  const size_t es = dev.element_size();
  Staging staging(dev.device(), {&dev});
  if (!oneShot && arenaReachesDevice(c, dev.device())) {
    // Each piece straight into our buffer, each final slice straight from its member's.
    ArenaHooks hooks;
    hooks.fillOwn = [&](char* dst, int64_t off, int64_t n) {
      staging.out(hostView(dst, n, dev), dev.narrow(0, off, n));
      staging.drain();
    };
    hooks.takeOut = [&](const char* src, int64_t off, int64_t n) {
      staging.back(dev.narrow(0, off, n), hostView(src, n, dev));
    };
    arenaAllreduce(c, nullptr, count, es, op, finalize, /*oneShot=*/false, hooks);
    staging.drain(); // the buffers are the next op's: nothing may read them after we return
    staging.finish();
    return;
  }
  at::Tensor host = pinnedLike(dev, count);
  const int64_t piece = arenaPieceFor(c, /*reduceScatter=*/false, es);
  const int64_t perStage = piecesPerStage(piece, es, 1);
  staging.copyOutStages(ceilDiv(ceilDiv(count, piece), perStage), [&](int64_t j) {
    const int64_t off = j * perStage * piece;
    const int64_t n = std::min(perStage * piece, count - off);
    host.narrow(0, off, n).copy_(dev.narrow(0, off, n), /*non_blocking=*/true);
  });
  CopyBack back(staging, dev, host);
  ArenaHooks hooks;
  hooks.awaitPiece = [&](int64_t i) { staging.awaitOut(static_cast<int>(i / perStage)); };
  hooks.onFinal = [&](int64_t off, int64_t n) { back.add(off, n); };
  arenaAllreduce(c, static_cast<char*>(host.data_ptr()), count, es, op, finalize, oneShot, hooks);
  back.flushAll();
  staging.finish();
}

void stagedArenaReduceScatter(OpContext& c, const at::Tensor& input, const at::Tensor& output, RedOp op,
                              const std::function<void(char*, int64_t)>& finalize) {
  TORCH_INTERNAL_ASSERT(input.is_contiguous() && output.is_contiguous() && !input.device().is_cpu());
  const int members = c.arena()->members();
  const int64_t chunk = output.numel();
  TORCH_INTERNAL_ASSERT(input.numel() == chunk * members);
  const size_t es = input.element_size();
  Staging staging(input.device(), {&input, &output});
  at::Tensor hostOut = pinnedLike(output, chunk);
  CopyBack back(staging, output, hostOut);
  ArenaHooks hooks;
  hooks.onFinal = [&](int64_t off, int64_t n) { back.add(off, n); };
  if (arenaReachesDevice(c, input.device())) {
    // Each chunk's block of a piece straight into our buffer.
    hooks.fillOwn = [&](char* dst, int64_t off, int64_t n) {
      for (const auto q : c10::irange(members)) {
        staging.out(hostView(dst + static_cast<size_t>(q * n) * es, n, input), input.narrow(0, q * chunk + off, n));
      }
      staging.drain();
    };
    arenaReduceScatter(c, nullptr, static_cast<char*>(hostOut.data_ptr()), chunk, es, op, finalize, hooks);
    back.flushAll();
    staging.finish();
    return;
  }
  at::Tensor hostIn = pinnedLike(input, input.numel());
  // A piece is a block of every member's chunk: a stage copies each chunk's part of it.
  const int64_t piece = arenaPieceFor(c, /*reduceScatter=*/true, es);
  const int64_t perStage = piecesPerStage(piece, es, members);
  staging.copyOutStages(ceilDiv(ceilDiv(chunk, piece), perStage), [&](int64_t j) {
    const int64_t off = j * perStage * piece;
    const int64_t n = std::min(perStage * piece, chunk - off);
    for (const auto q : c10::irange(members)) {
      hostIn.narrow(0, q * chunk + off, n).copy_(input.narrow(0, q * chunk + off, n), /*non_blocking=*/true);
    }
  });
  hooks.awaitPiece = [&](int64_t i) { staging.awaitOut(static_cast<int>(i / perStage)); };
  arenaReduceScatter(c, static_cast<const char*>(hostIn.data_ptr()), static_cast<char*>(hostOut.data_ptr()), chunk, es,
                     op, finalize, hooks);
  back.flushAll();
  staging.finish();
}

void stagedArenaAllGather(OpContext& c, const at::Tensor& input, const at::Tensor& output, bool streams) {
  TORCH_INTERNAL_ASSERT(input.is_contiguous() && output.is_contiguous() && !input.device().is_cpu());
  const int64_t chunk = input.numel();
  TORCH_INTERNAL_ASSERT(output.numel() == chunk * c.arena()->members());
  const int me = c.arena()->me();
  Staging staging(input.device(), {&input, &output});
  if (arenaReachesDevice(c, input.device())) {
    // Our piece straight into our buffer; every other member's straight from theirs
    // into the output; our own chunk device to device (already there, in place).
    const at::Tensor ownOut = output.narrow(0, chunk * me, chunk);
    if (ownOut.data_ptr() != input.data_ptr()) {
      staging.back(ownOut, input);
    }
    ArenaHooks hooks;
    hooks.fillOwn = [&](char* dst, int64_t off, int64_t n) {
      staging.out(hostView(dst, n, input), input.narrow(0, off, n));
      staging.drain();
    };
    hooks.takeOut = [&](const char* src, int64_t off, int64_t n) {
      if (off < chunk * me || off >= chunk * (me + 1)) {
        staging.back(output.narrow(0, off, n), hostView(src, n, output));
      }
    };
    arenaAllGather(c, nullptr, nullptr, chunk, output.element_size(), streams, hooks);
    staging.drain(); // the buffers are the next op's: nothing may read them after we return
    staging.finish();
    return;
  }
  at::Tensor host = pinnedLike(output, output.numel());
  // The own chunk: on the host whole before the first round (every round reads a piece of it).
  const at::Tensor mine = stageOwnChunk(staging, input, output, host, me);
  CopyBack back(staging, output, host);
  ArenaHooks hooks;
  hooks.onFinal = [&](int64_t off, int64_t n) {
    if (off < chunk * me || off >= chunk * (me + 1)) { // the own chunk went back above
      back.add(off, n);
    }
  };
  arenaAllGather(c, static_cast<const char*>(mine.data_ptr()), static_cast<char*>(host.data_ptr()), chunk,
                 output.element_size(), streams, hooks);
  back.flushAll();
  staging.finish();
}

} // namespace ringpg
