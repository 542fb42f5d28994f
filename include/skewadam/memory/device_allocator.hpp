#pragma once
// DeviceAllocator: where a device backend takes its memory from (its state,
// workspace and tables) when the caller has its own allocator, such as a
// framework's caching allocator (the LibTorch adapter sets torch's, so that
// the framework counts the memory, freeing it does not wait for the device,
// and no cudaMalloc runs while the framework captures a graph). Left empty, the
// runtime's own (cudaMalloc, cudaFree). The CPU backend ignores it.
//
//   allocate(bytes, context) -> device memory of the optimizer's device, at
//                               least 256-byte aligned (as cudaMalloc's);
//                               throws, or returns null, when it has none
//   release(p, context)      -> gives p back; never throws
//
// The backend calls allocate with its device current, and only outside a
// step. It may release memory that work already enqueued on its stream
// still reads: release orders the memory's reuse after that work, as a
// stream-ordered allocator does (torch's, for memory allocated on that
// stream; cudaFree waits for the device).

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
