// The CUDA optimizer's tests (built with SKEWADAM_WITH_CUDA): every golden
// case on the GPU, parity with the CPU backend, stochastic rounding bit for
// bit, determinism, a step captured in a CUDA graph, bad input.
//
// Without a CUDA device the program prints why and exits 77, which ctest
// reports as skipped (SKIP_RETURN_CODE). This file is compiled by the C++
// compiler with -ffp-contract=off, as the CUDA code is compiled without
// contraction (-fmad=false): the per-element math then rounds the same way on
// both sides, which the bf16 parity test relies on.

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <skewadam/skewadam.hpp>
#include <skewadam_tools/cuda_golden.hpp>
#include <skewadam_tools/cuda_runner.hpp>
#include <skewadam_tools/golden_case.hpp>

#include "../support/cuda_run_reference.hpp"
#include "../support/golden_dirs.hpp"

namespace {

namespace fs = std::filesystem;
namespace gpu = skewadam::tools::cuda;
using skewadam::test::Rng;
using skewadam::test::rule_name;
using skewadam::test::run_cpu;
using skewadam::bf16;
using skewadam::Dtype;
using skewadam::index_t;

using skewadam::test::golden_cases;
using skewadam::test::golden_dir;

const std::vector<std::vector<std::int64_t>> parity_shapes = {{3, 70, 129}, {300, 257}, {1000}, {1, 1}, {2, 5, 3, 40}};
const gpu::RuleKind all_rules[] = {gpu::RuleKind::backbone, gpu::RuleKind::experts, gpu::RuleKind::router,
                                   gpu::RuleKind::exact_momentum, gpu::RuleKind::adamw};

}  // namespace

TEST_CASE("golden cases pass on the GPU") {
  const auto cases = golden_cases();
  INFO("golden folder: ", golden_dir().string());
  REQUIRE_MESSAGE(!cases.empty(), "no golden cases found");
  for (const fs::path& dir : cases) {
    const auto c = skewadam::tools::load_golden_case(dir);
    for (bool graph : {false, true}) {
      if (graph && !c.capturable()) continue;  // clipping by the previous step's norm: no captured step (E8)
      CAPTURE(c.name);
      CAPTURE(graph);
      const auto run = skewadam::tools::run_golden_case_cuda(c, graph);
      for (const auto& check : skewadam::tools::check_golden_case(c, run)) {
        CAPTURE(check.array);
        CAPTURE(check.worst);
        CAPTURE(check.detail);
        CHECK(check.problem.empty());
        CHECK(check.ok);
      }
    }
  }
}

TEST_CASE("fp32: the GPU agrees with the CPU backend within the golden tolerance") {
  // rtol of the golden cases; atol scaled to the parameters (|p| < 0.05)
  const double rtol = 2e-5;
  const double atol = 2e-5 * 0.05;
  for (gpu::RuleKind rule : all_rules)
    for (const auto& shape : parity_shapes)
      for (skewadam::ClipScope scope : {skewadam::ClipScope::tensor, skewadam::ClipScope::matrix}) {
        std::int64_t n = 1;
        for (auto d : shape) n *= d;
        const std::int64_t steps = 6;
        Rng rng(static_cast<std::uint64_t>(n) + static_cast<std::uint64_t>(rule));
        std::vector<float> p0(static_cast<std::size_t>(n)), g(static_cast<std::size_t>(n * steps));
        for (auto& x : p0) x = rng.uniform(-0.05f, 0.05f);
        for (auto& x : g) x = rng.uniform(-1e-2f, 1e-2f);
        gpu::RunSpec s;
        s.rule = rule;
        s.name = "w";
        s.shape = shape;
        s.hyper = skewadam::Hyperparameters{.lr = 1e-3, .weight_decay = 0.05, .clip_scope = scope};
        s.lr.assign(steps, 1e-3);
        s.steps = steps;
        s.param0 = p0.data();
        s.grads = g.data();
        CAPTURE(rule_name(rule));
        CAPTURE(skewadam::Shape(shape.begin(), static_cast<index_t>(shape.size())).str());
        CAPTURE(static_cast<int>(scope));
        const auto want = run_cpu<float>(s);
        const auto got = gpu::run(s);
        REQUIRE(got.params.size() == want.params.size());
        std::vector<float> a(want.params.size() / 4), b(a.size());
        std::memcpy(a.data(), got.params.data(), got.params.size());
        std::memcpy(b.data(), want.params.data(), want.params.size());
        double worst = 0;
        for (std::size_t i = 0; i < a.size(); ++i)
          worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])) / (atol + rtol * std::fabs(double(b[i]))));
        CAPTURE(worst);
        CHECK(worst <= 1.0);
        CHECK(got.state.step == want.state.step);
        CHECK(got.state.v_row.size() == want.state.v_row.size());
        CHECK(got.state.m.size() == want.state.m.size());
      }
}

