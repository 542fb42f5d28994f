// The optimizer's state report on actually registered tensors equals the
// planner's figure for the same inventory, for every variant.

#include <doctest/doctest.h>

#include <skewadam/plan.hpp>
#include <skewadam/tiers/tier_assignment.hpp>

#include "test_util.hpp"

namespace test_plan_vs_optimizer {

using namespace skewadam;

namespace {

std::vector<TensorSpec> inventory() {
  return {
      {"tok_emb.weight", Shape{500, 32}, Dtype::bf16},
      {"pos_emb.weight", Shape{64, 32}, Dtype::f32},
      {"blocks.0.ln1.weight", Shape{32}, Dtype::f32},
      {"blocks.0.ln1.bias", Shape{32}, Dtype::f32},
      {"blocks.0.attn.q.weight", Shape{32, 32}, Dtype::bf16},
      {"blocks.0.mlp.gate_proj.weight", Shape{64, 32}, Dtype::bf16},
      {"blocks.1.moe.gate.weight", Shape{8, 32}, Dtype::f32},
      {"blocks.1.moe.experts.w1", Shape{8, 64, 32}, Dtype::bf16},
      {"blocks.1.moe.experts.w2", Shape{8, 32, 64}, Dtype::f16},
      {"blocks.1.moe.experts.3.gate_proj.weight", Shape{64, 32}, Dtype::bf16},
      {"blocks.1.conv.weight", Shape{2, 3, 8, 8}, Dtype::f32},  // rank 4 (E4)
  };
}

template <class Opt>
void check_variant(const TierLayouts& layouts) {
  const auto specs = inventory();
  const TierAssigner assigner;
  std::vector<std::vector<char>> buffers;
  Opt opt;
  for (const TensorSpec& s : specs) {
    buffers.emplace_back(static_cast<std::size_t>(s.weights_bytes()));
    ParamView p;
    p.data = buffers.back().data();
    p.dtype = s.dtype;
    p.shape = s.shape;
    opt.add(s.name, assigner.assign(s.name), p);
  }
  CHECK(opt.state_bytes() == state_bytes_for(specs, assigner, layouts));
  const Plan plan = make_plan(specs, assigner);
  if constexpr (std::is_same_v<Opt, SkewAdam>) {
    for (Tier t : all_tiers) {
      CAPTURE(tier_name(t));
      CHECK(opt.state_bytes(t) == plan.tiers[t].state_bytes);
    }
    CHECK(opt.state_bytes() == plan.state_bytes.skewadam);
  }
}

}  // namespace

TEST_CASE("optimizer state bytes equal the planner's for the same inventory") {
  check_variant<SkewAdam>(tier_layouts::skewadam);
  check_variant<ExpertMomentumAblation>(tier_layouts::expert_momentum);
  check_variant<FactoredRouterAblation>(tier_layouts::factored_router);
  check_variant<UniformAblation>(tier_layouts::uniform);
  check_variant<AdafactorLike>(tier_layouts::adafactor);
  check_variant<AdamW>(tier_layouts::adamw);
  check_variant<Optimizer<SkewAdamBf16Tiers>>(tier_layouts::skewadam_bf16);
  check_variant<Optimizer<SkewAdam8bitTiers>>(tier_layouts::skewadam_8bit);
  const Plan plan = make_plan(inventory());
  CHECK(plan.state_bytes.skewadam_8bit == state_bytes_for(inventory(), TierAssigner{}, tier_layouts::skewadam_8bit));
  CHECK(plan.state_bytes.skewadam_8bit < plan.state_bytes.skewadam_bf16);
  CHECK(plan.state_bytes.skewadam_bf16 < plan.state_bytes.skewadam);
  CHECK(plan.state_bytes.skewadam_bf16 == state_bytes_for(inventory(), TierAssigner{}, tier_layouts::skewadam_bf16));
  CHECK(plan.tiers.router.params == 8 * 32);
  CHECK(plan.tiers.experts.tensors == 3);
}

}  // namespace test_plan_vs_optimizer
