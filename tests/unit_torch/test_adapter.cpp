// skewadam::libtorch::Optimizer changes tensors exactly as skewadam::Optimizer
// does on the same inputs, and rejects what it cannot handle.

#include <skewadam/torch/optimizer.hpp>

#include "doctest_torch.hpp"

#include <torch/torch.h>

#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "torch_test_support.hpp"

namespace test_adapter {

namespace {

using namespace skewadam_torch_test;

skewadam::PerTier<skewadam::Hyperparameters> tier_hyperparameters() {
  return {skewadam::Hyperparameters{.lr = 2e-3, .weight_decay = 0.05},
          skewadam::Hyperparameters{.lr = 3e-3, .beta2 = 0.99, .weight_decay = 0.1, .clip_scope = skewadam::ClipScope::matrix},
          skewadam::Hyperparameters{.lr = 1e-3, .eps = 1e-10, .clip_threshold = 0.5}};
}

// The library's optimizer the adapter is compared with, on the engine the
// adapter picks for the test device: the CPU backend, or the engine
// registered for the device (skewadam-torch-device-tests: the emulated CUDA
// backend for CPU tensors; skewadam-torch-cuda-tests: the CUDA backend).
template <class Tiers>
std::unique_ptr<skewadam::libtorch::Core> reference_core(const skewadam::OptimizerOptions& options) {
  const torch::Device d = test_device();
  if (const auto make = skewadam::libtorch::device_core<Tiers>(d.is_cuda() ? "cuda" : "cpu"))
    return make(tier_hyperparameters(), options, d.has_index() ? d.index() : 0);
  return std::make_unique<skewadam::libtorch::CoreOf<skewadam::Optimizer<Tiers>>>(tier_hyperparameters(), options);
}

skewadam::Dtype dtype_of(const torch::Tensor& t) {
  return t.scalar_type() == torch::kBFloat16 ? skewadam::Dtype::bf16 : skewadam::Dtype::f32;
}

skewadam::Shape shape_of(const torch::Tensor& t) {
  return t.dim() == 0 ? skewadam::Shape{1} : skewadam::Shape(t.sizes().begin(), static_cast<skewadam::index_t>(t.dim()));
}

/// True when a state tensor of the adapter holds exactly the host array's floats.
bool same_floats(const torch::Tensor& t, const std::vector<float>& host) {
  if (!t.defined()) return host.empty();
  const auto c = t.to(torch::kCPU).contiguous();
  return c.numel() == static_cast<std::int64_t>(host.size()) &&
         std::memcmp(c.data_ptr(), host.data(), host.size() * sizeof(float)) == 0;
}

template <class Tiers>
void check_matches_core(bool clip) {
  const Named start = make_params();
  const Named a = clone(start);  // updated through the adapter
  const Named b = clone(start);  // updated by the library directly

  skewadam::libtorch::Options options;
  options.hyperparameters = tier_hyperparameters();
  options.seed = 99;
  options.threads = 2;
  options.max_grad_norm = clip ? 0.05 : 0.0;
  skewadam::libtorch::Optimizer<Tiers> adapter(a, options);

  const auto core = reference_core<Tiers>(
      skewadam::OptimizerOptions{.seed = 99, .threads = 2, .max_grad_norm = clip ? 0.05 : 0.0});
  const skewadam::TierAssigner rules;
  std::vector<skewadam::ParamId> ids;
  for (const auto& [name, t] : b) {
    skewadam::ParamView view;
    view.data = t.data_ptr();
    view.dtype = dtype_of(t);
    view.shape = shape_of(t);
    ids.push_back(core->add(name, rules.assign(name), view));
  }

  for (int k = 1; k <= 7; ++k) {
    const auto g = grads_for_step(start, k);
    const double lr_scale = 1.0 / k;
    // the adapter: grads on the tensors, lr through torch's param groups
    set_grads(a, g);
    for (skewadam::Tier t : skewadam::all_tiers)
      adapter.group_options(t).set_lr(tier_hyperparameters()[t].lr * lr_scale);
    adapter.step();
    // the library: the same gradients through views (kept until the step is done)
    std::vector<torch::Tensor> keep;
    for (std::size_t i = 0; i < b.size(); ++i) {
      if (!g[i].defined()) {
        core->clear_grad(ids[i]);
        continue;
      }
      keep.push_back(g[i].contiguous());
      skewadam::GradView gv;
      gv.data = keep.back().data_ptr();
      gv.dtype = dtype_of(keep.back());
      gv.shape = shape_of(b[i].second);
      core->set_grad(ids[i], gv);
    }
    for (skewadam::Tier t : skewadam::all_tiers) {
      skewadam::Hyperparameters h = core->hyperparameters(t);
      h.lr = tier_hyperparameters()[t].lr * lr_scale;
      core->set_hyperparameters(t, h);
    }
    core->step();
    (void)core->last_step();  // waits for a device engine's step
    core->clear_grads();
    INFO("step " << k);
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO("parameter " << a[i].first);
      CHECK(same_bits(a[i].second, b[i].second));
    }
  }
  // the parameters did change, and the state matches too
  CHECK_FALSE(same_bits(a, start));
  CHECK(adapter.state_bytes() == core->state_bytes());
  const skewadam::OptimizerState reference = core->export_state();
  for (std::size_t i = 0; i < b.size(); ++i) {
    INFO("parameter " << b[i].first);
    const auto& s = adapter.param_state(b[i].first);
    const auto& live = reference.params[static_cast<std::size_t>(ids[i].index)].state;
    CHECK(s.step == live.step);
    CHECK(same_floats(s.m, live.m));
    CHECK(same_floats(s.v, live.v));
    CHECK(same_floats(s.v_row, live.v_row));
    CHECK(same_floats(s.v_col, live.v_col));
  }
}

}  // namespace

