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

#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "transport/store_exchange.h"

namespace ringpg {

class Topology {
 public:
  // A group of no ranks until one of the factories below makes one.
  Topology();

  // The topology of ranks whose host identities are `hostIds` (index = rank).
  static Topology fromHosts(const std::vector<std::string>& hostIds);
  // The topology of ranks on hosts numbered by first appearance (hostOf[rank]), whose
  // ranks may run on hostCpus[h] CPUs together (empty where unknown).
  static Topology fromHostIndexes(const std::vector<int>& hostOf, std::vector<int> hostCpus = {});
  // The topology of `size` ranks whose hosts rank 0 published in compact form
  // (encodeHosts).  Groups of one process decoding the same form share its arrays.
  static Topology fromEncoded(const std::string& text, int size);
  // A group of `size` ranks on one host (a group of one; ring = rank order).
  static Topology singleHost(int size, std::vector<int> hostCpus = {});

  int size() const { return static_cast<int>(a_->ring.size()); }
  // How many hosts the group's ranks are on.
  int hosts = 1;
  // The rank's host, numbered by first appearance.
  int hostOf(int rank) const { return a_->hostOf[rank]; }
  // The rank at ring position `pos`, and where `rank` sits on the ring.
  int ringAt(int pos) const { return a_->ring[pos]; }
  int positionOf(int rank) const { return a_->position[rank]; }
  // Ring neighbours of `rank`.
  int left(int rank) const { return ringAt((positionOf(rank) + size() - 1) % size()); }
  int right(int rank) const { return ringAt((positionOf(rank) + 1) % size()); }
  // Neighbours of `rank` on the ring of its host's ranks (ascending, closing from the
  // last to the first): the same as on the group's ring except where the group's ring
  // leaves the host.  `rank` itself when it is alone on its host.
  int hostLeft(int rank) const {
    const auto& rs = ranksOfHost(hostOf(rank));
    return rs[(localIndex(rank) + rs.size() - 1) % rs.size()];
  }
  int hostRight(int rank) const {
    const auto& rs = ranksOfHost(hostOf(rank));
    return rs[(localIndex(rank) + 1) % rs.size()];
  }
  // Ranks on host h.
  int ranksOn(int h) const { return static_cast<int>(a_->hostRanks[h].size()); }
  // The ranks of host h, in ring order (ascending).
  const std::vector<int>& ranksOfHost(int h) const { return a_->hostRanks[h]; }
  // The j-th rank of every host that has one, hosts in order: the ring of local rank j
  // across hosts (the hierarchical collectives' inter-host rings).
  std::vector<int> localRanks(int j) const;
  // Which of its host's ranks `rank` is (0-based, ascending).
  int localIndex(int rank) const { return a_->local[rank]; }
  // K when every host holds K ranks, else 0.
  int ranksPerHost() const { return perHost_; }
  // The most ranks any host holds.
  int mostRanksOnAHost() const { return mostPerHost_; }
  // Whether some host holds two ranks or more (a same-host link exists).
  bool anyHostShared() const;
  // CPUs host h's ranks may run on together (cpusTogether, common/host.h); known in a
  // topology exchangeTopology made, not in one made from host identities alone.
  int cpusOfHost(int h) const;
  // Every rank's host, and the ring order (for the bindings and encodeHosts).
  const std::vector<int>& hostOfEach() const { return a_->hostOf; }
  const std::vector<int>& ringOrder() const { return a_->ring; }
  // How many topologies (groups, and copies in them) share these arrays.
  long holders() const { return a_.use_count(); }

 private:
  // What a topology knows a rank (or host) at a time; immutable once made, so copies of
  // a topology, and groups of one process with the same hosts, share one.  Ranks as
  // threads of one process (torchft's tests, benchmarks/scale_threads.py) would
  // otherwise hold a copy a rank: tens of bytes a rank of the group each.
  struct Arrays {
    std::vector<int> hostOf;                 // hostOf[rank]
    std::vector<int> ring;                   // ring[pos]: the rank at ring position pos
    std::vector<int> position;               // position[rank]: ring's inverse
    std::vector<std::vector<int>> hostRanks; // hostRanks[h]: host h's ranks, ascending (ring order)
    std::vector<int> local;                  // local[rank]: which of its host's ranks it is
    std::vector<int> hostCpus;               // hostCpus[h], or empty where unknown
  };
  // A topology over `arrays`, its counts derived from them.
  explicit Topology(std::shared_ptr<const Arrays> arrays);

  std::shared_ptr<const Arrays> a_;
  int perHost_ = 0;     // K when every host holds K ranks, else 0
  int mostPerHost_ = 0; // the most ranks any host holds
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
