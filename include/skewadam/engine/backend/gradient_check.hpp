#pragma once
// The gradient checks of NonFinitePolicy (nonfinite.hpp) on host memory: the
// limit a gradient element must stay within, and scans for the first element
// that does not. The CPU backend uses them inside its passes
// (cpu/cpu_backend.hpp), on the pieces of the gradients it steps.
//
// A gradient element offends when, after global-norm scaling, it is NaN,
// +-inf, or so large that its square would overflow the float second-moment
// statistics: |g| > sqrt(FLT_MAX / (2 n)), n the longest row or column the
// statistics sum over (1 for an element-wise second moment).

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../../detail/config.hpp"
#include "../../types/dtype.hpp"
#include "../../types/shape.hpp"
#include "../../types/tensor_view.hpp"

namespace skewadam::backend {

/// Largest |g| accepted for a tensor (see above).
inline float gradient_limit(const MatrixGeometry& g, bool factored) noexcept {
  const index_t n = factored ? std::max<index_t>({g.rows, g.cols, 1}) : 1;
  return static_cast<float>(std::sqrt(static_cast<double>(FLT_MAX) / (2.0 * static_cast<double>(n))));
}

/// |x| by its bits (NaN stays NaN).
SKEWADAM_HD SKEWADAM_ALWAYS_INLINE float abs_bits(float x) noexcept { return bits_float(float_bits(x) & 0x7fffffffu); }

/// Written on bits and plain floats so that the compiler vectorizes the scan;
/// the CUDA backend's scan (cuda/check_kernels.cuh) calls it too.
template <class G>
SKEWADAM_HD SKEWADAM_ALWAYS_INLINE bool offends(G g, float scale, float limit) noexcept {
  if constexpr (std::is_same_v<G, f16>) {
    (void)scale;
    (void)limit;  // every finite fp16 value is far below any limit
    return (bits_of(g) & 0x7c00u) == 0x7c00u;
  } else if constexpr (std::is_same_v<G, bf16>) {
    const float x = bits_float(static_cast<std::uint32_t>(bits_of(g)) << 16);  // exact widening
    return !(abs_bits(x * scale) <= limit);
  } else {
    return !(abs_bits(g * scale) <= limit);
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

/// Element i of a gradient in host memory, as a float.
inline float grad_element(const GradView& g, index_t i) noexcept {
  switch (g.dtype) {
    case Dtype::bf16: return to_float(g.as<bf16>()[i]);
    case Dtype::f16: return to_float(g.as<f16>()[i]);
    case Dtype::f32: break;
  }
  return g.as<float>()[i];
}

}  // namespace skewadam::backend
