// Momentum stored in fewer bits on the CUDA backend, run on the host by the
// emulated runtime: its momentum pass (kernels.cuh) stores the CPU backend's
// bits, locally and sharded, NaN and infinities included, and a checkpoint
// moves between the two backends and resumes with the same bits.

#include <skewadam_tools/emulated_runtime.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <vector>

#include <skewadam/checkpoint.hpp>
#include <skewadam/dist/sharded_optimizer.hpp>
#include <skewadam/engine/placement/sharded.hpp>
#include <skewadam/skewadam.hpp>

#include "stored_momentum_fixture.hpp"

namespace test_stored_momentum_emulated {

using namespace skewadam;
using namespace skewadam::test::stored;

namespace {

/// The parameters of a and b agree to rounding (the statistics are summed
/// in another order on the device).
void check_params_close(const Result& a, const Result& b, int steps) {
  const auto sp = specs();
  for (std::size_t k = 0; k < sp.size(); ++k) {
    CAPTURE(sp[k].name);
    CHECK(params_agree(Tensor::of(sp[k], a.params[k]), Tensor::of(sp[k], b.params[k]), steps,
                       static_cast<float>(hyper().lr)));
  }
}

}  // namespace

TEST_CASE_TEMPLATE("stored momentum, CUDA emulated: the CPU backend's momentum bits, locally and sharded", P,
                   Bf16Momentum, Float8BlockMomentum, Int8BlockMomentum) {
  using Tiers = AllStored<P>;
  auto cpu = local<Tiers>(2);
  cpu->steps(0, 3);
  const Result want = cpu->result();

  auto device = local<Tiers, tools::EmulatedCuda>(1);
  device->steps(0, 3);
  const Result got = device->result();
  check_same(want, got, false);
  check_params_close(want, got, 3);
  CHECK(device->opt->state_bytes() == cpu->opt->state_bytes());

  dist::SelfCommunicator self;
  Run<Optimizer<Tiers, tools::EmulatedCuda, dist::Sharded<dist::SelfCommunicator>>> sharded(
      self, hyper(), OptimizerOptions{.seed = 42, .threads = 1});
  sharded.steps(0, 3);
  check_same(got, sharded.result());  // one rank: the local device's bits
}

TEST_CASE_TEMPLATE("stored momentum, CUDA emulated: a checkpoint moves to the CPU backend and back", P, Bf16Momentum,
                   Float8BlockMomentum, Int8BlockMomentum) {
  using Tiers = AllStored<P>;
  auto device = local<Tiers, tools::EmulatedCuda>(1);
  device->steps(0, 2);
  const std::vector<std::byte> there = checkpoint_bytes(*device->opt, SaveOptions{.include_params = true});
  auto cpu = local<Tiers>(2);
  load_checkpoint(*cpu->opt, std::span<const std::byte>(there), LoadOptions{.params = ParamValues::require});
  check_same(device->result(), cpu->result());
  cpu->steps(2, 3);
  const std::vector<std::byte> back = checkpoint_bytes(*cpu->opt, SaveOptions{.include_params = true});
  auto again = local<Tiers, tools::EmulatedCuda>(1);
  load_checkpoint(*again->opt, std::span<const std::byte>(back), LoadOptions{.params = ParamValues::require});
  check_same(cpu->result(), again->result());
  // and steps on with the momentum the CPU would store
  again->steps(3, 4);
  cpu->steps(3, 4);
  check_same(cpu->result(), again->result(), false);
}

TEST_CASE_TEMPLATE("stored momentum, CUDA emulated: NaN and infinities store the CPU backend's bytes", P,
                   Float8BlockMomentum, Int8BlockMomentum) {
  // beta1 0 (m' is the gradient) and nonfinite unchecked: a NaN, a +inf, a
  // -inf among zeros, and all three among finite values, in four blocks
  const std::vector<float> g = nonfinite_gradient(4);
  using Tiers = TierRules<BackboneRule::with_momentum<P>, ExpertRule, RouterRule>;
  const auto cpu = stored_momentum_bytes<Tiers, backend::CpuBackend<ScalarArch>>(g);
  const auto device = stored_momentum_bytes<Tiers, tools::EmulatedCuda>(g);
  CHECK(cpu == device);
  CHECK(device[4 + 5] == 0x80u);  // block 0's NaN: its code after the block's scale word
}

}  // namespace test_stored_momentum_emulated
