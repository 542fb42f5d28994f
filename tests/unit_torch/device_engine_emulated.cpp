// The adapter's tests over a device engine: the CUDA backend on the emulated
// runtime (tools/common/skewadam_tools/emulated_runtime.hpp), registered for
// CPU tensors, so that every test of tests/unit_torch runs through the path
// of CUDA tensors (torch/core.hpp's DeviceCore: counts on the device, step()
// not waiting, state() viewing the engine's memory, checkpoints read from
// it) on a machine without a GPU. Linked into skewadam-torch-device-tests.

#include <skewadam_tools/emulated_runtime.hpp>

#include <memory>

#include <skewadam/placement/local_cuda.hpp>
#include <skewadam/torch/core.hpp>

namespace {

using namespace skewadam;

/// The emulated device: one, always current, its stream the default.
struct EmulatedDevice {
  struct Guard {
    explicit Guard(int) {}
  };
  static void* current_stream(int) { return nullptr; }
};

template <class Tiers>
std::unique_ptr<libtorch::Core> make(const PerTier<Hyperparameters>& hyper, const OptimizerOptions& options, int device) {
  return std::make_unique<libtorch::DeviceCore<Optimizer<Tiers, tools::EmulatedCuda>, EmulatedDevice>>(device, hyper,
                                                                                                       options);
}

template <class... Tiers>
bool register_all() {
  (libtorch::register_device_core<Tiers>("cpu", &make<Tiers>), ...);
  return true;
}

[[maybe_unused]] const bool registered = register_all<SkewAdamTiers, ExpertMomentumTiers, FactoredRouterTiers,
                                                      UniformTiers, AdafactorTiers, AdamWTiers>();

}  // namespace
