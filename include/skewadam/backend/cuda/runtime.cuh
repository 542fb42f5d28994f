#pragma once
// backend::cuda::DeviceRuntime: the CUDA runtime under CudaBackend
// (cuda_backend.hpp). Compiled by nvcc: a launch is kernel<<<...>>>.
//
//   skewadam::Optimizer<skewadam::SkewAdamTiers, skewadam::backend::CudaBackend<skewadam::backend::cuda::DeviceRuntime>>
//       opt(h, {.stream = stream});
//
// (skewadam/cuda.cuh names the backend skewadam::cuda::Backend.) Errors of
// the runtime become std::runtime_error naming the call; memory that is not
// the device's (or managed) is refused with std::invalid_argument.

#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string>

#include "cuda_backend.hpp"

namespace skewadam::backend::cuda {

/// Throws std::runtime_error("what: <CUDA's message>") unless e is cudaSuccess.
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear a sticky-free error so later calls are not blamed for it
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
  }
}

/// Number of CUDA devices; 0 when there is none or no driver (never throws).
inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

struct DeviceRuntime {
  using stream_type = cudaStream_t;

  static void* allocate(std::size_t bytes) {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes == 0 ? 1 : bytes), "cudaMalloc");
    return p;
  }
  static void release(void* p) noexcept { (void)cudaFree(p); }
  static void zero(void* p, std::size_t n, cudaStream_t s) { check(cudaMemsetAsync(p, 0, n, s), "cudaMemsetAsync"); }
  /// From pageable memory: the source is staged before the call returns.
  static void to_device(void* dst, const void* src, std::size_t n, cudaStream_t s) {
    check(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync (to the device)");
  }
  static void to_host(void* dst, const void* src, std::size_t n, cudaStream_t s) {
    check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync (to the host)");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  }
  static void synchronize(cudaStream_t s) { check(cudaStreamSynchronize(s), "cudaStreamSynchronize"); }
  static void check_device_memory(const void* p, const std::string& who) {
    cudaPointerAttributes a{};
    const cudaError_t err = cudaPointerGetAttributes(&a, p);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      throw std::invalid_argument(who + ": not a CUDA pointer (" + cudaGetErrorString(err) + ")");
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
      throw std::invalid_argument(who + ": host memory; the CUDA backend needs device or managed memory");
  }

  template <auto Kernel, class... Args>
  static void launch(unsigned grid, unsigned threads, cudaStream_t s, Args... args) {
    if (grid == 0) return;
    Kernel<<<grid, threads, 0, s>>>(args...);
    check(cudaGetLastError(), "skewadam CUDA step: kernel launch");
  }
};

}  // namespace skewadam::backend::cuda
