// A bf16 expert-tier tensor of more than 2^31 elements (ctest label "large":
// about 9 GB of memory, a minute or two on two cores).
//
// The shape is [46341, 46341]: 2^31 + 4633 elements, so that row and element
// offsets pass 2^31 - 1 and the rows end off any SIMD width. (2^31 + 1 itself
// is 3 x 715827883, a prime: its only matrix shapes put 715827883 in one
// dimension, whose factored statistic alone would take 2.9 GB.) 4.3 GB of
// bf16 parameter plus 4.3 GB of bf16 gradient; the optimizer state is 370 KB.
//
// Under every CPU kernel level this program and processor run (or the one
// SKEWADAM_CPU_ARCH names), in one process: the reference is computed once,
// as it depends on the gradients alone. Two steps, each checked against the
// rule computed independently in double: every element of the first two and
// the last two rows (those past 2^31 included) and every R_i and C_j.
// Then, under the default backend, a NaN in the very last element skips the
// step and is reported at its 64-bit index, and the state round-trips
// through a checkpoint.

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <skewadam/checkpoint.hpp>
#include <skewadam/skewadam.hpp>
#include <skewadam_tools/cpu_arch_env.hpp>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

using namespace skewadam;

namespace {

constexpr index_t rows = 46341, cols = 46341, numel = rows * cols;
static_assert(numel > (index_t{1} << 31));

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
float uniform(std::uint64_t key) { return static_cast<float>(static_cast<double>(mix(key) >> 11) * 0x1p-52 - 1.0); }

float initial_param(index_t i) { return 0.5f * uniform(static_cast<std::uint64_t>(i)); }
float gradient(std::int64_t t, index_t i) {
  const float row_scale = 1.0f + static_cast<float>((i / cols) % 7);  // spreads the row statistics
  return 0.01f * row_scale * uniform(static_cast<std::uint64_t>(i) ^ (static_cast<std::uint64_t>(t) << 48));
}

/// The rows whose every element is checked: both ends.
const index_t checked_rows[] = {0, 1, rows - 2, rows - 1};

/// The rule in double, with its state (docs/spec.md §3, factored, no momentum).
struct Reference {
  Hyperparameters h;
  std::vector<double> r = std::vector<double>(rows, 0.0), c = std::vector<double>(cols, 0.0);
  std::vector<double> row_factor = std::vector<double>(rows), col_factor = std::vector<double>(cols);
  double sqrt_bc2 = 0, divisor = 1;

  /// Statistics and clip divisor of step t from the gradient g.
  void statistics(const bf16* g, std::int64_t t) {
    std::vector<double> row_sum(rows, 0.0), col_sum(cols, 0.0);
#pragma omp parallel
    {
      std::vector<double> col_part(cols, 0.0);
#pragma omp for schedule(static)
      for (index_t i = 0; i < rows; ++i) {
        double s = 0;
        const bf16* gi = g + i * cols;
        for (index_t j = 0; j < cols; ++j) {
          const double x = static_cast<double>(to_float(gi[j]));
          s += x * x;
          col_part[static_cast<std::size_t>(j)] += x * x;
        }
        row_sum[static_cast<std::size_t>(i)] = s;
      }
#pragma omp critical
      for (index_t j = 0; j < cols; ++j) col_sum[static_cast<std::size_t>(j)] += col_part[static_cast<std::size_t>(j)];
    }
    double mean_r = 0;
    for (index_t i = 0; i < rows; ++i) {
      auto& ri = r[static_cast<std::size_t>(i)];
      ri = h.beta2 * ri + (1 - h.beta2) * row_sum[static_cast<std::size_t>(i)] / cols;
      mean_r += ri / rows;
    }
    for (index_t j = 0; j < cols; ++j) {
      auto& cj = c[static_cast<std::size_t>(j)];
      cj = h.beta2 * cj + (1 - h.beta2) * col_sum[static_cast<std::size_t>(j)] / rows;
      col_factor[static_cast<std::size_t>(j)] = std::sqrt(std::max(cj, h.eps));
    }
    const double vbar = std::max(mean_r, 1e-15);
    for (index_t i = 0; i < rows; ++i)
      row_factor[static_cast<std::size_t>(i)] = std::sqrt(std::max(r[static_cast<std::size_t>(i)] / vbar, h.eps));
    sqrt_bc2 = std::sqrt(1 - std::pow(h.beta2, static_cast<double>(t)));
    double sum_u2 = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum_u2)
    for (index_t i = 0; i < rows; ++i) {
      const bf16* gi = g + i * cols;
      double s = 0;
      for (index_t j = 0; j < cols; ++j) {
        const double u = static_cast<double>(to_float(gi[j])) * sqrt_bc2 /
                         (row_factor[static_cast<std::size_t>(i)] * col_factor[static_cast<std::size_t>(j)]);
        s += u * u;
      }
      sum_u2 += s;
    }
    divisor = std::max(std::sqrt(sum_u2 / static_cast<double>(numel)) / h.clip_threshold, 1.0);
  }

