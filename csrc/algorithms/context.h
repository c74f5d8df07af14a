// What one running collective knows: who it is, where its peers are, its deadline,
// and the named send/recv primitives every algorithm is written with.
#pragma once

#include <c10/core/ScalarType.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstdint>
#include <vector>

#include "common/config.h"
#include "common/errors.h"
#include "common/trace.h"
#include "reduce/reduce.h"
#include "transport/arena.h"
#include "transport/engine.h"
#include "transport/link.h"

namespace ringpg {

// What every rank must agree on for one collective.  Each of its frames carries it
// (transport/wire.h), so ranks that call different ops, dtypes, sizes or ReduceOps
// fail with a mismatch instead of combining unrelated data.
struct OpSignature {
  OpSignature(c10d::OpType type, c10::ScalarType dtype, uint64_t numel,
              c10d::ReduceOp::RedOpType reduceOp = c10d::ReduceOp::UNUSED)
      : type(type), dtype(dtype), numel(numel), reduceOp(reduceOp) {}
  OpSignature() = default;
  c10d::OpType type = c10d::OpType::UNKNOWN;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  uint64_t numel = 0; // the op's element count as this rank sees it
  c10d::ReduceOp::RedOpType reduceOp = c10d::ReduceOp::UNUSED; // UNUSED: the op does not reduce
};
static_assert(c10d::ReduceOp::UNUSED == kNoReduceOp, "wire.h names the frame of an op that does not reduce");

class OpContext {
 public:
  // `links`: the group's (transport/link.h), which outlive the op.
  OpContext(const LinkTable& links, const Config& cfg, OpTag tag, int size, OpSignature sig, Deadline deadline,
            std::vector<char>& scratch, std::vector<char>& workspace)
      : links_(links), engine_(*links.engine), failure_(*links.failure), cfg_(cfg), tag_(tag), size_(size), sig_(sig),
        deadline_(deadline),
        // The op's timeout, for messages: the deadline was set to now + timeout just
        // before, so rounding the time left to whole ms gives the timeout back.
        timeout_(std::chrono::round<std::chrono::milliseconds>(deadline - Clock::now())), scratch_(scratch),
        workspace_(workspace), lends_(links.sameHostCopy.cached) {}

  int rank() const { return tag_.rank; }
  int size() const { return size_; }
  // The ring (transport/topology.h): ranks of a host adjacent, hosts one after another.
  // Ring algorithms number chunks and steps by ring position; position(r) is rank r's,
  // ringRank(pos) the rank at a position.  Identity when the ranks of each host are
  // numbered consecutively (every single-host group).
  int position() const { return links_.topology->positionOf(tag_.rank); }
  int positionOf(int rank) const { return links_.topology->positionOf(rank); }
  int ringRank(int pos) const { return links_.topology->ringAt(pos); }
  int left() const { return links_.topology->left(tag_.rank); }
  const Topology& topology() const { return *links_.topology; }
  int right() const { return links_.topology->right(tag_.rank); }
  c10::ScalarType dtype() const { return sig_.dtype; }
  const Config& config() const { return cfg_; }
  // Receives a ring posts ahead on its link from `peer` (Config::recvWindowFor).
  int recvWindowFrom(int peer) const { return cfg_.recvWindowFor(links_.from(peer)->sendWaitsForReceive()); }
  const OpTag& tag() const { return tag_; }
  // Whether send() lends this op's same-host messages: its plan's (OpPlan::lends, the
  // size class's measured choice).  Until set, an op lends as the group's small ops do.
  void setLends(bool lends) { lends_ = lends; }

