// The CUDA backend's kernels (backend/cuda/kernels.cuh) run on host threads
// (cuda_emulation.hpp): golden cases and agreement with the CPU backend, on a
// machine without a GPU. The launch sequence and the work lists below follow
// backend/cuda/optimizer.cuh for one tensor (the optimizer itself needs the
// CUDA runtime); the GPU itself is tested by tests/cuda/test_cuda.cpp.
//
// Slow (a block is 512 OS threads meeting at barriers: minutes on 2 cores),
// so built and registered only with -DSKEWADAM_CUDA_EMULATION_TESTS=ON.

#include "cuda_emulation.hpp"

#include <skewadam/backend/cuda/kernels.cuh>

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <skewadam/skewadam.hpp>
#include <skewadam_tools/golden_case.hpp>

#include "../support/golden_dirs.hpp"

namespace {

namespace fs = std::filesystem;
namespace cu = skewadam::backend::cuda;
using skewadam::index_t;

/// One tensor's steps through the kernels, host memory standing in for the
/// device's.
template <class Rule>
struct EmulatedTensor {
  using S = typename Rule::second_moment;
  using C = typename Rule::clip;
  std::vector<float> m, v, v_row, v_col, scratch_f;
  std::vector<double> scratch_d;
  std::vector<unsigned> done;
  cu::DeviceTask task{};
  cu::TaskStep step{};
  std::int64_t count = 0;
  std::vector<cu::WorkItem> units, columns, applies;
  skewadam::Hyperparameters hyper;

  EmulatedTensor(float* param, const skewadam::Shape& shape, const skewadam::Hyperparameters& h,
                 std::string_view name)
      : hyper(h) {
    const skewadam::MatrixGeometry g = shape.matrices();
    const auto n = static_cast<std::size_t>(shape.numel());
    const auto B = static_cast<std::size_t>(g.batch), r = static_cast<std::size_t>(g.rows),
               c = static_cast<std::size_t>(g.cols);
    task.param = param;
    task.geom = g;
    task.id = skewadam::tensor_id(name);
    if (Rule::momentum::has_state) m.assign(n, 0.0f);
    task.m = m.empty() ? nullptr : m.data();
    if constexpr (S::factored) {
      task.row_blocks = cu::row_blocks_of(g);
      const auto nb = static_cast<std::size_t>(task.row_blocks);
      v_row.assign(B * r, 0.0f);
      v_col.assign(B * c, 0.0f);
      scratch_f.assign(B * nb * c * 2 + B * c + 2 * B, 0.0f);
      scratch_d.assign(2 * B * c + B, 0.0);
      done.assign(B + 1, 0u);
      task.v_row = v_row.data();
      task.v_col = v_col.data();
      task.col_partial = scratch_f.data();
      task.d_partial = task.col_partial + B * nb * c;
      task.inv_col = task.d_partial + B * nb * c;
      task.vbar = task.inv_col + B * c;
      task.divisor = task.vbar + B;
      task.col_term = scratch_d.data();
      task.matrix_sum = task.col_term + 2 * B * c;
      task.done = done.data();
      for (index_t b = 0; b < g.batch; ++b) {
        for (index_t q = 0; q < task.row_blocks; ++q)
          units.push_back({0, b, g.rows * q / task.row_blocks, g.rows * (q + 1) / task.row_blocks, q});
        const index_t na = cu::apply_blocks_of(g);
        for (index_t q = 0; q < na; ++q) applies.push_back({0, b, g.rows * q / na, g.rows * (q + 1) / na, q});
        for (index_t j = 0; j < g.cols; j += cu::column_block)
          columns.push_back({0, b, j, std::min(g.cols, j + cu::column_block), 0});
      }
    } else {
      task.chunks = cu::chunks_of(g);
      v.assign(n, 0.0f);
      task.v = v.data();
      scratch_f.assign(2 * B, 0.0f);
      task.divisor = scratch_f.data();
      scratch_d.assign(B * static_cast<std::size_t>(task.chunks) + B, 0.0);
      task.chunk_sum = scratch_d.data();
      task.matrix_sum = task.chunk_sum + B * static_cast<std::size_t>(task.chunks);
      for (index_t b = 0; b < g.batch; ++b)
        for (index_t q = 0; q < task.chunks; ++q)
          units.push_back({0, b, q * cu::chunk_elems, std::min(g.matrix_size(), (q + 1) * cu::chunk_elems),
                           b * task.chunks + q});
    }
  }

