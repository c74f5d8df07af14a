// Pure offset arithmetic of the ring: how a buffer is cut into chunks (one per rank)
// and chunks into pipelined segments, and which chunk a rank sends / receives at
// each ring step.  No I/O, no state: unit-tested exhaustively (tests/test_ring_plan.py).
//
// Conventions (all counts in elements):
//   * chunk c of `count` elements over `parts` ranks is balanced: the first
//     count % parts chunks hold one element more.  Chunks may be empty (count < parts).
//   * every chunk is cut into the same number of segments, so step k's segment j on
//     one rank pairs with step k's segment j on its neighbour; a segment may be empty,
//     and an empty segment is neither sent nor received (both sides compute the same
//     length, so they agree without a message).
//   * ring step k (0-based) of a rank r in a ring of p:
//       sends    chunk (r - k - 1) mod p   to   the right neighbour r + 1,
//       receives chunk (r - k - 2) mod p   from the left neighbour r - 1,
//     so what is received at step k is what is sent at step k + 1, and after the
//     p - 1 reduce steps of a reduce-scatter rank r owns the reduced chunk r.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/cache_line.h"

namespace ringpg {

struct Range {
  int64_t offset = 0;
  int64_t length = 0;
  bool empty() const { return length <= 0; }
};

inline int mod(int64_t a, int64_t m) {
  return static_cast<int>(((a % m) + m) % m);
}

// Chunk c of a balanced split of `count` into `parts`.
inline Range chunkRange(int64_t count, int parts, int c) {
  const int64_t base = count / parts;
  const int64_t rem = count % parts;
  // Chunks before c each hold `base` elements, and min(c, rem) of them one extra.
  return Range{c * base + std::min<int64_t>(c, rem), base + (c < rem ? 1 : 0)};
}

// Segment plan shared by all chunks of one buffer.
struct SegmentPlan {
  int64_t segments = 0; // segments per chunk (0 when count == 0)
  int64_t segElems = 0; // elements per full segment
};

// Largest chunk cut into ceil(maxChunk / maxSegElems) segments of equal size
// (rounded up), so segments are balanced instead of leaving a runt at the end.
inline SegmentPlan segmentPlan(int64_t count, int parts, int64_t maxSegElems) {
  const int64_t maxChunk = (count + parts - 1) / parts;
  if (maxChunk == 0) {
    return SegmentPlan{0, 0};
  }
  const int64_t cap = std::max<int64_t>(1, maxSegElems);
  const int64_t segments = (maxChunk + cap - 1) / cap;
  return SegmentPlan{segments, (maxChunk + segments - 1) / segments};
}

// Segment j of chunk `chunk` (absolute offsets into the buffer).
inline Range segmentRange(const Range& chunk, const SegmentPlan& plan, int64_t j) {
  const int64_t start = std::min(j * plan.segElems, chunk.length);
  const int64_t end = std::min(start + plan.segElems, chunk.length);
  return Range{chunk.offset + start, end - start};
}

inline int ringSendChunk(int rank, int size, int step) {
  return mod(static_cast<int64_t>(rank) - step - 1, size);
}

inline int ringRecvChunk(int rank, int size, int step) {
  return mod(static_cast<int64_t>(rank) - step - 2, size);
}

// Segments cut from one flat buffer (broadcast's chain): segment j of `count`.
inline Range flatSegment(int64_t count, int64_t segElems, int64_t j) {
  const int64_t start = std::min(j * segElems, count);
  return Range{start, std::min(start + segElems, count) - start};
}

inline int64_t flatSegments(int64_t count, int64_t segElems) {
  return count == 0 ? 0 : (count + segElems - 1) / segElems;
}

// Recursive doubling's pairs (direct.h's small allreduce at many ranks) in a group of
// p: m is the largest power of two <= p, and the e = p - m ranks beyond it fold in
// first: each even rank r < 2e hands its buffer to r + 1 and waits for the result.
// The m ranks left are numbered v = r / 2 (odd r < 2e) or r - e (r >= 2e), a numbering
// that keeps rank order, and in the round of `bit` rank v pairs with v ^ bit.
struct RecursiveDoubling {
  int p, m, e;
  explicit RecursiveDoubling(int size) : p(size), m(1), e(0) {
    while (m * 2 <= p) {
      m *= 2;
    }
    e = p - m;
  }
  // The rank `rank` hands its buffer to, or -1 if it takes part in the rounds.
  int foldedInto(int rank) const { return rank < 2 * e && rank % 2 == 0 ? rank + 1 : -1; }
  // The rank whose buffer `rank` takes before the rounds, or -1.
  int foldedFrom(int rank) const { return rank < 2 * e && rank % 2 == 1 ? rank - 1 : -1; }
  int virtualOf(int rank) const { return rank < 2 * e ? rank / 2 : rank - e; }
  int rankOf(int v) const { return v < e ? 2 * v + 1 : v + e; }
  // `rank`'s partner in the round of `bit` (1, 2, 4, ... < m); `rank` takes part.
  int partner(int rank, int bit) const { return rankOf(virtualOf(rank) ^ bit); }
  // Exchanges of the whole buffer on the longest path: log2(m) rounds, and one more
  // for the fold when some ranks fold in.
  int rounds() const {
    int n = e > 0 ? 1 : 0;
    for (int bit = 1; bit < m; bit <<= 1) {
      ++n;
    }
    return n;
  }
};

// Bruck's all-to-all (direct.h) in a group of p.  Each rank holds p blocks; at the
// start its block i (0 <= i < p) is its own data for rank r + i (mod p).  In the round
// of `bit` (1, 2, 4, ... < p) every rank sends the blocks whose index has that bit set
// to rank r + bit and takes the same indices from rank r - bit.  A block of index i thus
// moves by each set bit of i, by i in all, and keeps its index: at the end rank r's
// block i is rank (r - i)'s data for r.  Block 0 never moves.
struct Bruck {
  int p;
  explicit Bruck(int size) : p(size) {}
  // The rank `rank` sends to, and the one it takes from, in the round of `bit`.
  int sendsTo(int rank, int bit) const { return (rank + bit) % p; }
  int takesFrom(int rank, int bit) const { return ((rank - bit) % p + p) % p; }
  // Whose data `rank`'s block `index` is for at the start, and whose it is at the end.
  int destinationOf(int rank, int index) const { return (rank + index) % p; }
  int sourceOf(int rank, int index) const { return ((rank - index) % p + p) % p; }
  // The indices of the blocks that move in the round of `bit`, in increasing order (the
  // order of the blocks in that round's message).
  std::vector<int> movedIn(int bit) const {
    std::vector<int> moved;
    for (int i = bit; i < p; ++i) {
      if ((i & bit) != 0) {
        moved.push_back(i);
      }
    }
    return moved;
  }
  int rounds() const {
    int n = 0;
    for (int bit = 1; bit < p; bit <<= 1) {
      ++n;
    }
    return n;
  }
};

// The host arena's all-to-all round (arena_collectives.h): a member's buffer holds a
// header of two 8-byte sizes a member (what it sends each member, what it expects from
// each), in whole cache lines, then one slot per receiver.
inline size_t arenaAllToAllHeader(int members) {
  const size_t raw = 2 * sizeof(uint64_t) * static_cast<size_t>(std::max(members, 1));
  return (raw + kCacheLine - 1) / kCacheLine * kCacheLine;
}

// Bytes of each receiver's slot in a buffer of `bufferBytes`: an equal share of what the
// header leaves, in whole lines where a line fits (so every slot starts on one); 0 where
// the header leaves nothing, and the links run the op instead (choice.h).
inline size_t arenaAllToAllSlot(size_t bufferBytes, int members) {
  const size_t header = arenaAllToAllHeader(members);
  if (members < 1 || bufferBytes <= header) {
    return 0;
  }
  const size_t slot = (bufferBytes - header) / static_cast<size_t>(members);
  return slot >= kCacheLine ? slot / kCacheLine * kCacheLine : slot;
}

} // namespace ringpg
