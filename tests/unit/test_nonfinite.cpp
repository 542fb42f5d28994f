// Non-finite gradients: a skipped step changes no parameter, no state and no
// step count, in every tier and dtype; the report names the first offender;
// the two-phase checked step gives the bits of an unchecked one.

#include <doctest/doctest.h>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <skewadam/skewadam.hpp>

#include "training_fixture.hpp"

namespace test_nonfinite {

using namespace skewadam;
using fixture::Model;
using fixture::Snapshot;

namespace {

void poison(fixture::Tensor& t, index_t i, float value) {
  const auto k = static_cast<std::size_t>(i);
  switch (t.grad_dtype) {
    case Dtype::f32: t.g32[k] = value; break;
    case Dtype::bf16: t.gb[k] = bf16(value); break;
    case Dtype::f16: t.gh[k] = f16(value); break;
  }
}

/// Sets the gradients of step t, as Model::train does, without stepping.
template <class Opt>
void set_grads(Model& m, Opt& opt, const std::vector<ParamId>& ids, std::int64_t t) {
  for (std::size_t i = 0; i < m.tensors.size(); ++i) {
    if (t % m.tensors[i].grad_every == 0) {
      m.tensors[i].fill_grad(i + 1, t);
      opt.set_grad(ids[i], m.tensors[i].grad());
    } else {
      opt.clear_grad(ids[i]);
    }
  }
}

template <class Opt>
void same_bits_checked_and_unchecked(std::initializer_list<Dtype> dtypes, std::initializer_list<int> thread_counts) {
  for (const Dtype weights : dtypes) {
    for (const int threads : thread_counts) {
      CAPTURE(dtype_name(weights));
      CAPTURE(threads);
      Model a = Model::make(weights), b = Model::make(weights);
      auto checked = fixture::make_optimizer<Opt>(threads, 9, NonFinitePolicy::skip_step);
      auto unchecked = fixture::make_optimizer<Opt>(threads, 9, NonFinitePolicy::unchecked);
      const auto ia = a.register_with(checked);
      const auto ib = b.register_with(unchecked);
      a.train(checked, ia, 0, 4);
      b.train(unchecked, ib, 0, 4);
      CHECK(Snapshot::take(a, checked) == Snapshot::take(b, unchecked));
    }
  }
}

}  // namespace

TEST_CASE("a checked step gives the bits of an unchecked one, for every rule") {
  same_bits_checked_and_unchecked<SkewAdam>({Dtype::f32, Dtype::bf16, Dtype::f16}, {1, 2});
  same_bits_checked_and_unchecked<UniformAblation>({Dtype::bf16}, {2});
  same_bits_checked_and_unchecked<AdafactorLike>({Dtype::bf16}, {2});
  same_bits_checked_and_unchecked<AdamW>({Dtype::f32, Dtype::bf16}, {2});
  same_bits_checked_and_unchecked<FactoredRouterAblation>({Dtype::bf16}, {2});
}

TEST_CASE("NaN, +-inf and overflowing values in any tier and dtype skip the whole step") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  constexpr std::int64_t done = 3, bad_step = 4;  // every tensor has a gradient on step 4
  const std::pair<Dtype, int> configs[] = {{Dtype::f32, 2}, {Dtype::bf16, 1}, {Dtype::bf16, 2}, {Dtype::f16, 2}};
  for (const auto& config : configs) {
    const Dtype weights = config.first;  // plain variables: doctest's CAPTURE cannot name structured bindings
    const int threads = config.second;
    {
      // the run that never sees the bad gradient
      Model ref = Model::make(weights);
      auto ref_opt = fixture::make_optimizer<SkewAdam>(threads, 5);
      const auto ref_ids = ref.register_with(ref_opt);
      ref.train(ref_opt, ref_ids, 0, bad_step);
      const Snapshot expected = Snapshot::take(ref, ref_opt);

      Model m = Model::make(weights);
      auto opt = fixture::make_optimizer<SkewAdam>(threads, 5);
      const auto ids = m.register_with(opt);
      m.train(opt, ids, 0, done);
      const Snapshot before = Snapshot::take(m, opt);

      set_grads(m, opt, ids, bad_step);
      for (std::size_t k = 0; k < m.tensors.size(); ++k) {
        fixture::Tensor& x = m.tensors[k];
        const index_t n = x.numel();
        const fixture::Tensor clean = x;
        for (const float value : {nan, inf, -inf, 3e30f}) {
          if (value == 3e30f && x.grad_dtype == Dtype::f16) continue;  // not representable
          for (const index_t at : {index_t{0}, n / 2 + 1, n - 1}) {
            CAPTURE(dtype_name(weights));
            CAPTURE(threads);
            CAPTURE(x.name);
            CAPTURE(value);
            CAPTURE(at);
            poison(x, at, value);
            opt.step();
            const StepReport r = opt.last_step();
            CHECK_FALSE(r.applied);
            CHECK_FALSE(static_cast<bool>(r));
            REQUIRE(r.nonfinite.has_value());
            CHECK(r.nonfinite->name == x.name);
            CHECK(r.nonfinite->param == ids[k]);
            CHECK(r.nonfinite->element == at);
            if (std::isnan(value)) CHECK(std::isnan(r.nonfinite->value));
            else CHECK((r.nonfinite->value == static_cast<float>(bf16(value)) || r.nonfinite->value == value));
            CHECK(Snapshot::take(m, opt) == before);
            const auto a = static_cast<std::size_t>(at);  // unpoison in place: opt holds the buffer
            if (!x.g32.empty()) x.g32[a] = clean.g32[a];
            if (!x.gb.empty()) x.gb[a] = clean.gb[a];
            if (!x.gh.empty()) x.gh[a] = clean.gh[a];
          }
        }
      }
      // the skipped steps left no trace: the clean step gives the reference's bits
      set_grads(m, opt, ids, bad_step);
      opt.step();
      CHECK(opt.last_step().applied);
      CHECK(Snapshot::take(m, opt) == expected);
    }
  }
}

