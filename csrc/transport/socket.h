// Thin helpers over POSIX TCP sockets: an owning fd, addresses, the listener the
// rendezvous opens, and the options the engine sets on the sockets it dials and accepts.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <string>

namespace ringpg {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// Owns one file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void reset();

 private:
  int fd_ = -1;
};

// An IPv4/IPv6 socket address, printable as "host:port" / "[host]:port".
struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;
  std::string str() const;
  static SockAddr parse(const std::string& s); // inverse of str()
};

// The address this process binds to: the IPv4/IPv6 address of interface `ifname`
// when given, else the first address of this host's name that can be bound, else
// loopback (Gloo's choice order).
SockAddr chooseBindAddress(const std::string& ifname);

// Listening socket on `addr` with an ephemeral port; `addr` gets the real port.
Fd listenOn(SockAddr& addr, int backlog);

// Data-socket options: TCP_NODELAY, optional buffer sizes, and the congestion control
// `congestion` unless it is empty (throws as checkCongestionControl does).
void tuneDataSocket(int fd, int bufferBytes, const std::string& congestion);

// TCP congestion control (RINGPG_TUNING tcp_congestion).  Throws, naming the setting, the
// cause and what the host offers, when `name` cannot be set here: a module that is not
// loaded, or one outside net.ipv4.tcp_allowed_congestion_control for a process without
// CAP_NET_ADMIN.  Tried on a throwaway socket, so a group fails before it connects.
void checkCongestionControl(const std::string& name);
// The algorithm socket `fd` runs; "" if the kernel does not say.
std::string congestionControlOf(int fd);
void setNonBlocking(int fd, bool on);

} // namespace ringpg
