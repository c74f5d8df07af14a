// Every fixed threshold at which ringpg changes how it moves an op: one header, so that
// a reader finds them all in one place and no two files can disagree.  Each has its
// reason in a line; what was measured to set it, with machine and command, is in
// docs/internals.md ("Why these constants").  The settings' defaults (segment size,
// one-shot volume, single copy's message size, ...) are settings, not thresholds: they
// live in the settings table (common/config.h) and docs/configuration.md.
//
// The op's plan (algorithms/choice.h, planOp) is where most of these are asked; the
// transport's own (the slots' size, the probe's margin) are asked at group creation.
#pragma once

#include <cstddef>

namespace ringpg {

// ---- Which algorithm (algorithms/choice.cpp) ----------------------------------------

// Past this many ranks the links' one-shot allreduce (p - 1 peers, each a connection
// made on first use) gives way to recursive doubling's log2(p) peers.
constexpr int kOneShotMostRanks = 8;

// Below this volume (bytes x (ranks - 1): what each member reads of the others) an arena
// allreduce or reduce reduces everything on every member in one step instead of
// reduce-scatter and all-gather in two; other ops take the arena below it at any size.
constexpr size_t kArenaOneShotVolume = 64 * 1024;

// Up to this many bytes (the output) a two-rank all-gather the pair does not take (its
// size class copies through the slots) runs on the arena: its one flag round instead of
// a send and a receive per segment, the same three copies.  Past it the arena's pieces
// cost more than the ring's pipeline (2 MiB: twice the ring's time).
constexpr size_t kArenaPairAllGatherBytes = 512 * 1024;

// Up to this many bytes a two-rank reduce-scatter or all-gather on one host runs on the
// arena (its one round); past it the pair's one message each way, which copies half the
// input where the arena's reduce-scatter copies all of it.
constexpr size_t kArenaPairBytes = 16 * 1024;

// Up to this many bytes a pair's message is copied through the slots whatever its size
// class measured: pinning the sender's pages (single copy) costs more than two copies of
// a message this small.
constexpr size_t kPairCopiedMostBytes = 64 * 1024;

// From this many ranks on one host the arena runs every op of a one-host group, and a
// hierarchical group's host phases: at two, the links' one step over their one link,
// copying once where single copy pays, is already the arena's exchange.
constexpr int kArenaMinRanks = 3;

// From this many ranks all-to-all runs Bruck's rounds under auto: the direct exchange's
// 2(p - 1) sockets would pass the common limit of 1,024 open files a process.
constexpr int kBruckAutoRanks = 512;

// ---- How a device tensor reaches the host (algorithms/choice.cpp) -------------------

// Below this many bytes a device tensor's op stages it whole, before and after: the
// pipeline's streams and events cost more than they hide.
constexpr size_t kStagedMinBytes = 1024 * 1024;

// ---- Lend or copy: single copy against the slots (transport/shm.h) ------------------

// From this many bytes (the op's, as the plan counts them) an op's buffers are taken to
// stream from memory rather than sit in the caches: the group measures single copy for
// each of the two classes apart (transport/link.h, SameHostCopy).
constexpr size_t kStreamingOpBytes = 8 * 1024 * 1024;

// An allreduce's gather segments below this are copied, not lent: the receiver reads
// them back at once, from the slot its own core filled.
constexpr size_t kLentGatherAfterReduce = 256 * 1024;

// A reduce step's segments are lent only in a ring of two whose op moves at least this:
// the receiver reduces them in cache-sized pieces as it reads, writing no slot between.
constexpr size_t kLentReduceFrom = 4 * 1024 * 1024;

// The copy probe picks single copy only where it took less than this share of the
// slots' time: single copy pins the peer's pages on every read, and a few exchanges on
// a busy host tip either way by a little.
constexpr double kSingleCopyClearWin = 0.9;

// ---- Writing past the caches (common/config.cpp, Config::streamFrom) --------------

// Under auto an all-gather streams from half the last-level cache the kernel reports,
// but never from more than this: that cache is shared with every other core of the
// socket (in a VM, with other guests), so an output this large is not kept there
// whatever its reported size.
constexpr size_t kStreamAutoMostBytes = 32 * 1024 * 1024;

// ---- Sizes of the pipeline's units ---------------------------------------------------

// A ring segment is never made smaller than this to reach the ring's segments a chunk:
// below it a segment's fixed cost outweighs the shorter fill and drain.
constexpr size_t kMinSegmentBytes = 64 * 1024;

// A shared-memory slot holds one segment of the configured size, clamped to this range;
// larger segments travel as several fragments.
constexpr size_t kSlotMinBytes = 64 * 1024;
constexpr size_t kSlotMaxBytes = 4 * 1024 * 1024;

} // namespace ringpg
