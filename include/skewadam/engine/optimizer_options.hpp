#pragma once
// OptimizerOptions: what an optimizer is built with besides its
// hyperparameters; the engine under it (engine.hpp) takes its own part.

#include <cstdint>

#include "../memory/device_allocator.hpp"
#include "grad_norm_clip.hpp"
#include "nonfinite.hpp"

namespace skewadam {

struct OptimizerOptions {
  std::uint64_t seed = 0x5eed5eedULL;  ///< stochastic-rounding seed
  int threads = 0;                      ///< CPU backend: threads per step (0: the hardware's count)
  NonFinitePolicy nonfinite = NonFinitePolicy::skip_step;  ///< see nonfinite.hpp
  /// > 0: every step clips the global gradient norm to it (0: off): by
  /// default this step's norm, as clip_grad_norm(max_grad_norm) before each
  /// step would; with clip_norm = ClipNorm::previous, the previous step's
  /// (grad_norm_clip.hpp), which the step inside backward can do.
  double max_grad_norm = 0;
  ClipNorm clip_norm = ClipNorm::current;
  /// CUDA backend: the cudaStream_t steps are ordered on (null: the default
  /// stream). Ignored by the CPU backend.
  void* stream = nullptr;
  /// CUDA backend: the device its memory and steps are on (-1: the current
  /// device when the optimizer is built). Every tensor added must be that
  /// device's memory; each call that launches or allocates makes it current
  /// for its duration and restores the caller's. Ignored by the CPU backend.
  int device = -1;
  /// CUDA backend: where its memory comes from (device_allocator.hpp; empty:
  /// the runtime's own). Ignored by the CPU backend.
  DeviceAllocator device_allocator{};
};

}  // namespace skewadam
