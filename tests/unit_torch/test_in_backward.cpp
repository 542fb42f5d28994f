// The step inside backward through the LibTorch adapter: step_in_backward()
// hooks each parameter's gradient accumulator, steps it as soon as backward
// completes its gradient and frees that gradient; the bits are the plain
// step()'s. In a training loop: a backward that raises part way leaves a
// step that zero_grad(), step() or the next backward ends; a second backward
// before step() is refused before it changes anything; what needs every
// gradient is refused up front; frozen parameters are left alone; two
// optimizers never both step a parameter.

#include <c10/util/Exception.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "doctest_torch.hpp"

#include <limits>
#include <memory>
#include <sstream>
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

/// An independent copy of a parameter set, requiring gradients as well.
Named leaf_clone(const Named& ps) {
  Named out = clone(ps);
  for (auto& [name, t] : out) t.requires_grad_(true);
  return out;
}

/// A loss whose gradient with respect to each parameter is exactly g[i]
/// (sum of p * g, with g constant; the parameters with no g take no part).
torch::Tensor loss_with_grads(const Named& ps, const std::vector<torch::Tensor>& g) {
  torch::Tensor loss = torch::zeros({}, torch::TensorOptions().device(test_device()));
  for (std::size_t i = 0; i < ps.size(); ++i)
    if (g[i].defined()) loss = loss + (ps[i].second * g[i]).sum().to(torch::kFloat32);
  return loss;
}

/// x itself, whose backward raises: an out-of-memory error, as a CUDA
/// allocation failing inside backward gives.
struct RaisingBackward : torch::autograd::Function<RaisingBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& x) { return x.clone(); }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "out of memory (raised by the test inside backward)");
    return {};
  }
};

/// loss_with_grads, except that backward raises once it has completed the
/// gradients of the parameters from `cut` on: those of [0, cut) are behind
/// RaisingBackward (built first, so that backward reaches it last).
torch::Tensor loss_raising_after(const Named& ps, const std::vector<torch::Tensor>& g, std::size_t cut) {
  torch::Tensor blocked = torch::zeros({}, torch::TensorOptions().device(test_device()));
  for (std::size_t i = 0; i < cut; ++i)
    if (g[i].defined()) blocked = blocked + (ps[i].second * g[i]).sum().to(torch::kFloat32);
  torch::Tensor loss = RaisingBackward::apply(blocked);
  for (std::size_t i = cut; i < ps.size(); ++i)
    if (g[i].defined()) loss = loss + (ps[i].second * g[i]).sum().to(torch::kFloat32);
  return loss;
}

/// Every parameter and state array of a and b (the same names) bit for bit.
template <class A, class B>
void check_same(const Named& a, const A& oa, const Named& b, const B& ob) {
  CHECK(oa.steps() == ob.steps());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].first);
    CHECK(same_bits(a[i].second.detach(), b[i].second.detach()));
    const auto& sa = oa.param_state(a[i].first);
    const auto& sb = ob.param_state(b[i].first);
    CHECK(sa.step == sb.step);
    for (auto [x, y] : {std::pair{&sa.m, &sb.m}, {&sa.v, &sb.v}, {&sa.v_row, &sb.v_row}, {&sa.v_col, &sb.v_col}})
      if (x->defined()) CHECK(same_bits(*x, *y));
  }
}

/// opt.step_in_backward() throws std::invalid_argument whose message holds
/// every one of `words`, and leaves the step inside backward off.
void refused_up_front(skewadam::libtorch::OptimizerBase& opt, const std::vector<std::string>& words) {
  try {
    opt.step_in_backward();
    FAIL("step_in_backward() accepted what it must refuse: ", words.front());
  } catch (const std::invalid_argument& e) {
    for (const std::string& w : words) CHECK_MESSAGE(std::string(e.what()).find(w) != std::string::npos, e.what());
  }
  CHECK_FALSE(opt.steps_in_backward());
}

/// The gradients of step k with only those of [from, n) kept.
std::vector<torch::Tensor> grads_from(const Named& ps, int k, std::size_t from) {
  std::vector<torch::Tensor> g = grads_for_step(ps, k);
  for (std::size_t i = 0; i < from && i < g.size(); ++i) g[i] = torch::Tensor();
  return g;
}

}  // namespace

