// Settings, read once per process from the environment (docs/configuration.md): eight
// RINGPG_* variables a user may need, and RINGPG_TUNING, one expert variable of
// comma-separated key=value items for everything else (its keys are named below by
// "tuning key").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/thresholds.h"

namespace ringpg {

struct Config {
  // Bytes per pipelined ring segment (tuning key segment_bytes).
  size_t segmentBytes = 512 * 1024;
  // Allreduce of at most this many bytes x (world size - 1) uses the one-shot
  // exchange instead of the ring (tuning key oneshot_bytes; 0 disables it).
  size_t oneShotBytes = 256 * 1024;
  // Receive segments posted ahead of the one being reduced (tuning key recv_window); unset,
  // kGlooRecvWindow over Gloo's pairs, where a send moves only once its receive is
  // posted (the pair's recv-ready notice), so a deeper window keeps more on the wire
  // (docs/internals.md, "Why these constants").
  int recvWindow = 4;
  bool recvWindowSet = false;
  static constexpr int kGlooRecvWindow = 16;
  // `sendWaitsForReceive`: the link's (Link::sendWaitsForReceive).
  int recvWindowFor(bool sendWaitsForReceive) const {
    return sendWaitsForReceive && !recvWindowSet ? kGlooRecvWindow : recvWindow;
  }
  // SO_SNDBUF / SO_RCVBUF for data sockets; 0 keeps the kernel's autotuning (tuning key socket_buffer).
  int socketBuffer = 0;
  // Reduce-scatter's full-size buffer of partial sums is kept between ops while it
  // needs at most this many bytes (tuning key work_cache_bytes; 0: allocated per op).
  size_t workCacheBytes = 256 * 1024 * 1024;
  // A hierarchical collective of a larger buffer moves in pieces of about this many
  // bytes, the host rings of one piece running while another crosses the network
  // (tuning key hier_piece_bytes; 0: one piece, no overlap; algorithms/hierarchical.h).
  size_t hierPieceBytes = 2 * 1024 * 1024;
  // Bytes of each of a rank's two buffers in its group's host arena (RINGPG_ARENA_BYTES,
  // rounded up to whole pages; 0: no arena).  A group of N ranks on one host reserves
  // N x 2 x this in /dev/shm; larger buffers move large messages in fewer rounds.
  size_t arenaBytes = 1024 * 1024;
  // Same-host messages of at least this many bytes go by single copy (cross-memory
  // attach, transport/shm.h) where every rank may read its neighbour's memory
  // (RINGPG_CMA_BYTES; 0: never, two copies through the slots).  Unset, the group
  // also measures at creation whether single copy beats the slots on this host, and
  // keeps the slots where it does not (ShmLink::connect); set, it is taken as asked.
  size_t cmaBytes = 64 * 1024;
  bool cmaBytesSet = false;
  // Which ops lend those messages, by the op's bytes (tuning key cma_op_bytes): ops
  // from this size by single copy, smaller ones through the slots; this rank's sends
  // only, and nothing is measured.  kCmaOpAuto (unset, "auto"): each size class of op
  // as the group measured it (transport/link.h, SameHostCopy), or every op where
  // RINGPG_CMA_BYTES is set.  RINGPG_CMA_BYTES=0 turns single copy off whatever this says.
  static constexpr int64_t kCmaOpAuto = -1;
  int64_t cmaOpBytes = kCmaOpAuto;
  // An all-gather whose output holds at least this many bytes writes its chunks into it
  // with streaming stores, past the caches (reduce.h, copyStreaming): tuning key
  // stream_bytes (0: never); unset or "auto" (kStreamAuto), autoStreamFrom of this host's
  // last-level cache (streamFrom()).
  static constexpr int64_t kStreamAuto = -1;
  int64_t streamBytes = kStreamAuto;
  // The output size from which all-gather streams; 0: never.
  size_t streamFrom() const;
  // auto's threshold for a last-level cache of `cacheBytes`: half of it, at most
  // kStreamAutoMostBytes; 0 (never) where its size is unknown (0).
  static size_t autoStreamFrom(size_t cacheBytes);
  // Whether an output of `outputBytes` is written past the caches (streamFrom).
  bool streams(size_t outputBytes) const {
    const size_t from = streamFrom();
    return from > 0 && outputBytes >= from;
  }
  // Microseconds a waiting thread spins before it sleeps (tuning key spin_us); kSpinAuto:
  // shared-memory waits spin kAutoShmSpinMicros, TCP waits do not spin (see
  // shmSpinMicros(); where a host's ranks outnumber its CPUs the spin yields the CPU on
  // every look: transport/connect.cpp).
  static constexpr int kSpinAuto = -1;
  static constexpr int kAutoShmSpinMicros = 100;
  int spinMicros = kSpinAuto;
  // Which link carries each hop of the ring (RINGPG_TRANSPORT), chosen per link:
  //   Auto (the default): shared memory between ring neighbours on one host
  //        (transport/shm.h), ringpg's TCP engine between hosts; a group that cannot
  //        set shared memory up keeps every link on TCP;
  //   Shm  the same, but a group that cannot set shared memory up is refused;
  //   Tcp  every byte on the engine;
  //   Gloo the collectives' data over Gloo's TCP pairs (transport/gloo_link.h), the
  //        engine keeping control and point-to-point.
  // (Between hosts auto keeps the engine, not Gloo's pairs: it held more of an emulated
  // link; docs/internals.md, "Why these constants".)
  enum class Transport : uint8_t { Auto, Shm, Tcp, Gloo };
  Transport transport = Transport::Auto;
  static const char* transportName(Transport t);
  // The Transport named `name` (auto, shm, tcp, gloo); `what` names the setting in the error.
  static Transport transportNamed(const std::string& name, const char* what);
  // Which algorithms the group runs (RINGPG_ALGO; algorithms/choice.h decides per op):
  // Auto takes the host arena (transport/arena.h) where every rank shares one host and
  // it pays, the hierarchical algorithms (algorithms/hierarchical.h) where the group
  // spans several hosts holding the same number (> 1) of its ranks each, else the flat
  // ring; Ring always the links' algorithms of one flat ring (no arena is made); Hier
  // the hierarchical ones wherever hosts hold equal numbers of ranks (no arena);
  // Arena the arena for every op and size it serves (else as Auto).
  enum class Algo : uint8_t { Auto, Ring, Hier, Arena };
  Algo algo = Algo::Auto;
  static const char* algoName(Algo a);
  // The Algo named `name` (auto, ring, hier, arena); `what` names the setting in the error.
  static Algo algoNamed(const std::string& name, const char* what);
  // Which peers a group connects to at creation (tuning key connect): Lazy (the default)
  // only its rings' neighbours, every other peer on first use (transport/engine.h);
  // All every peer, the full mesh, as groups did before connections were lazy.  Ranks
  // may differ: a peer dialled by an "all" rank dials it back.
  enum class Connect : uint8_t { Lazy, All };
  Connect connect = Connect::Lazy;
  static const char* connectName(Connect c);
  // How all-to-all moves its blocks (tuning key alltoall):
  //   Direct: to every peer straight (direct.h), each byte sent once, but a rank
  //           talks to, and so connects to, all p - 1 peers (2(p - 1) sockets);
  //   Bruck:  ceil(log2 p) rounds with one peer each way per round (direct.h), each
  //           block forwarded once per set bit of its distance (log2(p)/2 times its
  //           bytes on average), O(log p) peers;
  //   Auto (the default): Bruck from kBruckAutoRanks (common/thresholds.h) ranks on, where the direct
  //           exchange's 2(p - 1) sockets would pass the common limit of 1,024 open
  //           files a process, else Direct.
  // The choice depends on the group's size only, never on this rank's splits (ranks
  // of one all-to-all may see uniform and uneven splits alike), so every rank makes it
  // alike; the setting must be the same on every rank (transport/connect.cpp).
  enum class AllToAll : uint8_t { Auto, Direct, Bruck };
  AllToAll allToAll = AllToAll::Auto;
  static const char* allToAllName(AllToAll a);
  // Whether a group of `size` ranks runs Bruck's all-to-all.
  bool bruckAllToAll(int size) const {
    return allToAll == AllToAll::Bruck || (allToAll == AllToAll::Auto && size >= kBruckAutoRanks);
  }
  // TCP congestion control of data sockets (tuning key tcp_congestion); empty keeps the
  // host's default (its network namespace's net.ipv4.tcp_congestion_control).
  std::string tcpCongestion;
  // Interface to bind (RINGPG_SOCKET_IFNAME, else GLOO_SOCKET_IFNAME); empty = hostname.
  std::string ifname;
  // This process's host identity (RINGPG_HOSTID, as NCCL_HOSTID): ranks with equal
  // identities are taken to share a host (memory, kernel); empty: hostname, kernel boot
  // id and network namespace (transport/topology.h).
  std::string hostId;
  // Directory each rank writes its per-step timeline to (RINGPG_TRACE, common/trace.h);
  // empty: no tracing.
  std::string traceDir;

  // Spin of waits on the TCP engine: the setting, or none under kSpinAuto.
  int engineSpinMicros() const { return spinMicros == kSpinAuto ? 0 : spinMicros; }
  // Spin of waits on shared memory (the links and the arena): the setting, else
  // kAutoShmSpinMicros.  On a host whose ranks outnumber its CPUs the spin yields on
  // every look rather than pause, so a queued rank runs; sleeping at once instead cost
  // a futex wake-up per wait (docs/internals.md, "Why these constants").
  int shmSpinMicros() const { return spinMicros == kSpinAuto ? kAutoShmSpinMicros : spinMicros; }

  // Which compiled copy of the reduction kernels runs (tuning key reduce_isa; reduce.h):
  // empty or "auto", the best this CPU runs.
  std::string reduceIsa;

  static const Config& get();
  // The defaults with RINGPG_TUNING's `text` applied (what a process with that variable,
  // and no other, would read): for tests and tools, through the bindings.
  static Config withTuning(const std::string& text);
  // Every tuning key with its effective value, as the INFO line prints it.
  std::vector<std::pair<std::string, std::string>> tuningValues() const;
  std::string summary() const;
};

} // namespace ringpg
