#include "transport/shm_segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <c10/util/StringUtil.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>

namespace ringpg {

static_assert(std::atomic<uint32_t>::is_always_lock_free, "a futex word must be plain memory shared between processes");

std::unique_ptr<SharedSegment> SharedSegment::create(const std::string& name, size_t bytes, const std::string& what,
                                                     std::string& why) {
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
  return std::unique_ptr<SharedSegment>(new SharedSegment(name, static_cast<char*>(p), bytes, /*named=*/true));
}

std::unique_ptr<SharedSegment> SharedSegment::open(const std::string& name, size_t bytes, std::string& why) {
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
  return std::unique_ptr<SharedSegment>(new SharedSegment(name, static_cast<char*>(p), bytes, /*named=*/false));
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

void futexWaitShared(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000000), static_cast<long>(timeout.count() % 1000000000)};
  // Shared (not FUTEX_PRIVATE): the word lives in memory several processes map.
  // EAGAIN (the word moved), EINTR and ETIMEDOUT all send the caller round its loop.
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futexWakeShared(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

} // namespace ringpg
