#pragma once
// The lane primitives of x86_lanes.hpp (LaneOps<Arch>, whose primary template
// is there) for aarch64 NEON: bf16 loads widened and bf16 stores narrowed in
// registers (one instruction per four lanes each), the 32 x 32 -> 64-bit
// multiply split into high and low words (Philox), the 4 x 4 word transpose
// and the spread of words into 16-bit halves that put Philox's output in
// element order. Without them the NEON kernels converted, rounded and drew
// random bits one element at a time. The bits are those of the scalar
// definitions, as on x86 (tests/unit/test_cpu_lanes.cpp checks every path).
//
// fp16 keeps the scalar conversion on NEON (native_f16 = false): its loads
// then treat signalling NaNs exactly as before.
//
// As in x86_lanes.hpp, the XSIMD_WITH_NEON64 guard only decides whether the
// specialisation exists (the batch types of neon64 exist only then); no
// function's body depends on a macro.

#include <xsimd/xsimd.hpp>

#include <cstdint>
#include <type_traits>

#include "x86_lanes.hpp"

#if XSIMD_WITH_NEON64
#include <arm_neon.h>

namespace skewadam::backend::cpu {

/// aarch64 NEON (neon64 and every architecture derived from it).
template <class Arch>
struct LaneOps<Arch, std::enable_if_t<std::is_base_of_v<xsimd::neon64, Arch>>> {
  static constexpr bool native = true;
  static constexpr bool native_f16 = false;
  using F = xsimd::batch<float, Arch>;
  using U = xsimd::batch<std::uint32_t, Arch>;

  static F widen_bf16(const std::uint16_t* p) noexcept {
    return F(vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)));
  }
  /// Stores the low 16 bits of each lane.
  static void narrow_store(std::uint16_t* p, const U& v) noexcept { vst1_u16(p, vmovn_u32(v)); }
  /// a * m as 64-bit products: high and low 32-bit words per lane.
  static void mulhilo(const U& a, std::uint32_t m, U& hi, U& lo) noexcept {
    const uint32x4_t x = a;
    const uint32x4_t p01 = vreinterpretq_u32_u64(vmull_u32(vget_low_u32(x), vdup_n_u32(m)));
    const uint32x4_t p23 = vreinterpretq_u32_u64(vmull_high_u32(x, vdupq_n_u32(m)));
    lo = U(vuzp1q_u32(p01, p23));
    hi = U(vuzp2q_u32(p01, p23));
  }
  static U xor3(const U& a, const U& b, const U& c) noexcept { return a ^ b ^ c; }
  /// x_k[r] -> y_r[k] (a 4 x 4 word transpose).
  static void transpose4(U& x0, U& x1, U& x2, U& x3) noexcept {
    const uint32x4_t t0 = vtrn1q_u32(x0, x1);
    const uint32x4_t t1 = vtrn2q_u32(x0, x1);
    const uint32x4_t t2 = vtrn1q_u32(x2, x3);
    const uint32x4_t t3 = vtrn2q_u32(x2, x3);
    x0 = U(vreinterpretq_u32_u64(vtrn1q_u64(vreinterpretq_u64_u32(t0), vreinterpretq_u64_u32(t2))));
    x1 = U(vreinterpretq_u32_u64(vtrn1q_u64(vreinterpretq_u64_u32(t1), vreinterpretq_u64_u32(t3))));
    x2 = U(vreinterpretq_u32_u64(vtrn2q_u64(vreinterpretq_u64_u32(t0), vreinterpretq_u64_u32(t2))));
    x3 = U(vreinterpretq_u32_u64(vtrn2q_u64(vreinterpretq_u64_u32(t1), vreinterpretq_u64_u32(t3))));
  }
  /// The four words' low halves, then their high halves, as 32-bit lanes.
  static void spread_halves(const U& x, U& e0, U& e1) noexcept {
    e0 = U(vandq_u32(x, vdupq_n_u32(0xffffu)));
    e1 = U(vshrq_n_u32(x, 16));
  }
};

}  // namespace skewadam::backend::cpu
#endif