  /// The step scalars and the statistics pass of a step with gradient
  /// `grad` (the first launches of launch_group).
  void statistics(const float* grad, double lr) {
    task.grad = grad;
    cu::TierHyper th{{hyper, hyper, hyper}};
    for (auto& h : th.h) h.lr = lr;
    const cu::DeviceTask* t = &task;
    cu::TaskStep* st = &step;
    emu::launch(1, 128, [&] { cu::prepare_kernel<>(t, st, &count, 1, th, nullptr, 0x5eed5eedULL, 1.0); });
    emu::launch(static_cast<unsigned>(units.size()), cu::block_threads,
                [&] { cu::statistics_kernel<Rule, float, float>(t, st, units.data()); });
  }

  /// One step with gradient `grad` (as launch_group does).
  void run(const float* grad, double lr) {
    statistics(grad, lr);
    const cu::DeviceTask* t = &task;
    cu::TaskStep* st = &step;
    const std::int32_t group[1] = {0};
    auto blocks = [&](const std::vector<cu::WorkItem>& items, auto kernel) {
      emu::launch(static_cast<unsigned>(items.size()), cu::block_threads, [&] { kernel(t, st, items.data()); });
    };
    if constexpr (S::factored)
      blocks(columns, [](auto... a) { cu::columns_kernel<Rule, float, float>(a...); });
    else if constexpr (C::active)
      emu::launch(1, 128, [&] { cu::finalize_kernel<Rule, float, float>(t, st, group, 1); });
    auto apply = [&](const std::vector<cu::WorkItem>& items) {
      emu::launch(static_cast<unsigned>(items.size()), cu::apply_threads,
                  [&] { cu::apply_kernel<Rule, float, float>(t, st, items.data()); });
    };
    if constexpr (S::factored) apply(applies);
    else if constexpr (C::active) apply(units);
  }
};

}  // namespace

TEST_CASE("CUDA kernels, emulated on host threads: every golden case") {
  const std::vector<fs::path> cases = skewadam::test::golden_cases();
  REQUIRE_MESSAGE(!cases.empty(), "no golden cases found");
  for (const fs::path& dir : cases) {
    const auto c = skewadam::tools::load_golden_case(dir);
    CAPTURE(c.name);
    skewadam::tools::with_case_rule(c, [&]<class Rule>() {
      const skewadam::Shape shape(c.shape.begin(), static_cast<index_t>(c.shape.size()), "case shape");
      std::vector<float> p = c.param0.data;
      const index_t n = shape.numel();
      skewadam::tools::CaseRun run;
      run.params.resize(static_cast<std::size_t>(c.steps * n));
      auto go = [&]<class R>() {
        EmulatedTensor<R> e(p.data(), shape, c.hyper, c.name.empty() ? "param" : c.name);
        for (std::int64_t t = 0; t < c.steps; ++t) {
          e.run(c.grads.data.data() + t * n, c.lr_schedule[static_cast<std::size_t>(t)]);
          std::copy(p.begin(), p.end(), run.params.begin() + t * n);
        }
        if (!e.m.empty()) run.state["exp_avg"] = e.m;
        if (!e.v.empty()) run.state["v"] = e.v;
        if (!e.v_row.empty()) run.state["v_row"] = e.v_row;
        if (!e.v_col.empty()) run.state["v_col"] = e.v_col;
      };
      if (shape.rank() < 2) go.template operator()<typename Rule::rank1_rule>();
      else go.template operator()<Rule>();
      for (const auto& check : skewadam::tools::check_golden_case(c, run)) {
        CAPTURE(check.array);
        CAPTURE(check.worst);
        CHECK(check.problem.empty());
        CHECK(check.ok);
      }
    });
  }
}

