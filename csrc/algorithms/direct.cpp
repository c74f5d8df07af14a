#include "algorithms/direct.h"

#include <c10/util/irange.h>

#include <cstring>

namespace ringpg {

void gatherTo(OpContext& c, int root, const char* input, size_t nbytes, const std::vector<char*>& outputs) {
  const int p = c.size();
  const int r = c.rank();
  if (r != root) {
    std::vector<RequestPtr> s{c.send(root, input, nbytes)};
    c.waitAll(s);
    return;
  }
  std::vector<RequestPtr> recvs;
  for (const auto d : c10::irange(1, p)) {
    const int q = (r + d) % p;
    recvs.push_back(c.recv(q, outputs[q], nbytes));
  }
  if (nbytes > 0 && outputs[r] != input) {
    std::memcpy(outputs[r], input, nbytes);
  }
  c.waitAll(recvs);
}

void scatterFrom(OpContext& c, int root, const std::vector<const char*>& inputs, char* output, size_t nbytes) {
  const int p = c.size();
  const int r = c.rank();
  if (r != root) {
    std::vector<RequestPtr> rv{c.recv(root, output, nbytes)};
    c.waitAll(rv);
    return;
  }
  std::vector<RequestPtr> sends;
  for (const auto d : c10::irange(1, p)) {
    const int q = (r + d) % p;
    sends.push_back(c.send(q, inputs[q], nbytes));
  }
  if (nbytes > 0 && inputs[r] != output) {
    std::memcpy(output, inputs[r], nbytes);
  }
  c.waitAll(sends);
}

void oneShotAllreduce(OpContext& c, char* data, int64_t count, size_t elemSize, RedOp op,
                      const std::function<void(char*, int64_t)>& finalize) {
  const int p = c.size();
  const int r = c.rank();
  const size_t nbytes = static_cast<size_t>(count) * elemSize;
  // Slot q holds peer q's buffer; slot p is the accumulator.
  char* slots = c.scratch(nbytes * (p + 1));
  std::vector<RequestPtr> reqs;
  for (const auto d : c10::irange(1, p)) {
    const int q = (r - d + p) % p;
    reqs.push_back(c.recv(q, slots + q * nbytes, nbytes));
  }
  for (const auto d : c10::irange(1, p)) {
    const int q = (r + d) % p;
    reqs.push_back(c.send(q, data, nbytes));
  }
  c.waitAll(reqs);
  auto from = [&](int q) -> const char* { return q == r ? data : slots + q * nbytes; };
  char* acc = slots + p * nbytes;
  reduce(c.dtype(), op, acc, from(0), from(1), count);
  for (const auto q : c10::irange(2, p)) {
    reduce(c.dtype(), op, acc, acc, from(q), count);
  }
  if (finalize) {
    finalize(acc, count);
  }
  std::memcpy(data, acc, nbytes);
}

void allToAll(OpContext& c, const std::vector<const char*>& sendBuf, const std::vector<size_t>& sendBytes,
              const std::vector<char*>& recvBuf, const std::vector<size_t>& recvBytes) {
  const int p = c.size();
  const int r = c.rank();
  std::vector<RequestPtr> reqs;
  for (const auto d : c10::irange(1, p)) {
    const int q = (r - d + p) % p;
    reqs.push_back(c.recv(q, recvBuf[q], recvBytes[q]));
  }
  for (const auto d : c10::irange(1, p)) {
    const int q = (r + d) % p;
    reqs.push_back(c.send(q, sendBuf[q], sendBytes[q]));
  }
  if (recvBytes[r] > 0 && recvBuf[r] != sendBuf[r]) {
    std::memcpy(recvBuf[r], sendBuf[r], recvBytes[r]);
  }
  c.waitAll(reqs);
}

} // namespace ringpg
