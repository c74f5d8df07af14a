#include "common/trace.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstring>
#include <filesystem>

namespace ringpg {
namespace {

long currentThreadId() {
  return static_cast<long>(::syscall(SYS_gettid));
}

// A group name as a file name part: letters, digits, '.', '-', '_' kept, others '_'.
std::string fileSafe(const std::string& s) {
  if (s.empty()) {
    return "default";
  }
  std::string out = s;
  for (char& ch : out) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
                    ch == '-' || ch == '_';
    if (!ok) {
      ch = '_';
    }
  }
  return out;
}

// A JSON string literal (quotes included).
std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(ch)));
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

const char* categoryOf(TraceKind k) {
  switch (k) {
    case TraceKind::Primitive:
      return "step";
    case TraceKind::Send:
      return "send";
    case TraceKind::Recv:
      return "recv";
    case TraceKind::Reduce:
      return "reduce";
  }
  return "?";
}

void appendf(std::string& out, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void appendf(std::string& out, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (n > 0) {
    out.append(buf, std::min<size_t>(static_cast<size_t>(n), sizeof(buf) - 1));
  }
}

} // namespace

Tracer::Tracer(const std::string& dir, const std::string& group, int rank, int size, const std::string& transport,
               int64_t clockOffsetNs, int64_t clockRttNs, int clockRounds)
    : rank_(rank), offsetNs_(clockOffsetNs) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  path_ = c10::str(dir, "/ringpg.", fileSafe(group), ".rank", rank, ".json");
  file_ = std::fopen(path_.c_str(), "w");
  TORCH_CHECK(file_ != nullptr, "ringpg: RINGPG_TRACE=", dir, ": cannot write ", path_, ": ", std::strerror(errno),
              ec ? c10::str(" (creating the directory: ", ec.message(), ")") : std::string());
  op_.events_.reserve(4096);
  // A JSON array of events; the closing bracket comes with the destructor (Chrome's
  // loader and ringpg.trace also read a file without it, should the process die).
  std::string head = "[\n";
  appendf(head, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"rank %d\"}}", rank,
          rank);
  appendf(head, ",\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"sort_index\":%d}}",
          rank, rank);
  head += c10::str(",\n{\"name\":\"ringpg\",\"ph\":\"M\",\"pid\":", rank, ",\"tid\":0,\"args\":{\"group\":",
                   jsonString(group), ",\"rank\":", rank, ",\"size\":", size, ",\"transport\":", jsonString(transport),
                   ",\"clock_offset_ns\":", clockOffsetNs, ",\"clock_rtt_ns\":", clockRttNs,
                   ",\"clock_rounds\":", clockRounds, ",\"pid\":", ::getpid(), "}}");
  write(head);
}

Tracer::~Tracer() {
  std::lock_guard<std::mutex> lk(mu_);
  if (file_) {
    std::fputs("\n]\n", file_);
    std::fclose(file_);
    file_ = nullptr;
  }
}

void Tracer::write(const std::string& text) noexcept {
  std::lock_guard<std::mutex> lk(mu_);
  if (file_) {
    std::fwrite(text.data(), 1, text.size(), file_);
    std::fflush(file_); // an op's events are on disk once it ends
  }
}

OpTrace* Tracer::beginOp(const char* name, uint64_t seq, int64_t bytes, const char* dtype) {
  op_.events_.clear();
  op_.algorithm = nullptr;
  op_.ring = TraceRingPlan{};
  opName_ = name;
  opSeq_ = seq;
  opBytes_ = bytes;
  opDtype_ = dtype;
  opThread_ = currentThreadId();
  opBegin_ = traceNow();
  return &op_;
}

void Tracer::endOp(bool failed) noexcept {
  const int64_t opEnd = traceNow();
  try {
    std::string& out = text_;
    out.clear();
    const long tid = opThread_;
    const auto us = [this](int64_t ns) { return static_cast<double>(ns + offsetNs_) / 1000.0; };
    if (std::find(knownThreads_.begin(), knownThreads_.end(), tid) == knownThreads_.end()) {
      knownThreads_.push_back(tid);
      char name[32] = "thread";
      pthread_getname_np(pthread_self(), name, sizeof(name));
      out += c10::str(",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":", rank_, ",\"tid\":", tid,
                      ",\"args\":{\"name\":", jsonString(c10::str(name, " (", tid, ")")), "}}");
    }
    appendf(out,
            ",\n{\"name\":\"%s\",\"cat\":\"op\",\"ph\":\"X\",\"pid\":%d,\"tid\":%ld,\"ts\":%.3f,\"dur\":%.3f,"
            "\"args\":{\"seq\":%llu,\"bytes\":%lld,\"dtype\":\"%s\"",
            opName_, rank_, tid, us(opBegin_), static_cast<double>(opEnd - opBegin_) / 1000.0,
            static_cast<unsigned long long>(opSeq_), static_cast<long long>(opBytes_), opDtype_);
    if (op_.algorithm) {
      appendf(out, ",\"algorithm\":\"%s\"", op_.algorithm);
    }
    const TraceRingPlan& rp = op_.ring;
    if (rp.segments > 0) {
      appendf(out,
              ",\"count\":%lld,\"elem_size\":%lld,\"segments\":%lld,\"seg_elems\":%lld,\"recv_window\":%d,"
              "\"fused\":%s,\"reduce_scatter\":%s,\"all_gather\":%s",
              static_cast<long long>(rp.count), static_cast<long long>(rp.elemSize),
              static_cast<long long>(rp.segments), static_cast<long long>(rp.segElems), rp.window,
              rp.fused ? "true" : "false", rp.reduceScatter ? "true" : "false", rp.allGather ? "true" : "false");
    }
    if (failed) {
      out += ",\"failed\":true";
    }
    out += "}}";
    for (const TraceEvent& e : op_.events_) {
      appendf(out, ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%ld,\"ts\":%.3f,\"dur\":%.3f,",
              e.name, categoryOf(e.kind), rank_, tid, us(e.begin), static_cast<double>(e.end - e.begin) / 1000.0);
      if (e.kind == TraceKind::Primitive) {
        appendf(out, "\"args\":{\"seq\":%llu,\"step\":%d,\"recv_chunk\":%d,\"send_chunk\":%d}}",
                static_cast<unsigned long long>(opSeq_), e.step, e.chunk, e.segment);
        continue;
      }
      appendf(out, "\"args\":{\"seq\":%llu,\"step\":%d,\"chunk\":%d,\"segment\":%d,\"bytes\":%lld,\"peer\":%d",
              static_cast<unsigned long long>(opSeq_), e.step, e.chunk, e.segment, static_cast<long long>(e.bytes),
              e.peer);
      if (e.kind == TraceKind::Recv) {
        appendf(out, ",\"posted_us\":%.3f", us(e.posted));
      }
      out += "}}";
    }
    write(out);
  } catch (...) {
    // Tracing never fails an op.
  }
  op_.events_.clear();
}

} // namespace ringpg
