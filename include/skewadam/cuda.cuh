#pragma once
// The optimizer front-end on an NVIDIA GPU (compile with nvcc):
//
//   #include <skewadam/cuda.cuh>
//   skewadam::Optimizer<skewadam::SkewAdamTiers, skewadam::cuda::Backend> opt(
//       skewadam::Hyperparameters{.lr = 3e-4}, {.stream = stream});
//   opt.add("blocks.1.moe.experts.w1", skewadam::Tier::experts,
//           skewadam::TensorView<skewadam::bf16>(d_w1, {128, 4096, 4096}),
//           skewadam::TensorView<const float>(d_gw1, {128, 4096, 4096}));
//   opt.step();
//
// Parameters, gradients and state live in device memory; everything of the
// front-end (optimizer.hpp) holds: names and tiers with every check, per-tier
// hyperparameters and schedules, the non-finite policy and StepReport (the
// skip is decided on the device; a checked step reads that decision before
// it returns), global gradient-norm clipping, fp32 gradients for bf16/fp16
// parameters, export/import and checkpoints (checkpoint.hpp: the same file
// as the CPU backend's, in both directions). state(id) views device memory;
// export_state() copies it to the host.
//
// The engine is placement/local_cuda.hpp, the runtime backend/cuda/runtime.cuh.

#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/runtime.cuh"
#include "optimizer.hpp"
#include "placement/local_cuda.hpp"

namespace skewadam::cuda {

/// The CUDA backend over the CUDA runtime.
using Backend = backend::CudaBackend<backend::cuda::DeviceRuntime>;

}  // namespace skewadam::cuda
