#include "algorithms/context.h"

#include <c10/util/StringUtil.h>

#include <c10/util/irange.h>

#include <chrono>

namespace ringpg {

FrameHeader OpContext::header() const {
  FrameHeader h = frameOfKind(FrameKind::Collective);
  h.opcode = static_cast<uint8_t>(sig_.type);
  h.dtype = static_cast<uint8_t>(sig_.dtype);
  h.reduceOp = static_cast<uint8_t>(sig_.reduceOp);
  h.key = tag_.seq;
  h.opNumel = sig_.numel;
  return h;
}

RequestPtr OpContext::send(int peer, const void* data, size_t nbytes) {
  Link& link = *links_.to(peer);
  return lends_ ? link.postSend(peer, header(), data, nbytes) : link.postSendCopied(peer, header(), data, nbytes);
}

RequestPtr OpContext::sendCopied(int peer, const void* data, size_t nbytes) {
  return links_.to(peer)->postSendCopied(peer, header(), data, nbytes);
}

RequestPtr OpContext::recv(int peer, void* data, size_t nbytes, bool streaming) {
  RequestPtr req = links_.from(peer)->postRecv(peer, header(), data, nbytes);
  req->streaming = streaming; // before any wait moves it: only waits copy out of the slots
  return req;
}

namespace {

// What the arena publishes of an op (its stamp; the root aside).
ArenaStamp stampOfHeader(const FrameHeader& h) {
  ArenaStamp s;
  s.key = h.key;
  s.numel = h.opNumel;
  s.opcode = h.opcode;
  s.dtype = h.dtype;
  s.reduceOp = h.reduceOp;
  return s;
}

// The header of the op a stamp describes, for mismatch messages.
FrameHeader headerOfStamp(FrameHeader h, const ArenaStamp& s) {
  h.key = s.key;
  h.opNumel = s.numel;
  h.opcode = s.opcode;
  h.dtype = s.dtype;
  h.reduceOp = s.reduceOp;
  return h;
}

} // namespace

void OpContext::failOtherOp(int member, const ArenaStamp& theirs) const {
  const std::string msg =
      c10::str(describe(tag_), ": ",
               collectiveMismatch(tag_.rank, links_.arena->rankOf(member), header(), headerOfStamp(header(), theirs)));
  failure_.fail(msg, /*network=*/false);
  throwBackend(msg);
}

std::vector<RequestPtr> OpContext::announce() {
  if (links_.arena) {
    links_.arena->announce(stampOfHeader(header()));
  }
  if (size_ == 1 || links_.from(left())->checksFrames()) {
    return {};
  }
  return {links_.control->postRecv(left(), header(), nullptr, 0),
          links_.control->postSend(right(), header(), nullptr, 0)};
}

bool OpContext::fusedRecvReduce(int peer) const {
  return links_.from(peer)->fusesReceive(peer);
}

RequestPtr OpContext::recvReduce(int peer, char* dst, const char* in, int64_t count, size_t es, RedOp op, int step,
                                 int chunk, int64_t segment, Operands order) {
  TORCH_INTERNAL_ASSERT(fusedRecvReduce(peer));
  const c10::ScalarType dtype = sig_.dtype;
  const bool receivedFirst = order == Operands::ReceivedFirst;
  // Fragments start at multiples of the slot size, a multiple of a cache line
  // (kCacheLine), so each holds whole elements.
  const auto reduceFragment = [=](const char* src, size_t offset, size_t n) {
    const char* local = in + offset;
    reduce(dtype, op, dst + offset, receivedFirst ? src : local, receivedFirst ? local : src,
           static_cast<int64_t>(n / es));
  };
  if (OpTrace* t = trace_) {
    // Traced: the same reduction, timed on the thread whose wait pulled the fragment.
    return links_.from(peer)->postRecvInto(
        peer, header(), static_cast<size_t>(count) * es, [=](const char* src, size_t offset, size_t n) {
          const int64_t begin = traceNow();
          reduceFragment(src, offset, n);
          t->segment(TraceKind::Reduce, "reduce", begin, step, chunk, segment, peer, static_cast<int64_t>(n));
        });
  }
  return links_.from(peer)->postRecvInto(peer, header(), static_cast<size_t>(count) * es, reduceFragment);
}

void OpContext::wait(const RequestPtr& req) {
  TORCH_INTERNAL_ASSERT(req->link, "ringpg: an op's request not posted through a link");
  bool done = false;
  if (HostArena* arena = links_.arena) {
    // A peer of the arena that runs this op's sequence number as another op may wait in
    // the arena for us and never send what we wait for here: looked for between slices.
    const ArenaStamp mine = stampOfHeader(header());
    while (!(done = links_.waitUntil(req, std::min(deadline_, Clock::now() + HostArena::kMismatchLook))) &&
           Clock::now() < deadline_) {
      ArenaStamp theirs;
      if (const int m = arena->runsOtherOp(mine, &theirs); m >= 0) {
        failOtherOp(m, theirs);
      }
    }
  } else {
    done = links_.waitUntil(req, deadline_);
  }
  if (!done) {
    const bool isSend = hasKind(req->hdr, FrameKind::Collective) && req->progress > 0;
    const std::string msg = c10::str(describe(tag_), ": Timed out waiting for rank ", req->peer, " after ",
                                     timeout_.count(), " ms (", req->len, "-byte ", isSend ? "send" : "transfer",
                                     " pending; the op's timeout). "
                                     "The peer may be stuck, stopped, or calling a different collective.");
    failure_.fail(msg, /*network=*/false, BreakCause::Timeout); // later ops fail at once with this cause
    throwBackend(msg);
  }
  if (req->state.load(std::memory_order_acquire) == Request::State::Failed) {
    throwRequestError(tag_, *req);
  }
}

void OpContext::waitAll(std::vector<RequestPtr>& reqs) {
  for (auto& r : reqs) {
    if (r) {
      wait(r);
    }
  }
  reqs.clear();
}

void OpContext::arenaStep(bool firstOfRound, int root) {
  HostArena& arena = *links_.arena;
  const FrameHeader h = header();
  ArenaStamp stamp = stampOfHeader(h);
  stamp.root = root;
  arena.arrive(firstOfRound ? &stamp : nullptr);
  int member = 0;
  ArenaStamp other;
  const ArenaWait result = arena.awaitAll(deadline_, &member, &other);
  const int laggard = arena.rankOf(member);
  switch (result) {
    case ArenaWait::Done:
      break;
    case ArenaWait::TimedOut: {
      const std::string msg = c10::str(describe(tag_), ": Timed out waiting for rank ", laggard, " after ",
                                       timeout_.count(), " ms in the host arena (the op's timeout). ",
                                       "The peer may be stuck, stopped, or calling a different collective.");
      failure_.fail(msg, /*network=*/false, BreakCause::Timeout); // later ops fail at once with this cause
      throwBackend(msg);
    }
    case ArenaWait::Broken: {
      bool network = false;
      const std::string why = c10::str(describe(tag_), ": ", failure_.reason(&network));
      network ? throwNetwork(why) : throwBackend(why);
    }
    case ArenaWait::Left: {
      const std::string why = c10::str(describe(tag_), ": ", engine_.goneFrom(laggard));
      throwNetwork(why);
    }
    case ArenaWait::Mismatch:
      failOtherOp(member, other);
  }
  if (!firstOfRound) {
    return;
  }
  // Every member's stamp of this round against ours: the same op, or a mismatch.
  stamp.round = arena.round();
  for (const auto m : c10::irange(arena.members())) {
    const ArenaStamp theirs = arena.stampOf(m);
    if (sameStamp(stamp, theirs)) {
      continue;
    }
    if (!sameOp(stamp, theirs)) {
      failOtherOp(m, theirs);
    }
    const std::string msg =
        c10::str(describe(tag_), ": ringpg: collective mismatch between ranks: rank ", tag_.rank, " runs seq ", h.key,
                 " with root ", root, " but rank ", arena.rankOf(m), " with root ", theirs.root, " (round ",
                 theirs.round, " of the host arena, expected ", stamp.round, ")");
    failure_.fail(msg, /*network=*/false);
    throwBackend(msg);
  }
}

OpContext OpContext::onThread(const LinkTable& links, std::vector<char>& scratch, std::vector<char>& workspace,
                              OpTrace* trace) const {
  OpContext other(links, cfg_, tag_, size_, sig_, deadline_, scratch, workspace);
  other.timeout_ = timeout_; // the op's, not what is left of it
  other.trace_ = trace;
  other.lends_ = lends_;
  return other;
}

void OpContext::failGroup(const std::string& why) const {
  failure_.fail(c10::str(describe(tag_), ": ", why), /*network=*/false);
}

char* OpContext::scratch(size_t bytes) {
  if (scratch_.size() < bytes) {
    scratch_.resize(bytes);
  }
  return scratch_.data();
}

char* OpContext::workspace(size_t bytes) {
  if (bytes > cfg_.workCacheBytes) {
    return nullptr;
  }
  if (workspace_.size() < bytes) {
    // Grows only: kept for the group's life, up to the cap.  What it holds is moot
    // between ops, so the old area goes first: no copy, and never two areas at once.
    std::vector<char>().swap(workspace_);
    workspace_.resize(bytes);
  }
  return workspace_.data();
}

} // namespace ringpg
