// The contract suite (support/contract_suite.hpp) over the configurations
// every build has: the local CPU optimizer, and the sharded one over the self
// communicator.

#include <filesystem>
#include <memory>

#include <skewadam/checkpoint.hpp>
#include <skewadam/dist/sharded_optimizer.hpp>
#include <skewadam/skewadam.hpp>

namespace test_contract {

using namespace skewadam;

struct ShardedSelf {
  static constexpr const char* name = "sharded over the self communicator";
  static constexpr bool cpu_bits = true;
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

}  // namespace test_contract

#define SKEWADAM_CONTRACT_CONFIGURATIONS skewadam::contract::CpuLocal, ::test_contract::ShardedSelf
#include "contract_suite.hpp"
