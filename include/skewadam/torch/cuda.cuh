#pragma once
// CUDA tensors in skewadam::libtorch::Optimizer. One translation unit of the
// program, compiled by nvcc and linked with LibTorch's CUDA libraries,
// builds the CUDA engine of each variant it uses and registers it:
//
//   // skewadam_torch_cuda.cu
//   #include <skewadam/torch/cuda.cuh>
//   SKEWADAM_LIBTORCH_CUDA(skewadam::SkewAdamTiers)
//   SKEWADAM_LIBTORCH_CUDA(skewadam::AdamWTiers)   // (each variant used on the GPU)
//
// Every other file includes <skewadam/torch/optimizer.hpp> as on the CPU and
// needs no CUDA: an optimizer built on CUDA parameters (all on one device)
// finds the registered engine (torch/core.hpp) and runs its steps on the CUDA
// backend, on torch's current stream of that device, without waiting for
// them; its memory comes from torch's caching allocator, so torch counts it
// and freeing it waits for nothing. With Options::process_group the same
// unit's sharded engine (cuda::ShardedOptimizer over the group, through
// dist::AnyCommunicator, so that nvcc never sees c10d's headers) keeps this
// rank's share of the state on the device. Without this translation unit,
// CUDA parameters are refused with a message saying so. With CMake:
// `enable_language(CUDA)`, the .cu file in the target's sources, and the
// target linked with `${TORCH_LIBRARIES}` of a CUDA build of LibTorch
// (torch_cuda, c10_cuda) and `skewadam::skewadam`.

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>

#include "../cuda.cuh"
#include "../tiers/variants.hpp"
#include "core.hpp"

namespace skewadam::libtorch {

/// The device as torch sees it: its current stream, and its caching
/// allocator.
struct TorchCudaDevice {
  static cudaStream_t current_stream(int index) {
    return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(index)).stream();
  }
  /// Torch's caching allocator, for memory used in the order of `stream`
  /// (its blocks go back to torch's pool and are reused in that order; torch
  /// sees them in its memory statistics).
  static DeviceAllocator allocator(cudaStream_t stream) {
    DeviceAllocator a;
    a.allocate = [](std::size_t bytes, void* s) -> void* {
      return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, static_cast<cudaStream_t>(s));
    };
    a.release = [](void* p, void*) noexcept {
      try {
        c10::cuda::CUDACachingAllocator::raw_delete(p);
      } catch (...) {  // torch reports a failed free itself; nothing is left to undo
      }
    };
    a.context = stream;
    return a;
  }
  /// The options of an engine on `device`: its index, torch's current stream
  /// there and torch's allocator.
  static OptimizerOptions options(OptimizerOptions o, int device) {
    o.device = device;
    const cudaStream_t s = current_stream(device);
    o.stream = s;
    o.device_allocator = allocator(s);
    return o;
  }
};

/// The Core of Tiers on the CUDA backend, on torch's streams and memory.
template <class Tiers>
std::unique_ptr<Core> make_cuda_core(const PerTier<Hyperparameters>& hyper, const OptimizerOptions& options, int device) {
  return std::make_unique<DeviceCore<cuda::Optimizer<Tiers>, TorchCudaDevice>>(
      device, hyper, TorchCudaDevice::options(options, device));
}

/// The Core of Tiers on the CUDA backend sharded over `comm`, on torch's
/// streams: step() is collective and leaves every rank the complete
/// parameters.
template <class Tiers>
std::unique_ptr<Core> make_sharded_cuda_core(dist::AnyCommunicator& comm, const PerTier<Hyperparameters>& hyper,
                                             const OptimizerOptions& options, dist::ShardOptions shard, int device) {
  return std::make_unique<DeviceCore<cuda::ShardedOptimizer<Tiers, dist::AnyCommunicator>, TorchCudaDevice>>(
      device, comm, hyper, TorchCudaDevice::options(options, device), shard);
}

/// Registers the CUDA engines of Tiers, in one process and sharded, while it
/// lives (SKEWADAM_LIBTORCH_CUDA).
template <class Tiers>
struct RegisterCudaCore {
  RegisterCudaCore() {
    register_device_core<Tiers>("cuda", &make_cuda_core<Tiers>);
    register_sharded_device_core<Tiers>("cuda", &make_sharded_cuda_core<Tiers>);
  }
};

/// Registers the CUDA engines of every variant of a VariantList while it
/// lives (SKEWADAM_LIBTORCH_CUDA_ALL_VARIANTS).
template <class List>
struct RegisterCudaCores {
  RegisterCudaCores() {
    List::for_each([]<class Tiers>() { RegisterCudaCore<Tiers>{}; });
  }
};

}  // namespace skewadam::libtorch

#define SKEWADAM_LIBTORCH_CUDA_CONCAT_(a, b) a##b
#define SKEWADAM_LIBTORCH_CUDA_NAME_(line) SKEWADAM_LIBTORCH_CUDA_CONCAT_(skewadam_libtorch_cuda_, line)
/// Builds and registers the CUDA engine of `Tiers` (a TierRules variant) for
/// skewadam::libtorch::Optimizer<Tiers>; once per variant, at namespace scope.
#define SKEWADAM_LIBTORCH_CUDA(Tiers) \
  static const ::skewadam::libtorch::RegisterCudaCore<Tiers> SKEWADAM_LIBTORCH_CUDA_NAME_(__LINE__){};

/// The CUDA engines of every variant the library names (skewadam::Variants,
/// variants.hpp: SkewAdam with its momentum in fp32, bf16 or 8 bits, the
/// ablations, Adafactor-like and AdamW); once per program, at namespace scope.
#define SKEWADAM_LIBTORCH_CUDA_ALL_VARIANTS() \
  static const ::skewadam::libtorch::RegisterCudaCores<::skewadam::Variants> skewadam_libtorch_cuda_variants_{};
