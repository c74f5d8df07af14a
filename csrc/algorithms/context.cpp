#include "algorithms/context.h"

#include <c10/util/StringUtil.h>

#include <chrono>

namespace ringpg {

FrameHeader OpContext::header() const {
  FrameHeader h;
  h.kind = static_cast<uint8_t>(FrameKind::Collective);
  h.opcode = opcode_;
  h.dtype = static_cast<uint8_t>(dtype_);
  h.key = tag_.seq;
  h.opNumel = opNumel_;
  return h;
}

RequestPtr OpContext::send(int peer, const void* data, size_t nbytes) {
  return engine_.postSend(peer, header(), data, nbytes);
}

RequestPtr OpContext::recv(int peer, void* data, size_t nbytes) {
  return engine_.postRecv(peer, header(), data, nbytes);
}

void OpContext::wait(const RequestPtr& req) {
  if (!engine_.waitUntil(req, deadline_)) {
    const bool isSend = req->hdr.kind == static_cast<uint8_t>(FrameKind::Collective) && req->progress > 0;
    const std::string msg = c10::str(
        describe(tag_), ": timed out waiting for rank ", req->peer, " (", req->len, "-byte ",
        isSend ? "send" : "transfer", " pending); the op's deadline (the group's timeout) has passed. "
        "The peer may be stuck, stopped, or calling a different collective.");
    engine_.fail(msg); // later ops fail at once with this cause
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

char* OpContext::scratch(size_t bytes) {
  if (scratch_.size() < bytes) {
    scratch_.resize(bytes);
  }
  return scratch_.data();
}

} // namespace ringpg