TEST_CASE_TEMPLATE("the adapter updates tensors bit for bit as the library does", Tiers, skewadam::SkewAdamTiers,
                   skewadam::UniformTiers, skewadam::AdafactorTiers, skewadam::AdamWTiers,
                   skewadam::SkewAdamBf16Tiers, skewadam::SkewAdam8bitTiers) {
  SUBCASE("without gradient clipping") { check_matches_core<Tiers>(false); }
  SUBCASE("with global gradient-norm clipping") { check_matches_core<Tiers>(true); }
}

// A variant whose device engine is missing would run on the CPU core (for CPU
// tensors, where the emulated engines are registered) and pass every test
// there: each one must run on the engine this program registers.
TEST_CASE("every variant runs on the engine registered for the test device, not on the CPU core instead") {
  skewadam::Variants::for_each([]<class Tiers>() {
    const std::string name(skewadam::Variant<Tiers>::name);
    CAPTURE(name);
    const skewadam::libtorch::Optimizer<Tiers> opt(make_params(), test_options());
    using cpu_core_type = skewadam::libtorch::CoreOf<typename skewadam::libtorch::Optimizer<Tiers>::core_type>;
    const bool cpu_core = dynamic_cast<const cpu_core_type*>(&opt.engine_core()) != nullptr;
    CHECK(cpu_core == !device_engine_expected());
    CHECK((skewadam::libtorch::device_core<Tiers>(test_device().is_cuda() ? "cuda" : "cpu") != nullptr) ==
          device_engine_expected());
  });
}

