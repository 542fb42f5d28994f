#pragma once
// DeviceAllocator: where a device backend takes its memory from (its state,
// workspace and tables) when the caller has its own allocator, such as a
// framework's caching allocator (the LibTorch adapter sets torch's, so that
// the framework sees the memory, freeing it does not wait for the device, and
// a step can be captured in the framework's CUDA graphs). Left empty, the
// runtime's own (cudaMalloc, cudaFree). The CPU backend ignores it.
//
//   allocate(bytes, context) -> device memory of the optimizer's device, at
//                               least 256-byte aligned (as cudaMalloc's);
//                               throws, or returns null, when it has none
//   release(p, context)      -> gives p back; never throws
//
// The backend calls both with its device current, allocate only outside a
// step, and release only for memory that its stream no longer uses (it waits
// for the stream first).

#include <cstddef>
#include <stdexcept>
#include <string>

namespace skewadam {

struct DeviceAllocator {
  void* (*allocate)(std::size_t bytes, void* context) = nullptr;
  void (*release)(void* p, void* context) noexcept = nullptr;
  void* context = nullptr;  ///< passed to both, as given

  /// Whether it is set (both functions), rather than the runtime's own.
  bool set() const noexcept { return allocate != nullptr; }
};

namespace detail {

/// std::invalid_argument naming `what` unless both functions are set or neither.
inline const DeviceAllocator& checked_allocator(const DeviceAllocator& a, const char* what = "device_allocator") {
  if ((a.allocate == nullptr) != (a.release == nullptr))
    throw std::invalid_argument(std::string(what) + ": allocate and release are set together or not at all");
  return a;
}

}  // namespace detail
}  // namespace skewadam
