// The memory planner: state bytes of hand-computed inventories under every
// policy, the paper's figures for the preset, and the report's formats.

#include <doctest/doctest.h>

#include <skewadam/plan.hpp>
#include <skewadam/state/state_layout.hpp>
#include <skewadam/tiers/tier_assignment.hpp>

#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <skewadam_tools/model_presets.hpp>
#include <skewadam_tools/plan_report.hpp>
#include "plan_test_support.hpp"

namespace test_plan {

using skewadam::Dtype;
using skewadam::index_t;
using skewadam::Shape;
using skewadam::TensorSpec;
using skewadam::Tier;

namespace {

// A toy MoE, every figure worked out by hand below.
std::vector<TensorSpec> toy_model() {
  return {
      {"embed.weight", Shape{10, 4}, Dtype::bf16},    // backbone, 40 params
      {"norm.weight", Shape{4}, Dtype::f32},          // backbone, 4 params, rank 1
      {"moe.experts.w1", Shape{3, 5, 4}, Dtype::bf16},  // experts, 60 params, 3 matrices 5 x 4
      {"moe.gate.weight", Shape{3, 4}, Dtype::f32},   // router, 12 params
  };
}

}  // namespace

TEST_CASE("plan of a toy MoE, worked out by hand") {
  const std::vector<TensorSpec> model = toy_model();
  const skewadam::Plan p = skewadam::make_plan(model);

  CHECK(p.tensors == 4);
  CHECK(p.total_params == 116);
  CHECK(p.weights_bytes == 40 * 2 + 4 * 4 + 60 * 2 + 12 * 4);

  // embed: m 4*40 + R,C 4*(10+4); norm: m 4*4 + exact 4*4 (rank 1 falls back)
  CHECK(p.tiers.backbone.tensors == 2);
  CHECK(p.tiers.backbone.params == 44);
  CHECK(p.tiers.backbone.weights_bytes == 96);
  CHECK(p.tiers.backbone.state_bytes == (160 + 56) + (16 + 16));
  // experts: 3 matrices of R (5) and C (4), no momentum
  CHECK(p.tiers.experts.params == 60);
  CHECK(p.tiers.experts.state_bytes == 4 * 3 * (5 + 4));
  // router: exact V
  CHECK(p.tiers.router.params == 12);
  CHECK(p.tiers.router.state_bytes == 4 * 12);

  const skewadam::PolicyStateBytes& s = p.state_bytes;
  CHECK(s.skewadam == 248 + 108 + 48);
  CHECK(s.adamw == 8 * 116);
  CHECK(s.one_buffer == 4 * 116);
  CHECK(s.adafactor == 56 + 16 + 108 + 4 * (3 + 4));
  CHECK(s.uniform == 248 + (240 + 108) + (48 + 28));
  CHECK(s.expert_momentum == 248 + (240 + 108) + 48);
  CHECK(s.factored_router == 248 + 108 + 28);
}

TEST_CASE("state_bytes_for agrees with the plan for every policy, by assigner or by explicit tiers") {
  using namespace skewadam;
  const std::vector<TensorSpec> model = toy_model();
  const Plan p = make_plan(model);
  const TierAssigner assigner;
  CHECK(state_bytes_for(model, assigner, tier_layouts::skewadam) == p.state_bytes.skewadam);
  CHECK(state_bytes_for(model, assigner, tier_layouts::adamw) == p.state_bytes.adamw);
  CHECK(state_bytes_for(model, assigner, tier_layouts::adafactor) == p.state_bytes.adafactor);
  CHECK(state_bytes_for(model, assigner, tier_layouts::uniform) == p.state_bytes.uniform);
  CHECK(state_bytes_for(model, assigner, tier_layouts::expert_momentum) == p.state_bytes.expert_momentum);
  CHECK(state_bytes_for(model, assigner, tier_layouts::factored_router) == p.state_bytes.factored_router);

  const std::vector<Tier> tiers{Tier::backbone, Tier::backbone, Tier::experts, Tier::router};
  CHECK(assign_tiers(model, assigner) == tiers);
  CHECK(state_bytes_for(model, tiers, tier_layouts::skewadam) == p.state_bytes.skewadam);
  const Plan q = make_plan(model, tiers);
  CHECK(q.state_bytes.skewadam == p.state_bytes.skewadam);
  CHECK(q.tiers.experts.state_bytes == p.tiers.experts.state_bytes);

  // Everything in one tier: the layout of that tier alone.
  const std::vector<Tier> all_router(model.size(), Tier::router);
  CHECK(state_bytes_for(model, all_router, tier_layouts::skewadam) == 4 * 116);
  CHECK(make_plan(model, all_router).tiers.router.params == 116);
}

TEST_CASE("the policies are the paper's layouts") {
  using namespace skewadam;
  CHECK(tier_layouts::skewadam[Tier::backbone] == layouts::backbone);
  CHECK(tier_layouts::skewadam[Tier::experts] == layouts::experts);
  CHECK(tier_layouts::skewadam[Tier::router] == layouts::router);
  CHECK(tier_layouts::expert_momentum[Tier::experts] == StateLayout{true, true});
  CHECK(tier_layouts::factored_router[Tier::router] == StateLayout{false, true});
  for (Tier t : all_tiers) {
    CHECK(tier_layouts::uniform[t] == StateLayout{true, true});
    CHECK(tier_layouts::adafactor[t] == StateLayout{false, true});
    CHECK(tier_layouts::adamw[t] == StateLayout{true, false});
  }
}

TEST_CASE("tier rules change the plan") {
  using namespace skewadam;
  const std::vector<TensorSpec> model = toy_model();
  const Plan p = make_plan(model, TierAssigner::from_strings({"gate=experts"}));
  CHECK(p.tiers.router.params == 0);
  CHECK(p.tiers.experts.params == 72);
  CHECK(p.tiers.experts.state_bytes == 108 + 4 * (3 + 4));
}

TEST_CASE("planner input checks") {
  using namespace skewadam;
  const std::vector<TensorSpec> model = toy_model();
  SKEWADAM_CHECK_ERROR(std::invalid_argument, make_plan(model, std::vector<Tier>{Tier::router}), "1 tiers for 4 tensors");
  SKEWADAM_CHECK_ERROR(std::invalid_argument,
                       make_plan(model, std::vector<Tier>{Tier::router, Tier::router, Tier::router, static_cast<Tier>(9)}),
                       "tier of tensor 'moe.gate.weight': unknown tier value 9");
  SKEWADAM_CHECK_ERROR(std::invalid_argument, make_plan(std::vector<TensorSpec>{{"x", Shape{}, Dtype::f32}}),
                       "tensor 'x': shape has rank 0");
  SKEWADAM_CHECK_ERROR(std::invalid_argument,
                       make_plan(std::vector<TensorSpec>{{"x", Shape{index_t{1} << 30, index_t{1} << 30}, Dtype::f32}}),
                       "more than the planner's limit of 2^56");
  SKEWADAM_CHECK_ERROR(std::invalid_argument,
                       make_plan(std::vector<TensorSpec>{{"x", Shape{2}, static_cast<Dtype>(5)}}), "unknown dtype value 5");
  SKEWADAM_CHECK_ERROR(std::invalid_argument,
                       make_plan(model, TierAssigner(std::vector<TierRule>{}, false)), "matches no tier rule");

  // 16 tensors of 2^56 elements: AdamW's 8 bytes each sum to 2^63.
  const std::vector<TensorSpec> huge(16, TensorSpec{"x", Shape{index_t{1} << 28, index_t{1} << 28}, Dtype::f32});
  SKEWADAM_CHECK_ERROR(std::overflow_error, make_plan(huge), "overflows 64 bits");
  // Far below that, sizes beyond 32 bits are exact.
  const std::vector<TensorSpec> big{{"moe.experts.w", Shape{index_t{1} << 20, 4096, 1024}, Dtype::bf16}};
  const Plan b = make_plan(big);
  CHECK(b.total_params == index_t{1} << 42);
  CHECK(b.state_bytes.adamw == index_t{1} << 45);
  CHECK(b.tiers.experts.state_bytes == 4 * (index_t{1} << 20) * (4096 + 1024));
}

TEST_CASE("a zero-size tensor plans to nothing") {
  using namespace skewadam;
  const Plan p = make_plan(std::vector<TensorSpec>{{"x", Shape{0, 5}, Dtype::f32}});
  CHECK(p.tensors == 1);
  CHECK(p.total_params == 0);
  CHECK(p.state_bytes.adamw == 0);
  CHECK(p.state_bytes.skewadam == 0);
}

TEST_CASE("preset paper-6.78b: the paper's figures") {
  using namespace skewadam;
  using namespace skewadam::tools;
  const std::vector<TensorSpec> model = preset_inventory("paper-6.78b");
  const Plan p = make_plan(model);

  // Exact integers (docs/spec.md §6 worked through).
  CHECK(p.total_params == 6'784'327'680);
  CHECK(p.weights_bytes == 13'569'785'856);
  CHECK(p.tiers.backbone.params == 341'352'448);
  CHECK(p.tiers.experts.params == 6'442'450'944);
  CHECK(p.tiers.router.params == 524'288);
  CHECK(p.tiers.backbone.state_bytes == 1'366'119'936);
  CHECK(p.tiers.experts.state_bytes == 12'582'912);
  CHECK(p.tiers.router.state_bytes == 2'097'152);
  CHECK(p.state_bytes.skewadam == 1'380'800'000);
  CHECK(p.state_bytes.adamw == 54'274'621'440);
  CHECK(p.state_bytes.one_buffer == 27'137'310'720);
  CHECK(p.state_bytes.uniform == 27'150'620'672);
  // 8-bit backbone momentum: numel codes + an fp32 scale per 256 elements
  // (every backbone matrix's size is a multiple of 256) instead of 4 numel
  CHECK(p.state_bytes.skewadam_8bit ==
        p.state_bytes.skewadam - 4 * p.tiers.backbone.params + p.tiers.backbone.params + p.tiers.backbone.params / 64);
  CHECK(p.state_bytes.skewadam_8bit == 362'076'288);
  CHECK(format_bytes(p.state_bytes.skewadam_8bit) == "362.1 MB");  // 0.34 GiB
  // bf16 backbone momentum: 2 bytes per element instead of 4
  CHECK(p.state_bytes.skewadam_bf16 == p.state_bytes.skewadam - 2 * p.tiers.backbone.params);

  // As the paper prints them.
  CHECK(format_millions(p.total_params) == "6,784.33 M");
  CHECK(format_bytes(p.weights_bytes) == "12.64 GiB");
  CHECK(format_bytes(p.state_bytes.adamw) == "50.55 GiB");
  CHECK(format_bytes(p.state_bytes.one_buffer) == "25.27 GiB");
  CHECK(format_bytes(p.state_bytes.skewadam) == "1.29 GiB");
  CHECK(format_bytes(p.tiers.backbone.state_bytes) == "1.27 GiB");
  CHECK(format_bytes(p.tiers.experts.state_bytes) == "12.6 MB");
  CHECK(format_bytes(p.tiers.router.state_bytes) == "2.1 MB");
  CHECK(format_bytes(p.state_bytes.uniform) == "25.29 GiB");
  CHECK(format_share(p.tiers.backbone.params, p.total_params) == "5.0 %");
  CHECK(format_share(p.tiers.experts.params, p.total_params) == "95.0 %");
  CHECK(format_share(p.tiers.router.params, p.total_params) == "0.008 %");

  // The table carries the same figures.
  const std::string table = plan_table(p, "paper-6.78b");
  for (const char* figure : {"6,784.33 M", "12.64 GiB", "50.55 GiB", "25.27 GiB", "1.29 GiB", "1.27 GiB", "12.6 MB",
                             "2.1 MB", "25.29 GiB", "0.008 %"}) {
    CAPTURE(figure);
    CHECK(table.find(figure) != std::string::npos);
  }
}

TEST_CASE("preset paper-6.78b: a stacked expert bank plans the same as separate experts") {
  using namespace skewadam;
  std::vector<TensorSpec> stacked;
  for (const TensorSpec& t : tools::preset_inventory("paper-6.78b"))
    if (t.name.find("experts.") == std::string::npos) stacked.push_back(t);
  for (const char* w : {"w1", "w2", "w3"})
    stacked.push_back({std::string("blocks.1.moe.experts.") + w, Shape{128, 4096, 4096}, Dtype::bf16});
  const Plan a = make_plan(tools::preset_inventory("paper-6.78b"));
  const Plan b = make_plan(stacked);
  CHECK(b.tensors == a.tensors - 381);
  CHECK(b.total_params == a.total_params);
  CHECK(b.weights_bytes == a.weights_bytes);
  CHECK(b.tiers.experts.state_bytes == a.tiers.experts.state_bytes);
  CHECK(b.state_bytes.skewadam == a.state_bytes.skewadam);
  CHECK(b.state_bytes.uniform == a.state_bytes.uniform);
}

TEST_CASE("unknown preset") {
  SKEWADAM_CHECK_ERROR(std::invalid_argument, skewadam::tools::preset_inventory("paper-7b", "--preset"),
                       "--preset: unknown preset 'paper-7b' (available: paper-6.78b)");
}

TEST_CASE("report: JSON keys are exactly the documented ones, all integers") {
  using namespace skewadam;
  const Plan p = make_plan(toy_model());
  const nlohmann::ordered_json j = tools::plan_json(p);
  std::set<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.insert(k);
  CHECK(keys == std::set<std::string>{"total_params", "weights_bytes", "tiers", "state_bytes"});
  CHECK(j["total_params"].is_number_integer());
  CHECK(j["total_params"] == 116);
  CHECK(j["weights_bytes"] == p.weights_bytes);

  REQUIRE(j["tiers"].is_object());
  CHECK(j["tiers"].size() == 3);
  for (const char* tier : {"backbone", "experts", "router"}) {
    CAPTURE(tier);
    const auto& t = j["tiers"][tier];
    REQUIRE(t.is_object());
    CHECK(t.size() == 2);
    CHECK(t["params"].is_number_integer());
    CHECK(t["state_bytes"].is_number_integer());
  }
  CHECK(j["tiers"]["experts"]["state_bytes"] == 108);

  REQUIRE(j["state_bytes"].is_object());
  std::set<std::string> policies;
  for (const auto& [k, v] : j["state_bytes"].items()) {
    policies.insert(k);
    CHECK(v.is_number_integer());
  }
  CHECK(policies == std::set<std::string>{"skewadam", "skewadam_bf16", "skewadam_8bit", "adamw", "adafactor", "uniform", "expert_momentum",
                                          "factored_router", "one_buffer"});
  CHECK(j["state_bytes"]["skewadam"] == p.state_bytes.skewadam);
  CHECK(j["state_bytes"]["skewadam_bf16"] == p.state_bytes.skewadam_bf16);
  CHECK(j["state_bytes"]["skewadam_8bit"] == p.state_bytes.skewadam_8bit);
  CHECK(j["state_bytes"]["one_buffer"] == 464);
}

TEST_CASE("report: number formats") {
  using namespace skewadam::tools;
  CHECK(with_commas(0) == "0");
  CHECK(with_commas(999) == "999");
  CHECK(with_commas(1000) == "1,000");
  CHECK(with_commas(6784327680) == "6,784,327,680");
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(99'999) == "99999 B");
  CHECK(format_bytes(100'000) == "0.1 MB");
  CHECK(format_bytes((skewadam::index_t{1} << 30) - 1) == "1073.7 MB");
  CHECK(format_bytes(skewadam::index_t{1} << 30) == "1.00 GiB");
  CHECK(format_millions(994'999) == "0.99 M");
  CHECK(format_millions(999'995'000) == "1,000.00 M");
  CHECK(format_share(0, 10) == "0 %");
  CHECK(format_share(1, 0) == "-");
  CHECK(format_share(1, 1'000'000) == "<0.001 %");
}

}  // namespace test_plan