TEST_CASE("bf16 with stochastic rounding: bit-identical to the CPU backend") {
  // Gradients k/64 with |k| <= 31: every sum of their squares is exact in
  // fp32 in any order, and the clip does not bind (threshold 1000), so the
  // fp32 values rounded are the same on both backends, whatever the order of
  // the reductions; the bits then depend only on the shared rounding and
  // random stream.
  for (gpu::RuleKind rule : all_rules)
    for (const auto& shape : parity_shapes) {
      std::int64_t n = 1;
      for (auto d : shape) n *= d;
      const std::int64_t steps = 4;
      Rng rng(static_cast<std::uint64_t>(n) * 7 + static_cast<std::uint64_t>(rule));
      std::vector<bf16> p0(static_cast<std::size_t>(n)), g(static_cast<std::size_t>(n * steps));
      for (auto& x : p0) x = bf16(rng.uniform(-0.05f, 0.05f));
      for (auto& x : g) x = bf16(static_cast<float>(rng.integer(-31, 31)) / 64.0f);
      gpu::RunSpec s;
      s.rule = rule;
      s.name = "blocks.0.w";
      s.shape = shape;
      s.dtype = Dtype::bf16;
      s.hyper = skewadam::Hyperparameters{.lr = 1e-3, .weight_decay = 0.05, .clip_threshold = 1000.0};
      s.lr = {1e-3, 2e-3, 5e-4, 1e-3};
      s.steps = steps;
      s.param0 = p0.data();
      s.grads = g.data();
      CAPTURE(rule_name(rule));
      CAPTURE(skewadam::Shape(shape.begin(), static_cast<index_t>(shape.size())).str());
      const auto want = run_cpu<bf16>(s);
      const auto got = gpu::run(s);
      REQUIRE(got.params.size() == want.params.size());
      std::size_t differ = 0, first = 0;
      for (std::size_t i = got.params.size(); i-- > 0;)
        if (got.params[i] != want.params[i]) {
          ++differ;
          first = i;
        }
      CAPTURE(first / 2);
      CHECK(differ == 0);
      // and the rounding moved parameters: the run is not trivially equal
      CHECK(std::memcmp(want.params.data() + (steps - 1) * n * 2, p0.data(), static_cast<std::size_t>(n) * 2) != 0);
    }
}

TEST_CASE("stochastic rounding: the GPU gives the CPU's bits for the same value and key") {
  Rng rng(99);
  std::vector<float> x;
  for (int i = 0; i < 1 << 20; ++i) {
    const float mag = std::ldexp(rng.uniform(1.0f, 2.0f), rng.integer(-30, 20));
    x.push_back(rng.next() & 1 ? mag : -mag);
  }
  for (float special : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 65504.0f, 65519.0f, 70000.0f, 1e-8f, 3e38f, 6e-5f})
    x.push_back(special);
  const skewadam::RoundingKey key{0x1234567887654321ULL, skewadam::tensor_id("layer.w"), 17};
  for (Dtype d : {Dtype::bf16, Dtype::f16}) {
    CAPTURE(skewadam::dtype_name(d));
    const auto got = gpu::stochastic_round(x, d, key);
    std::size_t differ = 0, first = 0;
    for (std::size_t i = x.size(); i-- > 0;) {
      const std::uint32_t r = skewadam::random_bits(key, static_cast<index_t>(i));
      const std::uint16_t want =
          d == Dtype::bf16 ? skewadam::bits_of(skewadam::StochasticRounding::store<skewadam::bf16>(x[i], r))
                           : skewadam::bits_of(skewadam::StochasticRounding::store<skewadam::f16>(x[i], r));
      // A NaN stays a NaN; its fp16 bits are the converter's (CUDA's gives
      // 0x7fff, x86's keeps the payload), as for any NaN either computes.
      const bool nan = std::isnan(x[i]);
      const bool same = nan && d == Dtype::f16 ? (got[i] & 0x7c00u) == 0x7c00u && (got[i] & 0x03ffu) != 0
                                               : got[i] == want;
      if (!same) {
        ++differ;
        first = i;
      }
    }
    CAPTURE(first);
    CHECK(differ == 0);
  }
}

