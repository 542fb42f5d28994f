// The adapter's tests over a device engine: the CUDA backend on the emulated
// runtime (emulated_device_cores.hpp), registered for CPU tensors, so that
// every test of tests/unit_torch runs through the path of CUDA tensors
// (torch/core.hpp's DeviceCore: counts on the device, step() not waiting,
// state() viewing the engine's memory, checkpoints read from it) on a machine
// without a GPU. Linked into skewadam-torch-device-tests.

#include <skewadam/tiers/variants.hpp>

#include "emulated_device_cores.hpp"
#include "torch_test_support.hpp"

namespace {

using namespace skewadam;

// Every variant the library names, as torch/cuda.cuh registers them for CUDA
// tensors (test_adapter.cpp checks that each one runs here).
[[maybe_unused]] const bool registered = [] {
  Variants::for_each([]<class Tiers>() {
    libtorch::register_device_core<Tiers>("cpu", &skewadam_torch_test::make_emulated_core<Tiers>);
  });
  skewadam_torch_test::device_engine_expected() = true;
  return true;
}();

}  // namespace
