// The Store steps of a group's set-up, written once: every set-up step that must hear
// from every rank (addresses, settings, host identities, shared-memory regions and
// their verdicts) goes through allGatherValues, and a step whose ranks may fail
// leaves through leaveTogether.
//
// Round trips.  A rank's part of one exchange is a constant number of Store calls,
// whatever the group's size: it sets its value, counts itself in, and reads back one
// key holding every rank's value, which the last rank to arrive gathered (one
// multiGet) and published.  The Store's host therefore serves O(N) requests per
// exchange, not the O(N^2) of every rank reading every other's key.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <string>
#include <vector>

#include "transport/socket.h" // Deadline

namespace ringpg {

// Every rank of a group of `size` publishes `mine` under `key` and gets all ranks'
// values, indexed by rank.  Collective: every rank calls it with the same `key` (a
// key of this group's namespace, used once).  Waits as the Store's get() does.
std::vector<std::string> allGatherValues(c10d::Store& store, const std::string& key, int rank, int size,
                                         const std::string& mine);

// Every rank of a group of `size` adds one to `key` and waits until all have (or
// `deadline` passes; a store gone meanwhile means its host has been and left): a step
// after which ranks that all raise may do so without pulling the store from under a
// slower one.
void leaveTogether(c10d::Store& store, const std::string& key, int size, Deadline deadline);

// The one-value encoding of a list of byte strings: each as its length in decimal,
// ':', then its bytes.  Pure, for the tests.
std::string packValues(const std::vector<std::string>& values);
// The inverse; TORCH_CHECK-fails on a malformed string or a count other than `count`.
std::vector<std::string> unpackValues(const std::string& packed, size_t count);

} // namespace ringpg
