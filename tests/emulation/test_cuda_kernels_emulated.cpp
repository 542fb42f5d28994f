// What only the CUDA kernels themselves show, run on the host
// (cuda_emulation.hpp): the row sums of the statistics pass over very long
// rows. Everything else of the CUDA backend (golden cases, agreement with the
// CPU backend, resume, non-finite steps, clipping, checkpoints, bad input) is
// the contract suite's, over the CUDA engine (test_contract_cuda_emulated.cpp).

#include <skewadam_tools/cuda_emulation.hpp>

#include <skewadam/backend/cuda/kernels.cuh>

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

#include <skewadam/skewadam.hpp>

namespace {

namespace cu = skewadam::backend::cuda;
using skewadam::index_t;

/// One factored tensor's statistics pass through the kernel, host memory
/// standing in for the device's.
template <class Rule>
struct FactoredStatistics {
  std::vector<float> m, v_row, v_col, scratch_f;
  std::vector<double> scratch_d;
  std::vector<unsigned> done;
  cu::DeviceTask task{};
  cu::TaskStep step{};
  std::vector<cu::WorkItem> units;

  FactoredStatistics(float* param, const skewadam::Shape& shape, std::string_view name) {
    const skewadam::MatrixGeometry g = shape.matrices();
    const auto B = static_cast<std::size_t>(g.batch), r = static_cast<std::size_t>(g.rows),
               c = static_cast<std::size_t>(g.cols);
    task.param = param;
    task.geom = g;
    task.id = skewadam::tensor_id(name);
    if (Rule::momentum::has_state) m.assign(static_cast<std::size_t>(shape.numel()), 0.0f);
    task.m = m.empty() ? nullptr : m.data();
    task.row_blocks = cu::row_blocks_of(g);
    v_row.assign(B * r, 0.0f);
    v_col.assign(B * c, 0.0f);
    task.v_row = v_row.data();
    task.v_col = v_col.data();
    const cu::ScratchSizes sz = cu::scratch_sizes(task, true);
    scratch_f.assign(sz.floats, 0.0f);
    scratch_d.assign(sz.doubles, 0.0);
    done.assign(sz.counters, 0u);
    cu::place_scratch(task, true, scratch_f.data(), scratch_d.data(), done.data());
    for (index_t b = 0; b < g.batch; ++b)
      for (index_t q = 0; q < task.row_blocks; ++q)
        units.push_back({0, b, g.rows * q / task.row_blocks, g.rows * (q + 1) / task.row_blocks, q});
  }

  /// The statistics pass of step 1 with gradient `grad`.
  void run(const float* grad, const skewadam::Hyperparameters& h) {
    task.grad = grad;
    step.s = skewadam::make_step_scalars(h, 1, 1.0);
    step.key = skewadam::RoundingKey{0x5eed5eedULL, task.id, 1};
    step.scope = h.clip_scope;
    const cu::DeviceTask* t = &task;
    const cu::TaskStep* st = &step;
    emu::launch(static_cast<unsigned>(units.size()), cu::block_threads,
                [&] { cu::statistics_kernel<Rule, float, float>(t, st, units.data()); });
  }
};

}  // namespace

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
    FactoredStatistics<Rule> e(p.data(), shape, "w");
    e.run(g.data(), h);
    const double want = (1.0 - h.beta2) * sum / static_cast<double>(cols);
    CHECK(std::abs(static_cast<double>(e.v_row[0]) - want) / want < 5e-6);
  }
}