TEST_CASE("tiers, param groups and state views") {
  const Named ps = make_params();
  skewadam::libtorch::SkewAdam opt(ps);
  REQUIRE(opt.param_groups().size() == 3);
  CHECK(opt.tier("blocks.1.moe.router.weight") == skewadam::Tier::router);
  CHECK(opt.tier("blocks.1.moe.experts.gate_proj") == skewadam::Tier::experts);
  CHECK(opt.tier("blocks.0.ffn.gate_proj.weight") == skewadam::Tier::backbone);
  CHECK(opt.param_groups()[0].params().size() == 5);  // backbone
  CHECK(opt.param_groups()[1].params().size() == 3);  // experts
  CHECK(opt.param_groups()[2].params().size() == 1);  // router
  CHECK(opt.state().size() == ps.size());

  // docs/spec.md §2: experts keep only factored statistics, the router exact V,
  // the backbone momentum + factored (rank 1 falls back to exact).
  const auto& experts = opt.param_state("blocks.1.moe.experts.gate_proj");
  CHECK_FALSE(experts.m.defined());
  CHECK(experts.v_row.sizes() == torch::IntArrayRef({4, 16}));
  CHECK(experts.v_col.sizes() == torch::IntArrayRef({4, 24}));
  const auto& router = opt.param_state("blocks.1.moe.router.weight");
  CHECK(router.v.sizes() == torch::IntArrayRef({4, 16}));
  const auto& norm = opt.param_state("blocks.0.ln1.weight");
  CHECK(norm.m.sizes() == torch::IntArrayRef({16}));
  CHECK(norm.v.sizes() == torch::IntArrayRef({16}));
  std::int64_t sum = 0;
  for (const auto& item : opt.state())
    sum += dynamic_cast<const skewadam::libtorch::ParamState&>(*item.second).bytes();
  CHECK(sum == opt.state_bytes());
}

TEST_CASE("step() with a closure returns its loss; zero_grad and undefined gradients") {
  Named ps = {{"w", on(torch::full({3, 4}, 1.0f))}, {"experts.w", on(torch::full({2, 3, 4}, 1.0f))}};
  skewadam::libtorch::SkewAdam opt(ps, skewadam::libtorch::Options::uniform({.lr = 0.1}));
  for (auto& [n, t] : ps) t.set_requires_grad(true);
  auto closure = [&] {
    opt.zero_grad();
    auto loss = (ps[0].second * ps[0].second).sum();  // no gradient reaches experts.w
    loss.backward();
    return loss;
  };
  const torch::Tensor before = ps[1].second.detach().clone();
  const torch::Tensor loss = opt.step(closure);
  CHECK(loss.item<float>() == doctest::Approx(12.0));
  CHECK(ps[0].second.detach().lt(1.0f).all().item<bool>());
  CHECK(same_bits(ps[1].second.detach(), before));  // undefined grad: skipped
  CHECK(opt.param_state("experts.w").step == 0);
  CHECK(opt.param_state("w").step == 1);
}

TEST_CASE("a tensor under two names is updated once") {
  torch::Tensor shared = on(torch::ones({4, 4}));
  Named ps = {{"tok_emb.weight", shared}, {"lm_head.weight", shared}};
  skewadam::libtorch::SkewAdam opt(ps);
  CHECK(opt.names().size() == 1);
  CHECK(opt.state().size() == 1);
}

TEST_CASE("invalid parameters and gradients raise clear errors") {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no exception");
  };
  SUBCASE("unsupported dtype") {
    const auto m = message([] { skewadam::libtorch::SkewAdam opt(Named{{"w", on(torch::ones({2}, torch::kDouble))}}); });
    CHECK(m.find("parameter 'w'") != std::string::npos);
    CHECK(m.find("Double") != std::string::npos);
  }
  SUBCASE("non-contiguous parameter") {
    const auto m = message([] { skewadam::libtorch::SkewAdam opt(Named{{"w", on(torch::ones({4, 3})).t()}}); });
    CHECK(m.find("parameter 'w': not contiguous") != std::string::npos);
  }
  SUBCASE("no rule matches") {
    skewadam::libtorch::Options o;
    o.tier_rules = skewadam::TierAssigner::from_strings({"experts=experts"}, false);
    const auto m = message([&] { skewadam::libtorch::SkewAdam opt(Named{{"attn.w", on(torch::ones({2}))}}, o); });
    CHECK(m.find("attn.w") != std::string::npos);
    CHECK(m.find("matches no tier rule") != std::string::npos);
  }
  SUBCASE("bad hyperparameters") {
    skewadam::libtorch::Options o;
    o.hyperparameters.router.beta2 = 1.5;
    const auto m = message([&] { skewadam::libtorch::SkewAdam opt(Named{{"w", on(torch::ones({2}))}}, o); });
    CHECK(m.find("router.beta2") != std::string::npos);
  }
  SUBCASE("gradient of the wrong dtype") {
    Named ps{{"w", on(torch::ones({2, 2}, torch::kBFloat16))}};
    skewadam::libtorch::SkewAdam opt(ps);
    ps[0].second.mutable_grad() = on(torch::ones({2, 2}, torch::kHalf));
    const auto m = message([&] { opt.step(); });
    CHECK(m.find("gradient of 'w'") != std::string::npos);
  }
  SUBCASE("a parameter whose storage moved") {
    Named ps{{"w", on(torch::ones({2, 2}))}};
    skewadam::libtorch::SkewAdam opt(ps);
    ps[0].second.set_data(on(torch::zeros({2, 2})));
    ps[0].second.mutable_grad() = on(torch::ones({2, 2}));
    const auto m = message([&] { opt.step(); });
    CHECK(m.find("parameter 'w'") != std::string::npos);
    CHECK(m.find("moved") != std::string::npos);
  }
  SUBCASE("a group lr set to NaN through torch") {
    Named ps{{"w", on(torch::ones({2, 2}))}};
    skewadam::libtorch::SkewAdam opt(ps);
    opt.param_groups()[0].options().set_lr(std::nan(""));
    ps[0].second.mutable_grad() = on(torch::ones({2, 2}));
    CHECK(message([&] { opt.step(); }).find("backbone.lr") != std::string::npos);
  }
  SUBCASE("a parameter added behind the optimizer's back") {
    Named ps{{"w", on(torch::ones({2, 2}))}};
    skewadam::libtorch::SkewAdam opt(ps);
    opt.param_groups()[0].params().push_back(on(torch::ones({3})));
    CHECK(message([&] { opt.step(); }).find("only by name") != std::string::npos);
  }
}

