#include "algorithms/arena_collectives.h"

#include <c10/util/irange.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "algorithms/ring_plan.h"
#include "common/errors.h"
#include "transport/arena.h"

namespace ringpg {
namespace {

// dst[0, n) = src[0] op src[1] op ... op src[last], in member order (reduceInOrder),
// each operand `offset` bytes into its member's buffer of this round.
void reduceMembers(const OpContext& c, RedOp op, char* dst, size_t offset, int64_t n, size_t es) {
  const HostArena& a = *c.arena();
  std::vector<const char*> srcs(a.members());
  for (const auto m : c10::irange(a.members())) {
    srcs[m] = a.buffer(m) + offset;
  }
  reduceInOrder(c.dtype(), op, dst, srcs, n, es);
}

// Member m is group rank m where the whole group shares one host, the only groups whose
// rooted ops run in the arena (choice.h; a group across hosts has one a host, which
// only the hierarchical host phases use).
int memberOfRank(const HostArena& a, int rank) {
  TORCH_INTERNAL_ASSERT(rank >= 0 && rank < a.members() && a.rankOf(rank) == rank,
                        "ringpg: the host arena's members are the group's ranks in order");
  return rank;
}

// The host phases' rounds: chunks (chunkRange) differ by at most one element, the
// first the longest, so its length counts the rounds on every member alike.
int64_t longestChunk(int64_t count, int members) {
  return chunkRange(count, members, 0).length;
}

// Elements [o, o + piece) of chunk q of `count` over `members`: where they start in the
// whole, and how many there are (0 past the chunk's end).
Range chunkPart(int64_t count, int members, int q, int64_t o, int64_t piece) {
  const Range chunk = chunkRange(count, members, q);
  return Range{chunk.offset + o, std::clamp<int64_t>(chunk.length - o, 0, piece)};
}

} // namespace

int64_t arenaPieceElems(size_t bufferBytes, size_t elemSize, int parts) {
  int64_t n = static_cast<int64_t>(bufferBytes / (elemSize * static_cast<size_t>(std::max(parts, 1))));
  // Whole lines, so that pieces (and a member's blocks of one) start on a line.
  if (kCacheLine % elemSize == 0) {
    const auto perLine = static_cast<int64_t>(kCacheLine / elemSize);
    if (n >= perLine) {
      n = n / perLine * perLine;
    }
  }
  return std::max<int64_t>(n, 1);
}

int64_t arenaPieceFor(const OpContext& c, bool reduceScatter, size_t elemSize) {
  const HostArena& a = *c.arena();
  return arenaPieceElems(a.bufferBytes(), elemSize, reduceScatter ? a.members() : 1);
}

void arenaAllreduce(OpContext& c, char* data, int64_t count, size_t es, RedOp op, const Finalize& finalize,
                    bool oneShot, const ArenaHooks& hooks) {
  HostArena& a = *c.arena();
  const int members = a.members();
  const int me = a.me();
  const int64_t piece = arenaPieceFor(c, /*reduceScatter=*/false, es);
  for (int64_t o = 0; o < count; o += piece) {
    const int64_t n = std::min(piece, count - o);
    char* at = data == nullptr ? nullptr : data + static_cast<size_t>(o) * es; // null: direct staging
    if (hooks.awaitPiece) {
      hooks.awaitPiece(o / piece);
    }
    a.beginRound();
    if (hooks.fillOwn) {
      TORCH_INTERNAL_ASSERT(!oneShot && data == nullptr, "ringpg: the arena's direct staging is two-step");
      hooks.fillOwn(a.buffer(me), o, n);
    } else {
      std::memcpy(a.buffer(me), at, static_cast<size_t>(n) * es);
    }
    c.arenaStep(/*firstOfRound=*/true);
    if (oneShot) {
      // Every member the whole piece, in member order: the same bits everywhere.
      reduceMembers(c, op, at, 0, n, es);
      if (finalize) {
        finalize(at, n);
      }
      if (hooks.onFinal) {
        hooks.onFinal(o, n);
      }
      continue;
    }
    // Reduce-scatter: this member's slice of the piece, over every buffer, into the
    // caller's buffer (its own buffer is an operand of the other elements still)...
    const Range mine = chunkRange(n, members, me);
    const size_t mineBytes = static_cast<size_t>(mine.length) * es;
    // (With direct staging there is no host copy of the data: a scratch area instead.)
    char* out = hooks.takeOut ? c.scratch(mineBytes) : at + static_cast<size_t>(mine.offset) * es;
    reduceMembers(c, op, out, static_cast<size_t>(mine.offset) * es, mine.length, es);
    if (finalize && mine.length > 0) {
      finalize(out, mine.length);
    }
    // ...then published in its place in our buffer, which only we read there: the
    // other members read their own slices of it.
    std::memcpy(a.buffer(me) + static_cast<size_t>(mine.offset) * es, out, mineBytes);
    c.arenaStep(/*firstOfRound=*/false);
    if (hooks.takeOut) {
      // Every slice, ours too, straight from the buffers.
      for (const auto q : c10::irange(members)) {
        const Range r = chunkRange(n, members, q);
        if (!r.empty()) {
          hooks.takeOut(a.buffer(q) + static_cast<size_t>(r.offset) * es, o + r.offset, r.length);
        }
      }
      continue;
    }
    // All-gather: every other member's slice.
    for (const auto q : c10::irange(members)) {
      if (q == me) {
        continue;
      }
      const Range r = chunkRange(n, members, q);
      const size_t off = static_cast<size_t>(r.offset) * es;
      std::memcpy(at + off, a.buffer(q) + off, static_cast<size_t>(r.length) * es);
    }
    if (hooks.onFinal) {
      hooks.onFinal(o, n); // the whole piece at once: one copy back, not one a slice
    }
  }
}

void arenaReduceScatter(OpContext& c, const char* input, char* output, int64_t chunkCount, size_t es, RedOp op,
                        const Finalize& finalize, const ArenaHooks& hooks) {
  HostArena& a = *c.arena();
  const int members = a.members();
  const int me = a.me();
  const int64_t piece = arenaPieceFor(c, /*reduceScatter=*/true, es);
  for (int64_t o = 0; o < chunkCount; o += piece) {
    const int64_t n = std::min(piece, chunkCount - o);
    const size_t block = static_cast<size_t>(n) * es;
    if (hooks.awaitPiece) {
      hooks.awaitPiece(o / piece);
    }
    a.beginRound();
    // Block q of our buffer: our contribution to member q's chunk at [o, o + n).
    char* mine = a.buffer(me);
    if (hooks.fillOwn) {
      hooks.fillOwn(mine, o, n);
    } else {
      for (const auto q : c10::irange(members)) {
        std::memcpy(mine + q * block, input + static_cast<size_t>(q * chunkCount + o) * es, block);
      }
    }
    c.arenaStep(/*firstOfRound=*/true);
    char* out = output + static_cast<size_t>(o) * es;
    reduceMembers(c, op, out, static_cast<size_t>(me) * block, n, es);
    if (finalize) {
      finalize(out, n);
    }
    if (hooks.onFinal) {
      hooks.onFinal(o, n);
    }
  }
}

void arenaAllGather(OpContext& c, const char* input, char* output, int64_t chunkCount, size_t es, bool streaming,
                    const ArenaHooks& hooks) {
  HostArena& a = *c.arena();
  const int members = a.members();
  const int me = a.me();
  const int64_t piece = arenaPieceFor(c, /*reduceScatter=*/false, es);
  for (int64_t o = 0; o < chunkCount; o += piece) {
    const int64_t n = std::min(piece, chunkCount - o);
    const size_t len = static_cast<size_t>(n) * es;
    a.beginRound();
    if (hooks.fillOwn) {
      hooks.fillOwn(a.buffer(me), o, n);
      c.arenaStep(/*firstOfRound=*/true);
      for (const auto q : c10::irange(members)) {
        hooks.takeOut(a.buffer(q), q * chunkCount + o, n);
      }
      continue;
    }
    const char* in = input + static_cast<size_t>(o) * es;
    std::memcpy(a.buffer(me), in, len);
    c.arenaStep(/*firstOfRound=*/true);
    for (const auto q : c10::irange(members)) {
      char* dst = output + static_cast<size_t>(q * chunkCount + o) * es;
      const char* src = q == me ? in : a.buffer(q);
      if (dst != src) { // the input may be this member's chunk of the output
        copyMaybeStreaming(dst, src, len, streaming);
      }
      if (hooks.onFinal) {
        hooks.onFinal(q * chunkCount + o, n);
      }
    }
  }
}

void arenaBroadcast(OpContext& c, char* data, size_t nbytes, int root) {
  HostArena& a = *c.arena();
  const int from = memberOfRank(a, root);
  const size_t piece = a.bufferBytes();
  for (size_t o = 0; o < nbytes; o += piece) {
    const size_t n = std::min(piece, nbytes - o);
    a.beginRound();
    if (a.me() == from) {
      std::memcpy(a.buffer(from), data + o, n);
    }
    c.arenaStep(/*firstOfRound=*/true, root);
    if (a.me() != from) {
      std::memcpy(data + o, a.buffer(from), n);
    }
  }
}

void arenaReduce(OpContext& c, const char* input, char* result, int64_t count, size_t es, RedOp op,
                 const Finalize& finalize, int root, bool oneShot) {
  HostArena& a = *c.arena();
  const int members = a.members();
  const int me = a.me();
  const bool atRoot = me == memberOfRank(a, root);
  const int64_t piece = arenaPieceElems(a.bufferBytes(), es, 1);
  for (int64_t o = 0; o < count; o += piece) {
    const int64_t n = std::min(piece, count - o);
    const size_t at = static_cast<size_t>(o) * es;
    a.beginRound();
    std::memcpy(a.buffer(me), input + at, static_cast<size_t>(n) * es);
    c.arenaStep(/*firstOfRound=*/true, root);
    if (oneShot) {
      if (atRoot) {
        reduceMembers(c, op, result + at, 0, n, es);
        if (finalize) {
          finalize(result + at, n);
        }
      }
      continue;
    }
    // As allreduce's reduce-scatter; then the root alone gathers the slices.
    const Range mine = chunkRange(n, members, me);
    const size_t off = static_cast<size_t>(mine.offset) * es;
    const size_t len = static_cast<size_t>(mine.length) * es;
    char* out = atRoot ? result + at + off : c.scratch(len);
    reduceMembers(c, op, out, off, mine.length, es);
    if (finalize && mine.length > 0) {
      finalize(out, mine.length);
    }
    if (!atRoot) {
      std::memcpy(a.buffer(me) + off, out, len);
    }
    c.arenaStep(/*firstOfRound=*/false);
    if (atRoot) {
      for (const auto q : c10::irange(members)) {
        if (q != me) {
          const Range r = chunkRange(n, members, q);
          const size_t qoff = static_cast<size_t>(r.offset) * es;
          std::memcpy(result + at + qoff, a.buffer(q) + qoff, static_cast<size_t>(r.length) * es);
        }
      }
    }
  }
}

void arenaGather(OpContext& c, const char* input, size_t nbytes, const std::vector<char*>& outputs, int root) {
  HostArena& a = *c.arena();
  const int from = memberOfRank(a, root);
  const bool atRoot = a.me() == from;
  const size_t piece = a.bufferBytes();
  for (size_t o = 0; o < nbytes; o += piece) {
    const size_t n = std::min(piece, nbytes - o);
    a.beginRound();
    std::memcpy(a.buffer(a.me()), input + o, n);
    c.arenaStep(/*firstOfRound=*/true, root);
    if (atRoot) {
      for (const auto q : c10::irange(a.members())) {
        std::memcpy(outputs[q] + o, q == from ? input + o : a.buffer(q), n);
      }
    }
  }
}

void arenaScatter(OpContext& c, const std::vector<const char*>& inputs, char* output, size_t nbytes, int root) {
  HostArena& a = *c.arena();
  const int members = a.members();
  const int from = memberOfRank(a, root);
  const int me = a.me();
  // The root's buffer holds a block for every member; whole lines, at least one byte.
  const size_t piece = std::max<size_t>(1, a.bufferBytes() / members / kCacheLine * kCacheLine);
  for (size_t o = 0; o < nbytes; o += piece) {
    const size_t n = std::min(piece, nbytes - o);
    a.beginRound();
    if (me == from) {
      for (const auto q : c10::irange(members)) {
        std::memcpy(a.buffer(me) + q * piece, inputs[q] + o, n);
      }
    }
    c.arenaStep(/*firstOfRound=*/true, root);
    std::memcpy(output + o, me == from ? inputs[me] + o : a.buffer(from) + me * piece, n);
  }
}

namespace {

// The send blocks of an all_to_all, each as sent: a block that an output block overlaps
// (an in-place call) would be overwritten before all of it is sent, the rounds writing
// received parts while later parts still wait, so such a block is sent from a copy
// (held in `copies`).  Block by block: the blocks of the list form are tensors of their
// own, anywhere in memory.
std::vector<const char*> sendBlocksApart(const std::vector<const char*>& sendBuf, const std::vector<size_t>& sendBytes,
                                         const std::vector<char*>& recvBuf, const std::vector<size_t>& recvBytes,
                                         std::vector<std::vector<char>>& copies) {
  const size_t members = sendBuf.size();
  const auto overlapsAnOutput = [&](size_t q) {
    const auto lo = reinterpret_cast<uintptr_t>(sendBuf[q]);
    for (const auto p : c10::irange(members)) {
      const auto at = reinterpret_cast<uintptr_t>(recvBuf[p]);
      if (recvBytes[p] > 0 && lo < at + recvBytes[p] && at < lo + sendBytes[q]) {
        return true;
      }
    }
    return false;
  };
  std::vector<const char*> send = sendBuf;
  copies.assign(members, {});
  for (const auto q : c10::irange(members)) {
    if (sendBytes[q] > 0 && overlapsAnOutput(q)) {
      copies[q].assign(sendBuf[q], sendBuf[q] + sendBytes[q]);
      send[q] = copies[q].data();
    }
  }
  return send;
}

// After the first round's step: every member reads every member's sizes (the start of
// its buffer: [send to q..., receive from q...]), so each reaches the same verdict.
// Fails the group where a pair disagrees; else the rounds the largest block needs.
size_t allToAllRounds(OpContext& c, const HostArena& a, size_t slot) {
  const int members = a.members();
  uint64_t largest = 0;
  for (const auto s : c10::irange(members)) {
    const auto* sent = reinterpret_cast<const uint64_t*>(a.buffer(s));
    for (const auto d : c10::irange(members)) {
      const uint64_t expected = reinterpret_cast<const uint64_t*>(a.buffer(d))[members + s];
      if (s != d && sent[d] != expected) {
        const std::string why =
            c10::str("ringpg: collective mismatch between ranks: rank ", a.rankOf(d), " expected ", expected,
                     " bytes from rank ", a.rankOf(s), ", which sent ", sent[d],
                     ": the ranks disagree on the split sizes (a rank's output split for a peer must equal that "
                     "peer's input split for it)");
        c.failGroup(why);
        throwBackend(c10::str(describe(c.tag()), ": ", why));
      }
      largest = std::max(largest, s == d ? 0 : sent[d]);
    }
  }
  return std::max<size_t>(1, (static_cast<size_t>(largest) + slot - 1) / slot);
}

} // namespace

void arenaAllToAll(OpContext& c, const std::vector<const char*>& sendBuf, const std::vector<size_t>& sendBytes,
                   const std::vector<char*>& recvBuf, const std::vector<size_t>& recvBytes) {
  HostArena& a = *c.arena();
  const int members = a.members();
  const int me = a.me();
  const size_t header = arenaAllToAllHeader(members);
  const size_t slot = arenaAllToAllSlot(a.bufferBytes(), members);
  TORCH_INTERNAL_ASSERT(slot > 0, "ringpg: all_to_all chose an arena too small for its header");
  std::vector<std::vector<char>> copies;
  const std::vector<const char*> send = sendBlocksApart(sendBuf, sendBytes, recvBuf, recvBytes, copies);
  // The part [r * slot, (r + 1) * slot) of a block of `total` bytes: its length, 0 past its end.
  const auto partOf = [slot](size_t total, size_t r) {
    return total > r * slot ? std::min(slot, total - r * slot) : 0;
  };
  size_t rounds = 1; // known after the first round's sizes
  for (size_t r = 0; r < rounds; ++r) {
    a.beginRound();
    char* mine = a.buffer(me);
    if (r == 0) {
      auto* sizes = reinterpret_cast<uint64_t*>(mine); // [send to q..., receive from q...]
      for (const auto q : c10::irange(members)) {
        sizes[q] = sendBytes[q];
        sizes[members + q] = recvBytes[q];
      }
    }
    for (const auto q : c10::irange(members)) {
      if (const size_t n = partOf(sendBytes[q], r); q != me && n > 0) {
        std::memcpy(mine + header + q * slot, send[q] + r * slot, n);
      }
    }
    c.arenaStep(/*firstOfRound=*/true);
    if (r == 0) {
      rounds = allToAllRounds(c, a, slot);
    }
    for (const auto q : c10::irange(members)) {
      if (const size_t n = partOf(recvBytes[q], r); q != me && n > 0) {
        std::memcpy(recvBuf[q] + r * slot, a.buffer(q) + header + me * slot, n);
      }
    }
  }
  // This member's own block, last: once the sizes agreed, and after the output blocks it
  // may overlap were written (it went from a copy then).
  if (sendBytes[me] > 0 && recvBuf[me] != send[me]) {
    std::memmove(recvBuf[me], send[me], sendBytes[me]);
  }
}

void arenaHostReduceScatter(OpContext& c, const char* input, char* output, int64_t count, size_t es, RedOp op) {
  HostArena& a = *c.arena();
  const int members = a.members();
  const int me = a.me();
  const int64_t piece = arenaPieceFor(c, /*reduceScatter=*/true, es); // of each chunk, a block a member
  const size_t block = static_cast<size_t>(piece) * es;
  for (int64_t o = 0; o < longestChunk(count, members); o += piece) {
    a.beginRound();
    for (const auto q : c10::irange(members)) {
      const Range part = chunkPart(count, members, q, o, piece);
      std::memcpy(a.buffer(me) + q * block, input + static_cast<size_t>(part.offset) * es,
                  static_cast<size_t>(part.length) * es);
    }
    c.arenaStep(/*firstOfRound=*/true);
    const Range mine = chunkPart(count, members, me, o, piece);
    reduceMembers(c, op, output + static_cast<size_t>(mine.offset) * es, static_cast<size_t>(me) * block, mine.length,
                  es);
  }
}

void arenaHostAllGather(OpContext& c, char* data, int64_t count, size_t es) {
  HostArena& a = *c.arena();
  const int members = a.members();
  const int me = a.me();
  const int64_t piece = arenaPieceFor(c, /*reduceScatter=*/false, es);
  for (int64_t o = 0; o < longestChunk(count, members); o += piece) {
    a.beginRound();
    const Range mine = chunkPart(count, members, me, o, piece);
    std::memcpy(a.buffer(me), data + static_cast<size_t>(mine.offset) * es, static_cast<size_t>(mine.length) * es);
    c.arenaStep(/*firstOfRound=*/true);
    for (const auto q : c10::irange(members)) {
      if (q != me) {
        const Range part = chunkPart(count, members, q, o, piece);
        std::memcpy(data + static_cast<size_t>(part.offset) * es, a.buffer(q), static_cast<size_t>(part.length) * es);
      }
    }
  }
}

void arenaBarrier(OpContext& c) {
  c.arena()->beginRound();
  c.arenaStep(/*firstOfRound=*/true);
}

bool arenaEveryMemberSays(OpContext& c, bool mine) {
  HostArena& a = *c.arena();
  a.beginRound();
  *a.buffer(a.me()) = mine ? 1 : 0;
  c.arenaStep(/*firstOfRound=*/true);
  for (const auto m : c10::irange(a.members())) {
    if (*a.buffer(m) != 1) {
      return false;
    }
  }
  return true;
}

} // namespace ringpg
