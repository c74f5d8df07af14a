#include "common/config.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <c10/util/env.h>

#include <algorithm>
#include <cctype>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/host.h"

namespace ringpg {
namespace {

// `text` as an integer in [lo, hi]; else an error naming the setting (`what`, e.g.
// "RINGPG_TUNING segment_bytes").
int64_t parseInt(const std::string& text, const std::string& what, int64_t lo, int64_t hi) {
  int64_t x = 0;
  size_t used = 0;
  try {
    x = std::stoll(text, &used);
  } catch (const std::out_of_range&) {
    TORCH_CHECK(false, "ringpg: ", what, "=", text, " is outside [", lo, ", ", hi, "]");
  } catch (const std::exception&) {
    used = 0;
  }
  TORCH_CHECK(used == text.size() && used > 0, "ringpg: ", what, "=", text, " is not an integer");
  TORCH_CHECK(x >= lo && x <= hi, "ringpg: ", what, "=", x, " is outside [", lo, ", ", hi, "]");
  return x;
}

int64_t envInt(const char* name, int64_t dflt, int64_t lo, int64_t hi) {
  auto v = c10::utils::get_env(name);
  return !v || v->empty() ? dflt : parseInt(*v, name, lo, hi);
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

// One key of RINGPG_TUNING, the expert setting: its name, the variable it replaced, how
// a value sets it (`what` names it in errors: "RINGPG_TUNING spin_us") and how the
// effective value reads back (Config::tuningValues, the INFO line).
struct TuningKey {
  const char* key;
  const char* replaced; // nullptr: a key that replaced no variable
  void (*set)(Config& c, const std::string& value, const std::string& what);
  std::string (*get)(const Config& c);
};

std::string autoOr(int64_t v, int64_t autoValue) {
  return v == autoValue ? std::string("auto") : std::to_string(v);
}

const std::vector<TuningKey>& tuningKeys() {
  static const std::vector<TuningKey> keys = {
      {"segment_bytes", "RINGPG_SEGMENT_BYTES",
       [](Config& c, const std::string& v, const std::string& w) {
         c.segmentBytes = static_cast<size_t>(parseInt(v, w, 4096, 1LL << 30));
       },
       [](const Config& c) { return std::to_string(c.segmentBytes); }},
      {"oneshot_bytes", "RINGPG_ONESHOT_BYTES",
       [](Config& c, const std::string& v, const std::string& w) {
         c.oneShotBytes = static_cast<size_t>(parseInt(v, w, 0, 1LL << 30));
       },
       [](const Config& c) { return std::to_string(c.oneShotBytes); }},
      {"hier_piece_bytes", "RINGPG_HIER_PIECE_BYTES",
       [](Config& c, const std::string& v, const std::string& w) {
         c.hierPieceBytes = static_cast<size_t>(parseInt(v, w, 0, 1LL << 40));
       },
       [](const Config& c) { return std::to_string(c.hierPieceBytes); }},
      {"alltoall", "RINGPG_ALLTOALL",
       [](Config& c, const std::string& v, const std::string& w) {
         c.allToAll = choiceNamed(v, {Config::AllToAll::Auto, Config::AllToAll::Direct, Config::AllToAll::Bruck},
                                  &Config::allToAllName, (w + "=").c_str());
       },
       [](const Config& c) { return std::string(Config::allToAllName(c.allToAll)); }},
      {"connect", "RINGPG_CONNECT",
       [](Config& c, const std::string& v, const std::string& w) {
         c.connect =
             choiceNamed(v, {Config::Connect::Lazy, Config::Connect::All}, &Config::connectName, (w + "=").c_str());
       },
       [](const Config& c) { return std::string(Config::connectName(c.connect)); }},
      {"recv_window", "RINGPG_RECV_WINDOW",
       [](Config& c, const std::string& v, const std::string& w) {
         c.recvWindow = static_cast<int>(parseInt(v, w, 1, 1024));
         c.recvWindowSet = true;
       },
       [](const Config& c) {
         return c.recvWindowSet ? std::to_string(c.recvWindow)
                                : c10::str(c.recvWindow, "(gloo:", Config::kGlooRecvWindow, ")");
       }},
      {"socket_buffer", "RINGPG_SOCKET_BUFFER",
       [](Config& c, const std::string& v, const std::string& w) {
         c.socketBuffer = v == "auto" ? 0 : static_cast<int>(parseInt(v, w, 0, 1LL << 30));
       },
       [](const Config& c) { return c.socketBuffer == 0 ? std::string("auto") : std::to_string(c.socketBuffer); }},
      {"work_cache_bytes", "RINGPG_WORK_CACHE_BYTES",
       [](Config& c, const std::string& v, const std::string& w) {
         c.workCacheBytes = static_cast<size_t>(parseInt(v, w, 0, 1LL << 40));
       },
       [](const Config& c) { return std::to_string(c.workCacheBytes); }},
      {"cma_op_bytes", nullptr,
       [](Config& c, const std::string& v, const std::string& w) {
         c.cmaOpBytes = v == "auto" ? Config::kCmaOpAuto : parseInt(v, w, 0, 1LL << 50);
       },
       [](const Config& c) { return autoOr(c.cmaOpBytes, Config::kCmaOpAuto); }},
      {"stream_bytes", "RINGPG_STREAM_BYTES",
       [](Config& c, const std::string& v, const std::string& w) {
         c.streamBytes = v == "auto" ? Config::kStreamAuto : parseInt(v, w, 0, 1LL << 50);
       },
       [](const Config& c) {
         return c.streamBytes == Config::kStreamAuto ? c10::str("auto(", c.streamFrom(), ")")
                                                     : std::to_string(c.streamBytes);
       }},
      {"spin_us", "RINGPG_SPIN_US",
       [](Config& c, const std::string& v, const std::string& w) {
         c.spinMicros = v == "auto" ? Config::kSpinAuto : static_cast<int>(parseInt(v, w, 0, 1000000));
       },
       [](const Config& c) { return autoOr(c.spinMicros, Config::kSpinAuto); }},
      {"tcp_congestion", "RINGPG_TCP_CONGESTION",
       [](Config& c, const std::string& v, const std::string& w) {
         if (v == "default") {
           c.tcpCongestion.clear();
           return;
         }
         // A kernel module name: letters, digits, '_' and '-', shorter than TCP_CA_NAME_MAX (16).
         const bool plain = v.size() < 16 && std::all_of(v.begin(), v.end(), [](char ch) {
                              return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-';
                            });
         TORCH_CHECK(plain, "ringpg: ", w, "=", v, " is not an algorithm name (e.g. cubic, bbr, reno)");
         c.tcpCongestion = v;
       },
       [](const Config& c) { return c.tcpCongestion.empty() ? std::string("default") : c.tcpCongestion; }},
      {"reduce_isa", "RINGPG_REDUCE_ISA",
       [](Config& c, const std::string& v, const std::string& /*w: checked against the CPU in reduce.cpp*/) {
         c.reduceIsa = v;
       },
       [](const Config& c) { return c.reduceIsa.empty() ? std::string("auto") : c.reduceIsa; }},
  };
  return keys;
}

// Sets `c` from RINGPG_TUNING's `text`: "key=value" items separated by commas (spaces
// around them ignored), a later key overriding an earlier one, so that settings can be
// appended to a variable that already holds some.
void applyTuning(Config& c, const std::string& text) {
  const auto trim = [](std::string s) {
    const auto notSpace = [](unsigned char ch) { return !std::isspace(ch); };
    s.erase(s.begin(), std::find_if(s.begin(), s.end(), notSpace));
    s.erase(std::find_if(s.rbegin(), s.rend(), notSpace).base(), s.end());
    return s;
  };
  size_t from = 0;
  while (from <= text.size()) {
    const size_t comma = std::min(text.find(',', from), text.size());
    const std::string item = trim(text.substr(from, comma - from));
    from = comma + 1;
    if (item.empty()) {
      continue;
    }
    const size_t eq = item.find('=');
    TORCH_CHECK(eq != std::string::npos, "ringpg: RINGPG_TUNING item '", item, "' is not key=value");
    const std::string key = trim(item.substr(0, eq));
    const std::string value = trim(item.substr(eq + 1));
    const auto& keys = tuningKeys();
    const auto k = std::find_if(keys.begin(), keys.end(), [&](const TuningKey& t) { return key == t.key; });
    if (k == keys.end()) {
      std::string listed;
      for (const auto& t : keys) {
        listed += c10::str(listed.empty() ? "" : ", ", t.key);
      }
      TORCH_CHECK(false, "ringpg: RINGPG_TUNING has no key '", key, "' (its keys: ", listed, ")");
    }
    if (!value.empty()) { // "key=" leaves the key as it was (its default unless set before)
      k->set(c, value, c10::str("RINGPG_TUNING ", key));
    }
  }
}

Config load() {
  // The variables RINGPG_TUNING replaced are refused rather than ignored: a job that set
  // one would otherwise run with another value than it asked for, and not know.
  for (const auto& k : tuningKeys()) {
    if (auto v = k.replaced ? c10::utils::get_env(k.replaced) : std::nullopt; v && !v->empty()) {
      TORCH_CHECK(false, "ringpg: ", k.replaced, " is no longer read; set RINGPG_TUNING=", k.key, "=", *v,
                  " instead (several keys: comma-separated; docs/configuration.md, \"Expert tuning\")");
    }
  }
  Config c;
  if (auto v = c10::utils::get_env("RINGPG_TUNING")) {
    applyTuning(c, *v);
  }
  c.cmaBytes = static_cast<size_t>(envInt("RINGPG_CMA_BYTES", static_cast<int64_t>(c.cmaBytes), 0, 1LL << 40));
  if (auto v = c10::utils::get_env("RINGPG_CMA_BYTES"); v && !v->empty()) {
    c.cmaBytesSet = true;
  }
  c.arenaBytes = static_cast<size_t>(envInt("RINGPG_ARENA_BYTES", static_cast<int64_t>(c.arenaBytes), 0, 1LL << 32));
  if (auto t = c10::utils::get_env("RINGPG_TRANSPORT"); t && !t->empty()) {
    c.transport = Config::transportNamed(*t, "RINGPG_TRANSPORT=");
  }
  if (auto v = c10::utils::get_env("RINGPG_SOCKET_IFNAME"); v && !v->empty()) {
    c.ifname = *v;
  } else if (auto g = c10::utils::get_env("GLOO_SOCKET_IFNAME"); g && !g->empty()) {
    c.ifname = *g;
  }
  if (auto v = c10::utils::get_env("RINGPG_ALGO"); v && !v->empty()) {
    c.algo = Config::algoNamed(*v, "RINGPG_ALGO=");
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

size_t Config::autoStreamFrom(size_t cacheBytes) {
  // Half the last-level cache: streaming paid off only for outputs well past it; but a
  // reported cache of hundreds of MiB is a whole socket's, shared with its other cores
  // and guests, and outputs from kStreamAutoMostBytes streamed faster there
  // (docs/internals.md, "Why these constants").
  return std::min(cacheBytes / 2, kStreamAutoMostBytes);
}

size_t Config::streamFrom() const {
  if (streamBytes != kStreamAuto) {
    return static_cast<size_t>(streamBytes); // set: no sysfs read at all
  }
  static const size_t from = autoStreamFrom(lastLevelCacheBytes()); // read once: sysfs files, asked on every op
  return from;
}

const Config& Config::get() {
  static const Config config = load(); // thread-safe static init
  return config;
}

std::vector<std::pair<std::string, std::string>> Config::tuningValues() const {
  std::vector<std::pair<std::string, std::string>> values;
  for (const auto& k : tuningKeys()) {
    values.emplace_back(k.key, k.get(*this));
  }
  return values;
}

Config Config::withTuning(const std::string& text) {
  Config c;
  applyTuning(c, text);
  return c;
}

std::string Config::summary() const {
  std::string tuning;
  for (const auto& [key, value] : tuningValues()) {
    tuning += c10::str(key, "=", value, " ");
  }
  return c10::str(tuning, "arena_bytes=", arenaBytes, " cma_bytes=", cmaBytes, cmaBytesSet ? "" : "(measured)",
                  " transport_setting=", transportName(transport), " algo=", algoName(algo),
                  " hostid=", hostId.empty() ? std::string("(auto)") : hostId,
                  " ifname=", ifname.empty() ? std::string("(hostname)") : ifname,
                  " trace=", traceDir.empty() ? std::string("off") : traceDir);
}

} // namespace ringpg
