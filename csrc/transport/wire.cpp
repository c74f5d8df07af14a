#include "transport/wire.h"

#include <c10/core/ScalarType.h>
#include <c10/util/StringUtil.h>

#include <iterator>

#include "common/errors.h"

namespace ringpg {
namespace {

constexpr const char* kSameCollectivesHint =
    ". All ranks must call the same collectives, in the same order, with the same sizes, dtypes and ReduceOps";

// The names of c10d::OpType's values (Work.hpp), by value; torch's opTypeToString
// asserts on a value it does not know, and these bytes come from a peer.
const char* opTypeName(uint8_t opcode) {
  static constexpr const char* kNames[] = {"broadcast",
                                           "allreduce",
                                           "allreduce_coalesced",
                                           "reduce",
                                           "allgather",
                                           "_allgather_base",
                                           "allgather_coalesced",
                                           "gather",
                                           "scatter",
                                           "reduce_scatter",
                                           "alltoall_base",
                                           "alltoall",
                                           "send",
                                           "recv",
                                           "recvanysource",
                                           "barrier",
                                           "_reduce_scatter_base",
                                           "coalesced",
                                           "_allreduce_sparse",
                                           "reduce_scatter_tensor_coalesced",
                                           "allgather_into_tensor_coalesced"};
  if (opcode < std::size(kNames)) {
    return kNames[opcode];
  }
  return opcode == 100 ? "unknown" : nullptr;
}

// c10d::ReduceOp::RedOpType's names, by value (Types.hpp); kNoReduceOp is UNUSED.
const char* reduceOpName(uint8_t op) {
  static constexpr const char* kNames[] = {"SUM",  "AVG", "PRODUCT", "MIN",        "MAX",
                                           "BAND", "BOR", "BXOR",    "PREMUL_SUM", "none"};
  return op < std::size(kNames) ? kNames[op] : nullptr;
}

// "name" when `name` is known, else the byte as a number.
std::string named(const char* name, uint8_t value) {
  return name ? std::string(name) : c10::str("#", int(value));
}

std::string dtypeName(uint8_t dtype) {
  const auto t = static_cast<c10::ScalarType>(dtype);
  return dtype < static_cast<uint8_t>(c10::ScalarType::NumOptions) ? std::string(c10::toString(t))
                                                                   : named(nullptr, dtype);
}

// "op=…, dtype=…, reduce_op=…, op_numel=…": the fields every rank must agree on.
std::string describeOp(const FrameHeader& h) {
  return c10::str("op=", named(opTypeName(h.opcode), h.opcode), ", dtype=", dtypeName(h.dtype),
                  ", reduce_op=", named(reduceOpName(h.reduceOp), h.reduceOp), ", op_numel=", h.opNumel);
}

} // namespace

const char* frameKindName(uint8_t kind) {
  switch (static_cast<FrameKind>(kind)) {
    case FrameKind::Collective:
      return "collective";
    case FrameKind::P2P:
      return "p2p";
    case FrameKind::Bye:
      return "goodbye";
    case FrameKind::Abort:
      return "abort";
  }
  return "unknown";
}

std::string describeFrame(const FrameHeader& h) {
  return c10::str(frameKindName(h.kind), " frame(key=", h.key, ", ", describeOp(h), ", nbytes=", h.nbytes, ")");
}

std::string collectiveMismatch(int rank, int peer, const FrameHeader& expected, const FrameHeader& got) {
  return c10::str("ringpg: collective mismatch between ranks: rank ", rank, " expected ", describeFrame(expected),
                  " from rank ", peer, " but received ", describeFrame(got), kSameCollectivesHint);
}

std::string runningOpMismatch(int rank, int peer, const FrameHeader& op, const FrameHeader& got) {
  return c10::str("ringpg: collective mismatch between ranks: rank ", rank, " runs seq ", op.key, " (", describeOp(op),
                  ") but rank ", peer, " sent ", describeFrame(got), kSameCollectivesHint);
}

std::string p2pSizeMismatch(int rank, int peer, size_t expected, uint64_t tag, uint64_t got) {
  return c10::str(opName("recv"), ": rank ", rank, " expected ", expected, " bytes with tag ", tag, " from rank ", peer,
                  " but the message has ", got, " bytes");
}

} // namespace ringpg