TEST_CASE_TEMPLATE("the step inside backward gives the plain step's bits and frees each gradient", Tiers,
                   skewadam::SkewAdamTiers, skewadam::AdamWTiers, skewadam::AdafactorTiers,
                   skewadam::SkewAdam8bitTiers) {
  Named a = leaf_params();
  Named b = leaf_clone(a);
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
    check_same(a, plain, b, inside);
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

TEST_CASE("clipping by the previous step's norm steps inside backward with the plain step's bits, and resumes") {
  Named a = leaf_params();
  Named b = leaf_clone(a);
  skewadam::libtorch::Options o = test_options();
  o.max_grad_norm = 1e-3;  // bites on every step after the first
  o.clip_norm = skewadam::ClipNorm::previous;
  skewadam::libtorch::SkewAdam plain(a, o);
  auto inside = std::make_unique<skewadam::libtorch::SkewAdam>(b, o);
  CHECK(inside->clip_norm() == skewadam::ClipNorm::previous);
  inside->step_in_backward();  // accepted
  auto step_both = [&](skewadam::libtorch::SkewAdam& in, int k) {
    const std::vector<torch::Tensor> g = grads_for_step(a, k);
    set_grads(a, g);
    plain.step();
    loss_with_grads(b, g).backward();
    in.step();
    // the first step, with no norm before it, only measures it (docs/spec.md E8)
    CHECK(in.last_step().applied == (k > 1));
    CHECK(in.last_step().measured == (k == 1));
  };
  for (int k = 1; k <= 3; ++k) step_both(*inside, k);
  check_same(a, plain, b, *inside);
  // through torch's archive: the norm the next step clips by comes back
  torch::serialize::OutputArchive out;
  inside->save(out);
  std::stringstream bytes;
  out.save_to(bytes);
  inside.reset();
  skewadam::libtorch::SkewAdam resumed(b, o);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  resumed.load(in);
  resumed.step_in_backward();
  for (int k = 4; k <= 5; ++k) step_both(resumed, k);
  check_same(a, plain, b, resumed);
  // and the clip changed the steps
  Named c = leaf_clone(leaf_params());
  skewadam::libtorch::SkewAdam unclipped(c, test_options());
  for (int k = 1; k <= 5; ++k) {
    set_grads(c, grads_for_step(c, k));
    unclipped.step();
  }
  CHECK_FALSE(same_bits(c[0].second.detach(), a[0].second.detach()));
}

TEST_CASE("the step inside backward refuses global-norm clipping, and its hooks go with the optimizer") {
  Named b = leaf_params();
  const std::vector<torch::Tensor> g = grads_for_step(b, 1);
  {
    skewadam::libtorch::Options o = test_options();
    o.max_grad_norm = 1.0;
    skewadam::libtorch::SkewAdam opt(b, o);
    refused_up_front(opt, {"max_grad_norm"});
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
  Named frozen = make_params();  // requires no gradient: left alone
  skewadam::libtorch::SkewAdam opt(frozen, test_options());
  opt.step_in_backward();
  CHECK(opt.steps_in_backward());
}

TEST_CASE("the step inside backward: a frozen parameter is left alone, as torch's optimizers leave it") {
  Named a = leaf_params();
  Named b = leaf_clone(a);
  a[1].second.requires_grad_(false);
  b[1].second.requires_grad_(false);
  skewadam::libtorch::SkewAdam plain(a, test_options());
  skewadam::libtorch::SkewAdam inside(b, test_options());
  inside.step_in_backward();
  for (int k = 1; k <= 2; ++k) {
    std::vector<torch::Tensor> g = grads_for_step(a, k);
    g[1] = torch::Tensor();
    set_grads(a, g);
    plain.step();
    loss_with_grads(b, g).backward();
    inside.step();
    check_same(a, plain, b, inside);
  }
  CHECK(inside.param_state(b[1].first).step == 0);
}

TEST_CASE("the step inside backward: a backward that raises part way leaves a step that ends, and training goes on") {
  // backward completes the gradients of [cut, n), then raises. What it
  // stepped stays stepped (the plain run: a step of those gradients alone);
  // zero_grad(), step() or the next backward's first hook ends the step,
  // reported as cut short; the next steps are the plain step's
  for (const char* ends_it : {"zero_grad", "step", "next backward"}) {
    CAPTURE(ends_it);
    Named a = leaf_params();
    Named b = leaf_clone(a);
    skewadam::libtorch::SkewAdam plain(a, test_options());
    skewadam::libtorch::SkewAdam inside(b, test_options());
    inside.step_in_backward();
    const std::size_t n = b.size(), cut = n / 2;
    set_grads(a, grads_for_step(a, 1));
    plain.step();
    loss_with_grads(b, grads_for_step(b, 1)).backward();
    inside.step();

    set_grads(a, grads_from(a, 2, cut));
    plain.step();
    try {
      loss_raising_after(b, grads_for_step(b, 2), cut).backward();
      FAIL("backward did not raise");
    } catch (const c10::OutOfMemoryError& e) {
      CHECK(std::string(e.what()).find("out of memory") != std::string::npos);
    }
    CHECK(inside.engine_core().step_open());
    for (std::size_t i = cut; i < n; ++i) CHECK_MESSAGE(!b[i].second.grad().defined(), b[i].first);
    const std::string first_left = b[0].first;
    try {  // state cannot be saved mid-step; the message says how to end it
      (void)inside.export_state();
      FAIL("export_state() of an open step");
    } catch (const std::logic_error& e) {
      CHECK(std::string(e.what()).find("raised part way; zero_grad() or step() ends it") != std::string::npos);
    }
    if (std::string(ends_it) == "zero_grad") {
      inside.zero_grad();
    } else if (std::string(ends_it) == "step") {
      inside.step();  // ends the cut-short step, and steps nothing more
    }
    if (std::string(ends_it) != "next backward") {
      CHECK_FALSE(inside.engine_core().step_open());
      const skewadam::StepReport& r = inside.last_step();
      CHECK(r.interrupted);
      CHECK(r.stepped == static_cast<skewadam::index_t>(n - cut));
      REQUIRE(r.not_stepped.size() == cut);
      CHECK(r.not_stepped.front() == first_left);
      check_same(a, plain, b, inside);
    }
    for (auto& [name, t] : b) t.mutable_grad() = torch::Tensor();
    for (int k = 3; k <= 4; ++k) {
      CAPTURE(k);
      set_grads(a, grads_for_step(a, k));
      plain.step();
      loss_with_grads(b, grads_for_step(b, k)).backward();
      inside.step();
      CHECK(inside.last_step().applied);
      CHECK_FALSE(inside.last_step().interrupted);
      check_same(a, plain, b, inside);
    }
  }
}

TEST_CASE("the step inside backward under nonfinite raise: the hook raises out of backward, and training goes on") {
  Named a = leaf_params();
  Named b = leaf_clone(a);
  skewadam::libtorch::Options o = test_options();
  o.nonfinite = skewadam::NonFinitePolicy::raise;
  skewadam::libtorch::SkewAdam plain(a, o);
  skewadam::libtorch::SkewAdam inside(b, o);
  inside.step_in_backward();
  std::vector<torch::Tensor> g = grads_for_step(b, 1);
  g[0] = g[0].clone();
  g[0].view({-1})[0] = std::numeric_limits<float>::quiet_NaN();
  try {
    loss_with_grads(b, g).backward();
    FAIL("backward did not raise");
  } catch (const skewadam::NonFiniteGradientError& e) {
    CHECK(e.report().name == b[0].first);
  }
  CHECK(!b[0].second.grad().defined());  // consumed, as every gradient a hook takes
  inside.zero_grad();
  CHECK(inside.last_step().interrupted);
  // what backward reached before the offending gradient is stepped: the plain
  // run's step of those gradients alone
  std::vector<torch::Tensor> reached = grads_for_step(a, 1);
  reached[0] = torch::Tensor();
  set_grads(a, reached);
  plain.step();
  check_same(a, plain, b, inside);
  for (int k = 2; k <= 3; ++k) {
    set_grads(a, grads_for_step(a, k));
    plain.step();
    loss_with_grads(b, grads_for_step(b, k)).backward();
    inside.step();  // no gradient left over keeps raising
    check_same(a, plain, b, inside);
  }
  CHECK(inside.steps() == 3);
}

TEST_CASE("the step inside backward refuses a second backward before step(), before it changes anything") {
  Named a = leaf_params();
  Named b = leaf_clone(a);
  skewadam::libtorch::SkewAdam plain(a, test_options());
  skewadam::libtorch::SkewAdam inside(b, test_options());
  inside.step_in_backward();
  // the second parameter has no gradient in the first backward, so only a
  // refusal at the second backward's first hook keeps it out of the step
  std::vector<torch::Tensor> first = grads_for_step(b, 1);
  first[1] = torch::Tensor();
  loss_with_grads(b, first).backward();
  const Named after_first = clone(b);
  try {
    loss_with_grads(b, grads_for_step(b, 2)).backward();
    FAIL("a second backward before step() was accepted");
  } catch (const std::exception& e) {
    const std::string m = e.what();
    CHECK(m.find("second backward") != std::string::npos);
    CHECK(m.find("accumulated") != std::string::npos);
    CHECK(m.find("step()") != std::string::npos);
  }
  for (std::size_t i = 0; i < b.size(); ++i) CHECK(same_bits(b[i].second.detach(), after_first[i].second));
  inside.zero_grad();  // the second backward's gradients are dropped; the first's step ends
  set_grads(a, first);
  plain.step();
  CHECK_FALSE(inside.last_step().interrupted);
  CHECK(inside.last_step().not_stepped == std::vector<std::string>{b[1].first});
  check_same(a, plain, b, inside);
}

TEST_CASE("the step inside backward: two optimizers never both step a parameter") {
  Named b = leaf_params();
  auto first = std::make_unique<skewadam::libtorch::SkewAdam>(b, test_options());
  first->step_in_backward();
  skewadam::libtorch::SkewAdam second(b, test_options());
  refused_up_front(second, {"another optimizer"});
  first.reset();  // its hooks go with it
  second.step_in_backward();
  loss_with_grads(b, grads_for_step(b, 1)).backward();
  second.step();
  CHECK(second.steps() == 1);
}

TEST_CASE("the step inside backward refuses parameters whose gradients DDP reduces after backward") {
  // DistributedDataParallel's reducer hooks each parameter's gradient
  // accumulator (a LambdaPostHook) and averages the gradient after backward
  // completed it: a step inside backward would step the local gradient
  Named b = leaf_params();
  std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(b[3].second);
  acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
      [](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) { return outputs; }));
  skewadam::libtorch::SkewAdam opt(b, test_options());
  refused_up_front(opt, {"parameter '" + b[3].first + "'", "DistributedDataParallel"});
}
