// The receive side of one TCP connection: a state machine over its stream of frames
// (transport/wire.h) that knows where the next bytes go.  It does no I/O and takes no
// lock: the Engine calls it with its mutex held, reads the socket into nextRead(), and
// decides where a complete header's payload goes (that needs the engine's queues).
//
//                 header complete            routed: a posted receive
//      kHeader ------------------> kPaused ---------------------------> kPayload ---+
//         ^                         | | |   routed: nobody asked yet, or an Abort    |
//         |                         | | +-------------------------------> kStash ---+
//         |                         | |     routed: a p2p receive of another size    |
//         |                         | +---------------------------------> kDiscard -+
//         |                         |       routed: goodbye                          |
//         |                         +-----------------------------------> kClosed    |
//         +------------------------------------------------- payload complete ------+
//   and from every state to kClosed when the group fails (abandon()), as from kHeader at
//   a frame boundary when the peer leaves (its stream ends there, nothing of it expected).
//
// A header leaves kPaused as soon as it is routed, which is at once unless it belongs
// to the op this rank is running and that op has not posted its receive yet: then the
// socket is not read until postRecv routes the header (flow control through the
// kernel's buffer instead of a copy aside).
//
// Hot path: nextRead() and advance() run once per recv() and are inline, with no
// allocation; the only allocation is stash()'s, for a frame nobody has asked for.
#pragma once

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "transport/request.h"
#include "transport/wire.h"

namespace ringpg {

// A frame read aside because no receive was posted for it yet.
struct Stashed {
  FrameHeader hdr;
  std::vector<char> data;
};

class FrameReceiver {
 public:
  enum class State : uint8_t {
    kHeader,  // reading a frame header; got_ bytes of it so far
    kPaused,  // a whole header in hdr_, its payload not routed yet; the socket is not read
    kPayload, // reading the payload into target_'s buffer (a posted receive of exactly nbytes)
    kStash,   // reading the payload into stash_ (a frame nobody asked for yet, or an Abort's reason)
    kDiscard, // reading the payload into scratch_ and dropping it (its receive failed on size)
    kClosed,  // nothing is read any more: the peer said goodbye or left, or the group failed
  };
  // What the bytes given to advance() completed.
  enum class Completed : uint8_t { kNothing, kHeader, kPayload };

  State state() const { return state_; }
  // kPaused and kClosed leave the socket alone; every other state reads it.
  bool readsSocket() const { return state_ != State::kPaused && state_ != State::kClosed; }
  bool closed() const { return state_ == State::kClosed; }
  // Between two frames: no byte of a header or payload read (a stream that ends here
  // ends cleanly).
  bool atFrameBoundary() const { return state_ == State::kHeader && got_ == 0; }
  // The frame being received: complete from kPaused until the payload is done.
  const FrameHeader& header() const { return hdr_; }

  // Where the next recv() writes, and at most how many bytes (a payload's read is also
  // capped by `budget`, the bytes left to this pass of the progress loop).
  std::pair<char*, size_t> nextRead(size_t budget) {
    switch (state_) {
      case State::kHeader:
        return {reinterpret_cast<char*>(&hdr_) + got_, sizeof(FrameHeader) - got_};
      case State::kPayload:
        return {target_->buf + got_, std::min<size_t>(hdr_.nbytes - got_, budget)};
      case State::kStash:
        return {stash_.data.data() + got_, std::min<size_t>(hdr_.nbytes - got_, budget)};
      case State::kDiscard:
        return {scratch_.data(), std::min({hdr_.nbytes - got_, scratch_.size(), budget})};
      case State::kPaused:
      case State::kClosed:
        break;
    }
    TORCH_INTERNAL_ASSERT(false, "FrameReceiver::nextRead in a state that does not read");
  }

  // `n` more bytes arrived where nextRead() said.  kHeader moves to kPaused when the
  // header is whole; a payload state reports kPayload when its last byte is in (the
  // caller then ends it with endDelivery / endStash / endDiscard).
  Completed advance(size_t n) {
    got_ += n;
    if (state_ == State::kHeader) {
      TORCH_INTERNAL_ASSERT(got_ <= sizeof(FrameHeader));
      if (got_ < sizeof(FrameHeader)) {
        return Completed::kNothing;
      }
      state_ = State::kPaused;
      got_ = 0;
      return Completed::kHeader;
    }
    TORCH_INTERNAL_ASSERT(got_ <= hdr_.nbytes, "read past the payload of ", describeFrame(hdr_));
    return got_ == hdr_.nbytes ? Completed::kPayload : Completed::kNothing;
  }

  // --- Routing a paused header (the header stays readable through header()) ---

