// Tier assignment by name: the default rules on real MoE checkpoints' names,
// user rules, and the errors.

#include <doctest/doctest.h>

#include <skewadam/tiers/tier_assignment.hpp>

#include <stdexcept>
#include <string>
#include <vector>

#include "plan_test_support.hpp"

namespace test_tier_assignment {

using skewadam::Tier;
using skewadam::TierAssigner;

namespace {

struct NamedCase {
  const char* name;
  Tier tier;
};

void check_all(const TierAssigner& a, const std::vector<NamedCase>& cases) {
  for (const NamedCase& c : cases) {
    CAPTURE(c.name);
    CHECK(a.assign(c.name) == c.tier);
  }
}

}  // namespace

TEST_CASE("default tier rules: Mixtral, DeepSeek, Qwen-MoE, OLMoE, DBRX, Switch, GPT-OSS and dense names") {
  const TierAssigner a;
  check_all(a, {
                   // Mixtral
                   {"model.layers.0.block_sparse_moe.gate.weight", Tier::router},
                   {"model.layers.0.block_sparse_moe.experts.3.w1.weight", Tier::experts},
                   {"model.layers.0.block_sparse_moe.experts.7.w2.weight", Tier::experts},
                   // DeepSeek / Qwen-MoE / OLMoE
                   {"model.layers.0.mlp.experts.5.gate_proj.weight", Tier::experts},
                   {"model.layers.0.mlp.experts.5.up_proj.weight", Tier::experts},
                   {"model.layers.0.mlp.gate.weight", Tier::router},
                   {"model.layers.3.mlp.gate.e_score_correction_bias", Tier::router},
                   {"model.layers.1.mlp.shared_experts.gate_proj.weight", Tier::experts},
                   {"model.layers.1.mlp.shared_expert.gate_proj.weight", Tier::backbone},
                   {"model.layers.1.mlp.shared_expert_gate.weight", Tier::backbone},
                   // DBRX, Jamba, GPT-OSS, Switch / NLLB-MoE
                   {"transformer.blocks.0.ffn.router.layer.weight", Tier::router},
                   {"transformer.blocks.0.ffn.experts.mlp.w1", Tier::experts},
                   {"model.layers.1.feed_forward.router.weight", Tier::router},
                   {"model.layers.0.mlp.router.weight", Tier::router},
                   {"model.layers.0.mlp.experts.gate_up_proj", Tier::experts},
                   {"encoder.block.1.layer.1.mlp.router.classifier.weight", Tier::router},
                   {"encoder.block.1.layer.1.mlp.experts.expert_0.wi.weight", Tier::experts},
                   // the paper's names, stacked or separate experts
                   {"blocks.1.moe.router.weight", Tier::router},
                   {"blocks.1.moe.experts.w1", Tier::experts},
                   {"blocks.1.moe.experts.17.w3.weight", Tier::experts},
                   {"layers.1.moe.gate.weight", Tier::router},
                   {"block.1.mlp.gate.weight", Tier::router},
                   {"layer_1/moe/gate/kernel", Tier::router},
                   // dense parts
                   {"model.layers.0.mlp.gate_proj.weight", Tier::backbone},
                   {"model.layers.0.mlp.gate_up_proj.weight", Tier::backbone},
                   {"model.layers.0.self_attn.q_proj.weight", Tier::backbone},
                   {"model.layers.0.input_layernorm.weight", Tier::backbone},
                   {"model.embed_tokens.weight", Tier::backbone},
                   {"model.norm.weight", Tier::backbone},
                   {"lm_head.weight", Tier::backbone},
                   {"tok_emb.weight", Tier::backbone},
                   {"gated.weight", Tier::backbone},
                   {"", Tier::backbone},
               });
}

TEST_CASE("user rules are tried first, in order, and the defaults still apply after them") {
  const TierAssigner a = TierAssigner::from_strings({"shared_expert=backbone", "lm_head=router", "lm_head=experts"});
  check_all(a, {
                   {"model.layers.1.mlp.shared_experts.gate_proj.weight", Tier::backbone},
                   {"model.layers.1.mlp.experts.0.gate_proj.weight", Tier::experts},
                   {"lm_head.weight", Tier::router},  // first match wins
                   {"model.layers.1.mlp.gate.weight", Tier::router},
                   {"model.embed_tokens.weight", Tier::backbone},
               });
  REQUIRE(a.user_rule_count() == 3);
  REQUIRE(a.rules().size() == 3 + skewadam::default_tier_rules().size());
  CHECK(a.rules()[0].pattern == "shared_expert");
  CHECK(a.rules()[3].pattern == "experts");
  CHECK(a.uses_defaults());
}

TEST_CASE("rules are searched, not matched whole; anchors restrict them") {
  const TierAssigner a = TierAssigner::from_strings({"^emb$=router", R"(\.bias$=experts)"});
  CHECK(a.assign("emb") == Tier::router);
  CHECK(a.assign("emb.weight") == Tier::backbone);
  CHECK(a.assign("blocks.0.ln1.bias") == Tier::experts);
}

TEST_CASE("parse_tier_rule splits at the last '='") {
  const skewadam::TierRule r = skewadam::parse_tier_rule("(?=blocks)blocks\\.1=experts");
  CHECK(r.pattern == "(?=blocks)blocks\\.1");
  CHECK(r.tier == Tier::experts);
  CHECK(r.matches("blocks.1.attn.q.weight"));
  CHECK_FALSE(r.matches("blocks.0.attn.q.weight"));
}

TEST_CASE("bad rules are errors naming the argument and the problem") {
  using skewadam::parse_tier_rule;
  SKEWADAM_CHECK_ERROR(std::invalid_argument, parse_tier_rule("experts", "--rule"), "--rule 'experts': expected REGEX=TIER");
  SKEWADAM_CHECK_ERROR(std::invalid_argument, parse_tier_rule("x=expert", "--rule"), "unknown tier 'expert'");
  SKEWADAM_CHECK_ERROR(std::invalid_argument, parse_tier_rule("x=", "--rule"), "unknown tier ''");
  SKEWADAM_CHECK_ERROR(std::invalid_argument, parse_tier_rule("=router", "--rule"), "empty regular expression");
  SKEWADAM_CHECK_ERROR(std::invalid_argument, parse_tier_rule("x(=router", "--rule"), "--rule 'x(=router': bad regular expression 'x('");
  SKEWADAM_CHECK_ERROR(std::invalid_argument, parse_tier_rule("[a=router", "--rule"), "bad regular expression");
  SKEWADAM_CHECK_ERROR(std::invalid_argument, skewadam::TierRule("a", static_cast<Tier>(7), "rule"), "unknown tier value 7");
}

TEST_CASE("without the defaults a name no rule matches is an error") {
  const TierAssigner a = TierAssigner::from_strings({"experts=experts", "router=router"}, /*use_defaults=*/false);
  CHECK_FALSE(a.uses_defaults());
  CHECK(a.rules().size() == 2);
  CHECK(a.assign("moe.experts.w1") == Tier::experts);
  CHECK_FALSE(a.try_assign("tok_emb.weight").has_value());
  SKEWADAM_CHECK_ERROR(std::invalid_argument, a.assign("tok_emb.weight"), "tensor 'tok_emb.weight': matches no tier rule");

  const TierAssigner none(std::vector<skewadam::TierRule>{}, false);
  SKEWADAM_CHECK_ERROR(std::invalid_argument, none.assign("x"), "matches no tier rule");
}

TEST_CASE("over-long names are rejected before any regex runs on them") {
  const TierAssigner a = TierAssigner::from_strings({".*x=router"});
  const std::string longest(static_cast<std::size_t>(skewadam::max_tensor_name_length), 'a');
  CHECK(a.assign(longest) == Tier::backbone);
  CHECK(a.assign(longest.substr(1) + "x") == Tier::router);
  SKEWADAM_CHECK_ERROR(std::invalid_argument, a.assign(longest + "a"), "longer than the limit of 4096 bytes");
}

}  // namespace test_tier_assignment
