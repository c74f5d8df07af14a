// What the test seams bound in module.cpp (bindTestSeams) drive, for the tests only:
//   * runInProcess: one collective run by N ranks in one process, a thread each, every
//     rank a RingBackend made over given links (its constructor over GroupLinks) that
//     are loopback links (transport/loopback_link.h): the ring algorithms and the
//     backend's path through them, without sockets or a Store;
//   * EngineProbe: a real Engine (transport/engine.h) listening on loopback, whose peers
//     a test plays through raw sockets: the hello and its refusals, dialling, and the
//     engine's matching of frames to receives.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "transport/engine.h"

namespace ringpg::seams {

struct InProcessOptions {
  std::string reduceOp = "sum"; // sum, product, min, max, band, bor, bxor, avg
  int root = 0;                 // broadcast's and reduce's
  std::string algo = "auto";    // the group's Config::Algo
  int64_t oneShotBytes = -1;    // Config::oneShotBytes; -1 keeps the process's setting
  int64_t segmentBytes = -1;    // Config::segmentBytes; likewise
  int repeat = 1;               // runs of the op, one after another, each on the inputs
  int absentRank = -1;          // a rank that calls nothing (its peers time out), -1: none
  std::chrono::milliseconds timeout{10000}; // the group's op timeout
};

struct InProcessResult {
  std::vector<at::Tensor> outputs;  // by rank: the last run's result (undefined where it failed)
  std::vector<std::string> errors;  // by rank: "" where every run succeeded (or it was absent), else the first error
  std::string algorithm;            // what rank 0's group chose for the op (RingBackend::algorithmFor)
  double seconds = 0;               // wall time of the runs, the groups' creation aside
};

// Runs `op` (allreduce, reduce_scatter, all_gather, broadcast, reduce) on ranks
// 0..inputs.size()-1, rank r with inputs[r] (contiguous CPU tensors; reduce_scatter's
// numel a multiple of the ranks).  Every rank's op ends by the timeout.
InProcessResult runInProcess(const std::string& op, const std::vector<at::Tensor>& inputs, const InProcessOptions& o);

// An Engine of rank `rank` in a group of `size`, listening on 127.0.0.1; peer q listens
// at addrs[q] and its hellos quote nonces[q] (this rank's entries are its own).  Frame
// headers come and go as 32-byte strings (wire.h's FrameHeader).  One caller thread at
// a time.
class EngineProbe {
 public:
  EngineProbe(int rank, int size, const std::vector<std::string>& addrs, const std::vector<uint64_t>& nonces,
              uint64_t nonce);
  ~EngineProbe();
  const std::string& address() const { return address_; }
  uint64_t nonce() const { return nonce_; }

  // Posts a send of `payload` to `peer` with header `hdr` (its nbytes becomes the
  // payload's length); the request's id.
  int64_t postSend(int peer, const std::string& hdr, const std::string& payload);
  // Posts a receive of `nbytes` from `peer` (-1: any source, point-to-point only) that
  // expects `hdr`; the request's id.
  int64_t postRecv(int peer, const std::string& hdr, size_t nbytes);
  // Waits up to `timeout` for request `id`: (state: pending, done or failed; its error;
  // what a receive holds; the rank it came from, -1 for a send).
  std::tuple<std::string, std::string, std::string, int> wait(int64_t id, std::chrono::milliseconds timeout);
  void setCurrentCollective(const std::string& hdr);
  void connectPeers(const std::vector<int>& peers, std::chrono::milliseconds timeout);
  Engine& engine() { return *engine_; }

 private:
  struct Posted {
    RequestPtr req;
    std::vector<char> buffer; // the send's payload or the receive's destination
  };
  std::string address_;
  uint64_t nonce_;
  int64_t nextId_ = 0;
  std::map<int64_t, std::unique_ptr<Posted>> posted_; // declared before the engine: outlives it
  std::unique_ptr<Engine> engine_;
};

} // namespace ringpg::seams
