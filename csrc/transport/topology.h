// Which ranks of a group share a host, and the ring order that follows from it.
//
// Each rank publishes its host identity under the group's keys; rank 0 reads them all
// and publishes the hosts in a compact form (encodeHosts) that every rank decodes into
// the same Topology, so both ends of every link decide alike.
// Hosts are numbered by first appearance in rank order, and the ring visits the ranks
// of one host one after another (ascending), host after host: whatever order the
// launcher gave the ranks, the ring crosses each host boundary once per direction.
//   hosts of ranks 0..3:  A B A B   ->  ring 0 2 1 3  (0->2 and 1->3 stay on a host)
#pragma once

#include <string>
#include <vector>

#include "common/config.h"
#include "transport/store_exchange.h"

namespace ringpg {

struct Topology {
  std::vector<int> hostOf;   // hostOf[rank]: the rank's host, numbered by first appearance
  std::vector<int> ring;     // ring[pos]: the rank at ring position pos
  std::vector<int> position; // position[rank]: where the rank sits on the ring (ring's inverse)
  int hosts = 1;
  // Derived once in fromHosts (the collectives read them on every op):
  std::vector<std::vector<int>> hostRanks; // hostRanks[h]: host h's ranks, ascending (ring order)
  std::vector<int> local;                  // local[rank]: which of its host's ranks it is
  int perHost = 0;                         // K when every host holds K ranks, else 0
  int mostPerHost = 0;                     // the most ranks any host holds
  // hostCpus[h]: CPUs host h's ranks may run on together (cpusTogether, common/host.h);
  // filled by exchangeTopology, empty in a topology made from host identities alone.
  std::vector<int> hostCpus;

  // The topology of ranks whose host identities are `hostIds` (index = rank).
  static Topology fromHosts(const std::vector<std::string>& hostIds);
  // The topology of ranks on hosts numbered by first appearance (hostOf[rank]).
  static Topology fromHostIndexes(const std::vector<int>& hostOf);
  // A group of `size` ranks on one host (a group of one; ring = rank order).
  static Topology singleHost(int size);

  int size() const { return static_cast<int>(ring.size()); }
  // Ring neighbours of `rank`.
  int left(int rank) const { return ring[(position[rank] + size() - 1) % size()]; }
  int right(int rank) const { return ring[(position[rank] + 1) % size()]; }
  // Neighbours of `rank` on the ring of its host's ranks (ascending, closing from the
  // last to the first): the same as on the group's ring except where the group's ring
  // leaves the host.  `rank` itself when it is alone on its host.
  int hostLeft(int rank) const {
    const auto& rs = hostRanks[hostOf[rank]];
    return rs[(local[rank] + rs.size() - 1) % rs.size()];
  }
  int hostRight(int rank) const {
    const auto& rs = hostRanks[hostOf[rank]];
    return rs[(local[rank] + 1) % rs.size()];
  }
  // Ranks on host h.
  int ranksOn(int h) const { return static_cast<int>(hostRanks[h].size()); }
  // The ranks of host h, in ring order (ascending).
  const std::vector<int>& ranksOfHost(int h) const { return hostRanks[h]; }
  // The j-th rank of every host that has one, hosts in order: the ring of local rank j
  // across hosts (the hierarchical collectives' inter-host rings).
  std::vector<int> localRanks(int j) const;
  // Which of its host's ranks `rank` is (0-based, ascending).
  int localIndex(int rank) const { return local[rank]; }
  // K when every host holds K ranks, else 0.
  int ranksPerHost() const { return perHost; }
  // The most ranks any host holds.
  int mostRanksOnAHost() const { return mostPerHost; }
  // Whether some host holds two ranks or more (a same-host link exists).
  bool anyHostShared() const;
};

// A group's host identity under its settings: cfg.hostId (RINGPG_HOSTID, or the
// group's host_id), else hostname, kernel boot id and network namespace (ranks the
// benchmark's network emulation puts in namespaces of their own stand for separate hosts).
std::string hostIdentity(const Config& cfg);

// The compact form of a group's hosts: the host of each rank (numbered by first
// appearance) and the CPUs each host's ranks may run on together.  Constant in size for
// the layouts launchers make, host by host in blocks of K ("blocks K": torchrun's
// --nproc-per-node) or cyclically ("cyclic H"), a list of N otherwise ("list h0 h1 ...");
// then ";every C" (each host's ranks share C CPUs) or ";each c0 c1 ...".  Pure, for the tests.
std::string encodeHosts(const std::vector<int>& hostOf, const std::vector<int>& hostCpus);
// The inverse, for a group of `size`; TORCH_CHECK-fails on a malformed form.
void decodeHosts(const std::string& text, int size, std::vector<int>* hostOf, std::vector<int>* hostCpus);

// Collective over the group: publishes this rank's host identity (under `cfg`) and CPU
// share (cpuShareText); rank 0 decides the hosts and every rank reads its compact form
// (the store's own timeout bounds each read).
Topology exchangeTopology(GroupStore& store, int rank, int size, const Config& cfg);

} // namespace ringpg
