// Collectives whose data moves between fixed pairs rather than around the ring:
// gather to a root, scatter from a root, and all-to-all.  Every receive is posted
// before any send, and sends go out in ring-distance order (the peer d steps to the
// right first) so no two ranks start by sending to the same peer.
#pragma once

#include <vector>

#include "algorithms/context.h"

namespace ringpg {

// Root receives `nbytes` from every rank q into outputs[q] (its own slot is copied).
void gatherTo(OpContext& c, int root, const char* input, size_t nbytes, const std::vector<char*>& outputs);

// Root sends inputs[q] (`nbytes` each) to every rank q; each rank's lands in `output`.
void scatterFrom(OpContext& c, int root, const std::vector<const char*>& inputs, char* output, size_t nbytes);

// Rank sends sendBuf[q] (sendBytes[q]) to q and receives recvBuf[q] (recvBytes[q]) from q.
void allToAll(OpContext& c, const std::vector<const char*>& sendBuf, const std::vector<size_t>& sendBytes,
              const std::vector<char*>& recvBuf, const std::vector<size_t>& recvBytes);

} // namespace ringpg