  /// The exact (unrounded) new value of element (i, j).
  double updated(double p, double g, index_t i, index_t j) const {
    const double u = g * sqrt_bc2 / (row_factor[static_cast<std::size_t>(i)] * col_factor[static_cast<std::size_t>(j)]);
    return p * (1 - h.lr * h.weight_decay) - h.lr * u / divisor;
  }
};

/// bf16's spacing at x.
double bf16_ulp(double x) {
  int e = 0;
  std::frexp(x == 0 ? std::numeric_limits<float>::min() : x, &e);
  return std::ldexp(1.0, e - 8);
}

void fill_gradient(bf16* g, std::int64_t t) {
#pragma omp parallel for schedule(static)
  for (index_t i = 0; i < numel; ++i) g[i] = bf16(gradient(t, i));
}

std::vector<bf16> copy_rows(const bf16* p) {
  std::vector<bf16> out;
  for (index_t i : checked_rows) out.insert(out.end(), p + i * cols, p + (i + 1) * cols);
  return out;
}

/// What one level's two steps leave: the state. (The levels' sums of R_i
/// differ in their last bits: their order depends on the SIMD width,
/// engine/backend/cpu/summation.hpp.)
struct LevelResult {
  std::vector<float> v_row, v_col;
};

/// Two steps from the initial parameter under the kernels of level A,
/// checked against the reference of each step.
template <class A>
LevelResult two_steps(bf16* p, bf16* g, const std::array<Reference, 2>& refs) {
#pragma omp parallel for schedule(static)
  for (index_t i = 0; i < numel; ++i) p[i] = bf16(initial_param(i));
  Optimizer<SkewAdamTiers, backend::CpuBackend<A>> opt(refs[0].h);
  const ParamId id = opt.add("blocks.1.moe.experts.w1", Tier::experts, TensorView<bf16>(p, {rows, cols}));
  opt.set_grad(id, TensorView<const bf16>(g, {rows, cols}));
  LevelResult out;
  for (std::int64_t t = 1; t <= 2; ++t) {
    CAPTURE(t);
    const Reference& ref = refs[static_cast<std::size_t>(t - 1)];
    fill_gradient(g, t);
    const std::vector<bf16> before = copy_rows(p);
    opt.step();
    REQUIRE(opt.last_step().applied);

    std::size_t bad = 0, k = 0;
    double worst = 0;
    for (index_t i : checked_rows)
      for (index_t j = 0; j < cols; ++j, ++k) {
        const index_t at = i * cols + j;
        const double want = ref.updated(static_cast<double>(to_float(before[k])), static_cast<double>(to_float(g[at])), i, j);
        const double err = std::abs(static_cast<double>(to_float(p[at])) - want) / (bf16_ulp(want) + 1e-6 * std::abs(want));
        worst = std::max(worst, err);
        if (!(err <= 1.0)) ++bad;  // stochastic rounding lands on a neighbour of the exact value
      }
    CHECK_MESSAGE(bad == 0, "elements off by more than one bf16 ulp: " << bad << ", worst " << worst << " ulp");

    const ParamStateView s = opt.state(id);
    REQUIRE(s.v_row.size() == static_cast<std::size_t>(rows));
    REQUIRE(s.v_col.size() == static_cast<std::size_t>(cols));
    double worst_r = 0, worst_c = 0;
    for (index_t i = 0; i < rows; ++i)
      worst_r = std::max(worst_r, std::abs(s.v_row[static_cast<std::size_t>(i)] - ref.r[static_cast<std::size_t>(i)]) /
                                      ref.r[static_cast<std::size_t>(i)]);
    for (index_t j = 0; j < cols; ++j)
      worst_c = std::max(worst_c, std::abs(s.v_col[static_cast<std::size_t>(j)] - ref.c[static_cast<std::size_t>(j)]) /
                                      ref.c[static_cast<std::size_t>(j)]);
    MESSAGE("kernels ", A::name(), ", step ", t, ": worst relative error of R ", worst_r, ", of C ", worst_c,
            ", elements ", worst, " bf16 ulp");
    // Blocked sums (engine/backend/cpu/summation.hpp) keep these near 1.5e-7 on
    // every architecture; one fp32 accumulator per lane gave up to 1.2e-5.
    CHECK(worst_r < 1e-6);
    CHECK(worst_c < 1e-6);
    CHECK(s.step == t);
    if (t == 2) {
      out.v_row.assign(s.v_row.begin(), s.v_row.end());
      out.v_col.assign(s.v_col.begin(), s.v_col.end());
    }
  }
  return out;
}

