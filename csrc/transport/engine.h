// The transport engine: TCP pairs (one socket per direction per peer, so the two
// directions of a ring never share a socket) driven by one progress thread.
//
// Connections are made on first use.  The engine keeps the listening socket of the
// rendezvous (rendezvous.h) and every peer's address; the first send to a peer dials
// it (Peer::Dial, a state machine the progress thread drives: connect, hello, the
// peer's acknowledgement), and a rank that accepts a peer's connection dials that peer
// back, so every pair in use holds both directions, as the ring's neighbours do from
// creation (connectPeers).  Per direction there is one socket and one dialler, so the
// two ends never race.
//
// Every message is a frame (transport/wire.h): a FrameHeader, then its payload.  Two
// streams share each socket and are matched separately on the receiving side:
//   * collective frames, keyed by the op's sequence number, matched strictly in order
//     against the receives the op posted (the plan is deterministic on both sides);
//   * point-to-point frames, keyed by the user's tag, matched to the first posted
//     receive with that tag (any order across tags).
// A frame nobody has asked for yet is either stashed (p2p, or a collective of a later
// op) or left in the kernel's socket buffer (a collective of the running op: the
// receive is about to be posted, and not reading is the flow control).  Each
// socket's receive side is a FrameReceiver (transport/receiver.h), a state machine
// whose transitions the engine picks from its queues.
//
// Lengths and keys that arrive from a peer are only compared with what this rank
// expects; payload is written only into buffers this rank posted, up to their size.
// Any failure (a connection lost mid-frame or while something of the peer was expected,
// a corrupt frame, a mismatch, a deadline, a peer that cannot be dialled) fails the
// group (its GroupFailure, group_failure.h, which any other link or the op context may
// fail too): every pending and later request fails with the same reason, no byte is
// read into or written from a user buffer afterwards, and every connected peer is sent
// the reason (an Abort frame) before the sockets close.  Each rank that fails does the
// same, so the news spreads along the ring (whose neighbours are always connected) to
// ranks that never connected to the failed one.
//
// Leaving is not failing.  A peer whose connection closes at a frame boundary while
// nothing of it is expected here (no receive posted from it, no send queued to it) has
// *left* (Presence::kDeparted): its process ended after its last op without a goodbye
// (a script that never calls destroy_process_group, an os._exit).  Nothing breaks:
// what it sent before it closed is still delivered (TCP delivers in order, so every
// frame it wrote was read before the end of stream, and a frame nobody had asked for
// yet waits in the stash), and only a later receive from it or send to it fails, naming
// it (goneFrom).  An op that needs it then fails, and breaks the group as any op error
// does.  A peer killed in the middle of an op is still a failure wherever a receive
// from it is posted (the ring's next rank), and that failure reaches every rank.
//
// The class's definitions live in four rooms: engine.cpp (construction, the API and
// its waits, the progress loop, completions), engine_dial.cpp (connecting on first use:
// dialling, the hello, accepting), engine_failure.cpp (breaking, telling the peers,
// the real cause of a lost connection) and engine_frames.cpp (writing and reading
// sockets, routing headers, the stash, point-to-point matching).
#pragma once

#include <poll.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/errors.h"
#include "transport/group_failure.h"
#include "transport/receiver.h"
#include "transport/rendezvous.h"
#include "transport/request.h"
#include "transport/socket.h"
#include "transport/wire.h"

