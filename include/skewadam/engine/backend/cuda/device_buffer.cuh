#pragma once
// DeviceBuffer<T>: cudaMalloc'd memory that frees itself (the CUDA runtime's
// DeviceArray, device_memory.hpp), movable, never copied; errors of the CUDA
// runtime become std::runtime_error naming the call (runtime.cuh).

#include <cuda_runtime.h>

#include "device_memory.hpp"
#include "runtime.cuh"

namespace skewadam::backend::cuda {

template <class T>
class DeviceBuffer : public DeviceArray<DeviceRuntime, T> {
 public:
  using DeviceArray<DeviceRuntime, T>::DeviceArray;

  /// Sets every byte to zero, synchronously: the memory is zero when it
  /// returns, for the host and every stream (cudaMemset alone returns before
  /// the device has run it). Work of other streams still writing the buffer
  /// is the caller's to wait for.
  void zero() { DeviceMemory<DeviceRuntime>::clear(this->data(), this->bytes()); }
};

}  // namespace skewadam::backend::cuda
