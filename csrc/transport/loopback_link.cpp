#include "transport/loopback_link.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cstring>

namespace ringpg {

LoopbackHub::LoopbackHub(int size) : size_(size) {
  TORCH_CHECK(size >= 1, "ringpg: an in-process group needs at least one rank, got ", size);
  inboxes_.resize(static_cast<size_t>(size) * size);
}

LoopbackLink::LoopbackLink(std::shared_ptr<LoopbackHub> hub, int rank, GroupFailure& failure)
    : hub_(std::move(hub)), rank_(rank), failure_(failure), posted_(hub_->size()) {
  TORCH_CHECK(rank >= 0 && rank < hub_->size(), "ringpg: rank ", rank, " outside an in-process group of ",
              hub_->size());
}

RequestPtr LoopbackLink::postSend(int peer, const FrameHeader& op, const void* data, size_t len) {
  TORCH_INTERNAL_ASSERT(peer >= 0 && peer < hub_->size() && peer != rank_, "ringpg: no loopback link to ", peer);
  RequestPtr req = makeRequest(op, data, len, peer);
  req->hdr.magic = kFrameMagic;
  req->link = this;
  if (settle()) {
    bool network = true;
    const std::string why = failure_.reason(&network);
    markFailed(*req, why, network);
    return req;
  }
  LoopbackHub::Frame frame{req->hdr, std::vector<char>(req->buf, req->buf + len)}; // copied outside the lock
  {
    std::lock_guard<std::mutex> lk(hub_->mu_); // the peer's inbox
    hub_->inbox(peer, rank_).push_back(std::move(frame));
  }
  hub_->cv_.notify_all();
  // The copy is the whole send: the caller may reuse its buffer at once.
  req->progress = sizeof(FrameHeader) + len;
  req->state.store(Request::State::Done, std::memory_order_release);
  return req;
}

RequestPtr LoopbackLink::postRecv(int peer, const FrameHeader& op, void* data, size_t len) {
  TORCH_INTERNAL_ASSERT(peer >= 0 && peer < hub_->size() && peer != rank_, "ringpg: no loopback link from ", peer);
  RequestPtr req = makeRequest(op, data, len, peer);
  req->link = this;
  posted_[peer].push_back(req);
  settle(); // the frame may be queued already; a broken group fails the receive here
  return req;
}

bool LoopbackLink::waitUntil(const RequestPtr& req, Deadline deadline) {
  for (;;) {
    settle(); // when the group is broken it fails every posted receive, `req` among them
    if (req->state.load(std::memory_order_acquire) != Request::State::Pending) {
      return true;
    }
    std::unique_lock<std::mutex> lk(hub_->mu_); // cv_'s mutex: senders queue under it, then notify
    if (Clock::now() >= deadline) {
      return false;
    }
    // Asked under the lock, so a frame queued after settle() is not missed.
    const auto arrivedOrBroken = [&] {
      if (!hub_->broken_.empty()) {
        return true;
      }
      for (const auto src : c10::irange(hub_->size())) {
        if (!posted_[src].empty() && !hub_->inbox(rank_, src).empty()) {
          return true;
        }
      }
      return false;
    };
    hub_->cv_.wait_until(lk, std::min(deadline, Clock::now() + kLookSlice), arrivedOrBroken);
  }
}

bool LoopbackLink::settle() {
  struct Match {
    RequestPtr req;
    LoopbackHub::Frame frame;
  };
  std::vector<Match> matched;
  std::string hubBroken;
  int brokenBy = -1;
  {
    std::lock_guard<std::mutex> lk(hub_->mu_); // the inboxes and the hub's failure
    hubBroken = hub_->broken_;
    brokenBy = hub_->brokenBy_;
    for (const auto src : c10::irange(hub_->size())) {
      auto& posted = posted_[src];
      auto& inbox = hub_->inbox(rank_, src);
      // In order: the peer sends an op's frames in the order this rank posts their
      // receives, and a later op's frames only after all of this one's.
      while (hubBroken.empty() && !posted.empty() && !inbox.empty()) {
        matched.push_back(Match{std::move(posted.front()), std::move(inbox.front())});
        posted.pop_front();
        inbox.pop_front();
      }
    }
  }
  std::string mismatch; // the first; the receives matched after it fail with it
  for (auto& m : matched) {
    Request& r = *m.req;
    if (mismatch.empty() && !sameCollective(r.hdr, m.frame.hdr)) {
      mismatch = collectiveMismatch(rank_, r.peer, r.hdr, m.frame.hdr);
    }
    if (!mismatch.empty()) {
      markFailed(r, mismatch, /*network=*/false);
      continue;
    }
    if (r.len > 0) {
      std::memcpy(r.buf, m.frame.payload.data(), r.len); // sameCollective: payload.size() == r.len
    }
    r.sourceRank = r.peer;
    r.progress = r.len;
    r.state.store(Request::State::Done, std::memory_order_release);
  }
  if (!mismatch.empty()) {
    failure_.fail(mismatch, /*network=*/false);
  }
  bool network = true;
  if (failure_.failed()) {
    // This rank's group failed (here, or on another of its threads): tell the others.
    const std::string why = failure_.reason(&network);
    {
      std::lock_guard<std::mutex> lk(hub_->mu_); // the hub's failure: the first rank's wins
      if (hub_->broken_.empty()) {
        hub_->broken_ = why;
        hub_->brokenBy_ = rank_;
      }
    }
    hub_->cv_.notify_all();
    failPosted(why, network);
    return true;
  }
  if (!hubBroken.empty() && brokenBy != rank_) {
    // Another rank's group broke: this one breaks with its reason, as its Abort frame
    // would break it over the engine.
    failure_.fail(c10::str("ringpg: rank ", brokenBy, " aborted the group: ", hubBroken), /*network=*/true,
                  BreakCause::Remote);
    const std::string why = failure_.reason(&network); // the group's first reason, maybe another
    failPosted(why, network);
    return true;
  }
  return false;
}

void LoopbackLink::failPosted(const std::string& why, bool network) {
  for (auto& posted : posted_) {
    for (const auto& r : posted) {
      markFailed(*r, why, network);
    }
    posted.clear();
  }
}

std::unique_ptr<GroupLinks> loopbackGroupLinks(const std::shared_ptr<LoopbackHub>& hub, int rank) {
  const int size = hub->size();
  TORCH_CHECK(rank >= 0 && rank < size, "ringpg: rank ", rank, " outside an in-process group of ", size);
  auto g = std::make_unique<GroupLinks>();
  g->localAddress = "in-process";
  // No listener (nobody dials in) and no Store (a frame for the engine fails the group
  // when it dials: there is no address to read).
  Rendezvous rv;
  g->engine = std::make_unique<Engine>(rank, size, std::move(rv), g->failure, /*socketBuffer=*/0, /*congestion=*/"",
                                       /*spinMicros=*/0);
  g->topology = Topology::singleHost(size);
  g->engineLink = std::make_unique<EngineLink>(*g->engine);
  g->given = std::make_unique<LoopbackLink>(hub, rank, *g->failure);
  g->transport = "loopback";
  g->links = LinkTable::engineOnly(*g->engineLink, *g->engine, g->topology);
  g->links.routeAll(g->given.get());
  return g;
}

} // namespace ringpg
