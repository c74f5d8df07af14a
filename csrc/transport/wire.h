// The wire format both transports share: what a frame is, how one is described in an
// error, and when a frame that arrived is not the one this rank expected.
//
// Every message is a frame: a 32-byte FrameHeader, then `nbytes` of payload.  The TCP
// engine (transport/engine.h) writes header and payload to a socket; the shared-memory
// ring (transport/shm.h) copies the same header into every slot fragment of a message.
// The layout is fixed (static_assert below): both ends of a link are the same build on
// the same kind of host, so fields travel in host byte order, as in Gloo's pairs.
//
// Lengths and keys that arrive from a peer are never trusted: they are only compared
// with what this rank expects (sameCollective / ofSameOp), and a disagreement is a
// *mismatch* between the ranks' programs, reported by the messages below.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ringpg {

enum class FrameKind : uint8_t {
  Collective = 1, // payload of a collective, keyed by sequence number
  P2P = 2,        // payload of a send, keyed by tag
  Bye = 3,        // orderly shutdown: the connection closes next, and that is fine
  Abort = 4,      // the sender's group failed; payload: the reason (at most kMaxAbortBytes)
};

// Longest reason an Abort frame carries.
constexpr uint64_t kMaxAbortBytes = 4096;

constexpr uint32_t kFrameMagic = 0x31475052; // "RPG1"

// FrameHeader::reduceOp of an op that does not reduce: c10d::ReduceOp::UNUSED
// (static_assert in algorithms/context.h).
constexpr uint8_t kNoReduceOp = 9;

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint8_t kind = 0;     // FrameKind (a byte as received: may hold any value)
  uint8_t opcode = 0;   // collective: c10d::OpType of the op (mismatch diagnostics)
  uint8_t dtype = 0;    // collective: c10::ScalarType of the op
  uint8_t reduceOp = kNoReduceOp; // collective: c10d::ReduceOp::RedOpType, or kNoReduceOp
  uint64_t key = 0;     // collective: sequence number; p2p: tag
  uint64_t opNumel = 0; // collective: the op's element count as the sender sees it
  uint64_t nbytes = 0;  // payload bytes after the header
};
static_assert(sizeof(FrameHeader) == 32, "FrameHeader is a wire format");

// A header of kind `k`, every other field at its default.
inline FrameHeader frameOfKind(FrameKind k) {
  FrameHeader h;
  h.kind = static_cast<uint8_t>(k);
  return h;
}

inline bool hasKind(const FrameHeader& h, FrameKind k) {
  return h.kind == static_cast<uint8_t>(k);
}

// "collective", "p2p", "goodbye", "abort", or "unknown" for a byte no FrameKind has.
const char* frameKindName(uint8_t kind);
// "<kind> frame(key=…, op=…, dtype=…, reduce_op=…, op_numel=…, nbytes=…)", for error
// messages, with names for the op, dtype and ReduceOp (numbers for bytes no name has).
std::string describeFrame(const FrameHeader& h);

// Does `got` (any fragment) belong to the op whose header is `op`?  The payload length
// differs between fragments, everything else must not.
inline bool ofSameOp(const FrameHeader& op, const FrameHeader& got) {
  return op.key == got.key && op.opcode == got.opcode && op.dtype == got.dtype && op.reduceOp == got.reduceOp &&
         op.opNumel == got.opNumel;
}

// A collective frame belongs to the receive posted for it only if every field agrees.
inline bool sameCollective(const FrameHeader& expected, const FrameHeader& got) {
  return ofSameOp(expected, got) && expected.nbytes == got.nbytes;
}

// Rank `rank` posted a receive for `expected` from `peer`, which sent `got` instead.
std::string collectiveMismatch(int rank, int peer, const FrameHeader& expected, const FrameHeader& got);
// Rank `rank` runs the op `op` (its receive from `peer` not posted yet) and `peer`
// sent a frame with the op's sequence number but another op, dtype, ReduceOp or size.
std::string runningOpMismatch(int rank, int peer, const FrameHeader& op, const FrameHeader& got);
// A p2p receive for `expected` bytes with tag `tag` met a message of `got` bytes.
std::string p2pSizeMismatch(int rank, int peer, size_t expected, uint64_t tag, uint64_t got);

} // namespace ringpg
