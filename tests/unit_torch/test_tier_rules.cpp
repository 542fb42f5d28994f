// Tier assignment by name on realistic MoE models: the demo's own model, and
// the parameter names of common MoE checkpoints.

#include <skewadam/torch/optimizer.hpp>

#include "doctest_torch.hpp"

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "model.hpp"
#include "torch_test_support.hpp"

namespace test_tier_rules {

namespace {

using skewadam::Tier;
using skewadam_torch_test::on;

moe_lm::ModelConfig small_config() {
  moe_lm::ModelConfig c;
  c.d_model = 32;
  c.heads = 2;
  c.context = 16;
  c.layers = 2;
  c.dense_ff = 48;
  c.experts = 8;
  c.expert_ff = 24;
  return c;
}

}  // namespace

TEST_CASE("the demo model's parameters land in the right tiers") {
  moe_lm::MoELM model(small_config());
  skewadam::libtorch::SkewAdam opt(model->named_parameters());
  const std::map<std::string, Tier> expected{
      {"tok_emb.weight", Tier::backbone},
      {"pos_emb.weight", Tier::backbone},
      {"blocks.0.ln1.weight", Tier::backbone},
      {"blocks.0.ln1.bias", Tier::backbone},
      {"blocks.0.attn.qkv.weight", Tier::backbone},
      {"blocks.0.attn.out.weight", Tier::backbone},
      {"blocks.0.ffn.gate_proj.weight", Tier::backbone},  // a dense FFN's gate_proj is no router
      {"blocks.0.ffn.up_proj.weight", Tier::backbone},
      {"blocks.0.ffn.down_proj.weight", Tier::backbone},
      {"blocks.1.moe.router.weight", Tier::router},
      {"blocks.1.moe.experts.gate_proj", Tier::experts},  // an expert's gate_proj is an expert weight
      {"blocks.1.moe.experts.up_proj", Tier::experts},
      {"blocks.1.moe.experts.down_proj", Tier::experts},
      {"ln_f.weight", Tier::backbone},
  };
  for (const auto& [name, tier] : expected) {
    INFO(name);
    CHECK(opt.tier(name) == tier);
  }
  CHECK(opt.names().size() == model->named_parameters().size());
  // the stacked banks keep per-expert statistics: [E, r] and [E, c]
  CHECK(opt.param_state("blocks.1.moe.experts.down_proj").v_row.sizes() == torch::IntArrayRef({8, 24}));
  CHECK(opt.param_state("blocks.1.moe.experts.down_proj").v_col.sizes() == torch::IntArrayRef({8, 32}));
}

TEST_CASE("names of common MoE checkpoints") {
  const skewadam::TierAssigner rules;
  const std::map<std::string, Tier> expected{
      // Mixtral
      {"model.layers.3.block_sparse_moe.gate.weight", Tier::router},
      {"model.layers.3.block_sparse_moe.experts.7.w1.weight", Tier::experts},
      {"model.layers.3.block_sparse_moe.experts.7.w3.weight", Tier::experts},
      {"model.layers.3.self_attn.q_proj.weight", Tier::backbone},
      {"model.embed_tokens.weight", Tier::backbone},
      // Qwen-MoE / DeepSeek-MoE
      {"model.layers.1.mlp.gate.weight", Tier::router},
      {"model.layers.1.mlp.experts.12.gate_proj.weight", Tier::experts},
      {"model.layers.1.mlp.experts.12.down_proj.weight", Tier::experts},
      {"model.layers.1.mlp.shared_expert_gate.weight", Tier::backbone},
      {"model.layers.0.mlp.gate_proj.weight", Tier::backbone},  // dense layer
      // Switch / OLMoE-style
      {"encoder.block.1.layer.1.mlp.router.classifier.weight", Tier::router},
      {"model.layers.2.mlp.experts.gate_up_proj", Tier::experts},
      {"lm_head.weight", Tier::backbone},
  };
  for (const auto& [name, tier] : expected) {
    INFO(name);
    CHECK(rules.assign(name) == tier);
  }
}

TEST_CASE("rules are overridable and the first match wins") {
  std::vector<std::pair<std::string, torch::Tensor>> ps{
      {"layers.0.mlp.shared_experts.w", on(torch::ones({4, 4}))},
      {"layers.0.mlp.experts.w", on(torch::ones({2, 4, 4}))},
      {"layers.0.mlp.gate.weight", on(torch::ones({2, 4}))},
  };
  skewadam::libtorch::Options o;
  o.tier_rules = skewadam::TierAssigner::from_strings({"shared_experts=backbone"});
  skewadam::libtorch::SkewAdam opt(ps, o);
  CHECK(opt.tier("layers.0.mlp.shared_experts.w") == Tier::backbone);
  CHECK(opt.tier("layers.0.mlp.experts.w") == Tier::experts);
  CHECK(opt.tier("layers.0.mlp.gate.weight") == Tier::router);

  skewadam::libtorch::Options only;
  only.tier_rules = skewadam::TierAssigner::from_strings({"experts=experts", "gate=router"}, /*use_defaults=*/false);
  CHECK_THROWS_WITH_AS(skewadam::libtorch::SkewAdam(std::vector<std::pair<std::string, torch::Tensor>>{
                                                        {"layers.0.attn.w", on(torch::ones({2}))}},
                                                    only),
                       doctest::Contains("layers.0.attn.w"), std::invalid_argument);
}

}  // namespace test_tier_rules