TEST_CASE("non-contiguous and float32 gradients of bf16 parameters are accepted") {
  Named a{{"w", on(torch::ones({4, 3}, torch::kBFloat16))}};
  Named b = clone(a);
  skewadam::libtorch::SkewAdam oa(a), ob(b);
  const auto g = on(torch::randn({3, 4})).t();  // float32, not contiguous
  a[0].second.mutable_grad() = g;
  b[0].second.mutable_grad() = g.contiguous();
  oa.step();
  ob.step();
  CHECK(same_bits(a, b));
  CHECK_FALSE(same_bits(a[0].second, on(torch::ones({4, 3}, torch::kBFloat16))));
}

TEST_CASE("a step with a non-finite gradient is skipped, or raises, as the options say") {
  Named ps{{"w", on(torch::ones({3, 4}))}, {"experts.w", on(torch::ones({2, 3, 4}))}};
  const Named before = clone(ps);
  auto bad_grads = [&] {
    ps[0].second.mutable_grad() = on(torch::ones({3, 4}));
    auto g = on(torch::ones({2, 3, 4}));
    g[1][2][3] = std::numeric_limits<float>::quiet_NaN();
    ps[1].second.mutable_grad() = g;
  };
  SUBCASE("skip_step (default)") {
    skewadam::libtorch::SkewAdam opt(ps);
    bad_grads();
    opt.step();
    CHECK_FALSE(opt.last_step().applied);
    REQUIRE(opt.last_step().nonfinite.has_value());
    CHECK(opt.last_step().nonfinite->name == "experts.w");
    CHECK(opt.last_step().nonfinite->element == 23);
    CHECK(same_bits(ps, before));
    CHECK(opt.steps() == 0);
    CHECK(opt.param_state("w").step == 0);
    ps[1].second.mutable_grad() = on(torch::ones({2, 3, 4}));
    opt.step();
    CHECK(opt.last_step().applied);
    CHECK(opt.param_state("w").step == 1);
  }
  SUBCASE("raise") {
    skewadam::libtorch::Options o;
    o.nonfinite = skewadam::NonFinitePolicy::raise;
    skewadam::libtorch::SkewAdam opt(ps, o);
    bad_grads();
    CHECK_THROWS_AS(opt.step(), skewadam::NonFiniteGradientError);
    CHECK(same_bits(ps, before));
    CHECK_FALSE(opt.engine_core().has_grad(*opt.engine_core().find("w")));  // no view of a gradient kept
  }
}

}  // namespace test_adapter