namespace ringpg {

class Engine {
 public:
  // `listener`, `nonce`, `book`: the rendezvous' (rendezvous.h); no peer is connected yet.
  // `congestion`: TCP congestion control for every data socket, "" = the host's default.
  // `helloWindow`: how long an accepted connection may take to say hello before it is
  // dropped (the group's timeout: a peer's dial can wait behind its Store reads, which at
  // thousands of ranks take seconds; a stray client holds a descriptor no longer), at
  // least kMinHelloWindow: a group made with a shorter timeout still gives a dialling
  // peer that long.
  static constexpr std::chrono::seconds kMinHelloWindow{5};
  // `failure`: the group's failure state (group_failure.h), which the engine reports to
  // and listens on: a failure recorded anywhere stops its traffic and tells its peers.
  Engine(int rank, int size, Rendezvous rv, std::shared_ptr<GroupFailure> failure, int socketBuffer,
         const std::string& congestion, int spinMicros, std::chrono::milliseconds helloWindow = kMinHelloWindow);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Connects `peers` both ways (dials each, and waits for each to dial back) before
  // `deadline`: the links a group's rings use, at its creation.  Throws a network error
  // naming the peers still missing, one of them that left meanwhile, or the failure
  // that broke the engine meanwhile.
  void connectPeers(const std::vector<int>& peers, Deadline deadline);
  // The peers this rank is connected to, in either direction, ascending (its engine
  // sockets: up to twice as many).
  std::vector<int> connectedPeers();

  // Dials `peer` first if no op has used it yet.
  RequestPtr postSend(int peer, const FrameHeader& hdr, const void* data, size_t len,
                      std::function<void(Request&)> onComplete = nullptr);
  // `expect` gives kind and key (and for collectives the fields that must match).
  RequestPtr postRecv(int peer, const FrameHeader& expect, void* data, size_t len,
                      std::function<void(Request&)> onComplete = nullptr);

  // Waits until `req` is no longer pending or `deadline` passes.  Returns false on
  // timeout (the request is still pending); true when done or failed.  For the first
  // spinMicros the caller polls the request's peer itself, yielding between looks,
  // before it sleeps.
  bool waitUntil(const RequestPtr& req, Deadline deadline);

  // The collective the worker is running (`op`: the header its frames carry, any
  // fragment); frames of this op that arrive before their receive is posted wait in
  // the socket instead of being copied aside.
  void setCurrentCollective(const FrameHeader& op);

  // The group's failure state, which this engine reports to and acts on.
  GroupFailure& failure() const { return *failure_; }
  // Waits until the group has failed, or `peer` (when >= 0) has left (goneFrom), or
  // `deadline` passes; false only if the deadline passed first.  For a link that saw a
  // peer's connection fail: the peer states its cause (an Abort frame on its engine
  // socket) before it closes, or its engine socket ends between frames (it left), and
  // the progress thread may be about to read either.
  bool awaitBroken(Deadline deadline, int peer = -1);

  // Why nothing more comes from `peer`, nor is taken by it, if it has left the group
  // (Presence: its goodbye arrived, or its connection closed between frames with
  // nothing of it expected), else "".  The shared-memory ring's and the arena's sends
  // and waits ask, since their data never passes this engine; while no peer has left
  // the answer is one load, no lock.
  std::string goneFrom(int peer);
  bool anyGone() const { return gone_.load(std::memory_order_acquire) != 0; }

  // The TCP congestion control the data sockets run ("" in a group of one).
  std::string congestionControl();

  // Test hook: queues raw bytes (not a frame) on the socket to `peer`, to play a
  // corrupt or hostile peer in tests.  Never used by ringpg itself.
  void debugSendRaw(int peer, std::string bytes);

  // Reads on from `at` in the stream of socket `fd`, whose connection to peer `peer`
  // just failed, for the frames it still had in flight: returns the reason they give
  // (the Abort's reason, or a mismatch with `op`, the op running here, when not null),
  // "" when they give none.  `*network` becomes false for a mismatch; `*remote` true for
  // an Abort (the group failed on `peer` first).  The bytes read are never delivered:
  // the group fails next.  Bounded in time (a peer that is really gone gives
  // end-of-stream at once) and in bytes; takes no lock.  One parser: the receive state
  // machine's (receiver.h), resumed where the live stream stopped.  Static, so that the
  // tests can run it on a socket pair (ringpg._C.cause_of_loss).
  static std::string causeOfLoss(int fd, const FrameReceiver::Position& at, int rank, int peer, const FrameHeader* op,
                                 bool* network, bool* remote);

