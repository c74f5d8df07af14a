#include "transport/link.h"

#include <algorithm>

namespace ringpg {

RequestPtr EngineLink::postSend(int peer, const FrameHeader& op, const void* data, size_t len) {
  RequestPtr req = engine_.postSend(peer, op, data, len);
  req->link = this; // read only by the posting thread, which also waits
  return req;
}

RequestPtr EngineLink::postRecv(int peer, const FrameHeader& op, void* data, size_t len) {
  RequestPtr req = engine_.postRecv(peer, op, data, len);
  req->link = this;
  return req;
}

bool EngineLink::waitUntil(const RequestPtr& req, Deadline deadline) {
  return engine_.waitUntil(req, deadline);
}

bool LinkTable::waitUntil(const RequestPtr& req, Deadline deadline) const {
  Link* link = req->link;
  if (driven != nullptr && link != driven) {
    // Nothing else posts on `driven` while this thread waits, so once it is empty the
    // wait can block on `link` alone.  A broken group leaves the reporting to `link`.
    while (driven->hasQueued() && !failure->failed()) {
      driven->progress();
      const Deadline slice = std::min(deadline, Clock::now() + kDriveSlice);
      if (link->waitUntil(req, slice)) {
        return true;
      }
      if (Clock::now() >= deadline) {
        return false;
      }
    }
  }
  return link->waitUntil(req, deadline);
}

} // namespace ringpg
