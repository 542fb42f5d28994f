// The factored statistics pass forms the clip's sum(u^2) without a pass of
// its own (engine/backend/cpu/kernels.hpp): sum_j (1 / col_j^2) vbar D_j with
// D_j = sum_i n_ij^2 / R_i over rows where the eps floor does not bind, plus
// the floored rows' terms re-read exactly. Here that sum is checked against
// the direct definition, sum_ij (n_ij / (row_i col_j))^2 in double, on
// matrices with zero rows and floored rows, split into row blocks or stacked
// in a bank, for every compiled architecture.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include <skewadam/skewadam.hpp>

#include "cpu_archs.hpp"

namespace test_cpu_clip_sum {

namespace {

using namespace skewadam;

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return x;
}

template <class Rule, class Arch>
void check_sum(Shape shape, int floored_rows, int threads) {
  const MatrixGeometry g = shape.matrices();
  const index_t n = g.numel();
  std::vector<float> p(static_cast<std::size_t>(n), 0.5f), grad(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) {
    const index_t row = (i / g.cols) % g.rows;
    float u = static_cast<float>(mix(static_cast<std::uint64_t>(i)) >> 40) * 0x1p-24f - 0.5f;
    if (row == 1) u = 0.0f;                       // a zero row: R = 0
    else if (row >= 2 && row < 2 + floored_rows) u *= 5e-5f;  // R / vbar < eps, u still O(1)
    grad[static_cast<std::size_t>(i)] = u;
  }
  const StepScalars s = make_step_scalars(Hyperparameters{}, 1);
  std::vector<float> m(Rule::momentum::has_state ? n : 0), vr(g.batch * g.rows), vc(g.batch * g.cols);
  std::vector<backend::MatrixScratch> ms(static_cast<std::size_t>(g.batch));
  backend::TensorTask t;
  t.param = p.data();
  t.grad = grad.data();
  t.geom = g;
  t.factored = true;
  t.scalars = s;
  t.m = m.empty() ? nullptr : m.data();
  t.v_row = vr.data();
  t.v_col = vc.data();
  t.matrices = ms.data();
  t.row_blocks = backend::Cutting::row_blocks(g);
  std::vector<float> cp(backend::Cutting::partial_floats(g)), dp(cp.size());
  t.col_partial = cp.empty() ? nullptr : cp.data();
  t.d_partial = dp.empty() ? nullptr : dp.data();
  using Backend = backend::CpuBackend<Arch>;
  t.kernel = Backend::template kernels<Rule, float, float>();
  Backend be;
  be.set_threads(threads);
  be.run(std::span<const backend::TensorTask>(&t, 1));

  using S = typename Rule::second_moment;
  using M = typename Rule::momentum;
  int floored_seen = 0;
  for (index_t b = 0; b < g.batch; ++b) {
    const float vbar = ms[static_cast<std::size_t>(b)].vbar;
    double want = 0;
    for (index_t i = 0; i < g.rows; ++i) {
      const float ri = vr[static_cast<std::size_t>(b * g.rows + i)];
      floored_seen += ri > 0.0f && S::row_floored(ri, vbar, s);
      const double row = S::row_factor(ri, vbar, s);
      for (index_t j = 0; j < g.cols; ++j) {
        const index_t o = (b * g.rows + i) * g.cols + j;
        const float mm = m.empty() ? 0.0f : m[static_cast<std::size_t>(o)];
        const double num = M::numerator(grad[static_cast<std::size_t>(o)], mm, s);
        const double col = S::col_factor(vc[static_cast<std::size_t>(b * g.cols + j)], s);
        const double u = num / (row * col);
        want += u * u;
      }
    }
    const double got = ms[static_cast<std::size_t>(b)].sum_u2;
    CAPTURE(b);
    CHECK(got == doctest::Approx(want).epsilon(2e-5));
  }
  CHECK(floored_seen == floored_rows * g.batch);
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("the statistics pass's sum(u^2) equals the direct sum", Arch, clip_sum) {
  CAPTURE(Arch::name());
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    for (int floored : {0, 1, 3}) {
      CAPTURE(floored);
      check_sum<ExpertRule, Arch>(Shape{1500, 300}, floored, threads);   // 2 row blocks
      check_sum<BackboneRule, Arch>(Shape{1500, 300}, floored, threads);
      check_sum<ExpertRule, Arch>(Shape{3, 40, 37}, floored, threads);   // a bank, odd widths
      check_sum<BackboneRule, Arch>(Shape{3, 40, 37}, floored, threads);
      check_sum<ExpertRule, Arch>(Shape{4096, 70}, floored, threads);    // 2 row blocks of 2048 rows
    }
  }
}
TEST_CASE_TEMPLATE_APPLY(clip_sum, skewadam::test::CpuArchs);

}  // namespace test_cpu_clip_sum
