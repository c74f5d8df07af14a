// What the engine's rooms share (engine.cpp: the API, waits and the progress loop;
// engine_dial.cpp: connecting on first use; engine_failure.cpp: failure and its cause;
// engine_frames.cpp: sending, receiving, routing and matching frames): the messages
// more than one of them writes.  Private to transport/engine*.cpp.
#pragma once

#include <c10/util/StringUtil.h>

#include <cerrno>
#include <string>

namespace ringpg::engine_detail {

inline std::string abortedBy(int peer, const std::string& why) {
  return c10::str("ringpg: rank ", peer, " aborted the group: ", why);
}

inline std::string shutDownBy(int peer) {
  return c10::str("ringpg: rank ", peer, " has shut down this process group (Connection closed by peer)");
}

// Why a request that needs `peer` fails once `peer` has left without a goodbye
// (Engine::Presence::kDeparted).  "Connection closed by peer", gloo's words, is what
// torchft and scripts match on, as for a lost connection.
inline std::string departedFrom(int rank, int peer) {
  return c10::str("ringpg: rank ", rank, " needs rank ", peer, ", which left the group: its connection closed ",
                  "between frames with nothing of it in flight (Connection closed by peer; its process exited without ",
                  "destroy_process_group, or crashed or was killed)");
}

// A non-blocking socket call that found nothing to do (or was interrupted): try later.
inline bool wouldBlock(int err) {
  return err == EAGAIN || err == EWOULDBLOCK || err == EINTR;
}

} // namespace ringpg::engine_detail
