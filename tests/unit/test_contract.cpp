// The contract suite (support/contract_suite.hpp) over the configurations
// every build has: the local CPU optimizer, the sharded one over the self
// communicator (one rank), and the sharded one at three ranks, each a thread
// of this process (support/thread_ranks.hpp), which cuts matrices into row
// slices between the ranks.

#include <filesystem>
#include <memory>

#include <skewadam/checkpoint.hpp>
#include <skewadam/dist/sharded_optimizer.hpp>
#include <skewadam/skewadam.hpp>

#include "thread_ranks.hpp"

namespace test_contract {

using namespace skewadam;

struct ShardedSelf {
  static constexpr const char* name = "sharded over the self communicator";
  static constexpr bool cpu_bits = true;
  static constexpr bool cuts_matrices = false;
  static constexpr bool emulated = false;
  static dist::SelfCommunicator& comm() {
    static dist::SelfCommunicator c;
    return c;
  }
  template <class Tiers>
  static auto make(const PerTier<Hyperparameters>& h, OptimizerOptions o) {
    return std::make_unique<dist::ShardedOptimizer<Tiers, dist::SelfCommunicator>>(comm(), h, o);
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

struct ShardedThreeRanks : test::RanksInThreads<3> {
  static constexpr const char* name = "sharded at 3 ranks in threads";
  static constexpr bool emulated = false;
};

}  // namespace test_contract

#define SKEWADAM_CONTRACT_CONFIGURATIONS \
  skewadam::contract::CpuLocal, ::test_contract::ShardedSelf, ::test_contract::ShardedThreeRanks
#include "contract_suite.hpp"

TEST_CASE("contract: Local and Sharded at one rank give the same bits, clipping at either scope (CPU)") {
  skewadam::contract::local_and_sharded_at_one_rank_agree<skewadam::contract::CpuLocal, ::test_contract::ShardedSelf>();
}
