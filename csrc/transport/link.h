// The one interface between the algorithms and the transports.
//
// A Link moves the collective frames of the running op to and from peers: it posts a
// send, posts a receive into a buffer, posts a fused receive where it can hand each
// fragment over as it arrives (shared memory: the ring reduces straight out of the
// slot), and waits for a request with a deadline.  Three transports implement it:
//   EngineLink  ringpg's TCP engine (transport/engine.h), any peer;
//   ShmLink     the shared-memory ring (transport/shm.h), right neighbour / left one;
//   GlooLink    Gloo's own TCP pairs (transport/gloo_link.h), any peer.
// The group has one failure state, its Engine's: every link reports a failure into it
// (Engine::fail, which tells every peer), and every link's waits end when it breaks.
// A group owns a link per peer and direction (LinkTable); each link says which
// transport it is.
#pragma once

#include <c10/util/Exception.h>

#include <functional>
#include <vector>

#include "common/thresholds.h"
#include "transport/engine.h"
#include "transport/request.h"
#include "transport/topology.h"
#include "transport/wire.h"

namespace ringpg {

class HostArena;

// Called with each fragment of a message as it arrives: `offset` bytes into the
// message, `n` bytes at `src` (valid only during the call).
using FragmentConsumer = std::function<void(const char* src, size_t offset, size_t n)>;

class Link {
 public:
  virtual ~Link() = default;

  // "tcp", "shm" or "gloo": for messages and traces; what a link can do is asked
  // through the capabilities below, never through this name.
  virtual const char* transport() const = 0;

  // `op`: the header every frame of the running op carries (its key is the op's
  // sequence number).  The requests remember this link (Request::link), which waits.
  virtual RequestPtr postSend(int peer, const FrameHeader& op, const void* data, size_t len) = 0;
  virtual RequestPtr postRecv(int peer, const FrameHeader& op, void* data, size_t len) = 0;
  // A send that links which could lend the buffer (shared memory's single copy) copy
  // instead, where lending measured slower: most sends the receiver reduces as they
  // arrive (a ring's reduce-scatter step, the two-rank one-shot), and an allreduce's
  // smaller gather segments (algorithms/ring.cpp).  Either way the receiver may reduce
  // or copy what arrives: the choice is the sender's alone.
  virtual RequestPtr postSendCopied(int peer, const FrameHeader& op, const void* data, size_t len) {
    return postSend(peer, op, data, len);
  }

  // Whether the link compares what arrives with what the receive expects (op, dtype,
  // numel, ReduceOp), as the engine's and shared memory's frame headers let them; a
  // link of bare bytes (Gloo's pairs) has each op's signature checked on the engine.
  virtual bool checksFrames() const { return true; }

  // Whether a send moves only once the peer has posted its receive (Gloo's pairs): a
  // ring then posts receives further ahead (Config::recvWindowFor).
  virtual bool sendWaitsForReceive() const { return false; }

  // Whether a second thread of an op may post and wait on this link while the op's
  // thread does too, each for its own peers, with the link moving the bytes itself (a
  // progress thread of its own): what a hierarchical op in pieces needs of the links
  // its rings across hosts take (algorithms/hierarchical.cpp).
  virtual bool servesASecondThread() const { return false; }

  // Whether postRecvInto() works for frames from `peer`.
  virtual bool fusesReceive(int /*peer*/) const { return false; }
  // A receive of `len` bytes whose fragments go to `consume` as they arrive.
  virtual RequestPtr postRecvInto(int /*peer*/, const FrameHeader& /*op*/, size_t /*len*/,
                                  FragmentConsumer /*consume*/) {
    TORCH_INTERNAL_ASSERT(false, "ringpg: ", transport(), " links do not fuse receives");
  }

  // Waits until `req` (posted here) is no longer pending: true when done or failed
  // (a failure also when the group's failure state broke meanwhile), false when
  // `deadline` passed first (still pending; the caller reports the timeout).
  virtual bool waitUntil(const RequestPtr& req, Deadline deadline) = 0;

