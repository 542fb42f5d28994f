// The contract suite (support/contract_suite.hpp) over the CUDA backend
// (engine/backend/cuda/cuda_backend.hpp) and the CUDA kernels, run on the host by the
// emulated runtime (skewadam_tools/emulated_runtime.hpp): the whole GPU path above the CUDA
// runtime's few calls, on machines without a GPU, local, sharded at one rank,
// and sharded at three ranks, each a thread of this process
// (support/thread_ranks.hpp), which cuts matrices into row slices; and Eigen
// objects as its parameters.

#include <skewadam_tools/emulated_runtime.hpp>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <utility>
#include <vector>

#include <skewadam/checkpoint.hpp>
#include <skewadam/dist/sharded_optimizer.hpp>
#include <skewadam/engine/placement/sharded.hpp>
#include <skewadam/eigen_view.hpp>
#include <skewadam/skewadam.hpp>

#include "thread_ranks.hpp"

namespace test_contract_cuda_emulated {

using namespace skewadam;

struct EmulatedCudaLocal {
  static constexpr const char* name = "CUDA engine, emulated";
  static constexpr bool cpu_bits = false;
  static constexpr bool cuts_matrices = false;
  static constexpr bool emulated = true;
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

struct EmulatedCudaSharded {
  static constexpr const char* name = "sharded CUDA engine over the self communicator, emulated";
  static constexpr bool cpu_bits = false;
  static constexpr bool cuts_matrices = false;
  static constexpr bool emulated = true;
  static dist::SelfCommunicator& comm() {
    static dist::SelfCommunicator c;
    return c;
  }
  template <class Tiers>
  static auto make(const PerTier<Hyperparameters>& h, OptimizerOptions o) {
    return std::make_unique<Optimizer<Tiers, tools::EmulatedCuda, dist::Sharded<dist::SelfCommunicator>>>(comm(), h,
                                                                                                         o);
  }
  template <class Opt>
  static void save(Opt& opt, const std::filesystem::path& f) {
    save_checkpoint(opt, f);
  }
  template <class Opt>
  static void load(Opt& opt, const std::filesystem::path& f) {
    load_checkpoint(opt, f);
  }
};

struct EmulatedCudaThreeRanks : test::RanksInThreads<3, tools::EmulatedCuda> {
  static constexpr const char* name = "sharded CUDA engine at 3 ranks in threads, emulated";
  static constexpr bool emulated = true;
};

}  // namespace test_contract_cuda_emulated

#define SKEWADAM_CONTRACT_CONFIGURATIONS                                                                \
  ::test_contract_cuda_emulated::EmulatedCudaLocal, ::test_contract_cuda_emulated::EmulatedCudaSharded, \
      ::test_contract_cuda_emulated::EmulatedCudaThreeRanks
#include "contract_suite.hpp"

namespace test_contract_cuda_emulated {

TEST_CASE("CUDA engine, emulated: Eigen objects register as any view does") {
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Matrix w = Matrix::Constant(32, 16, 0.5f), g = Matrix::Constant(32, 16, 0.01f);
  std::vector<float> v(w.data(), w.data() + w.size());
  const std::vector<float> gv(g.data(), g.data() + g.size());
  Optimizer<SkewAdamTiers, tools::EmulatedCuda> mapped(Hyperparameters{.lr = 1e-2}), viewed(Hyperparameters{.lr = 1e-2});
  mapped.add("w", Tier::backbone, eigen_view(w), eigen_view(std::as_const(g)));
  viewed.add("w", Tier::backbone, TensorView<float>(v.data(), {32, 16}), TensorView<const float>(gv.data(), {32, 16}));
  for (int t = 0; t < 3; ++t) {
    mapped.step();
    viewed.step();
  }
  CHECK(std::equal(v.begin(), v.end(), w.data()));
  CHECK(mapped.steps() == 3);
}

}  // namespace test_contract_cuda_emulated

TEST_CASE("contract: Local and Sharded at one rank give the same bits, clipping at either scope (CUDA, emulated)") {
  skewadam::contract::local_and_sharded_at_one_rank_agree<::test_contract_cuda_emulated::EmulatedCudaLocal,
                                                          ::test_contract_cuda_emulated::EmulatedCudaSharded>();
}
