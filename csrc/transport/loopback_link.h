// An in-process link, a seam for tests only: the ranks of a group live in one process,
// a thread each, and a frame one rank sends is copied into an in-memory queue that the
// receiving rank matches against its posted receives.  It lets the in-process tests
// (ringpg._C.run_in_process, tests/test_loopback_ring.py) run RingBackend and its
// algorithms over N ranks in milliseconds, without sockets, shared memory or a Store.
// No group that connectGroup makes ever uses it.
//
// What it keeps of the real links (transport/link.h):
//   * collective frames from one peer are matched strictly in order against the
//     receives posted for that peer, and every field of the header must agree
//     (sameCollective, wire.h), as on the engine: a mismatch fails the group;
//   * a failure is the group's: a rank whose engine broke tells the hub, and every
//     other rank's next look at it breaks that rank's engine too (as an Abort frame
//     would), so no rank sits out its deadline.  A rank notices the hub, and publishes
//     its own failure, only while it posts or waits on its loopback link.
// What it leaves out: sends complete at once (copied, never lent); no receive is fused
// (the ring receives into staging and reduces); point-to-point and control frames go
// to the rank's engine, which has no peer to dial (they fail the group).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/connect.h"
#include "transport/link.h"

namespace ringpg {

// The queues between the ranks of one in-process group, and its failure.
class LoopbackHub {
 public:
  explicit LoopbackHub(int size);
  int size() const { return size_; }

 private:
  friend class LoopbackLink;
  struct Frame {
    FrameHeader hdr;
    std::vector<char> payload;
  };
  // Frames from `src` for `dst`, oldest first.
  std::deque<Frame>& inbox(int dst, int src) { return inboxes_[static_cast<size_t>(dst) * size_ + src]; }

  const int size_;
  // mu_ guards inboxes_, broken_ and brokenBy_.  Never held while calling into an
  // group failure (whose listeners run user hooks) or while copying a payload.
  std::mutex mu_;
  std::condition_variable cv_; // signalled on every frame queued and when the group breaks
  std::vector<std::deque<Frame>> inboxes_; // [dst * size + src]
  std::string broken_;                     // the first failure any rank published, "" while healthy
  int brokenBy_ = -1;                      // the rank that published it
};

class LoopbackLink final : public Link {
 public:
  // Rank `rank`'s link to every peer of `hub`; `failure`: the rank's group's failure state.
  LoopbackLink(std::shared_ptr<LoopbackHub> hub, int rank, GroupFailure& failure);
  const char* transport() const override { return "loopback"; }
  // Copies the payload into the peer's queue: done when it returns (or failed, the
  // group broken).
  RequestPtr postSend(int peer, const FrameHeader& op, const void* data, size_t len) override;
  RequestPtr postRecv(int peer, const FrameHeader& op, void* data, size_t len) override;
  bool waitUntil(const RequestPtr& req, Deadline deadline) override;

  // How long a wait sleeps before it looks at the group's failure again: a failure from another
  // thread of this rank (abort()) is not signalled on the hub.
  static constexpr std::chrono::milliseconds kLookSlice{10};

 private:
  // Matches what has arrived with the receives posted here, in order per peer, and
  // settles the group's failure: true if the group is (now) broken, with every posted
  // receive failed.  Runs on the rank's op thread, without the hub's lock held.
  bool settle();
  // Fails every posted receive with `why`.
  void failPosted(const std::string& why, bool network);

  std::shared_ptr<LoopbackHub> hub_;
  const int rank_;
  GroupFailure& failure_;
  // Receives posted per source, oldest first.  Only the rank's op thread posts and
  // waits (servesASecondThread is false), so no lock.
  std::vector<std::deque<RequestPtr>> posted_;
};

// Rank `rank`'s links in an in-process group of hub->size() ranks on one host: an
// engine with no listener and no address to dial (the rank's failure state and control
// channel), every peer both ways on a LoopbackLink of `hub` (GroupLinks::given), the
// transport "loopback".  For RingBackend's constructor over given links.
std::unique_ptr<GroupLinks> loopbackGroupLinks(const std::shared_ptr<LoopbackHub>& hub, int rank);

} // namespace ringpg