  // The payload goes to `req`, a posted receive whose length the caller matched with
  // the header's: nothing is ever written past the buffer its owner posted.
  void deliverTo(RequestPtr req) {
    TORCH_INTERNAL_ASSERT(state_ == State::kPaused && req && req->len == hdr_.nbytes);
    target_ = std::move(req);
    enterPayload(State::kPayload);
  }
  // The payload is read aside, nbytes of it; the caller has bounded nbytes.  Throws
  // std::bad_alloc (the state is then unchanged).
  void stash() {
    TORCH_INTERNAL_ASSERT(state_ == State::kPaused);
    stash_.data.assign(hdr_.nbytes, 0);
    stash_.hdr = hdr_;
    enterPayload(State::kStash);
  }
  // The payload is read and dropped, through a small buffer kept for the purpose.
  void discard() {
    TORCH_INTERNAL_ASSERT(state_ == State::kPaused);
    if (scratch_.empty()) {
      scratch_.resize(kScratchBytes);
    }
    enterPayload(State::kDiscard);
  }
  // The header was a goodbye: the peer sends nothing more.
  void close() {
    TORCH_INTERNAL_ASSERT(state_ == State::kPaused);
    state_ = State::kClosed;
  }
  // Whether the payload state just entered is already complete (a 0-byte payload).
  bool payloadComplete() const { return isPayloadState() && got_ == hdr_.nbytes; }

  // --- Ending a complete payload; each goes back to kHeader ---

  // kPayload: the receive whose buffer now holds the payload.
  RequestPtr endDelivery() {
    TORCH_INTERNAL_ASSERT(state_ == State::kPayload && got_ == hdr_.nbytes);
    nextFrame();
    return std::move(target_);
  }
  // kStash: the frame read aside.
  Stashed endStash() {
    TORCH_INTERNAL_ASSERT(state_ == State::kStash && got_ == hdr_.nbytes);
    nextFrame();
    return std::exchange(stash_, Stashed{});
  }
  // kDiscard.
  void endDiscard() {
    TORCH_INTERNAL_ASSERT(state_ == State::kDiscard && got_ == hdr_.nbytes);
    nextFrame();
  }

  // The group failed: nothing is read any more, whatever was half-read is dropped.
  // Returns the receive a payload was being read into (null if none), for the caller
  // to fail.  The caller must own the socket (no recv() into that buffer in flight).
  RequestPtr abandon() {
    state_ = State::kClosed;
    stash_ = Stashed{};
    return std::move(target_);
  }

  // Where the stream stands, for reading on past it once the connection failed
  // (Engine::failLostPeerLocked): the header so far, the bytes of it read, how much of
  // the current payload is still unread, and the part of an Abort's reason already in.
  struct Position {
    FrameHeader hdr;
    size_t headerGot = 0;    // sizeof(FrameHeader) when paused (a whole header, unrouted)
    uint64_t payloadLeft = 0;
    bool inAbort = false;    // the payload being read is an Abort's reason
    std::string abortSoFar;
  };
  // A receiver that reads on from `at` (another's position) and delivers nothing: a
  // payload under way is read aside where it is an Abort's reason (the part already in
  // kept), else dropped.  For reading past a lost connection's last frames
  // (Engine::failLostPeerLocked) with the same parser as the live stream.
  static FrameReceiver resumingAt(const Position& at) {
    FrameReceiver rx;
    rx.hdr_ = at.hdr;
    if (at.payloadLeft > 0) {
      rx.got_ = at.hdr.nbytes - at.payloadLeft;
      if (at.inAbort) {
        rx.state_ = State::kStash;
        rx.stash_.hdr = at.hdr;
        rx.stash_.data.assign(at.hdr.nbytes, 0);
        std::copy(at.abortSoFar.begin(), at.abortSoFar.end(), rx.stash_.data.begin());
      } else {
        rx.state_ = State::kDiscard;
        rx.scratch_.resize(kScratchBytes);
      }
    } else if (at.headerGot == sizeof(FrameHeader)) {
      rx.state_ = State::kPaused;
    } else {
      rx.got_ = at.headerGot;
    }
    return rx;
  }

  Position position() const {
    Position at;
    at.hdr = hdr_;
    if (state_ == State::kHeader) {
      at.headerGot = got_;
    } else if (state_ == State::kPaused) {
      at.headerGot = sizeof(FrameHeader);
    } else if (isPayloadState()) {
      at.payloadLeft = hdr_.nbytes - got_;
      at.inAbort = state_ == State::kStash && hasKind(hdr_, FrameKind::Abort);
      if (at.inAbort) {
        at.abortSoFar.assign(stash_.data.data(), got_);
      }
    }
    return at;
  }

 private:
  // Discarded payloads pass through this many bytes at a time.
  static constexpr size_t kScratchBytes = 64 << 10;

  bool isPayloadState() const {
    return state_ == State::kPayload || state_ == State::kStash || state_ == State::kDiscard;
  }
  void enterPayload(State s) {
    state_ = s;
    got_ = 0;
  }
  void nextFrame() {
    state_ = State::kHeader;
    got_ = 0;
  }

  State state_ = State::kHeader;
  FrameHeader hdr_;          // the frame being received (partial in kHeader)
  size_t got_ = 0;           // bytes of the header (kHeader) or of the payload (payload states) read
  RequestPtr target_;        // kPayload: where the payload goes; null otherwise
  Stashed stash_;            // kStash: the frame being read aside
  std::vector<char> scratch_; // kDiscard: a throw-away buffer, allocated at the first discard
};

} // namespace ringpg
