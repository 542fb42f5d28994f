#pragma once
// Non-finite gradients: what Optimizer::step() does when a gradient holds NaN
// or an infinity.
//
//   NonFinitePolicy::skip_step  (default) the whole step is skipped: no
//       parameter, no state and no step count changes (so the stochastic-
//       rounding stream, keyed by the step count, does not advance either), and
//       step() returns a StepReport naming the first offending tensor in
//       registration order and its first offending element.
//   NonFinitePolicy::raise      the same, then NonFiniteGradientError is thrown
//       carrying that report.
//   NonFinitePolicy::unchecked  no check, as in the reference: NaN and
//       infinities flow into the state and the parameters.
//
// A gradient element "offends" when, after global-norm scaling (E6), it is
// NaN, +-inf, or so large that its square would overflow the float second-
// moment statistics (|g| > sqrt(FLT_MAX / (2 n)), n the longest row or column
// the statistics sum over; about 1e17 for a 4096-wide matrix). Such a step
// would leave non-finite values in the state for good.
//
// How it is detected, and why it costs almost nothing
// ---------------------------------------------------
// The step runs in two phases (Optimizer::step):
//  1. Tensors whose statistics pass writes only their small factored
//     statistics R and C (factored rules without momentum: the experts, 95 %
//     of an MoE's parameters) run their statistics pass as usual; R and C are
//     copied first (B (r + c) floats, never numel). A non-finite gradient makes
//     its row's R_i and column's C_j non-finite, so checking R and C afterwards
//     detects it inside the existing pass. Every other tensor (with momentum,
//     or with an element-wise second moment, whose statistics pass overwrites
//     state of the parameter's size) has its gradient scanned instead, in the
//     same parallel region.
//  2. If nothing offends, the remaining passes run: the apply pass of the first
//     group, every pass of the second. Otherwise R and C are restored from the
//     copies and nothing else has been written.
// The results are bit-identical to a single-phase step (tests check it).

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "backend/work.hpp"
#include "config.hpp"
#include "dtype.hpp"
#include "param_state.hpp"
#include "shape.hpp"

namespace skewadam {

enum class NonFinitePolicy : int { skip_step = 0, raise = 1, unchecked = 2 };

constexpr std::string_view nonfinite_policy_name(NonFinitePolicy p) noexcept {
  switch (p) {
    case NonFinitePolicy::skip_step: return "skip_step";
    case NonFinitePolicy::raise: return "raise";
    case NonFinitePolicy::unchecked: return "unchecked";
  }
  return "unknown";
}

/// The first offending gradient of a rejected step.
struct NonFiniteGradient {
  ParamId param{};
  std::string name;   ///< the parameter's name
  Shape shape{};      ///< the parameter's shape
  index_t element = -1;  ///< flat index of its first offending element; -1 when no
                         ///< gradient element offends but the statistics came out
                         ///< non-finite (the state was not finite before the step)
  float value = 0;    ///< that element after global-norm scaling

  /// One line, e.g. "gradient of 'w1' is NaN at element 17 ([0, 17])".
  std::string describe() const {
    std::string s = "gradient of '" + name + "' ";
    if (element < 0) return s + "gives non-finite second-moment statistics (the state was not finite)";
    if (std::isnan(value)) s += "is NaN";
    else if (std::isinf(value)) s += value > 0 ? "is +inf" : "is -inf";
    else {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(value));
      s += "is " + std::string(buf) + ", whose square overflows the float statistics,";
    }
    s += " at element " + std::to_string(element);
    if (shape.rank() > 1) {
      std::string at;
      index_t rest = element;
      for (int d = shape.rank() - 1; d >= 0; --d) {
        const index_t n = shape[d] > 0 ? shape[d] : 1;
        at = std::to_string(rest % n) + (at.empty() ? "" : ", ") + at;
        rest /= n;
      }
      s += " ([" + at + "])";
    }
    return s;
  }
};

/// What step() did.
struct StepReport {
  bool applied = true;                          ///< false: skipped, nothing changed
  std::optional<NonFiniteGradient> nonfinite;   ///< why, when skipped
  explicit operator bool() const noexcept { return applied; }
};

/// Thrown by step() under NonFinitePolicy::raise; nothing has changed.
class NonFiniteGradientError : public std::runtime_error {
 public:
  explicit NonFiniteGradientError(NonFiniteGradient report)
      : std::runtime_error("step rejected: " + report.describe()), report_(std::move(report)) {}
  const NonFiniteGradient& report() const noexcept { return report_; }

