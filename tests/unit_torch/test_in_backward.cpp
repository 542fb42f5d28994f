// The step inside backward through the LibTorch adapter: step_in_backward()
// hooks each parameter's gradient accumulator, steps it as soon as backward
// completes its gradient and frees that gradient; the bits are the plain
// step()'s.

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "torch_test_support.hpp"

namespace {

using namespace skewadam_torch_test;

/// Parameters that require a gradient.
Named leaf_params() {
  Named p = make_params();
  for (auto& [name, t] : p) t.requires_grad_(true);
  return p;
}

/// A loss whose gradient with respect to each parameter is exactly g[i]
/// (sum of p * g, with g constant; the parameters with no g take no part).
torch::Tensor loss_with_grads(const Named& ps, const std::vector<torch::Tensor>& g) {
  torch::Tensor loss = torch::zeros({}, torch::TensorOptions().device(test_device()));
  for (std::size_t i = 0; i < ps.size(); ++i)
    if (g[i].defined()) loss = loss + (ps[i].second * g[i]).sum().to(torch::kFloat32);
  return loss;
}

}  // namespace

TEST_CASE_TEMPLATE("the step inside backward gives the plain step's bits and frees each gradient", Tiers,
                   skewadam::SkewAdamTiers, skewadam::AdamWTiers, skewadam::AdafactorTiers,
                   skewadam::SkewAdam8bitTiers) {
  Named a = leaf_params();
  Named b = clone(a);
  for (auto& [name, t] : b) t.requires_grad_(true);
  skewadam::libtorch::Optimizer<Tiers> plain(a, test_options());
  skewadam::libtorch::Optimizer<Tiers> inside(b, test_options());
  inside.step_in_backward();
  CHECK(inside.steps_in_backward());
  for (int k = 1; k <= 4; ++k) {
    CAPTURE(k);
    const std::vector<torch::Tensor> g = grads_for_step(a, k);
    set_grads(a, g);
    plain.step();
    loss_with_grads(b, g).backward();
    // backward has stepped every parameter it reached, and freed its gradient
    CHECK(inside.engine_core().step_open());
    for (const auto& [name, t] : b) CHECK_MESSAGE(!t.grad().defined(), name);
    inside.step();
    CHECK_FALSE(inside.engine_core().step_open());
    CHECK(inside.last_step().applied);
    CHECK(inside.steps() == plain.steps());
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO(a[i].first);
      CHECK(same_bits(a[i].second.detach(), b[i].second.detach()));
      const auto& sa = plain.param_state(a[i].first);
      const auto& sb = inside.param_state(b[i].first);
      CHECK(sa.step == sb.step);
      for (auto [x, y] : {std::pair{&sa.m, &sb.m}, {&sa.v, &sb.v}, {&sa.v_row, &sb.v_row}, {&sa.v_col, &sb.v_col}})
        if (x->defined()) CHECK(same_bits(*x, *y));
    }
  }
  // a gradient set by hand, with no backward, is stepped by step() itself
  const std::vector<torch::Tensor> g = grads_for_step(a, 5);
  set_grads(a, g);
  set_grads(b, g);
  plain.step();
  inside.step();
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(same_bits(a[i].second.detach(), b[i].second.detach()));
  CHECK(inside.steps() == plain.steps());
}

TEST_CASE("the step inside backward refuses global-norm clipping, and its hooks go with the optimizer") {
  Named b = leaf_params();
  const std::vector<torch::Tensor> g = grads_for_step(b, 1);
  {
    skewadam::libtorch::Options o = test_options();
    o.max_grad_norm = 1.0;
    skewadam::libtorch::SkewAdam opt(b, o);
    opt.step_in_backward();
    const Named before = clone(b);
    try {
      loss_with_grads(b, g).backward();
      FAIL("backward did not refuse max_grad_norm");
    } catch (const std::exception& e) {
      CHECK(std::string(e.what()).find("max_grad_norm") != std::string::npos);
    }
    CHECK(opt.steps() == 0);
    for (std::size_t i = 0; i < b.size(); ++i) CHECK(same_bits(b[i].second.detach(), before[i].second));
    for (auto& [name, t] : b) t.mutable_grad() = torch::Tensor();
  }
  // once the optimizer is gone, backward accumulates gradients as usual
  loss_with_grads(b, g).backward();
  for (std::size_t i = 0; i < b.size(); ++i)
    if (g[i].defined()) CHECK(same_bits(b[i].second.grad(), g[i]));
  {
    skewadam::libtorch::SkewAdam opt(b, test_options());
    opt.step_in_backward();
    opt.step_in_backward(false);  // removed again
    CHECK_FALSE(opt.steps_in_backward());
    for (auto& [name, t] : b) t.mutable_grad() = torch::Tensor();
    loss_with_grads(b, g).backward();
    CHECK(opt.steps() == 0);
    for (std::size_t i = 0; i < b.size(); ++i)
      if (g[i].defined()) CHECK(b[i].second.grad().defined());
  }
  Named frozen = make_params();  // requires no gradient
  skewadam::libtorch::SkewAdam opt(frozen, test_options());
  try {
    opt.step_in_backward();
    FAIL("hooks on parameters that require no gradient");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("does not require a gradient") != std::string::npos);
  }
  CHECK_FALSE(opt.steps_in_backward());
}
