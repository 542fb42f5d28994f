// The adapter's tests over a device engine: the CUDA backend on the emulated
// runtime (emulated_device_cores.hpp), registered for CPU tensors, so that
// every test of tests/unit_torch runs through the path of CUDA tensors
// (torch/core.hpp's DeviceCore: counts on the device, step() not waiting,
// state() viewing the engine's memory, checkpoints read from it) on a machine
// without a GPU. Linked into skewadam-torch-device-tests.

#include "emulated_device_cores.hpp"

namespace {

using namespace skewadam;

template <class... Tiers>
bool register_all() {
  (libtorch::register_device_core<Tiers>("cpu", &skewadam_torch_test::make_emulated_core<Tiers>), ...);
  return true;
}

[[maybe_unused]] const bool registered = register_all<SkewAdamTiers, ExpertMomentumTiers, FactoredRouterTiers,
                                                      UniformTiers, AdafactorTiers, AdamWTiers>();

}  // namespace