  // Says goodbye to every peer (so they know the close is orderly) and stops.  A peer
  // whose goodbye came first gets none (it reads nothing more); and from here on a
  // peer that closes without one is taken as leaving too: two ranks that shut down
  // together each hear the other's goodbye, so neither sends the other one.
  void shutdown(Deadline deadline);

 private:
  // Where our socket to a peer stands.  kNone until the first send to the peer (or its
  // first connection to us); then kConnecting while connect() is in progress (polled
  // for POLLOUT), kHello once the hello is written and the peer's one-byte HelloAck is
  // awaited (polled for POLLIN), kOpen when frames may flow.  A dial that fails breaks
  // the engine (dialFailedLocked); a peer that answers kLeaving ends as one that said
  // goodbye.
  enum class Dial : uint8_t { kNone, kConnecting, kHello, kOpen };
  // Whether a peer is still in the group as this rank sees it.  A peer that fails
  // (lost mid-frame or while something of it was expected, corrupt, aborting) has no
  // state of its own: the whole group fails (failure_).  Both gone states are final:
  // the peer's socket is no longer read, and a later receive from it or send to it
  // fails with goneReasonLocked.
  enum class Presence : uint8_t {
    kPresent,  // connected, or not used yet
    kShutDown, // its goodbye came, or it answered our hello as leaving (destroy_process_group)
    kDeparted, // its connection closed between frames with nothing of it expected (departLocked)
  };
  struct Peer {
    Dial dial = Dial::kNone;
    Presence presence = Presence::kPresent;
    Fd txFd, rxFd;                  // our socket to the peer / from the peer (invalid until connected)
    std::deque<RequestPtr> txq;     // sends, written in order; the head may be part-written
    std::deque<RequestPtr> collPosted; // collective receives, matched in order
    std::deque<RequestPtr> p2pPosted;  // p2p receives from this peer, matched by tag
    std::deque<Stashed> collStash;  // collective frames of later ops, in arrival order
    std::deque<Stashed> p2pStash;   // p2p frames nobody has asked for yet
    FrameReceiver rx;               // where rxFd's next bytes go (transport/receiver.h)
    // A thread is inside recv()/send() on this peer's socket with mu_ released.
    // While set, no other thread does I/O on that socket, and the request it reads
    // into / writes from is not failed by others (the I/O thread does it when the
    // syscall returns), so no buffer goes back to its owner while the kernel may
    // still touch it.  rxBusy also makes the holder the only one to touch `rx`.
    bool rxBusy = false;
    bool txBusy = false;
  };
  // The peers' state, made on a peer's first use (a dial, a hello, a queued send or
  // receive): a rank holds a Peer only for the peers its ops have used, so its memory
  // and the progress loop's pass grow with those (two for a ring), not with the group.
  // Guarded by mu_, as the state it holds.
  class PeerTable {
   public:
    // Peer q's state, made now if it had none.
    Peer& operator[](int q) {
      auto& slot = slots_[q];
      if (!slot) {
        slot = std::make_unique<Peer>();
        used_.push_back(q);
      }
      return *slot;
    }
    // Peer q's state, or a never-used peer's (nothing connected, nothing queued).
    const Peer& operator[](int q) const {
      static const Peer kUnused;
      const auto it = slots_.find(q);
      return it != slots_.end() && it->second ? *it->second : kUnused; // null: its making threw
    }
    // The peers with state, in the order of their first use (a loop that may use a new
    // peer iterates a copy).
    const std::vector<int>& used() const { return used_; }