 private:
  NonFiniteGradient report_;
};

namespace detail {

/// Largest |g| accepted for a tensor (see the top of this file).
inline float gradient_limit(const MatrixGeometry& g, bool factored) noexcept {
  const index_t n = factored ? std::max<index_t>({g.rows, g.cols, 1}) : 1;
  return static_cast<float>(std::sqrt(static_cast<double>(FLT_MAX) / (2.0 * static_cast<double>(n))));
}

/// Written on bits and plain floats so that the compiler vectorizes the scan.
template <class G>
SKEWADAM_ALWAYS_INLINE bool offends(G g, float scale, float limit) noexcept {
  if constexpr (std::is_same_v<G, f16>) {
    (void)scale;
    (void)limit;  // every finite fp16 value is far below any limit
    return (bits_of(g) & 0x7c00u) == 0x7c00u;
  } else if constexpr (std::is_same_v<G, bf16>) {
    const float x = bits_float(static_cast<std::uint32_t>(bits_of(g)) << 16);  // exact widening
    return !(std::fabs(x * scale) <= limit);
  } else {
    return !(std::fabs(g * scale) <= limit);
  }
}

/// Index of the first offending element of g[0, n), or -1.
template <class G>
index_t first_offending(const G* g, index_t n, float scale, float limit) noexcept {
  constexpr index_t block = 1024;
  for (index_t b = 0; b < n; b += block) {
    const index_t e = std::min(n, b + block);
    int bad = 0;
    for (index_t i = b; i < e; ++i) bad |= static_cast<int>(offends(g[i], scale, limit));
    if (bad)
      for (index_t i = b; i < e; ++i)
        if (offends(g[i], scale, limit)) return i;
  }
  return -1;
}

/// True when no value of x[0, n) is NaN or infinite.
inline bool all_finite(const float* x, std::size_t n) noexcept {
  std::uint32_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad |= static_cast<std::uint32_t>((float_bits(x[i]) & 0x7f800000u) == 0x7f800000u);
  return bad == 0;
}

/// A backend kernel that scans a gradient instead of stepping it. Its task is
/// cut into element chunks (task.factored = false); unit k writes to
/// task.unit_sum[k] the offset of the chunk's first offending element, or -1.
/// Factored says whether the scanned tensor's own rule is factored (it sets
/// the limit).
template <class G, bool Factored>
struct GradientScan {
  static void statistics(const backend::TensorTask& t, const backend::Unit& u, backend::Scratch /*scratch*/) {
    const G* g = static_cast<const G*>(t.grad) + u.matrix * t.geom.matrix_size();
    const index_t at = first_offending(g + u.begin, u.end - u.begin, t.scalars.grad_scale,
                                       gradient_limit(t.geom, Factored));
    t.unit_sum[u.block] = static_cast<double>(at);
  }
  static void finalize(const backend::TensorTask& /*t*/, backend::Scratch /*scratch*/) {}
  static const backend::KernelTable* table() noexcept {
    static constexpr backend::KernelTable k{&statistics, &finalize, nullptr};
    return &k;
  }
};

inline const backend::KernelTable* gradient_scan_kernels(Dtype grad, bool factored) noexcept {
  switch (grad) {
    case Dtype::f32: return factored ? GradientScan<float, true>::table() : GradientScan<float, false>::table();
    case Dtype::bf16: return factored ? GradientScan<bf16, true>::table() : GradientScan<bf16, false>::table();
    case Dtype::f16: return factored ? GradientScan<f16, true>::table() : GradientScan<f16, false>::table();
  }
  return nullptr;
}

/// A kernel table's passes, split for a two-phase step: the statistics and
/// finalize passes alone, and the apply pass alone. Results are identical to
/// the full table's, because a backend keeps everything apply needs in the
/// task's own memory (state, MatrixScratch), never in per-run scratch.
struct PhaseKernels {
  const backend::KernelTable* full = nullptr;
  backend::KernelTable statistics_only{};
  backend::KernelTable apply_only{};
};

inline void no_statistics(const backend::TensorTask&, const backend::Unit&, backend::Scratch) {}
inline void no_finalize(const backend::TensorTask&, backend::Scratch) {}

inline PhaseKernels split_phases(const backend::KernelTable* full) noexcept {
  return PhaseKernels{full, {full->statistics, full->finalize, nullptr}, {&no_statistics, &no_finalize, full->apply}};
}

}  // namespace detail
}  // namespace skewadam
