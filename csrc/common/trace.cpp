#include "common/trace.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdarg>
#include <cstring>
#include <filesystem>

#include "common/host.h"

namespace ringpg {
namespace {

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

// Fast appends for the per-event loop: snprintf per event (and an fflush per op) cost a
// large op's trace a visible share of its time (docs/internals.md, "Why these constants").
void appendInt(std::string& out, int64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, r.ptr);
}

// `ns` nanoseconds as microseconds with three decimals: "12.345".
void appendMicros(std::string& out, int64_t ns) {
  if (ns < 0) {
    out += '-';
    ns = -ns;
  }
  appendInt(out, ns / 1000);
  const int f = static_cast<int>(ns % 1000);
  const char frac[4] = {'.', static_cast<char>('0' + f / 100), static_cast<char>('0' + f / 10 % 10),
                        static_cast<char>('0' + f % 10)};
  out.append(frac, 4);
}

void appendField(std::string& out, const char* key, int64_t v) {
  out += key;
  appendInt(out, v);
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
  head += c10::str(",\n{\"name\":\"ringpg\",\"ph\":\"M\",\"pid\":", rank,
                   ",\"tid\":0,\"args\":{\"group\":", jsonString(group), ",\"rank\":", rank, ",\"size\":", size,
                   ",\"transport\":", jsonString(transport), ",\"clock_offset_ns\":", clockOffsetNs,
                   ",\"clock_rtt_ns\":", clockRttNs, ",\"clock_rounds\":", clockRounds, ",\"pid\":", ::getpid(), "}}");
  // Buffered: an op's events reach the disk when a MiB has gathered, after a failed
  // op, and when the group stops (a write per op slowed the op's thread).
  std::setvbuf(file_, nullptr, _IOFBF, 1 << 20);
  write(head, /*flush=*/true);
}

Tracer::~Tracer() {
  std::string last;
  lastWriteEvent(last);
  std::lock_guard<std::mutex> lk(mu_);
  if (file_) {
    std::fputs(last.c_str(), file_);
    std::fputs("\n]\n", file_);
    std::fclose(file_);
    file_ = nullptr;
  }
}

void Tracer::write(const std::string& text, bool flush) noexcept {
  std::lock_guard<std::mutex> lk(mu_);
  if (file_) {
    std::fwrite(text.data(), 1, text.size(), file_);
    if (flush) {
      std::fflush(file_);
    }
  }
}

OpTrace* Tracer::beginOp(const char* name, uint64_t seq, int64_t bytes, const char* dtype) {
  op_.events_.clear();
  op_.algorithm = nullptr;
  op_.ring = TraceRingPlan{};
  op_.pieces = 0;
  op_.threads = 0;
  opName_ = name;
  opSeq_ = seq;
  opBytes_ = bytes;
  opDtype_ = dtype;
  opThread_ = currentThreadId();
  opBegin_ = traceNow();
  return &op_;
}

void Tracer::lastWriteEvent(std::string& out) const {
  if (writeBegin_ == 0) {
    return;
  }
  appendf(out,
          ",\n{\"name\":\"trace_write\",\"cat\":\"trace\",\"ph\":\"X\",\"pid\":%d,\"tid\":%ld,\"ts\":%.3f,"
          "\"dur\":%.3f,\"args\":{\"op_seq\":%llu,\"events\":%lld,\"bytes\":%lld}}",
          rank_, writeThread_, static_cast<double>(writeBegin_ + offsetNs_) / 1000.0,
          static_cast<double>(writeEnd_ - writeBegin_) / 1000.0, static_cast<unsigned long long>(writeSeq_),
          static_cast<long long>(writeEvents_), static_cast<long long>(writeBytes_));
}

// The op's events (sends, receives, steps), one trace line each.
void Tracer::appendOpEvents(std::string& out, long tid) const {
  const int64_t seq = static_cast<int64_t>(opSeq_);
  for (const TraceEvent& e : op_.events_) {
    out += ",\n{\"name\":\"";
    out += e.name;
    out += "\",\"cat\":\"";
    out += categoryOf(e.kind);
    appendField(out, "\",\"ph\":\"X\",\"pid\":", rank_);
    appendField(out, ",\"tid\":", tid);
    out += ",\"ts\":";
    appendMicros(out, e.begin + offsetNs_);
    out += ",\"dur\":";
    appendMicros(out, e.end - e.begin);
    appendField(out, ",\"args\":{\"seq\":", seq);
    appendField(out, ",\"step\":", e.step);
    if (e.kind == TraceKind::Primitive) {
      appendField(out, ",\"recv_chunk\":", e.chunk);
      appendField(out, ",\"send_chunk\":", e.segment);
      out += "}}";
      continue;
    }
    appendField(out, ",\"chunk\":", e.chunk);
    appendField(out, ",\"segment\":", e.segment);
    appendField(out, ",\"bytes\":", e.bytes);
    appendField(out, ",\"peer\":", e.peer);
    if (e.kind == TraceKind::Recv) {
      out += ",\"posted_us\":";
      appendMicros(out, e.posted + offsetNs_);
    }
    out += "}}";
  }
}

void Tracer::endOp(bool failed) noexcept {
  const int64_t opEnd = traceNow();
  try {
    std::string& out = text_;
    out.clear();
    lastWriteEvent(out); // the tracer's own cost, one op late: formatting and writing the last op
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
    if (op_.pieces > 0) {
      appendf(out, ",\"pieces\":%d,\"threads\":%d", op_.pieces, op_.threads);
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
    appendOpEvents(out, tid);
    write(out, /*flush=*/failed);
    writeBegin_ = opEnd;
    writeEnd_ = traceNow();
    writeThread_ = tid;
    writeSeq_ = opSeq_;
    writeEvents_ = static_cast<int64_t>(op_.events_.size());
    writeBytes_ = static_cast<int64_t>(out.size());
  } catch (...) {
    // Tracing never fails an op.
  }
  op_.events_.clear();
}

} // namespace ringpg
