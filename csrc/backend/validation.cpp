#include "backend/validation.h"

#include "common/errors.h"
#include "common/torch_compat.h"
#include "reduce/reduce.h"

namespace ringpg {

void checkTensor(const char* op, const at::Tensor& t) {
  RINGPG_CHECK(t.defined(), op, "undefined tensor");
  RINGPG_CHECK(t.layout() == at::kStrided, op, "only dense (strided) tensors are supported, got ", t.layout(),
               " (sparse tensors are not supported)");
  RINGPG_CHECK(t.device().is_cpu() || t.device().is_cuda(), op, "tensors must be on cpu or cuda, got ", t.device());
}

void checkSingle(const char* op, const std::vector<at::Tensor>& ts) {
  RINGPG_CHECK(ts.size() == 1, op, "expects exactly one tensor per call, got ", ts.size());
  checkTensor(op, ts[0]);
}

void checkSameDevice(const char* op, const at::Tensor& a, const at::Tensor& b) {
  RINGPG_CHECK(a.device() == b.device(), op, "tensors on different devices (", a.device(), " and ", b.device(),
               ") in one call");
}

void checkSameTypeAndSize(const char* op, const at::Tensor& ref, const at::Tensor& t, const char* what) {
  checkTensor(op, t);
  checkSameDevice(op, ref, t);
  RINGPG_CHECK(t.scalar_type() == ref.scalar_type(), op, what, " has dtype ", t.scalar_type(), " but the input has ",
               ref.scalar_type());
  RINGPG_CHECK(t.numel() == ref.numel(), op, what, " has ", t.numel(), " elements but the input has ", ref.numel());
}

uint64_t checkUniform(const char* op, const std::vector<at::Tensor>& ts) {
  RINGPG_CHECK(!ts.empty(), op, "no tensors");
  uint64_t total = 0;
  for (const auto& t : ts) {
    checkTensor(op, t);
    checkSameDevice(op, ts[0], t);
    RINGPG_CHECK(t.scalar_type() == ts[0].scalar_type(), op, "all tensors must share a dtype");
    total += t.numel();
  }
  return total;
}

void checkScaledPair(const char* op, const at::Tensor& small, const at::Tensor& big, int size, const char* smallName,
                     const char* bigName, int64_t index) {
  checkTensor(op, small);
  checkTensor(op, big);
  checkSameDevice(op, small, big);
  if (index >= 0) { // a pair of a coalesced call: one message for both properties
    RINGPG_CHECK(big.scalar_type() == small.scalar_type() && big.numel() == small.numel() * size, op, bigName, " ",
                 index, " must have the ", smallName, "'s dtype and numel x group size");
    return;
  }
  RINGPG_CHECK(big.scalar_type() == small.scalar_type(), op, bigName, " dtype ", big.scalar_type(), " differs from ",
               smallName, " dtype ", small.scalar_type());
  RINGPG_CHECK(big.numel() == small.numel() * size, op, bigName, " has ", big.numel(), " elements, expected ",
               smallName, " numel x group size = ", small.numel() * size);
}

void checkRoot(const char* op, int64_t root, int size) {
  RINGPG_CHECK(root >= 0 && root < size, op, "invalid root rank ", root, " for a group of size ", size);
}

void checkListLength(const char* op, size_t got, int size, const char* what) {
  RINGPG_CHECK(static_cast<int>(got) == size, op, what, " must hold one tensor per rank (", size, "), got ", got);
}

std::vector<at::Tensor> checkPerRankList(const char* op, const std::vector<std::vector<at::Tensor>>& lists,
                                         const at::Tensor& ref, int size, const char* what) {
  RINGPG_CHECK(lists.size() == 1, op, "expects one ", what, " list, got ", lists.size());
  checkListLength(op, lists[0].size(), size, c10::str("the ", what, " list").c_str());
  const std::string each = c10::str("an ", what, " tensor");
  for (const auto& t : lists[0]) {
    checkSameTypeAndSize(op, ref, t, each.c_str());
  }
  return lists[0];
}

std::vector<at::Tensor> checkRootList(const char* op, const std::vector<std::vector<at::Tensor>>& lists,
                                      const at::Tensor& ref, int rank, int root, int size, const char* what) {
  if (rank == root) {
    return checkPerRankList(op, lists, ref, size, what);
  }
  RINGPG_CHECK(lists.empty() || (lists.size() == 1 && lists[0].empty()), op, "only the root (rank ", root,
               ") may pass ", what, " tensors");
  return {};
}

void checkPeer(const char* op, int peer, int rank, int size, const char* what) {
  RINGPG_CHECK(peer >= 0 && peer < size && peer != rank, op, "invalid ", what, " rank ", peer, " (group size ", size,
               ", this rank ", rank, ")");
}

Reduction toReduction(const char* op, const c10d::ReduceOp& rop, at::ScalarType dtype) {
  Reduction r;
  RINGPG_CHECK(!at::isComplexType(dtype) || rop.op_ == c10d::ReduceOp::SUM || rop.op_ == c10d::ReduceOp::AVG ||
                   rop.op_ == c10d::ReduceOp::PREMUL_SUM,
               op, "complex tensors support SUM, AVG and PREMUL_SUM only");
  switch (rop.op_) {
    case c10d::ReduceOp::SUM:
      r.op = RedOp::Sum;
      break;
    case c10d::ReduceOp::AVG:
      r.op = RedOp::Sum;
      r.average = true;
      break;
    case c10d::ReduceOp::PRODUCT:
      r.op = RedOp::Prod;
      break;
    case c10d::ReduceOp::MIN:
      r.op = RedOp::Min;
      break;
    case c10d::ReduceOp::MAX:
      r.op = RedOp::Max;
      break;
    case c10d::ReduceOp::BAND:
      r.op = RedOp::Band;
      break;
    case c10d::ReduceOp::BOR:
      r.op = RedOp::Bor;
      break;
    case c10d::ReduceOp::BXOR:
      r.op = RedOp::Bxor;
      break;
    case c10d::ReduceOp::PREMUL_SUM: {
      r.op = RedOp::Sum;
      auto* sup = dynamic_cast<compat::PreMulSumSupplement*>(rop.supplement_.get());
      RINGPG_CHECK(sup, op, "PREMUL_SUM without its factor");
      if (sup->tensor_factor.defined()) {
        r.premulTensor = sup->tensor_factor;
      } else {
        r.premul = sup->double_factor;
      }
      RINGPG_CHECK(at::isFloatingType(dtype) || at::isComplexType(dtype), op,
                   "PREMUL_SUM needs a floating or complex dtype, got ", dtype);
      break;
    }
    default:
      RINGPG_CHECK(false, op, "unsupported reduce op ", static_cast<int>(rop.op_));
  }
  RINGPG_CHECK(reduceSupported(reduceDtype(dtype), r.op), op, "ReduceOp ", redOpName(r.op),
               " is not supported for dtype ", dtype);
  RINGPG_CHECK(!r.average || dtype != at::kBool, op, "AVG is not defined for bool tensors");
  return r;
}

std::vector<int64_t> resolveSplits(const char* op, const std::vector<int64_t>& splits, int64_t rows, int size,
                                   const char* what) {
  if (splits.empty()) {
    RINGPG_CHECK(rows % size == 0, op, what, " dim 0 (", rows, ") is not divisible by group size ", size);
    return std::vector<int64_t>(size, rows / size);
  }
  checkListLength(op, splits.size(), size, what);
  int64_t sum = 0;
  for (auto s : splits) {
    RINGPG_CHECK(s >= 0, op, "negative split size ", s);
    sum += s;
  }
  RINGPG_CHECK(sum == rows, op, what, " sum to ", sum, " but dim 0 is ", rows);
  return splits;
}

} // namespace ringpg