TEST_CASE("raise: throws the report, changes nothing") {
  Model m = Model::make(Dtype::bf16);
  auto opt = fixture::make_optimizer<SkewAdam>(2, 5, NonFinitePolicy::raise);
  const auto ids = m.register_with(opt);
  m.train(opt, ids, 0, 2);
  const Snapshot before = Snapshot::take(m, opt);
  set_grads(m, opt, ids, 3);
  poison(m.tensors[3], 17, std::numeric_limits<float>::infinity());
  try {
    opt.step();
    FAIL("no exception");
  } catch (const NonFiniteGradientError& e) {
    CHECK(e.report().name == "blocks.1.moe.experts.w1");
    CHECK(e.report().element == 17);
    CHECK(std::string(e.what()) ==
          "step rejected: gradient of 'blocks.1.moe.experts.w1' is +inf at element 17 ([0, 1, 1])");
  }
  CHECK(Snapshot::take(m, opt) == before);
  CHECK(opt.steps() == 2);
}

TEST_CASE("the first offender in registration order is reported") {
  Model m = Model::make(Dtype::f32);
  auto opt = fixture::make_optimizer<SkewAdam>(2);
  const auto ids = m.register_with(opt, /*reversed=*/true);  // router first, embed last
  set_grads(m, opt, ids, 2);
  poison(m.tensors[1], 5, std::numeric_limits<float>::quiet_NaN());   // scanned (momentum)
  poison(m.tensors[4], 9, std::numeric_limits<float>::quiet_NaN());   // found by its statistics
  opt.step();
  StepReport r = opt.last_step();
  REQUIRE(r.nonfinite);
  CHECK(r.nonfinite->name == "blocks.1.moe.experts.w2");
  CHECK(r.nonfinite->element == 9);
  m.tensors[4].fill_grad(5, 2);
  opt.step();
  r = opt.last_step();
  REQUIRE(r.nonfinite);
  CHECK(r.nonfinite->name == "blocks.0.attn.q");
  CHECK(r.nonfinite->describe() == "gradient of 'blocks.0.attn.q' is NaN at element 5 ([0, 5])");
  CHECK(opt.steps() == 0);
}

