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
// hyperparameters and schedules, the non-finite policy and StepReport,
// global gradient-norm clipping, fp32 gradients for bf16/fp16 parameters,
// export/import and checkpoints (checkpoint.hpp: the same file as the CPU
// backend's, in both directions). state(id) views device memory;
// export_state() copies it to the host.
//
// Step counts live on the device too: step() returns nothing and never waits
// for the GPU (under NonFinitePolicy::raise it waits, to throw); a step with
// an offending gradient is skipped by the kernels, and last_step(), steps()
// and export_state() read the device's answer when asked. A step can be
// captured in a CUDA graph and replayed, each replay a counted step:
//
//   auto graph = opt.capture_step();   // on OptimizerOptions::stream
//   for (...) { /* write the gradients */ opt.replay(graph); }
//
// The backend is engine/backend/cuda/cuda_backend.hpp, the runtime
// engine/backend/cuda/runtime.cuh. cuda::ShardedOptimizer<Tiers, Comm> shards the
// state over the ranks of a communicator (MPI, NCCL; engine/placement/sharded.hpp):
// step() is collective, gather_params() completes every rank's parameters,
// save_checkpoint / load_checkpoint write and read the single-process file.

#include "engine/backend/cuda/cuda_backend.hpp"
#include "engine/backend/cuda/runtime.cuh"
#include "engine/placement/sharded.hpp"
#include "optimizer.hpp"

namespace skewadam::cuda {

/// The CUDA backend over the CUDA runtime.
using Backend = backend::CudaBackend<backend::cuda::DeviceRuntime>;

/// The front-end over it.
template <class Tiers = SkewAdamTiers>
using Optimizer = skewadam::Optimizer<Tiers, Backend>;

/// The front-end over it, the state sharded over the ranks of a Comm
/// (engine/placement/sharded.hpp); several ranks may share a GPU.
template <class Tiers = SkewAdamTiers, dist::Communicator Comm = dist::SelfCommunicator>
using ShardedOptimizer = skewadam::Optimizer<Tiers, Backend, dist::Sharded<Comm>>;

using backend::cuda::device_count;

}  // namespace skewadam::cuda