  // A link moved only by its waiters (shared memory: no progress thread of its own)
  // says whether it holds queued sends or posted receives, and moves what can move
  // now (true if anything moved).  Links with a progress thread keep the defaults.
  virtual bool hasQueued() const { return false; }
  virtual bool progress() { return false; }
};

// ringpg's TCP engine as a Link.
class EngineLink final : public Link {
 public:
  explicit EngineLink(Engine& engine) : engine_(engine) {}
  const char* transport() const override { return "tcp"; }
  // The engine's progress thread moves every socket, and its queues take posts from any thread.
  bool servesASecondThread() const override { return true; }
  RequestPtr postSend(int peer, const FrameHeader& op, const void* data, size_t len) override;
  RequestPtr postRecv(int peer, const FrameHeader& op, void* data, size_t len) override;
  bool waitUntil(const RequestPtr& req, Deadline deadline) override;

 private:
  Engine& engine_;
};

// Which ops' large same-host messages move by single copy (cross-memory attach: the
// receiver reads the sender's buffer, one copy) rather than through the slots (two),
// by the op's size class (kStreamingOpBytes, common/thresholds.h): below `streamingFrom` an op's buffers are mostly in
// the caches, from it on they stream from memory, and which way is faster can differ between the two on one host.
// Measured by the group at creation (ShmLink::connect), the same on every rank; single copy nowhere where it is refused
// or off, everywhere where RINGPG_CMA_BYTES is set, from a rank's own size where tuning key cma_op_bytes is.
struct SameHostCopy {
  bool cached = false; // ops below streamingFrom
  bool streaming = false; // ops from it on
  size_t streamingFrom = kStreamingOpBytes;
  bool any() const { return cached || streaming; }
};

// The links of one group: the one collective frames to peer q take (`to(q)`), the one
// frames from q come by (`from(q)`), the group's failure state, and the Engine, its
// control channel (`control`, its Link: announcements; aborts; point-to-point);
// and the ring they form (`topology`: ring order by host, transport/topology.h).
// Every peer shares one link but at most one each way (shared memory to the right
// neighbour on this host, from the left one), so the table holds those and no entry a
// peer: its size does not grow with the group.
struct LinkTable {
  Engine* engine = nullptr;
  GroupFailure* failure = nullptr; // the group's failure state, which every wait asks
  const Topology* topology = nullptr;
  Link* control = nullptr;
  Link* collective = nullptr; // every peer's, both ways, but the ones below
  Link* toOne = nullptr; // frames to peer toPeer, where set
  int toPeer = -1;
  Link* fromOne = nullptr; // frames from peer fromPeer, where set
  int fromPeer = -1;

  Link* to(int peer) const { return peer == toPeer ? toOne : collective; }
  Link* from(int peer) const { return peer == fromPeer ? fromOne : collective; }
  // Peer `peer`'s frames one way on `link` instead of `collective`.
  void routeTo(int peer, Link* link) {
    toPeer = peer;
    toOne = link;
  }
  void routeFrom(int peer, Link* link) {
    fromPeer = peer;
    fromOne = link;
  }
  // Every peer's frames both ways on `link`.
  void routeAll(Link* link) {
    collective = link;
    toOne = fromOne = nullptr;
    toPeer = fromPeer = -1;
  }
  // The group's host arena (transport/arena.h), when it has one: the host collectives
  // (algorithms/arena_collectives.h) run over it instead of the links.
  HostArena* arena = nullptr;
  // The link only waiters move (shared memory), when the group has one: see waitUntil.
  Link* driven = nullptr;
  // Whether every hop of the ring, on every rank, fuses receives (shared memory on one
  // host): the same on all ranks, so plans that depend on it (the ring's segment
  // count) agree at both ends of every link.
  bool ringFusedEverywhere = false;
  // Which ops lend their large same-host messages (ShmLink::copyPlan): none where the
  // group has no shared-memory link.
  SameHostCopy sameHostCopy;

  // Waits for `req` on the link that posted it (Link::waitUntil).  A wait on another
  // link keeps `driven` moving meanwhile, in slices of kDriveSlice: a rank whose ring
  // hop to the right is shared memory and whose hop from the left is TCP would
  // otherwise sit on its TCP receive with its shared-memory sends queued, and the
  // ring, which runs through both, would stall until the deadline.
  static constexpr std::chrono::microseconds kDriveSlice{100};
  bool waitUntil(const RequestPtr& req, Deadline deadline) const;

  // Every peer on the engine both ways.
  static LinkTable engineOnly(EngineLink& link, Engine& engine, const Topology& topology) {
    LinkTable t;
    t.engine = &engine;
    t.failure = &engine.failure();
    t.topology = &topology;
    t.control = &link;
    t.collective = &link;
    return t;
  }
};

} // namespace ringpg
