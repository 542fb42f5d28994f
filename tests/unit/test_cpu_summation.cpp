// The CPU kernels' sums are blocked (engine/backend/cpu/summation.hpp): their error
// must not grow with the length of a row, a column or a chunk, on any
// architecture. Checked on the summation primitive itself and on the
// factored statistics of very long rows and very tall columns, against
// double-precision oracles, for every compiled architecture.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include <skewadam/engine/backend/cpu/summation.hpp>
#include <skewadam/skewadam.hpp>

#include "cpu_archs.hpp"

namespace test_cpu_summation {

namespace {

using namespace skewadam;

/// The bound stated in summation.hpp: 65 fp32 units of the sum.
constexpr double sum_bound = 65.0 * 0x1p-24;

/// A gradient whose squares are all close to 0.01: terms of one magnitude
/// make the rounding errors of a long fp32 sum add up instead of cancelling.
float grad_value(index_t i, index_t j) {
  return 0.1f * (1.0f + 0.001f * static_cast<float>((i * 7 + j * 13) % 17));
}

/// Worst relative errors of R_i and of C_j.
struct Errors {
  double r = 0, c = 0;
};

/// One step of the expert rule (factored, no momentum) on a [rows, cols]
/// fp32 matrix; the worst relative errors of R_i and C_j against the rule in
/// double.
template <class Arch>
Errors statistics_error(index_t rows, index_t cols, int threads) {
  const index_t n = rows * cols;
  std::vector<float> p(static_cast<std::size_t>(n), 0.5f), g(static_cast<std::size_t>(n));
  std::vector<double> row_sum(static_cast<std::size_t>(rows), 0.0), col_sum(static_cast<std::size_t>(cols), 0.0);
  for (index_t i = 0; i < rows; ++i)
    for (index_t j = 0; j < cols; ++j) {
      const float x = grad_value(i, j);
      g[static_cast<std::size_t>(i * cols + j)] = x;
      const double x2 = static_cast<double>(x) * static_cast<double>(x);
      row_sum[static_cast<std::size_t>(i)] += x2;
      col_sum[static_cast<std::size_t>(j)] += x2;
    }
  const Hyperparameters h{};
  Optimizer<SkewAdamTiers, backend::CpuBackend<Arch>> opt(h, OptimizerOptions{.threads = threads});
  const ParamId id = opt.add("moe.experts.w", Tier::experts, TensorView<float>(p.data(), {rows, cols}),
                             TensorView<const float>(g.data(), {rows, cols}));
  opt.step();
  REQUIRE(opt.last_step().applied);
  const ParamStateView s = opt.state(id);
  const double one_minus_beta2 = 1.0 - h.beta2;
  double worst_r = 0, worst_c = 0;
  for (index_t i = 0; i < rows; ++i) {
    const double want = one_minus_beta2 * row_sum[static_cast<std::size_t>(i)] / static_cast<double>(cols);
    worst_r = std::max(worst_r, std::abs(s.v_row[static_cast<std::size_t>(i)] - want) / want);
  }
  for (index_t j = 0; j < cols; ++j) {
    const double want = one_minus_beta2 * col_sum[static_cast<std::size_t>(j)] / static_cast<double>(rows);
    worst_c = std::max(worst_c, std::abs(s.v_col[static_cast<std::size_t>(j)] - want) / want);
  }
  return Errors{worst_r, worst_c};
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("a blocked sum's error does not grow with its length", Arch, blocked_sum_every_arch) {
  using V = backend::cpu::vec_t<Arch>;
  CAPTURE(Arch::name());
  for (const index_t n : {index_t{1000}, index_t{1} << 16, index_t{1} << 22, (index_t{1} << 22) + 7}) {
    CAPTURE(n);
    backend::cpu::BlockedSum<V> acc;
    const float x = 0.1f;
    backend::cpu::for_blocks<V>(0, n, [&]<class W>(index_t) { acc.add(vmath::splat<W>(x)); }, [&] { acc.fold(); });
    const double want = static_cast<double>(n) * static_cast<double>(x);
    CHECK(std::abs(acc.sum() - want) <= sum_bound * want);
  }
}
TEST_CASE_TEMPLATE_APPLY(blocked_sum_every_arch, skewadam::test::CpuArchs);

TEST_CASE_TEMPLATE_DEFINE("R and C of very long rows and very tall columns stay accurate", Arch, long_stats_every_arch) {
  CAPTURE(Arch::name());
  // 5e-6: the sums' bound (65 fp32 units) plus the few units of the EMA and
  // the division by the length. Measured: at most 1.5e-7 on every
  // architecture; one fp32 accumulator per lane gave 7.7e-5 (AVX-512) to
  // 8.4e-4 (scalar) on these shapes.
  const double tolerance = 5e-6;
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    {
      const auto [r, c] = statistics_error<Arch>(3, 1000003, threads);  // rows of a million elements
      CHECK(r < tolerance);
      CHECK(c < tolerance);
    }
    {
      const auto [r, c] = statistics_error<Arch>(1000003, 5, threads);  // columns of a million, in row blocks
      CHECK(r < tolerance);
      CHECK(c < tolerance);
    }
  }
}
TEST_CASE_TEMPLATE_APPLY(long_stats_every_arch, skewadam::test::CpuArchs);

TEST_CASE("wide_sum: double sums in blocks") {
  const index_t n = (index_t{1} << 20) + 3;
  const double s = backend::cpu::wide_sum(n, [](index_t i) { return static_cast<double>(i % 3); });
  double want = 0;
  for (index_t i = 0; i < n; ++i) want += static_cast<double>(i % 3);
  CHECK(s == want);  // integers: exact in any order
  CHECK(backend::cpu::wide_sum(0, [](index_t) { return 1.0; }) == 0.0);
}

}  // namespace test_cpu_summation
