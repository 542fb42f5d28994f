#pragma once
// Lane primitives the CPU kernels need beyond what xsimd 8 offers, for the
// x86 architectures: 16-bit <-> 32-bit lane conversion in registers (bf16 and
// fp16 loads, narrowing stores), a 32 x 32 -> 64-bit multiply split into high
// and low words (Philox), and the 4 x 4 word interleave and the spread of
// each word's 16-bit halves that put Philox's output in element order.
//
// LaneOps<Arch> is selected by the architecture type alone: a function's body
// never depends on a macro such as __AVX2__ (which would break the one
// definition rule across translation units built with different flags). The
// XSIMD_WITH_* guards below only decide whether a specialisation exists at
// all; where it does not, the batch types of that architecture do not exist
// either. aarch64 NEON has its specialisation in neon64_lanes.hpp; every
// other architecture (ScalarArch, plain AVX) gets the primary template,
// native == false, and the kernels use portable code.

#include <xsimd/xsimd.hpp>

#include <cstdint>
#include <type_traits>

#if XSIMD_WITH_SSE4_1 || XSIMD_WITH_AVX2 || XSIMD_WITH_AVX512F
#include <immintrin.h>
#endif

namespace skewadam::backend::cpu {

/// Primary template: no native lane primitives.
template <class Arch, class = void>
struct LaneOps {
  static constexpr bool native = false;
  static constexpr bool native_f16 = false;
};

#if XSIMD_WITH_AVX512F
/// AVX-512 (avx512f and every architecture derived from it).
template <class Arch>
struct LaneOps<Arch, std::enable_if_t<std::is_base_of_v<xsimd::avx512f, Arch>>> {
  static constexpr bool native = true;
  static constexpr bool native_f16 = true;  // vcvtph2ps / vcvtps2ph are AVX512F
  using F = xsimd::batch<float, Arch>;
  using U = xsimd::batch<std::uint32_t, Arch>;

  static F widen_bf16(const std::uint16_t* p) noexcept {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static F widen_f16(const std::uint16_t* p) noexcept {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  /// Stores the low 16 bits of each lane.
  static void narrow_store(std::uint16_t* p, const U& v) noexcept {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(v));
  }
  /// a * m as 64-bit products: high and low 32-bit words per lane.
  static void mulhilo(const U& a, std::uint32_t m, U& hi, U& lo) noexcept {
    const __m512i mm = _mm512_set1_epi32(static_cast<int>(m));
    const __m512i even = _mm512_mul_epu32(a, mm);                                  // lanes 0, 2, ...
    const __m512i odd = _mm512_mul_epu32(_mm512_shuffle_epi32(a, _MM_PERM_CDAB), mm);  // lanes 1, 3, ...
    // swap the words of each product into place, keeping the other's lanes
    hi = _mm512_mask_shuffle_epi32(odd, 0x5555, even, _MM_PERM_CDAB);
    lo = _mm512_mask_shuffle_epi32(even, 0xAAAA, odd, _MM_PERM_CDAB);
  }
  static U xor3(const U& a, const U& b, const U& c) noexcept { return _mm512_ternarylogic_epi32(a, b, c, 0x96); }
  /// Per 128-bit chunk q: x_k[4q + r] -> y_r[4q + k] (a 4 x 4 word transpose).
  static void transpose4(U& x0, U& x1, U& x2, U& x3) noexcept {
    const __m512i a = _mm512_unpacklo_epi32(x0, x1);
    const __m512i b = _mm512_unpackhi_epi32(x0, x1);
    const __m512i c = _mm512_unpacklo_epi32(x2, x3);
    const __m512i d = _mm512_unpackhi_epi32(x2, x3);
    x0 = _mm512_unpacklo_epi64(a, c);
    x1 = _mm512_unpackhi_epi64(a, c);
    x2 = _mm512_unpacklo_epi64(b, d);
    x3 = _mm512_unpackhi_epi64(b, d);
  }
  /// Per 128-bit chunk q of x (four words): its low halves, then its high
  /// halves, as 32-bit lanes: chunks 0 and 1 into e0, chunks 2 and 3 into e1.
  static void spread_halves(const U& x, U& e0, U& e1) noexcept {
    const __m512i lo = _mm512_and_si512(x, _mm512_set1_epi32(0xffff));
    const __m512i hi = _mm512_srli_epi32(x, 16);
    e0 = _mm512_permutex2var_epi32(lo, _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23), hi);
    e1 = _mm512_permutex2var_epi32(lo, _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31),
                                   hi);
  }
};
#endif

