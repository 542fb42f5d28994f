#pragma once
// CUDA error checks and an owning device buffer.
//
// Errors of the CUDA runtime become std::runtime_error naming the call; the
// library never exits. DeviceBuffer<T> is cudaMalloc'd memory that frees
// itself, movable, never copied.

#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>

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

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    if (n_ > 0) check(cudaMalloc(reinterpret_cast<void**>(&p_), n_ * sizeof(T)), "cudaMalloc");
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { release(); }

  T* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }
  bool empty() const noexcept { return n_ == 0; }

  /// Sets every byte to zero (synchronously).
  void zero() {
    if (n_ > 0) check(cudaMemset(p_, 0, n_ * sizeof(T)), "cudaMemset");
  }

 private:
  void release() noexcept {
    if (p_) (void)cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace skewadam::backend::cuda
