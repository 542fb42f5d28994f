// The contract suite (support/contract_suite.hpp) over the CUDA engine
// (placement/local_cuda.hpp) and the CUDA kernels, run on the host by the
// emulated runtime (skewadam_tools/emulated_runtime.hpp): the whole GPU path above the CUDA
// runtime's few calls, on machines without a GPU.

#include <skewadam_tools/emulated_runtime.hpp>

#include <filesystem>
#include <memory>

#include <skewadam/checkpoint.hpp>
#include <skewadam/skewadam.hpp>

namespace {

using namespace skewadam;

struct EmulatedCudaLocal {
  static constexpr const char* name = "CUDA engine, emulated";
  static constexpr bool cpu_bits = false;
  template <class Tiers>
  static auto make(const PerTier<Hyperparameters>& h, OptimizerOptions o) {
    return std::make_unique<Optimizer<Tiers, tools::EmulatedCuda>>(h, o);
  }
  template <class Opt>
  static void save(const Opt& opt, const std::filesystem::path& f) {
    save_checkpoint(opt, f);
  }
  template <class Opt>
  static void load(Opt& opt, const std::filesystem::path& f) {
    load_checkpoint(opt, f);
  }
};

}  // namespace

#define SKEWADAM_CONTRACT_CONFIGURATIONS EmulatedCudaLocal
#include "contract_suite.hpp"
