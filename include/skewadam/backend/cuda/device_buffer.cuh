#pragma once
// DeviceBuffer<T>: cudaMalloc'd memory that frees itself (the CUDA runtime's
// DeviceArray, cuda_backend.hpp), movable, never copied; errors of the CUDA
// runtime become std::runtime_error naming the call (runtime.cuh).

#include <cuda_runtime.h>

#include "cuda_backend.hpp"
#include "runtime.cuh"

namespace skewadam::backend::cuda {

template <class T>
class DeviceBuffer : public DeviceArray<DeviceRuntime, T> {
 public:
  using DeviceArray<DeviceRuntime, T>::DeviceArray;

  /// Sets every byte to zero (synchronously).
  void zero() {
    if (!this->empty()) check(cudaMemset(this->data(), 0, this->bytes()), "cudaMemset");
  }
};

}  // namespace skewadam::backend::cuda
