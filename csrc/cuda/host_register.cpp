#include "cuda/host_register.h"

#include <c10/util/StringUtil.h>
#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstring>
#include <mutex>

namespace ringpg {
namespace {

// The runtime's entry points we use; cudaError_t is an int enum, 0 success.
using HostRegisterFn = int (*)(void*, size_t, unsigned int);
using HostUnregisterFn = int (*)(void*);
using GetLastErrorFn = int (*)();
constexpr unsigned int kHostRegisterPortable = 1; // cudaHostRegisterPortable

struct Runtime {
  HostRegisterFn hostRegister = nullptr;
  HostUnregisterFn hostUnregister = nullptr;
  GetLastErrorFn getLastError = nullptr;
  std::string missing; // why not, where the functions were not found
};

// dl_iterate_phdr's callback: the path of the first loaded object named libcudart*.
int findCudart(struct dl_phdr_info* info, size_t /*size*/, void* out) {
  const char* name = info->dlpi_name;
  if (name != nullptr && std::strstr(name, "libcudart") != nullptr) {
    *static_cast<std::string*>(out) = name;
    return 1;
  }
  return 0;
}

const Runtime& runtime() {
  static Runtime rt;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string path;
    dl_iterate_phdr(findCudart, &path);
    // RTLD_NOLOAD: only the runtime torch already loaded, never a second one.
    void* lib = path.empty() ? nullptr : dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
    if (lib == nullptr) {
      rt.missing = "no CUDA runtime (libcudart) is loaded in this process";
      return;
    }
    rt.hostRegister = reinterpret_cast<HostRegisterFn>(dlsym(lib, "cudaHostRegister"));
    rt.hostUnregister = reinterpret_cast<HostUnregisterFn>(dlsym(lib, "cudaHostUnregister"));
    rt.getLastError = reinterpret_cast<GetLastErrorFn>(dlsym(lib, "cudaGetLastError"));
    if (rt.hostRegister == nullptr || rt.hostUnregister == nullptr || rt.getLastError == nullptr) {
      rt.hostRegister = nullptr;
      rt.missing = c10::str(path, " lacks cudaHostRegister");
    }
  });
  return rt;
}

std::atomic<bool> refused{false}; // refuseHostRegistration

} // namespace

void refuseHostRegistration(bool refuse) {
  refused.store(refuse);
}

bool registerHostMemory(void* base, size_t bytes, std::string* why) {
  if (refused.load()) {
    *why = "refused in this process (ringpg._C.refuse_device_registration)";
    return false;
  }
  const Runtime& rt = runtime();
  if (rt.hostRegister == nullptr) {
    *why = rt.missing;
    return false;
  }
  const int err = rt.hostRegister(base, bytes, kHostRegisterPortable);
  if (err != 0) {
    rt.getLastError(); // clears it: not an error of the user's next kernel
    *why = c10::str("cudaHostRegister of ", bytes, " bytes failed (cudaError ", err, ")");
    return false;
  }
  return true;
}

void unregisterHostMemory(void* base) {
  const Runtime& rt = runtime();
  if (rt.hostUnregister != nullptr && rt.hostUnregister(base) != 0) {
    rt.getLastError();
  }
}

} // namespace ringpg
