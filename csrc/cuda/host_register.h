// Page-locking host memory that torch's allocators did not make (a host arena's
// segment, transport/arena.h), so that copies between it and a CUDA device run by DMA
// at the copy engines' speed, asynchronously, with no bounce through a driver buffer.
//
// Through the CUDA runtime that torch's CUDA build has already loaded into the process,
// found by name at run time (dl_iterate_phdr, dlsym): no CUDA headers and no link
// against it, so the same build serves CPU-only machines, where registering says no.
#pragma once

#include <cstddef>
#include <string>

namespace ringpg {

// Registers [base, base + bytes) as pinned for every device context (the runtime's
// portable flag) on the calling thread's current device.  False where the process has
// no CUDA runtime loaded or it refused (`*why` says which); a refusal leaves the
// runtime's last error cleared, so torch's next check does not report it.
bool registerHostMemory(void* base, size_t bytes, std::string* why);

// From now on registerHostMemory refuses (`refuse`) or tries again, in this process:
// for the tests of what runs where it refuses.
void refuseHostRegistration(bool refuse);

// Undoes registerHostMemory(base, ...).  Errors are ignored: at process exit the
// runtime may be gone already.
void unregisterHostMemory(void* base);

} // namespace ringpg
