#include "transport/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace ringpg {

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = o.release();
  }
  return *this;
}

Fd::~Fd() {
  reset();
}

int Fd::release() {
  int f = fd_;
  fd_ = -1;
  return f;
}

void Fd::reset() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

std::string SockAddr::str() const {
  char host[NI_MAXHOST] = {0};
  char port[NI_MAXSERV] = {0};
  int rc = ::getnameinfo(reinterpret_cast<const sockaddr*>(&storage), len, host, sizeof(host), port, sizeof(port),
                         NI_NUMERICHOST | NI_NUMERICSERV);
  TORCH_CHECK(rc == 0, "ringpg: getnameinfo failed: ", gai_strerror(rc));
  if (storage.ss_family == AF_INET6) {
    return c10::str("[", host, "]:", port);
  }
  return c10::str(host, ":", port);
}

SockAddr SockAddr::parse(const std::string& s) {
  std::string host, port;
  if (!s.empty() && s[0] == '[') {
    auto close = s.find(']');
    TORCH_CHECK(close != std::string::npos && close + 1 < s.size() && s[close + 1] == ':', "ringpg: bad peer address '",
                s, "'");
    host = s.substr(1, close - 1);
    port = s.substr(close + 2);
  } else {
    auto colon = s.rfind(':');
    TORCH_CHECK(colon != std::string::npos, "ringpg: bad peer address '", s, "'");
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
  }
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  TORCH_CHECK(rc == 0 && res, "ringpg: bad peer address '", s, "': ", gai_strerror(rc));
  SockAddr a;
  std::memcpy(&a.storage, res->ai_addr, res->ai_addrlen);
  a.len = res->ai_addrlen;
  ::freeaddrinfo(res);
  return a;
}

namespace {

bool canBind(const sockaddr* sa, socklen_t len) {
  Fd fd(::socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    return false;
  }
  sockaddr_storage copy{};
  std::memcpy(&copy, sa, len);
  // Port 0: we only ask whether the address is local.
  if (copy.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&copy)->sin_port = 0;
  } else {
    reinterpret_cast<sockaddr_in6*>(&copy)->sin6_port = 0;
  }
  return ::bind(fd.get(), reinterpret_cast<sockaddr*>(&copy), len) == 0;
}

SockAddr fromInterface(const std::string& ifname) {
  ifaddrs* list = nullptr;
  TORCH_CHECK(::getifaddrs(&list) == 0, "ringpg: getifaddrs failed: ", std::strerror(errno));
  SockAddr out;
  for (ifaddrs* it = list; it; it = it->ifa_next) {
    if (!it->ifa_addr || ifname != it->ifa_name) {
      continue;
    }
    const int fam = it->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) {
      continue;
    }
    const socklen_t len = fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    // Prefer IPv4 (what Gloo does); take IPv6 only if nothing else is found.
    if (out.len == 0 || (fam == AF_INET && out.storage.ss_family != AF_INET)) {
      std::memcpy(&out.storage, it->ifa_addr, len);
      out.len = len;
    }
  }
  ::freeifaddrs(list);
  TORCH_CHECK(out.len != 0, "ringpg: network interface '", ifname,
              "' (RINGPG_SOCKET_IFNAME / GLOO_SOCKET_IFNAME) has no IPv4/IPv6 address");
  return out;
}

SockAddr fromHostname() {
  char name[256] = {0};
  if (::gethostname(name, sizeof(name) - 1) == 0) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_family = AF_UNSPEC;
    addrinfo* res = nullptr;
    if (::getaddrinfo(name, nullptr, &hints, &res) == 0) {
      for (addrinfo* it = res; it; it = it->ai_next) {
        if ((it->ai_family == AF_INET || it->ai_family == AF_INET6) && canBind(it->ai_addr, it->ai_addrlen)) {
          SockAddr a;
          std::memcpy(&a.storage, it->ai_addr, it->ai_addrlen);
          a.len = it->ai_addrlen;
          ::freeaddrinfo(res);
          return a;
        }
      }
      ::freeaddrinfo(res);
    }
  }
  SockAddr lo;
  auto* in = reinterpret_cast<sockaddr_in*>(&lo.storage);
  in->sin_family = AF_INET;
  in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  lo.len = sizeof(sockaddr_in);
  return lo;
}

} // namespace

SockAddr chooseBindAddress(const std::string& ifname) {
  return ifname.empty() ? fromHostname() : fromInterface(ifname);
}

Fd listenOn(SockAddr& addr, int backlog) {
  Fd fd(::socket(addr.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  TORCH_CHECK(fd.valid(), "ringpg: socket() failed: ", std::strerror(errno));
  if (addr.storage.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&addr.storage)->sin_port = 0;
  } else {
    reinterpret_cast<sockaddr_in6*>(&addr.storage)->sin6_port = 0;
  }
  TORCH_CHECK(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr.storage), addr.len) == 0, "ringpg: cannot bind ",
              addr.str(), ": ", std::strerror(errno));
  TORCH_CHECK(::listen(fd.get(), backlog) == 0, "ringpg: listen failed: ", std::strerror(errno));
  socklen_t len = sizeof(addr.storage);
  TORCH_CHECK(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr.storage), &len) == 0,
              "ringpg: getsockname failed: ", std::strerror(errno));
  addr.len = len;
  return fd;
}

namespace {

// One line of a /proc/sys file ("" if unreadable): for error messages only.
std::string procLine(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

void setCongestionOrThrow(int fd, const std::string& name) {
  if (::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(), static_cast<socklen_t>(name.size())) == 0) {
    return;
  }
  const int err = errno;
  TORCH_CHECK(false, "ringpg: RINGPG_TUNING tcp_congestion=", name, " cannot be set on this host (", std::strerror(err),
              "); available: ", procLine("/proc/sys/net/ipv4/tcp_available_congestion_control"),
              "; allowed without CAP_NET_ADMIN: ", procLine("/proc/sys/net/ipv4/tcp_allowed_congestion_control"),
              "; unset it to keep the host's default");
}

} // namespace

void tuneDataSocket(int fd, int bufferBytes, const std::string& congestion) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (bufferBytes > 0) {
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bufferBytes, sizeof(bufferBytes));
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bufferBytes, sizeof(bufferBytes));
  }
  if (!congestion.empty()) {
    setCongestionOrThrow(fd, congestion);
  }
}

void checkCongestionControl(const std::string& name) {
  Fd probe(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!probe.valid()) {
    probe = Fd(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0)); // an IPv6-only host
  }
  TORCH_CHECK(probe.valid(),
              "ringpg: cannot open a TCP socket to check RINGPG_TUNING tcp_congestion: ", std::strerror(errno));
  setCongestionOrThrow(probe.get(), name);
}

std::string congestionControlOf(int fd) {
  char name[32] = {};
  socklen_t len = sizeof(name) - 1;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) {
    return "";
  }
  return std::string(name, ::strnlen(name, len));
}

void setNonBlocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  ::fcntl(fd, F_SETFL, flags);
}

} // namespace ringpg
