#include "transport/link.h"

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

} // namespace ringpg