TEST_CASE("an overflowing gradient is named as such") {
  Model m = Model::make(Dtype::f32);
  auto opt = fixture::make_optimizer<SkewAdam>(1);
  const auto ids = m.register_with(opt);
  set_grads(m, opt, ids, 2);
  poison(m.tensors[0], 30, 1e30f);
  opt.step();
  const StepReport r = opt.last_step();
  REQUIRE(r.nonfinite);
  CHECK(r.nonfinite->describe().find("whose square overflows the float statistics, at element 30 ([1, 6])") !=
        std::string::npos);
}

TEST_CASE("global-norm clipping of a NaN gradient: the step is skipped and the scale dropped") {
  Model m = Model::make(Dtype::bf16);
  auto opt = fixture::make_optimizer<SkewAdam>(2);
  const auto ids = m.register_with(opt);
  set_grads(m, opt, ids, 2);
  poison(m.tensors[6], 3, std::numeric_limits<float>::quiet_NaN());
  CHECK(std::isnan(opt.clip_grad_norm(1.0)));
  CHECK(opt.pending_grad_scale() == 1.0);
  opt.step();
  CHECK_FALSE(opt.last_step().applied);
  CHECK(opt.steps() == 0);

  set_grads(m, opt, ids, 2);
  CHECK(opt.clip_grad_norm(1e-3) > 1e-3);
  CHECK(opt.pending_grad_scale() < 1.0);
  poison(m.tensors[2], 0, std::numeric_limits<float>::infinity());
  opt.step();
  const StepReport r = opt.last_step();
  REQUIRE(r.nonfinite);
  CHECK(std::isinf(r.nonfinite->value));
  CHECK(opt.pending_grad_scale() == 1.0);
}

TEST_CASE("non-finite state without an offending gradient is reported as such") {
  Model m = Model::make(Dtype::f32);
  auto opt = fixture::make_optimizer<SkewAdam>(1);
  const auto ids = m.register_with(opt);
  m.train(opt, ids, 0, 2);
  OptimizerState s = opt.export_state();
  s.params[3].state.v_row[2] = std::numeric_limits<float>::infinity();
  opt.import_state(s);
  const Snapshot before = Snapshot::take(m, opt);
  set_grads(m, opt, ids, 3);
  opt.step();
  const StepReport r = opt.last_step();
  REQUIRE(r.nonfinite);
  CHECK(r.nonfinite->name == "blocks.1.moe.experts.w1");
  CHECK(r.nonfinite->element == -1);
  CHECK(r.nonfinite->describe().find("the state was not finite") != std::string::npos);
  CHECK(Snapshot::take(m, opt) == before);
}

TEST_CASE("unchecked: NaN flows through, as in the reference") {
  std::vector<float> w(64, 0.5f), g(64, 0.1f);
  SkewAdam opt(Hyperparameters{}, OptimizerOptions{.nonfinite = NonFinitePolicy::unchecked});
  CHECK(opt.nonfinite_policy() == NonFinitePolicy::unchecked);
  const ParamId id = opt.add("w", Tier::experts, TensorView<float>(w.data(), {8, 8}));
  g[9] = std::numeric_limits<float>::quiet_NaN();
  opt.set_grad(id, TensorView<const float>(g.data(), {8, 8}));
  opt.step();
  CHECK(opt.last_step().applied);
  CHECK(std::isnan(w[9]));
  CHECK(opt.steps() == 1);
  CHECK_THROWS_AS(opt.set_nonfinite_policy(static_cast<NonFinitePolicy>(7)), std::invalid_argument);
}

}  // namespace test_nonfinite