/// The levels to run: SKEWADAM_CPU_ARCH's, or every one available here.
std::vector<CpuArch> levels() {
  const char* env = std::getenv("SKEWADAM_CPU_ARCH");
  if (env != nullptr && *env != '\0') return {backend::cpu::parse_arch(env, "SKEWADAM_CPU_ARCH")};
  return backend::cpu::available_archs();
}

}  // namespace

TEST_CASE("a bf16 expert tensor of more than 2^31 elements") {
  auto param = std::make_unique_for_overwrite<bf16[]>(static_cast<std::size_t>(numel));
  auto grad = std::make_unique_for_overwrite<bf16[]>(static_cast<std::size_t>(numel));
  bf16* p = param.get();
  bf16* g = grad.get();

  // the reference of both steps: it depends on the gradients alone
  std::array<Reference, 2> refs;
  {
    Reference ref;
    ref.h = Hyperparameters{.lr = 1e-2, .weight_decay = 0.05};
    for (std::int64_t t = 1; t <= 2; ++t) {
      fill_gradient(g, t);
      ref.statistics(g, t);
      refs[static_cast<std::size_t>(t - 1)] = ref;
    }
  }

  const std::vector<CpuArch> run = levels();
  REQUIRE(!run.empty());
  std::optional<LevelResult> last;
  for (CpuArch a : run) {
    const std::string level = backend::cpu::level_name(a);
    CAPTURE(level);
    last = backend::cpu::visit_arch(a, [&]<class A>() { return two_steps<A>(p, g, refs); });
  }

  // the default backend, from where the last level's steps left the parameter
  SkewAdam opt(refs[0].h);
  const ParamId id = opt.add("blocks.1.moe.experts.w1", Tier::experts, TensorView<bf16>(p, {rows, cols}));
  opt.set_grad(id, TensorView<const bf16>(g, {rows, cols}));
  {
    OptimizerState state = opt.export_state();
    state.steps = 2;
    state.params[0].state.step = 2;
    state.params[0].state.v_row = last->v_row;
    state.params[0].state.v_col = last->v_col;
    opt.import_state(std::move(state));
  }

  {  // a NaN in the last element skips the step and is reported at its 64-bit index
    const std::vector<bf16> before = copy_rows(p);
    const OptimizerState state = opt.export_state();
    g[numel - 1] = bf16(std::numeric_limits<float>::quiet_NaN());
    opt.step();
    const StepReport r = opt.last_step();
    CHECK_FALSE(r.applied);
    REQUIRE(r.nonfinite);
    CHECK(r.nonfinite->element == numel - 1);
    CHECK(r.nonfinite->describe() ==
          "gradient of 'blocks.1.moe.experts.w1' is NaN at element 2147488280 ([46340, 46340])");
    CHECK(opt.steps() == 2);
    const std::vector<bf16> after = copy_rows(p);
    CHECK(std::memcmp(before.data(), after.data(), 2 * before.size()) == 0);
    const ParamStateView s = opt.state(id);
    CHECK(std::memcmp(s.v_row.data(), state.params[0].state.v_row.data(), 4 * s.v_row.size()) == 0);
    CHECK(std::memcmp(s.v_col.data(), state.params[0].state.v_col.data(), 4 * s.v_col.size()) == 0);
    CHECK(s.step == 2);
  }

  {  // the state round-trips through a checkpoint
    long pid = 0;
#if defined(__unix__) || defined(__APPLE__)
    pid = static_cast<long>(::getpid());
#endif
    const auto file = std::filesystem::temp_directory_path() / ("skewadam-huge-" + std::to_string(pid) + ".ckpt");
    save_checkpoint(opt, file);
    const CheckpointInfo info = read_checkpoint_info(file);
    REQUIRE(info.params.size() == 1);
    CHECK(info.params[0].shape.numel() == numel);
    SkewAdam other(Hyperparameters{});
    other.add("blocks.1.moe.experts.w1", Tier::experts, TensorView<bf16>(p, {rows, cols}));
    load_checkpoint(other, file);
    std::filesystem::remove(file);
    const ParamStateView a = opt.state(id), b = other.state(ParamId{0});
    CHECK(b.step == 2);
    CHECK(std::memcmp(a.v_row.data(), b.v_row.data(), 4 * a.v_row.size()) == 0);
    CHECK(std::memcmp(a.v_col.data(), b.v_col.data(), 4 * a.v_col.size()) == 0);
    CHECK(other.hyperparameters(Tier::experts).lr == refs[0].h.lr);
  }
}

int main(int argc, char** argv) {
  // SKEWADAM_CPU_ARCH may name one level: one this program or processor
  // cannot run is skipped.
  if (const auto why = skewadam::tools::requested_arch_unavailable()) {
    std::printf("skipped: %s\n", why->c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