#if XSIMD_WITH_AVX2
/// AVX2 (avx2 and fma3<avx2>).
template <class Arch>
struct LaneOps<Arch, std::enable_if_t<std::is_base_of_v<xsimd::avx2, Arch>>> {
  static constexpr bool native = true;
  static constexpr bool native_f16 = false;
  using F = xsimd::batch<float, Arch>;
  using U = xsimd::batch<std::uint32_t, Arch>;

  static F widen_bf16(const std::uint16_t* p) noexcept {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static void narrow_store(std::uint16_t* p, const U& v) noexcept {
    const __m256i lo16 = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo16, lo16), 0xD8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
  static void mulhilo(const U& a, std::uint32_t m, U& hi, U& lo) noexcept {
    const __m256i mm = _mm256_set1_epi32(static_cast<int>(m));
    const __m256i even = _mm256_mul_epu32(a, mm);
    const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), mm);
    hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
    lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  }
  static U xor3(const U& a, const U& b, const U& c) noexcept { return a ^ b ^ c; }
  static void transpose4(U& x0, U& x1, U& x2, U& x3) noexcept {
    const __m256i a = _mm256_unpacklo_epi32(x0, x1);
    const __m256i b = _mm256_unpackhi_epi32(x0, x1);
    const __m256i c = _mm256_unpacklo_epi32(x2, x3);
    const __m256i d = _mm256_unpackhi_epi32(x2, x3);
    x0 = _mm256_unpacklo_epi64(a, c);
    x1 = _mm256_unpackhi_epi64(a, c);
    x2 = _mm256_unpacklo_epi64(b, d);
    x3 = _mm256_unpackhi_epi64(b, d);
  }
  static void spread_halves(const U& x, U& e0, U& e1) noexcept {
    const __m256i lo = _mm256_and_si256(x, _mm256_set1_epi32(0xffff));
    const __m256i hi = _mm256_srli_epi32(x, 16);
    e0 = _mm256_permute2x128_si256(lo, hi, 0x20);
    e1 = _mm256_permute2x128_si256(lo, hi, 0x31);
  }
};
#endif

#if XSIMD_WITH_SSE4_1
/// SSE4.1 and later 128-bit architectures (sse4_1, sse4_2, fma3<sse4_2>).
template <class Arch>
struct LaneOps<Arch, std::enable_if_t<std::is_base_of_v<xsimd::sse4_1, Arch>>> {
  static constexpr bool native = true;
  static constexpr bool native_f16 = false;
  using F = xsimd::batch<float, Arch>;
  using U = xsimd::batch<std::uint32_t, Arch>;

  static F widen_bf16(const std::uint16_t* p) noexcept {
    const __m128i w = _mm_cvtepu16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm_castsi128_ps(_mm_slli_epi32(w, 16));
  }
  static void narrow_store(std::uint16_t* p, const U& v) noexcept {
    const __m128i lo16 = _mm_and_si128(v, _mm_set1_epi32(0xffff));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi32(lo16, lo16));
  }
  static void mulhilo(const U& a, std::uint32_t m, U& hi, U& lo) noexcept {
    const __m128i mm = _mm_set1_epi32(static_cast<int>(m));
    const __m128i even = _mm_mul_epu32(a, mm);
    const __m128i odd = _mm_mul_epu32(_mm_srli_epi64(a, 32), mm);
    hi = _mm_blend_epi16(_mm_srli_epi64(even, 32), odd, 0xCC);
    lo = _mm_blend_epi16(even, _mm_slli_epi64(odd, 32), 0xCC);
  }
  static U xor3(const U& a, const U& b, const U& c) noexcept { return a ^ b ^ c; }
  static void transpose4(U& x0, U& x1, U& x2, U& x3) noexcept {
    const __m128i a = _mm_unpacklo_epi32(x0, x1);
    const __m128i b = _mm_unpackhi_epi32(x0, x1);
    const __m128i c = _mm_unpacklo_epi32(x2, x3);
    const __m128i d = _mm_unpackhi_epi32(x2, x3);
    x0 = _mm_unpacklo_epi64(a, c);
    x1 = _mm_unpackhi_epi64(a, c);
    x2 = _mm_unpacklo_epi64(b, d);
    x3 = _mm_unpackhi_epi64(b, d);
  }
  static void spread_halves(const U& x, U& e0, U& e1) noexcept {
    e0 = _mm_and_si128(x, _mm_set1_epi32(0xffff));
    e1 = _mm_srli_epi32(x, 16);
  }
};
#endif

}  // namespace skewadam::backend::cpu