  // Collective frames of this op: same key/op/dtype/numel on both sides, on the link
  // the group routes that peer to (LinkTable; both ends of a link decide alike).  A
  // same-host send is lent to the receiver (single copy) where the link takes it and
  // this op's plan lends (setLends), and copied otherwise.
  RequestPtr send(int peer, const void* data, size_t nbytes);
  // A send the link copies rather than lends (Link::postSendCopied): one `peer` reduces
  // as it arrives, or one that measured faster copied.
  RequestPtr sendCopied(int peer, const void* data, size_t nbytes);
  // `streaming`: into an output larger than the caches keep (Request::streaming).
  RequestPtr recv(int peer, void* data, size_t nbytes, bool streaming = false);
  // True when recvReduce() from `peer` reduces each fragment as it arrives (its link
  // fuses receives: shared memory); otherwise the caller receives into staging and reduces.
  bool fusedRecvReduce(int peer) const;
  // Whether every rank's ring hop fuses (LinkTable::ringFusedEverywhere): the same on
  // all ranks, unlike fusedRecvReduce(left()) in a group of several hosts.
  bool ringFusedEverywhere() const { return links_.ringFusedEverywhere; }
  // The order of a fused reduction's operands: the kernels' results (NaN payloads, and
  // MIN/MAX where one side is NaN) may depend on it, and ranks that each reduce the same
  // buffers must pass them alike to hold the same bits.
  enum class Operands : uint8_t { LocalFirst, ReceivedFirst };
  // recvReduce, fused: dst[i] = in[i] (op) received[i] (ReceivedFirst: received[i] (op)
  // in[i]) for `count` elements of this op's dtype (`elemSize` bytes each).  Requires
  // fusedRecvReduce(peer); `in` must be ready when it is posted.  When the op is traced,
  // each fragment's reduction is a "reduce" event of ring step `step`, chunk `chunk`,
  // segment `segment`.
  RequestPtr recvReduce(int peer, char* dst, const char* in, int64_t count, size_t elemSize, RedOp op, int step = -1,
                        int chunk = -1, int64_t segment = -1, Operands order = Operands::LocalFirst);
  // Where the group's links do not check what their frames carry (Gloo's pairs:
  // Link::checksFrames), the op is checked on the engine, its control link, instead:
  // an empty frame of this op to the right neighbour, and the receive of the left
  // one's.  The engine compares op, dtype, numel and ReduceOp at once and, on a
  // mismatch, breaks the group (which wakes every wait) instead of leaving both ranks
  // to their deadline.  Empty where the links check; wait for both when the op is done.
  std::vector<RequestPtr> announce();

  // The group's host arena (transport/arena.h), or null where it has none.
  HostArena* arena() const { return links_.arena; }
  // One step in the arena: arrive (the round's first step carries this op's stamp,
  // with `root` for a rooted op), then wait for every member.  Throws like wait():
  // a c10d error naming the op, this rank and the member that did not arrive, after
  // breaking the group on a timeout; and, at a first step, a mismatch when a member
  // runs another op (which breaks the group too).
  void arenaStep(bool firstOfRound, int root = -1);
  // Breaks the group and throws a mismatch: arena member `member` runs this op's
  // sequence number as `theirs`.
  [[noreturn]] void failOtherOp(int member, const ArenaStamp& theirs) const;

  // Blocks until `req` completes; throws a c10d error naming op, rank and peer on
  // failure or when the op's deadline passes (which also breaks the engine, so no
  // late byte can land in a buffer the caller is about to free).
  void wait(const RequestPtr& req);
  void waitAll(std::vector<RequestPtr>& reqs);

  // A reusable scratch area of at least `bytes` (owned by the backend's worker).
  char* scratch(size_t bytes);
  // A second reusable area of at least `bytes`, for an op's full-size intermediate
  // (reduce-scatter's partial sums), or nullptr when `bytes` exceeds
  // Config::workCacheBytes: the caller then allocates for this op alone.
  char* workspace(size_t bytes);

  // The header every frame of this op carries (the payload length aside).
  FrameHeader header() const;

  // The same op on a second thread (the hierarchical pipeline, hierarchical.cpp): its
  // tag, deadline and failure state, over `links` (which must route no peer to a link
  // that only waiters move: shared memory stays this thread's), with scratch areas and
  // a trace buffer (null: untraced) of its own.  The references must outlive it.
  OpContext onThread(const LinkTable& links, std::vector<char>& scratch, std::vector<char>& workspace,
                     OpTrace* trace) const;
  const LinkTable& links() const { return links_; }
  Deadline deadline() const { return deadline_; }
  // Breaks the group with `why` (naming this op), as the backend does when an op
  // throws: every wait of every rank ends with it.
  void failGroup(const std::string& why) const;

  // This op's trace buffer (RINGPG_TRACE), or null when tracing is off: recording
  // sites test it (common/trace.h).
  OpTrace* trace() const { return trace_; }
  void setTrace(OpTrace* t) { trace_ = t; }

 private:
  const LinkTable& links_;
  Engine& engine_;        // who has left the group (goneFrom)
  GroupFailure& failure_; // the group's failure state
  const Config& cfg_;
  OpTag tag_;
  int size_;
  OpSignature sig_;
  Deadline deadline_;
  std::chrono::milliseconds timeout_;
  std::vector<char>& scratch_;
  std::vector<char>& workspace_;
  OpTrace* trace_ = nullptr;
  bool lends_; // send() lends where the link takes it (setLends)
};

} // namespace ringpg
