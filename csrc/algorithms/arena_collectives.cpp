#include "algorithms/arena_collectives.h"

#include <c10/util/irange.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/ring_plan.h"
#include "transport/arena.h"

namespace ringpg {
namespace {

constexpr size_t kLine = 64;

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

// Names the op's algorithm in its trace (RINGPG_TRACE), as choice.h names it.
void traceAs(const OpContext& c, bool oneShot) {
  if (c.trace()) {
    c.trace()->algorithm = oneShot ? "arena_oneshot" : "arena";
  }
}

// Member m is group rank m: the arena is made for groups on one host (arena.h).
int memberOfRank(const HostArena& a, int rank) {
  TORCH_INTERNAL_ASSERT(rank >= 0 && rank < a.members() && a.rankOf(rank) == rank,
                        "ringpg: the host arena's members are the group's ranks in order");
  return rank;
}

} // namespace

int64_t arenaPieceElems(size_t bufferBytes, size_t elemSize, int parts) {
  int64_t n = static_cast<int64_t>(bufferBytes / (elemSize * static_cast<size_t>(std::max(parts, 1))));
  // Whole lines, so that pieces (and a member's blocks of one) start on a line.
  if (kLine % elemSize == 0) {
    const auto perLine = static_cast<int64_t>(kLine / elemSize);
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
  traceAs(c, oneShot);
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
  traceAs(c, false);
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

void arenaAllGather(OpContext& c, const char* input, char* output, int64_t chunkCount, size_t es,
                    const ArenaHooks& hooks) {
  traceAs(c, false);
  HostArena& a = *c.arena();
  const int members = a.members();
  const int me = a.me();
  const int64_t piece = arenaPieceFor(c, /*reduceScatter=*/false, es);
  // An output the caches cannot keep is written past them (Config::streamFrom).
  const size_t streamFrom = c.config().streamFrom();
  const bool streaming = streamFrom > 0 && static_cast<size_t>(chunkCount) * members * es >= streamFrom;
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
  traceAs(c, false);
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
  traceAs(c, oneShot);
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
  traceAs(c, false);
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
  traceAs(c, false);
  HostArena& a = *c.arena();
  const int members = a.members();
  const int from = memberOfRank(a, root);
  const int me = a.me();
  // The root's buffer holds a block for every member; whole lines, at least one byte.
  const size_t piece = std::max<size_t>(1, a.bufferBytes() / members / kLine * kLine);
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

void arenaBarrier(OpContext& c) {
  traceAs(c, false);
  c.arena()->beginRound();
  c.arenaStep(/*firstOfRound=*/true);
}

} // namespace ringpg