   private:
    std::unordered_map<int, std::unique_ptr<Peer>> slots_;
    std::vector<int> used_;
  };
  using Completions = std::vector<RequestPtr>;
  // A connection accepted from the listener whose hello has not fully arrived.
  struct Inbound {
    Fd fd;
    Hello hello{};
    size_t got = 0; // bytes of `hello` read so far
    Deadline until; // dropped if the hello is not whole by then
  };
  // What a polled descriptor is: a peer's receive socket, its send socket (frames, or
  // a dial in progress), the listener, or inbound_[index].
  enum class Role : uint8_t { kRx, kTx, kDial, kListen, kInbound };
  // The descriptors one pass of the progress loop waits on: the wake-up eventfd
  // first, then sockets, with (peer or inbound index, role) for each in `who`.  Kept
  // across passes so building it allocates nothing once it has grown.
  struct PollSet {
    std::vector<pollfd> fds;
    std::vector<std::pair<int, Role>> who;
    int timeoutMs = -1; // poll()'s: finite while a hello window is open
  };

  // The progress thread: wait for a socket that is ready, move its bytes, repeat.
  void loop();
  // Fills `set` with what is worth waiting for now; false once the engine stops.
  bool collectPollSet(PollSet& set);
  // Moves the bytes of every socket poll() found ready.
  void serviceReady(const PollSet& set);
  // Connection set-up, with mu_ held.  startDialLocked: a non-blocking connect() to
  // peer p; advanceDialLocked: the next step once p's send socket is ready;
  // acceptLocked: takes the listener's new connections; readHelloLocked: reads
  // inbound_[i]'s hello and, when whole and valid, makes it peer's receive socket
  // (and dials that peer back); dialFailedLocked: breaks the engine, naming the peer.
  void startDialLocked(int p, Completions& done);
  void advanceDialLocked(int p, Completions& done);
  void acceptLocked(Completions& done);
  void readHelloLocked(Inbound& in, Completions& done);
  void dialFailedLocked(int p, const std::string& why, Completions& done);
  // A socket this rank could not set up (`what` it was for), not the peer's doing: out
  // of descriptors (`err` EMFILE/ENFILE: the message says so) or memory, an address or
  // socket option refused here.  Breaks the engine.
  void socketFailedHereLocked(const std::string& what, const std::string& why, int err, Completions& done);
  void wake();
  // All helpers below run with mu_ held; readPeer/writePeer release it around the
  // socket syscalls (so one rank's sending and receiving copies run in parallel).
  void readPeer(int p, std::unique_lock<std::mutex>& lk, Completions& done);
  // Decides where the payload of peer p's paused header goes (FrameReceiver's
  // routing transitions), or leaves it paused; fails the group on a bad frame.
  void routeHeader(int p, Completions& done);
  void routeCollective(int p, Completions& done);
  void routeP2P(int p, Completions& done);
  // Reads the paused payload aside: kept (`keep`, FrameReceiver::stash) or dropped
  // (discard), after bounding its length.
  void readAside(int p, bool keep, Completions& done);
  // Takes what the payload that just completed was read for: a receive, a stash, an abort.
  void finishPayload(int p, Completions& done);
  bool writePeer(int p, std::unique_lock<std::mutex>& lk, Completions& done);
  // Without mu_ held: moves what peer p's sockets take or hold right now, never
  // blocking (a waiting thread's turn at the progress thread's work).
  void pollPeer(int p);
  void drainStash(int p, Completions& done);
  // The first receive waiting for p2p tag `tag` from peer p (its own, then any-source).
  RequestPtr takeP2PReceiver(int p, uint64_t tag);
  // Copies a stashed payload into `req` and completes it (or fails it on a size mismatch).
  void deliverStashed(const RequestPtr& req, const Stashed& s, int from, Completions& done);
  bool matchP2PStash(const RequestPtr& req, Completions& done);
  void complete(const RequestPtr& req, Completions& done);
  // The failure path: records the failure with the group (first reason wins) and, the
  // first time the engine sees the group failed, tells every peer; fails every queued
  // request with the group's reason.
  void failLocked(const std::string& reason, Completions& done, bool network = true,
                  BreakCause cause = BreakCause::Local);
  void failRequest(const RequestPtr& req, const std::string& why, Completions& done, bool network = true);
  // Fails `req` with the group's reason (the group has failed).
  void failWithGroupLocked(const RequestPtr& req, Completions& done);
  // The group's listener: a failure recorded anywhere (another link, the op context,
  // abort()) stops this engine's traffic as its own would.
  void onGroupFailed();
  void runCallbacks(Completions& done);
  // Wakes cv_'s waiters (request waits, awaitBroken, connectPeers); without mu_ held.
  void notifyWaiters();
  std::string peerLostReason(int p, const char* how);
  // The connection to p failed (`how`): reads what p still had in flight for the
  // real cause and fails the group with it (see the definition).
  void failLostPeerLocked(int p, const std::string& how, std::unique_lock<std::mutex>& lk, Completions& done);
  // Fails the receives posted for peer P's frames with `why` (P sends nothing more).
  void failPostedLocked(Peer& P, const std::string& why, Completions& done);
  // While leaving: peer p's connection closed; fails what still waits on p (the
  // goodbye to it) and stops reading it, without breaking the engine.
  void endPeerQuietlyLocked(int p, Completions& done);
  // Peer p's connection ended (end of stream) while the group is healthy: p has left
  // if the stream ended at a frame boundary and nothing of p is expected (no receive
  // posted from it, no send queued to it), else it failed (failLostPeerLocked).
  bool leftQuietlyLocked(int p) const;
  // Records that p left (`how`): its socket is read no more, waiters wake (cv_), and
  // goneFrom names it from here on.  Breaks nothing.
  void markGoneLocked(int p, Presence how, Completions& done);
  // What a request that needs p, which has left, fails with ("" while p is present).
  std::string goneReasonLocked(int p) const;
  // Fails the collective receives posted for peer p, which has left, once its stash
  // (what it sent before it left) has been matched.
  void failPostedToGoneLocked(int p, Completions& done);
  void broadcastAbortLocked(const std::string& why);

