#include "cuda/device_sync.h"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include "common/errors.h"

namespace ringpg {

DeviceSync::DeviceSync(c10::Device device) : device_(device), ready_(device.type()), done_(device.type()) {}

std::shared_ptr<DeviceSync> DeviceSync::capture(const char* op, const std::vector<at::Tensor>& inputs,
                                                const std::vector<at::Tensor>& outputs) {
  std::optional<c10::Device> dev;
  for (const auto* tensors : {&inputs, &outputs}) {
    for (const auto& t : *tensors) {
      if (!t.defined() || t.device().is_cpu()) {
        continue;
      }
      RINGPG_CHECK(!dev || *dev == t.device(), op, "tensors on different devices (", *dev, " and ", t.device(),
                   ") in one call");
      dev = t.device();
    }
  }
  if (!dev) {
    return nullptr;
  }
  auto sync = std::shared_ptr<DeviceSync>(new DeviceSync(*dev));
  c10::impl::VirtualGuardImpl impl(dev->type());
  sync->ready_.record(impl.getStream(*dev));
  return sync;
}

void DeviceSync::waitForCaller() {
  ready_.synchronize();
}

void DeviceSync::markDone() {
  c10::impl::VirtualGuardImpl impl(device_.type());
  done_.record(impl.getStream(device_));
  doneRecorded_ = true;
}

void DeviceSync::blockCurrentStream() {
  if (doneRecorded_) {
    c10::impl::VirtualGuardImpl impl(device_.type());
    done_.block(impl.getStream(device_));
  }
}

} // namespace ringpg
