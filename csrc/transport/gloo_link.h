// Gloo's own TCP pairs as a ring link (RINGPG_TRANSPORT=gloo).
//
// The torch wheel carries Gloo compiled in but ships none of its headers, so ringpg
// never names a Gloo type: it holds torch's ProcessGroupGloo as a plain c10d::Backend
// (created in Python on a prefix of the group's store, honouring GLOO_SOCKET_IFNAME)
// and posts each ring segment as that backend's send()/recv() of a byte tensor that
// views ringpg's buffer (no copy).  Those calls run Gloo's unbound-buffer sends and
// receives on its transport::tcp::Pair, completed by Gloo's device thread.
//
// Tags.  Gloo matches a receive to a send by (peer, tag), so both ends must compute the
// same tag for the same message: the k-th non-empty message of op `seq` between two
// ranks (k counted per direction, in posting order, which the deterministic plan makes
// the same on both sides) gets
//     tag = sig(9 bits) << 22 | (seq mod 256) << 14 | (k mod 16384)
// non-negative in int32 and unique among the messages in flight between two ranks
// (they belong to at most two consecutive ops, and a ring keeps far fewer than 16384
// segments in flight).  `sig` hashes the op's signature (type, dtype, numel,
// ReduceOp), so the bytes of ranks that call different collectives never match and
// never combine, while the engine names the mismatch at once (a Link that does not
// check its frames gets each op's signature checked there: OpContext::announce).
//
// Failures.  Control stays on ringpg's engine, which every group has: when a Gloo post
// or wait fails (a lost peer) the link first gives the engine a moment to read the
// peer's own Abort frame (the peer failed first and said why), else breaks the engine
// as a lost peer, whose Abort frames reach every rank at once; when the engine breaks for any reason (a peer's abort, a
// timeout, abort()) the engine's failure listener calls abortWaits(), which wakes the wait in progress and fails every
// later one.  A Gloo request's Work holds Gloo's buffer registration; dropping the Work (when the op's requests are
// released, before its buffers go back to their owner) withdraws it, so Gloo never touches a buffer after its op ended.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "transport/engine.h"
#include "transport/link.h"
#include "transport/request.h"

namespace ringpg {

// How a ProcessGroupGloo of a group's ranks is made.  torch's wheel ships no Gloo
// headers, so its Python binding (which reads GLOO_SOCKET_IFNAME) is the only way: the
// bindings install a factory that calls it, once, when ringpg's module loads
// (bindings/module.cpp).  `store`: the prefix of the group's Store Gloo's rendezvous uses.
using GlooBackendFactory = std::function<c10::intrusive_ptr<c10d::Backend>(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout)>;
void setGlooBackendFactory(GlooBackendFactory factory);
// A ProcessGroupGloo through the installed factory (TORCH_CHECK: one is installed).
c10::intrusive_ptr<c10d::Backend> makeGlooBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                  std::chrono::milliseconds timeout);

class GlooLink final : public Link {
 public:
  // `gloo`: a ProcessGroupGloo of the same ranks, used for nothing else; `engine`: the
  // group's failure state, which outlives the link.
  GlooLink(c10::intrusive_ptr<c10d::Backend> gloo, Engine& engine, int rank, int size);

  const char* transport() const override { return "gloo"; }
  bool sendWaitsForReceive() const override { return true; }
  bool checksFrames() const override { return false; }
  // `op`: the header of the op's frames (its key is the op's sequence number).
  RequestPtr postSend(int peer, const FrameHeader& op, const void* data, size_t len) override;
  RequestPtr postRecv(int peer, const FrameHeader& op, void* data, size_t len) override;

  // Waits until `req` ends or `deadline` passes: false on timeout (still pending);
  // true when done or failed.  A Gloo error fails `req` and breaks the engine with it.
  bool waitUntil(const RequestPtr& req, Deadline deadline) override;

  // Wakes the wait in progress and fails every later one (the engine broke).
  void abortWaits();

  // The Gloo tag of a message (see above); pure, for the tests.
  static int32_t tagOf(const FrameHeader& op, uint32_t index);

 private:
  enum class Direction : uint8_t { Send, Recv };
  // Posts one message (an empty one completes at once: neither side posts it to Gloo).
  RequestPtr post(Direction dir, int peer, const FrameHeader& op, const void* data, size_t len);
  // Fails `req` after Gloo reported `error` on its pair: with the engine's reason if the
  // engine breaks by `deadline` (capped at kCauseGrace from now), else as a lost peer,
  // breaking the engine with that.
  void failLost(Request& req, const std::string& error, Deadline deadline);
  // How long a lost pair waits to learn the peer's stated cause.
  static constexpr std::chrono::milliseconds kCauseGrace{250};
  // The index of the next message of op `op` to or from `peer` in `counts`.
  uint32_t nextIndex(const FrameHeader& op, int peer, std::vector<uint32_t>& counts);

  c10::intrusive_ptr<c10d::Backend> gloo_;
  Engine& engine_; // the control channel: a failed peer's stated cause, who has left
  GroupFailure& failure_; // the group's failure state (the engine's)
  const int rank_;
  uint64_t countsKey_ = ~uint64_t{0}; // the op whose messages sent_/received_ count
  std::vector<uint32_t> sent_; // per peer, messages of that op posted to it
  std::vector<uint32_t> received_; // per peer, receives of that op posted from it

  // mu_ guards aborted_ and waiting_: abortWaits() runs on whichever thread broke the
  // engine while the op's thread waits.
  std::mutex mu_;
  bool aborted_ = false;
  c10d::Work* waiting_ = nullptr; // the Work a thread is blocked in, if any
};

} // namespace ringpg
