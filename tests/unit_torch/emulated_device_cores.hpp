#pragma once
// The library's CUDA backend on the emulated runtime
// (tools/common/skewadam_tools/emulated_runtime.hpp) as the LibTorch
// adapter's device engines, in one process and sharded: what torch/cuda.cuh
// registers for CUDA tensors, built for a machine without a GPU. A test
// registers them for CPU tensors, so that the adapter's device path runs.

#include <skewadam_tools/emulated_runtime.hpp>  // (before the CUDA engines: it defines what nvcc would)

#include <memory>

#include <skewadam/comm/any_communicator.hpp>

#include <skewadam/engine/placement/sharded.hpp>
#include <skewadam/torch/core.hpp>

namespace skewadam_torch_test {

/// The emulated device's stream: the default.
struct EmulatedDevice {
  static void* current_stream(int) { return nullptr; }
};

template <class Tiers>
std::unique_ptr<skewadam::libtorch::Core> make_emulated_core(const skewadam::PerTier<skewadam::Hyperparameters>& hyper,
                                                             const skewadam::OptimizerOptions& options, int device) {
  using Opt = skewadam::Optimizer<Tiers, skewadam::tools::EmulatedCuda>;
  return std::make_unique<skewadam::libtorch::DeviceCore<Opt, EmulatedDevice>>(device, hyper, options);
}

template <class Tiers>
std::unique_ptr<skewadam::libtorch::Core> make_emulated_sharded_core(
    skewadam::dist::AnyCommunicator& comm, const skewadam::PerTier<skewadam::Hyperparameters>& hyper,
    const skewadam::OptimizerOptions& options, skewadam::dist::ShardOptions shard, int device) {
  using Opt = skewadam::Optimizer<Tiers, skewadam::tools::EmulatedCuda,
                                  skewadam::dist::Sharded<skewadam::dist::AnyCommunicator>>;
  return std::make_unique<skewadam::libtorch::DeviceCore<Opt, EmulatedDevice>>(device, comm, hyper, options, shard);
}

}  // namespace skewadam_torch_test
