#include "transport/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <c10/util/StringUtil.h>
#include <c10/util/irange.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <sstream>

namespace ringpg {

uint64_t mixNonce(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::unique_ptr<SharedSegment> SharedSegment::create(const std::string& name, size_t bytes, const SegmentHeader& header,
                                                     const std::string& what, std::string& why) {
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    why = c10::str("shm_open(", name, "): ", std::strerror(errno));
    return nullptr;
  }
  // Reserved now, so that a full /dev/shm fails here and not as a SIGBUS mid-op.
  const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (rc != 0) {
    why = c10::str("reserving ", bytes, " bytes of shared memory for ", what, ": ", std::strerror(rc));
    ::close(fd);
    ::shm_unlink(name.c_str());
    return nullptr;
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    why = c10::str("mmap: ", std::strerror(errno));
    ::shm_unlink(name.c_str());
    return nullptr;
  }
  // Before the name is announced, so every mapper finds it written.
  *static_cast<SegmentHeader*>(p) = header;
  return std::unique_ptr<SharedSegment>(new SharedSegment(name, static_cast<char*>(p), bytes, /*named=*/true));
}

std::unique_ptr<SharedSegment> SharedSegment::open(const std::string& name, size_t bytes, const SegmentHeader& expect,
                                                   const std::string& kind, std::string& why) {
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    why = c10::str("shm_open(", name, "): ", std::strerror(errno));
    return nullptr;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes || st.st_uid != ::geteuid() ||
      (st.st_mode & 077) != 0) {
    why = c10::str(name, " is not a segment of this user's of ", bytes, " bytes open to this user alone");
    ::close(fd);
    return nullptr;
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    why = c10::str("mmap: ", std::strerror(errno));
    return nullptr;
  }
  auto seg = std::unique_ptr<SharedSegment>(new SharedSegment(name, static_cast<char*>(p), bytes, /*named=*/false));
  // Copied out once: a peer's memory is read, never trusted in place.
  SegmentHeader h;
  std::memcpy(&h, seg->base(), sizeof(h));
  if (!(h == expect)) {
    why = c10::str(name, " is not the ", kind, " its creator announced");
    return nullptr;
  }
  return seg;
}

SharedSegment::~SharedSegment() {
  ::munmap(base_, bytes_);
  unlinkName();
}

void SharedSegment::unlinkName() {
  if (named_) {
    ::shm_unlink(name_.c_str());
    named_ = false;
  }
}

std::string segmentName(const std::string& kind, int pid, uint64_t nonce) {
  std::ostringstream o;
  o << "/ringpg-" << (kind.empty() ? "" : kind + "-") << pid << "-" << std::hex << nonce;
  return o.str();
}

int segmentCreatorPid(const std::string& name) {
  // "ringpg-arena-<pid>-<hex>" (the arena) or "ringpg-<pid>-<hex>" (the links).
  std::string rest;
  if (name.rfind("ringpg-arena-", 0) == 0) {
    rest = name.substr(std::strlen("ringpg-arena-"));
  } else if (name.rfind("ringpg-", 0) == 0) {
    rest = name.substr(std::strlen("ringpg-"));
  } else {
    return 0;
  }
  const size_t dash = rest.find('-');
  if (dash == 0 || dash == std::string::npos || dash > 9 || dash + 1 == rest.size()) {
    return 0;
  }
  int pid = 0;
  for (const auto i : c10::irange(dash)) {
    if (rest[i] < '0' || rest[i] > '9') {
      return 0;
    }
    pid = pid * 10 + (rest[i] - '0');
  }
  for (size_t i = dash + 1; i < rest.size(); ++i) {
    if (!std::isxdigit(static_cast<unsigned char>(rest[i]))) {
      return 0;
    }
  }
  return pid;
}

int reclaimStaleSegments(const std::string& dir, int minAgeSeconds) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) {
    return 0;
  }
  int reclaimed = 0;
  const time_t now = ::time(nullptr);
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    const int pid = segmentCreatorPid(name);
    if (pid <= 0) {
      continue;
    }
    struct stat st {};
    const std::string path = dir + "/" + name;
    // Ours, old enough that no group is still mapping it, and its creator gone (a
    // live creator unlinks its own segments once they are mapped).
    if (::stat(path.c_str(), &st) != 0 || st.st_uid != ::geteuid() || now - st.st_mtime < minAgeSeconds) {
      continue;
    }
    if (::kill(pid, 0) == 0 || errno != ESRCH) {
      continue;
    }
    if (::shm_unlink(("/" + name).c_str()) == 0) {
      ++reclaimed;
    }
  }
  ::closedir(d);
  return reclaimed;
}

} // namespace ringpg
