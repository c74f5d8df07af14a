#include "common/config.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <c10/util/env.h>

#include <algorithm>
#include <cctype>
#include <initializer_list>
#include <string>

#include "common/host.h"

namespace ringpg {
namespace {

int64_t envInt(const char* name, int64_t dflt, int64_t lo, int64_t hi) {
  auto v = c10::utils::get_env(name);
  if (!v || v->empty()) {
    return dflt;
  }
  int64_t x = 0;
  try {
    x = std::stoll(*v);
  } catch (const std::exception&) {
    TORCH_CHECK(false, "ringpg: ", name, "=", *v, " is not an integer");
  }
  TORCH_CHECK(x >= lo && x <= hi, "ringpg: ", name, "=", x, " is outside [", lo, ", ", hi, "]");
  return x;
}

// The one of `choices` whose name (`nameOf`) is `name`; else an error naming the setting
// (`what`, e.g. "RINGPG_ALGO=") and every choice.
template <typename E>
E choiceNamed(const std::string& name, std::initializer_list<E> choices, const char* (*nameOf)(E), const char* what) {
  std::string listed;
  for (E choice : choices) {
    if (name == nameOf(choice)) {
      return choice;
    }
    listed += c10::str(listed.empty() ? "" : ", ", nameOf(choice));
  }
  TORCH_CHECK(false, "ringpg: ", what, name, " is not one of ", listed);
}

Config load() {
  Config c;
  c.segmentBytes =
      static_cast<size_t>(envInt("RINGPG_SEGMENT_BYTES", static_cast<int64_t>(c.segmentBytes), 4096, 1LL << 30));
  c.oneShotBytes =
      static_cast<size_t>(envInt("RINGPG_ONESHOT_BYTES", static_cast<int64_t>(c.oneShotBytes), 0, 1LL << 30));
  c.recvWindow = static_cast<int>(envInt("RINGPG_RECV_WINDOW", c.recvWindow, 1, 1024));
  if (auto v = c10::utils::get_env("RINGPG_RECV_WINDOW"); v && !v->empty()) {
    c.recvWindowSet = true;
  }
  c.socketBuffer = static_cast<int>(envInt("RINGPG_SOCKET_BUFFER", c.socketBuffer, 0, 1LL << 30));
  c.workCacheBytes =
      static_cast<size_t>(envInt("RINGPG_WORK_CACHE_BYTES", static_cast<int64_t>(c.workCacheBytes), 0, 1LL << 40));
  c.cmaBytes = static_cast<size_t>(envInt("RINGPG_CMA_BYTES", static_cast<int64_t>(c.cmaBytes), 0, 1LL << 40));
  if (auto v = c10::utils::get_env("RINGPG_CMA_BYTES"); v && !v->empty()) {
    c.cmaBytesSet = true;
  }
  if (auto v = c10::utils::get_env("RINGPG_STREAM_BYTES"); v && *v == "auto") {
    c.streamBytes = Config::kStreamAuto;
  } else {
    c.streamBytes = envInt("RINGPG_STREAM_BYTES", c.streamBytes, 0, 1LL << 50);
  }
  c.arenaBytes = static_cast<size_t>(envInt("RINGPG_ARENA_BYTES", static_cast<int64_t>(c.arenaBytes), 0, 1LL << 32));
  c.hierPieceBytes =
      static_cast<size_t>(envInt("RINGPG_HIER_PIECE_BYTES", static_cast<int64_t>(c.hierPieceBytes), 0, 1LL << 40));
  if (auto v = c10::utils::get_env("RINGPG_SPIN_US"); v && *v == "auto") {
    c.spinMicros = Config::kSpinAuto;
  } else {
    c.spinMicros = static_cast<int>(envInt("RINGPG_SPIN_US", c.spinMicros, 0, 1000000));
  }
  if (auto t = c10::utils::get_env("RINGPG_TRANSPORT"); t && !t->empty()) {
    c.transport = Config::transportNamed(*t, "RINGPG_TRANSPORT=");
  }
  if (auto v = c10::utils::get_env("RINGPG_TCP_CONGESTION"); v && !v->empty() && *v != "default") {
    // A kernel module name: letters, digits, '_' and '-', shorter than TCP_CA_NAME_MAX (16).
    const bool plain = v->size() < 16 && std::all_of(v->begin(), v->end(), [](char ch) {
                         return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-';
                       });
    TORCH_CHECK(plain, "ringpg: RINGPG_TCP_CONGESTION=", *v, " is not an algorithm name (e.g. cubic, bbr, reno)");
    c.tcpCongestion = *v;
  }
  if (auto v = c10::utils::get_env("RINGPG_SOCKET_IFNAME"); v && !v->empty()) {
    c.ifname = *v;
  } else if (auto g = c10::utils::get_env("GLOO_SOCKET_IFNAME"); g && !g->empty()) {
    c.ifname = *g;
  }
  if (auto v = c10::utils::get_env("RINGPG_ALGO"); v && !v->empty()) {
    c.algo = Config::algoNamed(*v, "RINGPG_ALGO=");
  }
  if (auto v = c10::utils::get_env("RINGPG_CONNECT"); v && !v->empty()) {
    c.connect = choiceNamed(*v, {Config::Connect::Lazy, Config::Connect::All}, &Config::connectName, "RINGPG_CONNECT=");
  }
  if (auto v = c10::utils::get_env("RINGPG_ALLTOALL"); v && !v->empty()) {
    c.allToAll = choiceNamed(*v, {Config::AllToAll::Auto, Config::AllToAll::Direct, Config::AllToAll::Bruck},
                             &Config::allToAllName, "RINGPG_ALLTOALL=");
  }
  if (auto v = c10::utils::get_env("RINGPG_HOSTID"); v && !v->empty()) {
    c.hostId = *v;
  }
  if (auto v = c10::utils::get_env("RINGPG_TRACE"); v && !v->empty()) {
    c.traceDir = *v;
  }
  return c;
}

} // namespace

const char* Config::transportName(Transport t) {
  switch (t) {
    case Transport::Auto:
      return "auto";
    case Transport::Shm:
      return "shm";
    case Transport::Tcp:
      return "tcp";
    case Transport::Gloo:
      return "gloo";
  }
  return "?";
}

Config::Transport Config::transportNamed(const std::string& name, const char* what) {
  return choiceNamed(name, {Transport::Auto, Transport::Shm, Transport::Tcp, Transport::Gloo}, &transportName, what);
}

const char* Config::algoName(Algo a) {
  switch (a) {
    case Algo::Auto:
      return "auto";
    case Algo::Ring:
      return "ring";
    case Algo::Hier:
      return "hier";
    case Algo::Arena:
      return "arena";
  }
  return "?";
}

Config::Algo Config::algoNamed(const std::string& name, const char* what) {
  return choiceNamed(name, {Algo::Auto, Algo::Ring, Algo::Hier, Algo::Arena}, &algoName, what);
}

const char* Config::connectName(Connect c) {
  return c == Connect::All ? "all" : "lazy";
}

const char* Config::allToAllName(AllToAll a) {
  switch (a) {
    case AllToAll::Auto:
      return "auto";
    case AllToAll::Direct:
      return "direct";
    case AllToAll::Bruck:
      return "bruck";
  }
  return "?";
}

size_t Config::streamFrom() const {
  // Half the last-level cache: the prototype's all-gather streamed at 16-64 MiB took
  // 0.85x the time, at 1-8 MiB 1.25-1.84x, with a 32 MiB L3 (docs/internals.md, "Why
  // these constants").
  if (streamBytes != kStreamAuto) {
    return static_cast<size_t>(streamBytes); // set: no sysfs read at all
  }
  static const size_t halfCache = lastLevelCacheBytes() / 2; // read once: sysfs files, asked on every op
  return halfCache;
}

const Config& Config::get() {
  static const Config config = load(); // thread-safe static init
  return config;
}

std::string Config::summary() const {
  return c10::str(
      "segment_bytes=", segmentBytes, " oneshot_bytes=", oneShotBytes, " recv_window=",
      recvWindowSet ? std::to_string(recvWindow) : c10::str(recvWindow, "(gloo:", kGlooRecvWindow, ")"),
      " socket_buffer=", socketBuffer == 0 ? std::string("auto") : std::to_string(socketBuffer),
      " work_cache_bytes=", workCacheBytes, " hier_piece_bytes=", hierPieceBytes, " arena_bytes=", arenaBytes,
      " cma_bytes=", cmaBytes, cmaBytesSet ? "" : "(measured)",
      " stream_bytes=", streamBytes == kStreamAuto ? c10::str("auto(", streamFrom(), ")") : std::to_string(streamBytes),
      " spin_us=", spinMicros == kSpinAuto ? std::string("auto") : std::to_string(spinMicros),
      " transport_setting=", transportName(transport), " algo=", algoName(algo), " connect=", connectName(connect),
      " alltoall=", allToAllName(allToAll),
      " tcp_congestion=", tcpCongestion.empty() ? std::string("default") : tcpCongestion,
      " hostid=", hostId.empty() ? std::string("(auto)") : hostId,
      " ifname=", ifname.empty() ? std::string("(hostname)") : ifname,
      " trace=", traceDir.empty() ? std::string("off") : traceDir);
}

} // namespace ringpg