  const int rank_;
  const int size_;
  const int spinMicros_;
  const std::chrono::milliseconds helloWindow_;
  const int socketBuffer_;       // tuneDataSocket's, for every socket made later
  const std::string congestion_; // likewise
  const uint64_t nonce_;         // what hellos to this rank must quote
  AddressBook book_; // where the peers dialled so far listen (read on first dial)
  PeerTable peers_;
  // The listener and the connections it gave that are still saying hello: the progress
  // thread's alone (it polls, accepts and closes them; under mu_ all the same).
  Fd listener_;
  std::vector<Inbound> inbound_;
  std::deque<RequestPtr> anyPosted_; // p2p receives from any source
  std::vector<std::string> rawKeepAlive_; // buffers of debugSendRaw
  Fd wake_;                           // eventfd that interrupts poll()

  // mu_ guards every field above that changes after construction (queues, receive
  // state, stashes, rawKeepAlive_) and every field below but failure_, gone_ and thread_.
  // It is never held across a blocking call: poll() runs unlocked, and readPeer /
  // writePeer drop it around recv() / send() (rxBusy / txBusy keep the socket theirs).
  std::mutex mu_;
  std::condition_variable cv_; // signalled when any request completes or fails
  // The group's failure state (GroupFailure's lock is taken under mu_, never the other
  // way round).
  const std::shared_ptr<GroupFailure> failure_;
  int failureToken_ = -1;   // this engine's listener on failure_
  // failLocked has run: the engine moves no byte, its queued requests have failed and
  // its peers have the group's reason.  Set under mu_ in the same hold that fails the
  // queues, so code under mu_ that sees it owes nothing more; the group's failed() may
  // turn true before this engine's listener has run, so the engine's own paths ask this.
  bool stopped_ = false;
  std::atomic<int> gone_{0}; // peers no longer kPresent (counted under mu_)
  bool haveCurrent_ = false;
  FrameHeader currentOp_; // valid when haveCurrent_; key = its sequence number
  bool stop_ = false;
  // shutdown() has begun: this rank has finished its ops and is saying goodbye, so a
  // peer that closes now is leaving too, not lost (endPeerQuietlyLocked).
  bool leaving_ = false;
  std::thread thread_;
};

} // namespace ringpg