TEST_CASE("the GPU step is deterministic") {
  const std::vector<std::int64_t> shape = {4, 512, 640};
  const std::int64_t n = 4 * 512 * 640, steps = 3;
  Rng rng(5);
  std::vector<float> p0(static_cast<std::size_t>(n)), g(static_cast<std::size_t>(n * steps));
  for (auto& x : p0) x = rng.uniform(-0.05f, 0.05f);
  for (auto& x : g) x = rng.uniform(-1e-2f, 1e-2f);
  for (gpu::RuleKind rule : all_rules) {
    gpu::RunSpec s;
    s.rule = rule;
    s.shape = shape;
    s.hyper = skewadam::Hyperparameters{.lr = 1e-3, .weight_decay = 0.05};
    s.lr.assign(steps, 1e-3);
    s.steps = steps;
    s.param0 = p0.data();
    s.grads = g.data();
    CAPTURE(rule_name(rule));
    const auto a = gpu::run(s);
    const auto b = gpu::run(s);
    CHECK(a.params == b.params);
    s.graph = true;
    const auto c = gpu::run(s);
    CHECK(a.params == c.params);
  }
}

TEST_CASE("step scalars: the GPU forms the host's bits") {
  // every t in 1..10^6 for the usual betas (beta^t by binary powering in
  // double-double, step_scalars.hpp: no device pow)
  std::vector<std::int64_t> steps(1'000'000);
  for (std::size_t i = 0; i < steps.size(); ++i) steps[i] = static_cast<std::int64_t>(i) + 1;
  steps.push_back(std::int64_t{1} << 40);
  for (double b2 : {0.9, 0.95, 0.98, 0.99, 0.999, 0.9999}) {
    const skewadam::Hyperparameters h{.lr = 3e-4, .beta1 = 0.9, .beta2 = b2, .eps = 1e-8, .weight_decay = 0.05};
    const auto got = gpu::device_step_scalars(h, steps);
    REQUIRE(got.size() == steps.size());
    std::size_t differ = 0, first = 0;
    for (std::size_t i = got.size(); i-- > 0;) {
      const skewadam::StepScalars want = skewadam::make_step_scalars(h, steps[i], 1.0);
      if (std::memcmp(&want, &got[i], sizeof want) != 0) {
        ++differ;
        first = i;
      }
    }
    CAPTURE(b2);
    CAPTURE(first);
    CHECK(differ == 0);
  }
}

TEST_CASE("bad input raises std::invalid_argument naming the argument") {
  const auto messages = gpu::bad_input_messages();
  REQUIRE(messages.size() == 2);
  CHECK(messages[0].find("param of 'w'") != std::string::npos);
  CHECK(messages[0].find("host memory") != std::string::npos);
  CHECK(messages[1].find("grad of 'w'") != std::string::npos);
  CHECK(messages[1].find("dtype") != std::string::npos);
}

int main(int argc, char** argv) {
  doctest::Context ctx;
  ctx.applyCommandLine(argc, argv);
  for (int i = 1; i < argc; ++i)  // listing needs no device
    if (std::strstr(argv[i], "-list-") != nullptr || std::strcmp(argv[i], "-ltc") == 0) return ctx.run();
  const int devices = gpu::device_count();
  if (devices == 0) {
    std::printf("SKIP: no CUDA device (the CUDA tests need an NVIDIA GPU and its driver)\n");
    return 77;
  }
  std::printf("CUDA device: %s\n", gpu::device_description().c_str());
  return ctx.run();
}
