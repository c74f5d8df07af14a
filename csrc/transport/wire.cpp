#include "transport/wire.h"

#include <c10/util/StringUtil.h>

#include "common/errors.h"

namespace ringpg {
namespace {

constexpr const char* kSameCollectivesHint =
    ". All ranks must call the same collectives, in the same order, with the same sizes and dtypes";

} // namespace

const char* frameKindName(uint8_t kind) {
  switch (static_cast<FrameKind>(kind)) {
    case FrameKind::Collective: return "collective";
    case FrameKind::P2P: return "p2p";
    case FrameKind::Bye: return "goodbye";
    case FrameKind::Abort: return "abort";
  }
  return "unknown";
}

std::string describeFrame(const FrameHeader& h) {
  return c10::str(frameKindName(h.kind), " frame(key=", h.key, ", op=", int(h.opcode), ", dtype=",
                  int(h.dtype), ", op_numel=", h.opNumel, ", nbytes=", h.nbytes, ")");
}

std::string collectiveMismatch(int rank, int peer, const FrameHeader& expected, const FrameHeader& got) {
  return c10::str("ringpg: collective mismatch between ranks: rank ", rank, " expected ", describeFrame(expected),
                  " from rank ", peer, " but received ", describeFrame(got), kSameCollectivesHint);
}

std::string runningOpMismatch(int rank, int peer, const FrameHeader& op, const FrameHeader& got) {
  return c10::str("ringpg: collective mismatch between ranks: rank ", rank, " runs seq ", op.key,
                  " (op=", int(op.opcode), ", dtype=", int(op.dtype), ", op_numel=", op.opNumel, ") but rank ",
                  peer, " sent ", describeFrame(got), kSameCollectivesHint);
}

std::string p2pSizeMismatch(int rank, int peer, size_t expected, uint64_t tag, uint64_t got) {
  return c10::str(opName("recv"), ": rank ", rank, " expected ", expected, " bytes with tag ", tag, " from rank ",
                  peer, " but the message has ", got, " bytes");
}

} // namespace ringpg
