// Tuning knobs, read once from RINGPG_* environment variables (documented in README).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ringpg {

struct Config {
  // Bytes per pipelined ring segment (RINGPG_SEGMENT_BYTES).
  size_t segmentBytes = 512 * 1024;
  // Allreduce of at most this many bytes x (world size - 1) uses the one-shot
  // exchange instead of the ring (RINGPG_ONESHOT_BYTES; 0 disables it).
  size_t oneShotBytes = 256 * 1024;
  // Receive segments posted ahead of the one being reduced (RINGPG_RECV_WINDOW).
  int recvWindow = 4;
  // SO_SNDBUF / SO_RCVBUF for data sockets; 0 keeps the kernel's autotuning (RINGPG_SOCKET_BUFFER).
  int socketBuffer = 0;
  // Microseconds a waiting thread spins before it sleeps (RINGPG_SPIN_US).
  int spinMicros = 0;
  // Same-host groups may use the shared-memory ring (RINGPG_TRANSPORT=auto, the
  // default); RINGPG_TRANSPORT=tcp keeps every byte on TCP.
  bool shmAllowed = true;
  // Interface to bind (RINGPG_SOCKET_IFNAME, else GLOO_SOCKET_IFNAME); empty = hostname.
  std::string ifname;

  static const Config& get();
  std::string summary() const;
};

} // namespace ringpg
