#include "transport/request.h"

#include <c10/util/StringUtil.h>

namespace ringpg {

void markFailed(Request& req, const std::string& why, bool network) {
  req.error = why;
  req.networkError = network;
  req.state.store(Request::State::Failed, std::memory_order_release);
}

void throwRequestError(const OpTag& tag, const Request& req) {
  const std::string msg = c10::str(describe(tag), ": ", req.error);
  if (req.networkError) {
    throwNetwork(msg);
  }
  throwBackend(msg);
}

} // namespace ringpg
