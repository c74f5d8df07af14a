// A posted send or receive: what every link (the TCP engine, the shared-memory ring,
// Gloo's pairs) hands back to the op that posted it, and how its failure becomes a
// c10d error.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/errors.h"
#include "transport/wire.h"

namespace ringpg {

class Link; // transport/link.h

// One posted send or receive.  The transport owns it while Pending; the poster keeps
// the buffer alive until it is not Pending any more.
struct Request {
  enum class State : uint8_t { Pending, Done, Failed };
  std::atomic<State> state{State::Pending};
  std::string error;        // set before state becomes Failed
  bool networkError = true; // peer/connection failure (else: mismatch, misuse, timeout)
  FrameHeader hdr;          // send: header to write; receive: the frame expected
  char* buf = nullptr;      // send: source; receive: destination
  size_t len = 0;
  size_t progress = 0;      // bytes moved so far (a send counts its header)
  int peer = -1;            // send: destination; receive: source, -1 = any (p2p only)
  int sourceRank = -1;      // receive: who actually sent it
  // send: the receiver may copy it straight from `buf` (shared memory's single copy);
  // false where it reduces what arrives, which reads a slot faster than a peer's pages.
  bool lendable = true;
  // receive: write the payload with streaming stores, past the caches (reduce.h,
  // copyStreaming), into an output larger than they keep.  A hint: the shared-memory
  // link's copies out of its slots follow it, in the waiting thread that posted it;
  // other links' receives write through the kernel and ignore it.
  bool streaming = false;
  // The transport/link.h Link that posted it, and so the one that waits for it (null:
  // posted on the engine directly, point-to-point).
  Link* link = nullptr;
  std::function<void(Request&)> onComplete; // run by the engine, outside its lock
};
using RequestPtr = std::shared_ptr<Request>;

// A pending request for `len` bytes at `buf` to / from `peer`, with `hdr` (its nbytes
// set to `len`): what a send writes, or what a receive expects.  `R`: a link's own
// Request type, where it keeps more (GlooLink's Work).
template <class R = Request>
std::shared_ptr<R> makeRequest(const FrameHeader& hdr, const void* buf, size_t len, int peer) {
  auto req = std::make_shared<R>();
  req->hdr = hdr;
  req->hdr.nbytes = len;
  req->buf = static_cast<char*>(const_cast<void*>(buf));
  req->len = len;
  req->peer = peer;
  return req;
}

// Ends a pending request with `why` (`network`: a peer/connection failure); the
// state is published last, so a waiter that sees Failed also sees the reason.
void markFailed(Request& req, const std::string& why, bool network);

// Throws the c10d error a failed request stands for (DistNetworkError for a lost
// peer, DistBackendError otherwise), prefixed with the op's description.
[[noreturn]] void throwRequestError(const OpTag& tag, const Request& req);

} // namespace ringpg