TEST_CASE_TEMPLATE("CUDA kernels, emulated on host threads: agree with the CPU backend", Rule, skewadam::BackboneRule,
                   skewadam::ExpertRule, skewadam::RouterRule, skewadam::AdamWRule) {
  // several row blocks, a bank, column blocks with a remainder, floored rows
  // (zero gradient rows), matrix and tensor clip scopes; rows of a multiple
  // of 4 elements (walked in quads) and not
  const std::vector<std::vector<index_t>> shapes = {{300, 257}, {300, 256}, {3, 20, 70}, {3, 20, 72}, {1000}};
  for (const auto& dims : shapes)
    for (skewadam::ClipScope scope : {skewadam::ClipScope::tensor, skewadam::ClipScope::matrix}) {
      const skewadam::Shape shape(dims.begin(), static_cast<index_t>(dims.size()));
      const index_t n = shape.numel();
      const int steps = 3;
      std::vector<float> p0(static_cast<std::size_t>(n)), g(static_cast<std::size_t>(n * steps));
      std::uint64_t s = static_cast<std::uint64_t>(n) * 0x9E3779B97F4A7C15ULL + 1;
      auto next = [&] {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        return static_cast<float>(s >> 40) * 0x1p-24f - 0.5f;
      };
      for (auto& x : p0) x = 0.1f * next();
      for (auto& x : g) x = 0.02f * next();
      const index_t cols = shape.matrices().cols;
      for (int t = 0; t < steps; ++t)  // rows 2 and 5 of every matrix never see a gradient
        for (index_t i = 0; i < n; ++i)
          if (shape.rank() >= 2 && ((i / cols) % shape.matrices().rows == 2 || (i / cols) % shape.matrices().rows == 5))
            g[static_cast<std::size_t>(t * n + i)] = 0.0f;
      const skewadam::Hyperparameters h{.lr = 1e-3, .weight_decay = 0.05, .clip_scope = scope};

      skewadam::Optimizer<skewadam::TierRules<Rule, Rule, Rule>> opt(
          h, skewadam::OptimizerOptions{.threads = 1, .nonfinite = skewadam::NonFinitePolicy::unchecked});
      std::vector<float> pc = p0, pe = p0;
      const auto id = opt.add("w", skewadam::Tier::backbone, skewadam::TensorView<float>(pc.data(), shape));
      auto go = [&]<class R>() {
        EmulatedTensor<R> e(pe.data(), shape, h, "w");
        for (int t = 0; t < steps; ++t) {
          opt.set_grad(id, skewadam::TensorView<const float>(g.data() + t * n, shape));
          opt.step();
          e.run(g.data() + t * n, 1e-3);
        }
        CHECK(e.count == steps);
      };
      if (shape.rank() < 2) go.template operator()<typename Rule::rank1_rule>();
      else go.template operator()<Rule>();
      double worst = 0;
      for (std::size_t i = 0; i < pc.size(); ++i)
        worst = std::max(worst, std::fabs(double(pe[i]) - double(pc[i])) / (1e-6 + 2e-5 * std::fabs(double(pc[i]))));
      CAPTURE(shape.str());
      CAPTURE(static_cast<int>(scope));
      CHECK(worst <= 1.0);
    }
}

TEST_CASE_TEMPLATE("CUDA kernels, emulated on host threads: row sums of very long rows stay accurate", Rule,
                   skewadam::BackboneRule, skewadam::ExpertRule) {
  // 20,000 terms per thread of a 512-thread block: each thread's fp32 terms
  // are folded into doubles every sum_block terms (the file comment of
  // kernels.cuh states the bound, 86 fp32 units); a single fp32 sum per
  // thread was 9.2e-6 off here. Quads and the element walk.
  for (const index_t cols : {index_t{10240000}, index_t{10240001}}) {
    CAPTURE(cols);
    const skewadam::Shape shape({1, cols});
    std::vector<float> p(static_cast<std::size_t>(cols), 0.5f), g(static_cast<std::size_t>(cols));
    double sum = 0;
    for (index_t j = 0; j < cols; ++j) {
      const float x = 0.1f * (1.0f + 0.001f * static_cast<float>((j * 13) % 17));
      g[static_cast<std::size_t>(j)] = x;
      sum += static_cast<double>(x) * static_cast<double>(x);
    }
    const skewadam::Hyperparameters h{};
    EmulatedTensor<Rule> e(p.data(), shape, h, "w");
    e.statistics(g.data(), 1e-3);
    const double want = (1.0 - h.beta2) * sum / static_cast<double>(cols);
    CHECK(std::abs(static_cast<double>(e.v_row[0]) - want) / want < 5e-6);
  }
}
