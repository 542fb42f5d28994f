// What only the CUDA kernels themselves show, run on the host
// (cuda_emulation.hpp): the row sums of the statistics pass over very long
// rows, and how the work lists cut a group's matrices (the statistics
// workspace stays bounded however large the model). Everything else of the CUDA backend (golden cases, agreement with the
// CPU backend, resume, non-finite steps, clipping, checkpoints, bad input) is
// the contract suite's, over the CUDA engine (test_contract_cuda_emulated.cpp).

#include <skewadam_tools/emulated_runtime.hpp>

#include <skewadam/engine/backend/cuda/kernels.cuh>
#include <skewadam/engine/backend/cuda/passes.hpp>

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

#include <skewadam/skewadam.hpp>

namespace {

namespace cu = skewadam::backend::cuda;
using skewadam::backend::WorkUnit;
using skewadam::index_t;

/// A factored piece of geometry g as the CUDA backend describes it to the
/// work lists: the most row blocks of its shape.
cu::DeviceTask factored_piece(const skewadam::MatrixGeometry& g) {
  cu::DeviceTask d;
  d.geom = g;
  d.row_blocks = cu::row_blocks_of(g);
  return d;
}

/// One factored tensor's statistics pass through the kernel, host memory
/// standing in for the device's; its row blocks planned as the engines plan
/// a group of it alone (passes.hpp).
template <class Rule>
struct FactoredStatistics {
  std::vector<float> m, v_row, v_col, scratch_f;
  std::vector<double> scratch_d;
  cu::DeviceArray<emu::Runtime, double> workspace;  // aligned as cudaMalloc's (the quad walks load quads of it)
  std::vector<unsigned> done;
  cu::DeviceTask task{};
  cu::TaskStep step{};
  std::vector<WorkUnit> units;

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
    cu::GroupLists lists;
    lists.factored = true;
    lists.add(0, task, false);
    (void)lists.concatenated();
    units = lists.units;
    workspace = cu::DeviceArray<emu::Runtime, double>(lists.workspace_doubles());
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
                [&] { cu::statistics_kernel<Rule, float, float>(t, st, units.data(), workspace.data()); });
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

TEST_CASE("CUDA work lists: a group's statistics workspace is bounded by statistics_blocks, not by the model") {
  // the paper's experts: 384 matrices of 4096 x 4096 (separate tensors).
  // Scratch per row block of the finest cut was numel / 2 bytes, 3.2 GB
  const skewadam::MatrixGeometry g{1, 4096, 4096};
  cu::GroupLists lists;
  lists.factored = true;
  for (std::int32_t k = 0; k < 384; ++k) lists.add(k, factored_piece(g), false);
  const std::size_t ws = lists.workspace_doubles() * sizeof(double);
  const std::size_t bound = (cu::statistics_blocks + 384) * 2 * 4096 * sizeof(double);
  CHECK(ws <= bound);
  CHECK(ws < std::size_t{384} * 4096 * 4096 / 2 / 20);
  CHECK(lists.units.size() <= static_cast<std::size_t>(cu::statistics_blocks + 384));
  CHECK(lists.units.size() >= static_cast<std::size_t>(cu::statistics_blocks));
  // every matrix's rows covered by its row blocks, in order, each with its own partials
  std::vector<index_t> next(384, 0);
  std::vector<index_t> blocks(384, 0);
  for (const WorkUnit& it : lists.units) {
    CHECK(it.begin == next[static_cast<std::size_t>(it.task)]);
    next[static_cast<std::size_t>(it.task)] = it.end;
    CHECK(it.block == blocks[static_cast<std::size_t>(it.task)]++);
    CHECK(it.scratch % 4 == 0);
  }
  for (index_t r : next) CHECK(r == 4096);
  for (const WorkUnit& it : lists.columns) CHECK(it.block == blocks[static_cast<std::size_t>(it.task)]);
  MESSAGE("384 x 4096^2: ", lists.units.size(), " row blocks, workspace ", static_cast<double>(ws) / 1e6, " MB");

  // a matrix alone keeps the finest cut
  cu::GroupLists one;
  one.factored = true;
  one.add(0, factored_piece(g), false);
  (void)one.concatenated();
  CHECK(one.units.size() == static_cast<std::size_t>(cu::row_blocks_of(g)));
}

TEST_CASE("CUDA work lists: a sharded rank cuts a matrix it owns whole as one process does") {
  const std::vector<skewadam::MatrixGeometry> model = {{1, 4096, 1024}, {8, 2048, 2048}, {1, 512, 4096}, {3, 100, 300}};
  cu::GroupLists local;
  local.factored = true;
  for (std::size_t k = 0; k < model.size(); ++k)
    local.add(static_cast<std::int32_t>(k), factored_piece(model[k]), false);
  (void)local.concatenated();
  // rank: owns only the bank's third expert (one matrix) and all of the last tensor
  cu::GroupLists rank;
  rank.factored = true;
  for (const auto& g : model) rank.count(g);
  const skewadam::MatrixGeometry expert{1, 2048, 2048};
  rank.add(10, factored_piece(expert), false);
  rank.add(11, factored_piece(model[3]), false);
  (void)rank.concatenated();
  auto rows_of = [](const cu::GroupLists& l, std::int32_t task, index_t matrix) {
    std::vector<std::pair<index_t, index_t>> out;
    for (const WorkUnit& it : l.units)
      if (it.task == task && it.matrix == matrix) out.emplace_back(it.begin, it.end);
    return out;
  };
  CHECK(rows_of(rank, 10, 0) == rows_of(local, 1, 2));
  for (index_t b = 0; b < 3; ++b) CHECK(rows_of(rank, 11, b) == rows_of(local, 3, b));
  CHECK(rows_of(local, 1, 2).size() > 1);
}

TEST_CASE("CUDA engine, emulated: device_bytes() counts the state, the scratch and the shared workspace") {
  using Opt = skewadam::Optimizer<skewadam::SkewAdamTiers, skewadam::tools::EmulatedCuda>;
  Opt opt(skewadam::Hyperparameters{});
  const skewadam::Shape shape{256, 2048};
  std::vector<std::vector<float>> bufs;
  for (int k = 0; k < 16; ++k) {
    bufs.emplace_back(static_cast<std::size_t>(shape.numel()), 0.01f);
    opt.add("e" + std::to_string(k), skewadam::Tier::experts, skewadam::TensorView<float>(bufs.back().data(), shape));
  }
  // the lists the engine plans for its one group
  cu::GroupLists lists;
  lists.factored = true;
  for (std::int32_t k = 0; k < 16; ++k) lists.add(k, factored_piece(shape.matrices()), false);
  const auto workspace = static_cast<index_t>(lists.workspace_doubles() * sizeof(double));
  const index_t own_scratch = 16 * (2048 * (4 + 16) + 2 * 4 + 8 + 2 * 4);  // per tensor: O(c)
  const index_t extra = opt.device_bytes() - opt.state_bytes();
  CHECK(opt.state_bytes() == 16 * (256 + 2048) * 4);
  CHECK(extra >= workspace + own_scratch);
  CHECK(extra <= workspace + own_scratch + (index_t{1} << 20));  // + the step's tables
  MESSAGE("16 x 256 x 2048: state ", opt.state_bytes(), " B, device ", opt.device_bytes(), " B");
}
