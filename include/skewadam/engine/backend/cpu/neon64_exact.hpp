#pragma once
// Correctly rounded fp32 division and square root on aarch64 NEON lanes.
//
// xsimd 8 (Debian 12) implements batch<float, neon64>'s division and sqrt
// with the 32-bit NEON estimates refined by Newton-Raphson steps, which are
// off by an ulp or two (0.1f / sqrt(0.1f * 0.1f) gives 0.99999994, not 1).
// AArch64 has correctly rounded instructions for both (vdivq_f32,
// vsqrtq_f32); with them the NEON kernels round every element exactly as the
// scalar code and the x86 kernels do, so a rule's per-element results do
// not depend on the architecture.
//
// Division: an explicit specialization of batch<float, neon64>::operator/=
// (which operator/ calls), declared right after xsimd, before any kernel
// uses it. Square root: ExactOps<Arch>::sqrt, which vmath::sqrt calls on
// xsimd batches. The XSIMD_WITH_NEON64 guard only decides whether the
// specializations exist (the batch type exists only then), as in
// x86_lanes.hpp.

#include <xsimd/xsimd.hpp>

#include <type_traits>

#include "../../../detail/config.hpp"

#if XSIMD_WITH_NEON64
namespace xsimd {
template <>
inline batch<float, neon64>& batch<float, neon64>::operator/=(batch<float, neon64> const& other) noexcept {
  return *this = batch<float, neon64>(vdivq_f32(*this, other));
}
}  // namespace xsimd
#endif

namespace skewadam::backend::cpu {

/// Primary template: xsimd's own functions are correctly rounded.
template <class Arch, class = void>
struct ExactOps {
  static SKEWADAM_ALWAYS_INLINE xsimd::batch<float, Arch> sqrt(const xsimd::batch<float, Arch>& x) {
    return xsimd::sqrt(x);
  }
};

#if XSIMD_WITH_NEON64
template <class Arch>
struct ExactOps<Arch, std::enable_if_t<std::is_base_of_v<xsimd::neon64, Arch>>> {
  static SKEWADAM_ALWAYS_INLINE xsimd::batch<float, Arch> sqrt(const xsimd::batch<float, Arch>& x) {
    return vsqrtq_f32(x);
  }
};
#endif

}  // namespace skewadam::backend::cpu
