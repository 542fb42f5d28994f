// The optimizer object: registration, state bytes, skipping, schedules,
// global gradient-norm clipping, and bad input (clear errors, nothing changed).

#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "test_util.hpp"

namespace test_optimizer {

using namespace skewadam;

namespace {

struct Model {
  // a small MoE-shaped set: backbone matrix + bias, expert bank, router
  std::vector<float> emb = testutil::random_vector(50 * 16, 1);
  std::vector<float> bias = testutil::random_vector(16, 2);
  std::vector<float> experts = testutil::random_vector(4 * 16 * 32, 3);
  std::vector<float> router = testutil::random_vector(4 * 16, 4);
  std::vector<float> g_emb = testutil::random_vector(50 * 16, 5);
  std::vector<float> g_bias = testutil::random_vector(16, 6);
  std::vector<float> g_experts = testutil::random_vector(4 * 16 * 32, 7);
  std::vector<float> g_router = testutil::random_vector(4 * 16, 8);

  template <class Opt>
  void add_to(Opt& opt) {
    opt.add("emb", Tier::backbone, TensorView<float>(emb.data(), {50, 16}), TensorView<const float>(g_emb.data(), {50, 16}));
    opt.add("ln.bias", Tier::backbone, TensorView<float>(bias.data(), {16}), TensorView<const float>(g_bias.data(), {16}));
    opt.add("moe.experts.w1", Tier::experts, TensorView<float>(experts.data(), {4, 16, 32}),
            TensorView<const float>(g_experts.data(), {4, 16, 32}));
    opt.add("moe.router", Tier::router, TensorView<float>(router.data(), {4, 16}),
            TensorView<const float>(g_router.data(), {4, 16}));
  }
  std::vector<float> all() const {
    std::vector<float> v = emb;
    v.insert(v.end(), bias.begin(), bias.end());
    v.insert(v.end(), experts.begin(), experts.end());
    v.insert(v.end(), router.begin(), router.end());
    return v;
  }
};

template <class Opt>
index_t expected_bytes(Tier t) {
  const StateLayout l = Opt::tiers::layout(t);
  switch (t) {
    case Tier::backbone: return state_bytes(l, Shape{50, 16}) + state_bytes(l, Shape{16});
    case Tier::experts: return state_bytes(l, Shape{4, 16, 32});
    case Tier::router: return state_bytes(l, Shape{4, 16});
  }
  return -1;
}

template <class Opt>
void check_bytes() {
  Model m;
  Opt opt;
  m.add_to(opt);
  index_t total = 0;
  for (Tier t : all_tiers) {
    CAPTURE(tier_name(t));
    CHECK(opt.state_bytes(t) == expected_bytes<Opt>(t));
    total += opt.state_bytes(t);
  }
  CHECK(opt.state_bytes() == total);
}

}  // namespace

TEST_CASE("state bytes follow docs/spec.md section 2 for every variant") {
  // hand-computed for SkewAdam
  SkewAdam opt;
  Model m;
  m.add_to(opt);
  CHECK(opt.state_bytes(Tier::backbone) == 4 * (50 * 16) + 4 * (50 + 16) + 4 * 16 + 4 * 16);  // m + R,C; bias: m + v
  CHECK(opt.state_bytes(Tier::experts) == 4 * 4 * (16 + 32));
  CHECK(opt.state_bytes(Tier::router) == 4 * 4 * 16);
  check_bytes<SkewAdam>();
  check_bytes<ExpertMomentumAblation>();
  check_bytes<FactoredRouterAblation>();
  check_bytes<UniformAblation>();
  check_bytes<AdafactorLike>();
  check_bytes<AdamW>();
  AdamW adamw;
  Model m2;
  m2.add_to(adamw);
  CHECK(adamw.state_bytes() == 8 * static_cast<index_t>(m2.all().size()));
}

TEST_CASE("a parameter without a gradient is skipped") {
  Model m;
  SkewAdam opt;
  m.add_to(opt);
  const ParamId router = *opt.find("moe.router");
  opt.clear_grad(router);
  const auto before = m.router;
  opt.step();
  CHECK(m.router == before);
  CHECK(opt.state(router).step == 0);
  for (float x : opt.state(router).v) CHECK(x == 0.0f);
  CHECK(opt.state(*opt.find("emb")).step == 1);
  opt.set_grad(router, TensorView<const float>(m.g_router.data(), {4, 16}));
  opt.step();
  CHECK(opt.state(router).step == 1);  // its own t starts at 1
  CHECK(opt.state(*opt.find("emb")).step == 2);
  CHECK(opt.steps() == 2);
  CHECK(m.router != before);
}

TEST_CASE("zero-size tensors are a no-op") {
  SkewAdam opt;
  std::vector<float> none;
  const ParamId id = opt.add("empty", Tier::experts, TensorView<float>(nullptr, {0, 8}), TensorView<const float>(nullptr, {0, 8}));
  opt.step();
  CHECK(opt.state_bytes() == 0);
  CHECK(opt.state(id).step == 0);
}

TEST_CASE("per-tier hyperparameters and schedules") {
  Model m;
  PerTier<Hyperparameters> h;
  h.backbone.lr = 1e-2;
  h.experts.lr = 0.0;  // experts frozen by lr 0 and no weight decay
  h.router.lr = 1e-2;
  SkewAdam opt(h);
  m.add_to(opt);
  const auto experts_before = m.experts;
  opt.step();
  CHECK(m.experts == experts_before);
  CHECK(opt.hyperparameters(Tier::experts).lr == 0.0);

  std::vector<std::int64_t> seen;
  opt.set_lr_schedule(Tier::experts, [&](std::int64_t t) {
    seen.push_back(t);
    return 1e-3;
  });
  opt.step();
  CHECK(seen == std::vector<std::int64_t>{2});
  CHECK(m.experts != experts_before);
  opt.set_lr_schedule(Tier::experts, [](std::int64_t) { return -1.0; });
  const auto all_before = m.all();
  CHECK_THROWS_WITH_AS(opt.step(), doctest::Contains("lr schedule of tier experts"), std::invalid_argument);
  CHECK(m.all() == all_before);
  CHECK(opt.steps() == 2);
}

TEST_CASE("global gradient-norm clipping scales the gradients of the next step") {
  Model a, b;
  SkewAdam clipped, manual;
  a.add_to(clipped);
  // manual: scale the gradients by hand the way torch.nn.utils.clip_grad_norm_ does
  double sum = 0;
  for (const auto* g : {&b.g_emb, &b.g_bias, &b.g_experts, &b.g_router})
    for (float x : *g) sum += static_cast<double>(x) * x;
  const double norm = std::sqrt(sum);
  const double scale = 0.5 / (norm + 1e-6);
  for (auto* g : {&b.g_emb, &b.g_bias, &b.g_experts, &b.g_router})
    for (float& x : *g) x = static_cast<float>(x * static_cast<float>(scale));
  b.add_to(manual);
  CHECK(clipped.grad_norm() == doctest::Approx(norm));
  CHECK(clipped.clip_grad_norm(0.5) == doctest::Approx(norm));
  clipped.step();
  manual.step();
  CHECK(a.all() == b.all());
  CHECK(clipped.pending_grad_scale() == 1.0);
  CHECK_THROWS_AS(clipped.clip_grad_norm(0.0), std::invalid_argument);
  CHECK_THROWS_AS(clipped.clip_grad_norm(NAN), std::invalid_argument);
}

TEST_CASE("bad input raises an exception naming the argument and changes nothing") {
  Model m;
  SkewAdam opt;
  m.add_to(opt);
  std::vector<float> w(12), g(12);
  const auto snapshot = m.all();
  const index_t bytes = opt.state_bytes();

  CHECK_THROWS_WITH_AS(opt.add("emb", Tier::backbone, TensorView<float>(w.data(), {3, 4})),
                       doctest::Contains("'emb' is already registered"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(opt.add("", Tier::backbone, TensorView<float>(w.data(), {3, 4})),
                       doctest::Contains("name"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(opt.add("x", "gates", TensorView<float>(w.data(), {3, 4})),
                       doctest::Contains("unknown tier 'gates'"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(opt.add("x", static_cast<Tier>(7), TensorView<float>(w.data(), {3, 4})),
                       doctest::Contains("unknown tier value 7"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(opt.add("x", Tier::experts, TensorView<float>(w.data(), {3, 4}), TensorView<const float>(g.data(), {4, 3})),
                       doctest::Contains("grad of 'x': shape [4, 3] does not match the parameter's [3, 4]"),
                       std::invalid_argument);
  std::vector<bf16> gb(12);
  std::vector<f16> wh(12);
  CHECK_THROWS_WITH_AS(opt.add("x", Tier::experts, TensorView<f16>(wh.data(), {3, 4}), TensorView<const bf16>(gb.data(), {3, 4})),
                       doctest::Contains("dtype bf16 must be f32 or the parameter's dtype f16"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(TensorView<float>(nullptr, {3, 4}, "param"), doctest::Contains("param: null data pointer"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(TensorView<float>(w.data(), {3, -4}), doctest::Contains("dimension 1 is negative"),
                       std::invalid_argument);
  ParamView raw;
  raw.shape = Shape{3, 4};
  CHECK_THROWS_WITH_AS(opt.add("x", Tier::experts, raw), doctest::Contains("param of 'x': null data pointer"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(opt.set_grad(*opt.find("emb"), TensorView<const float>(g.data(), {3, 4})),
                       doctest::Contains("grad of 'emb'"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(opt.set_grad(ParamId{99}, TensorView<const float>(g.data(), {3, 4})),
                       doctest::Contains("param id 99"), std::invalid_argument);

  CHECK_THROWS_WITH_AS(opt.set_lr(-1e-3), doctest::Contains("lr = -0.001"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(opt.set_lr(NAN), doctest::Contains("lr"), std::invalid_argument);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH_AS(opt.set_hyperparameters(Tier::router, Hyperparameters{.beta1 = 1.0}),
                       doctest::Contains("router.beta1"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(opt.set_hyperparameters(Tier::router, Hyperparameters{.beta2 = -0.1}),
                       doctest::Contains("router.beta2"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(opt.set_hyperparameters(Tier::router, Hyperparameters{.eps = 0.0}),
                       doctest::Contains("router.eps"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(opt.set_hyperparameters(Tier::experts, Hyperparameters{.clip_threshold = 0.0}),
                       doctest::Contains("experts.clip_threshold"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(opt.set_hyperparameters(Tier::experts, Hyperparameters{.weight_decay = nan}),
                       doctest::Contains("experts.weight_decay"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(opt.set_hyperparameters(Tier::experts, Hyperparameters{.beta1 = nan}),
                       doctest::Contains("experts.beta1"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(SkewAdam(Hyperparameters{.lr = nan}), doctest::Contains("backbone.lr"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(opt.set_threads(-2), doctest::Contains("threads = -2"), std::invalid_argument);
  // memory shared with a registered parameter: a second name for it, a view
  // of part of it (last element only), a gradient inside it
  CHECK_THROWS_WITH_AS(opt.add("emb.tied", Tier::backbone, TensorView<float>(m.emb.data(), {50, 16})),
                       doctest::Contains("param of 'emb.tied': its memory overlaps parameter 'emb'"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(opt.add("tail", Tier::backbone, TensorView<float>(m.experts.data() + m.experts.size() - 1, {1})),
                       doctest::Contains("overlaps parameter 'moe.experts.w1'"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(opt.add("x", Tier::backbone, TensorView<float>(w.data(), {3, 4}),
                               TensorView<const float>(m.router.data(), {3, 4})),
                       doctest::Contains("grad of 'x': its memory overlaps parameter 'moe.router'"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(opt.add("x", Tier::backbone, TensorView<float>(w.data(), {3, 4}),
                               TensorView<const float>(w.data() + 4, {3, 4})),
                       doctest::Contains("grad of 'x': its memory overlaps the parameter itself"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(opt.set_grad(*opt.find("ln.bias"), TensorView<const float>(m.emb.data() + 16, {16})),
                       doctest::Contains("grad of 'ln.bias': its memory overlaps parameter 'emb'"),
                       std::invalid_argument);

  CHECK(opt.size() == 4);
  CHECK(opt.state_bytes() == bytes);
  CHECK(m.all() == snapshot);
  CHECK(opt.steps() == 0);
  opt.step();  // still usable
  CHECK(m.all() != snapshot);
}

TEST_CASE("parameters packed back to back in one buffer, with their gradients in another") {
  std::vector<float> flat(2 * 12 + 5, 0.5f), grads(2 * 12 + 5, 0.25f);
  SkewAdam opt;
  opt.add("a", Tier::backbone, TensorView<float>(flat.data() + 12, {3, 4}), TensorView<const float>(grads.data() + 12, {3, 4}));
  opt.add("b", Tier::backbone, TensorView<float>(flat.data(), {3, 4}), TensorView<const float>(grads.data(), {3, 4}));
  opt.add("c", Tier::router, TensorView<float>(flat.data() + 24, {5}), TensorView<const float>(grads.data() + 24, {5}));
  CHECK(opt.size() == 3);
  CHECK_THROWS_WITH_AS(opt.add("d", Tier::router, TensorView<float>(flat.data() + 10, {2})),
                       doctest::Contains("overlaps parameter 'b'"), std::invalid_argument);
  opt.step();
  for (float x : flat) CHECK(x < 0.5f);
}

TEST_CASE("registration order does not change results") {
  Model a, b;
  SkewAdam first(Hyperparameters{}, OptimizerOptions{.seed = 3});
  a.add_to(first);
  SkewAdam second(Hyperparameters{}, OptimizerOptions{.seed = 3});
  second.add("moe.router", Tier::router, TensorView<float>(b.router.data(), {4, 16}), TensorView<const float>(b.g_router.data(), {4, 16}));
  second.add("moe.experts.w1", Tier::experts, TensorView<float>(b.experts.data(), {4, 16, 32}),
             TensorView<const float>(b.g_experts.data(), {4, 16, 32}));
  second.add("ln.bias", Tier::backbone, TensorView<float>(b.bias.data(), {16}), TensorView<const float>(b.g_bias.data(), {16}));
  second.add("emb", Tier::backbone, TensorView<float>(b.emb.data(), {50, 16}), TensorView<const float>(b.g_emb.data(), {50, 16}));
  for (int k = 0; k < 3; ++k) {
    first.step();
    second.step();
  }
  CHECK(a.all() == b.all());
}

TEST_CASE("gradients in the parameter's 16-bit dtype") {
  std::vector<f16> w(64, f16(0.5f)), g(64, f16(0.25f));
  std::vector<float> w32(64, 0.5f), g32(64, 0.25f);
  SkewAdam a, b;
  a.add("experts.w", Tier::experts, TensorView<f16>(w.data(), {8, 8}), TensorView<const f16>(g.data(), {8, 8}));
  b.add("experts.w", Tier::experts, TensorView<float>(w32.data(), {8, 8}), TensorView<const float>(g32.data(), {8, 8}));
  a.step();
  b.step();
  for (std::size_t i = 0; i < w.size(); ++i) CHECK(std::fabs(to_float(w[i]) - w32[i]) <= 5e-4f);
  CHECK(a.state(ParamId{0}).v_row.size() == 8);
  CHECK(a.state(ParamId{0}).v_row[0] == b.state(ParamId{0}).v_row[0]);
}

}  // namespace test_optimizer
