// A group's links, connected: the set-up RingBackend runs once and then serves ops over.
//
// connectGroup runs every collective step of a group's creation, in order: this rank's
// address published (rendezvous.h), the settings every rank must share (ranks that
// differ fail here, every one, naming the setting), the host topology (topology.h), the
// engine and its connections to the peers the algorithms' rings use (the caller says
// which; other peers are connected on first use, engine.h), the shared-memory links
// (shm.h), the host arena (arena.h) and, for the gloo transport, Gloo's pairs
// (gloo_link.h, through the factory the bindings install).  Each step reads from the
// Store only the values this rank needs and rank 0's decisions (store_exchange.h).
// What it returns is complete and never rewired: the link each peer's frames take is
// decided here, once.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "transport/arena.h"
#include "transport/engine.h"
#include "transport/gloo_link.h"
#include "transport/link.h"
#include "transport/shm.h"
#include "transport/store_exchange.h"
#include "transport/topology.h"

namespace ringpg {

struct GroupLinks {
  // The group's failure state (group_failure.h): first, so that it outlives every link
  // that reports to it or listens on it.
  std::shared_ptr<GroupFailure> failure = std::make_shared<GroupFailure>();
  std::string localAddress; // where this rank listens
  // This group's keys in its Store ("ringpg/<instance>/") and their traffic; null in the
  // in-process tests' groups.
  std::shared_ptr<GroupStore> store;
  // Declared before the engine, so destroyed after it: the group's failure listener
  // wakes the Gloo link's waits.
  std::unique_ptr<GlooLink> gloo; // the gloo transport: every collective frame; else null
  std::unique_ptr<Engine> engine; // the group's sockets and control channel
  Topology topology;              // who shares a host; the ring order
  std::unique_ptr<EngineLink> engineLink;
  // A link made outside connectGroup and owned with the group: the in-process tests'
  // (transport/loopback_link.h); null in a connected group.  Declared after the engine,
  // so destroyed before it.
  std::unique_ptr<Link> given;
  std::unique_ptr<ShmLink> shm; // this rank's shared-memory links, or null
  // This rank's host's arena (the whole group's on one host; its host's, for the
  // hierarchical host phases, in a group across hosts), or null.
  std::unique_ptr<HostArena> arena;
  std::string arenaWhyNot; // why a group whose algorithms would use one has none ("" otherwise)
  int shmSpinMicros = 0;        // how long waits on shm spin (Config::shmSpinMicros)
  bool shmSpinYields = false;   // ...yielding the CPU on every look (more ranks than CPUs)
  // The links collectives move over, the same words on every rank: "gloo", "shm" (one
  // host), "shm+tcp" (shared memory within hosts, the engine between), "tcp".
  std::string transport;
  LinkTable links; // where each peer's collective frames go
};

// What the algorithms need of a group of this topology, which connectGroup sets up:
//   peers:     the peers a rank's algorithms exchange with (symmetric: q is in rank's
//              iff rank is in q's), connected at creation;
//   hostArena: whether each host's ranks share a host arena (a function of facts every
//              rank agrees on: the topology and the shared settings), so that every rank
//              takes part in its making, or none does;
//   sameHostLinks: whether any op can use the same-host links, given whether the arena
//              was made (agreed on every rank): where not, they are not mapped and single
//              copy is not measured.
struct GroupPlan {
  std::function<std::vector<int>(const Topology&)> peers;
  std::function<bool(const Topology&)> hostArena;
  std::function<bool(const Topology&, bool arena)> sameHostLinks;
};

// Connects this rank's part of a group of `size` on `store` (collective: every rank
// calls it alike), within `timeout`.  `cfg`: the process's settings with the group's
// algorithm; `transport`: what the group was asked for; `plan`: the algorithms' peers of
// this rank, connected at creation (every peer under RINGPG_TUNING connect=all; the
// others on first use), and whether hosts share an arena.
std::unique_ptr<GroupLinks> connectGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                         std::chrono::milliseconds timeout, const Config& cfg,
                                         Config::Transport transport, const GroupPlan& plan);

} // namespace ringpg
