#pragma once
// emu::Runtime: the runtime of backend::CudaBackend (cuda_backend.hpp) on the
// host. Memory is host memory (every address counts as the device's), copies
// are memcpy, streams are ignored and a launch runs the kernel's blocks one
// after another on the calling thread (cuda_emulation.hpp). With it the CUDA
// engine (placement/local_cuda.hpp) and its kernels run, unchanged, on
// machines without a GPU (the tests, skewadam-replay --backend cuda-emulated):
//
//   skewadam::Optimizer<skewadam::SkewAdamTiers, skewadam::backend::CudaBackend<emu::Runtime>> opt(h);

#include <skewadam_tools/cuda_emulation.hpp>

#include <cstddef>
#include <cstring>
#include <new>
#include <string>

#include <skewadam/backend/cuda/cuda_backend.hpp>
#include <skewadam/placement/local_cuda.hpp>

namespace emu {

struct Runtime {
  using stream_type = void*;
  static constexpr std::align_val_t alignment{256};  // as cudaMalloc's

  static void* allocate(std::size_t bytes) { return ::operator new(bytes == 0 ? 1 : bytes, alignment); }
  static void release(void* p) noexcept { ::operator delete(p, alignment); }
  static void zero(void* p, std::size_t n, stream_type) { std::memset(p, 0, n); }
  static void to_device(void* dst, const void* src, std::size_t n, stream_type) { std::memcpy(dst, src, n); }
  static void to_host(void* dst, const void* src, std::size_t n, stream_type) { std::memcpy(dst, src, n); }
  static void synchronize(stream_type) {}
  static void check_device_memory(const void*, const std::string&) {}

  template <auto Kernel, class... Args>
  static void launch(unsigned grid, unsigned threads, stream_type, Args... args) {
    if (grid == 0) return;
    emu::launch(grid, threads, [&] { Kernel(args...); });
  }
};

}  // namespace emu

namespace skewadam::tools {
/// The CUDA backend over the emulated runtime.
using EmulatedCuda = backend::CudaBackend<emu::Runtime>;
}  // namespace skewadam::tools
