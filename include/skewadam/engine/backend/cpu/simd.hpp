#pragma once
// SIMD plumbing of the CPU backend: value types per architecture, loads and
// stores for every dtype, horizontal sums. The architecture is a type
// (xsimd's tags, or ScalarArch), so one binary can hold several and no
// function's meaning depends on macros such as __AVX2__.

#include <xsimd/xsimd.hpp>

#include "neon64_exact.hpp"  // right after xsimd: exact NEON division

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../../../detail/config.hpp"
#include "../../../math/random.hpp"
#include "../../../math/vmath.hpp"
#include "../../../policies/nearest_rounding.hpp"
#include "../../../policies/stochastic_rounding.hpp"
#include "../../../types/dtype.hpp"
#include "arch.hpp"
#include "neon64_lanes.hpp"
#include "random_lanes.hpp"
#include "x86_lanes.hpp"

namespace skewadam::vmath {

template <class A>
struct ops<xsimd::batch<float, A>> {
  using B = xsimd::batch<float, A>;
  using bits = xsimd::batch<std::uint32_t, A>;
  static constexpr int width = static_cast<int>(B::size);
  static SKEWADAM_ALWAYS_INLINE bits to_bits(const B& x) { return xsimd::bitwise_cast<bits>(x); }
  static SKEWADAM_ALWAYS_INLINE B from_bits(const bits& b) { return xsimd::bitwise_cast<B>(b); }
  static SKEWADAM_ALWAYS_INLINE B select(const xsimd::batch_bool<float, A>& m, const B& a, const B& b) {
    return xsimd::select(m, a, b);
  }
  static SKEWADAM_ALWAYS_INLINE bool any(const xsimd::batch_bool<float, A>& m) { return xsimd::any(m); }
  static SKEWADAM_ALWAYS_INLINE xsimd::batch_bool<float, A> isnan(const B& x) { return xsimd::isnan(x); }
  static SKEWADAM_ALWAYS_INLINE void store(const B& x, float* out) { x.store_unaligned(out); }
  static SKEWADAM_ALWAYS_INLINE void store_bits(const bits& x, std::uint32_t* out) { x.store_unaligned(out); }
  static SKEWADAM_ALWAYS_INLINE bits load_bits(const std::uint32_t* in) { return bits::load_unaligned(in); }
  static SKEWADAM_ALWAYS_INLINE B sqrt(const B& x) { return backend::cpu::ExactOps<A>::sqrt(x); }
  static SKEWADAM_ALWAYS_INLINE B floor_at(const B& x, const B& f) { return xsimd::select(x < f, f, x); }
  static SKEWADAM_ALWAYS_INLINE B broadcast(float x) { return B(x); }
  static SKEWADAM_ALWAYS_INLINE B mul_rn(const B& a, const B& b) {
    auto p = (a * b).data;
    SKEWADAM_OPAQUE_FLOAT(p);
    return B(p);
  }
};

}  // namespace skewadam::vmath

namespace skewadam::backend::cpu {

template <class Arch>
struct lanes {
  using type = xsimd::batch<float, Arch>;
  static constexpr index_t size = static_cast<index_t>(type::size);
};
template <>
struct lanes<ScalarArch> {
  using type = float;
  static constexpr index_t size = 1;
};

template <class Arch>
using vec_t = typename lanes<Arch>::type;

template <class V>
inline constexpr index_t width_v = 1;
template <class A>
inline constexpr index_t width_v<xsimd::batch<float, A>> = static_cast<index_t>(xsimd::batch<float, A>::size);

/// Loads width_v<V> elements of any dtype as fp32. 16-bit types are widened
/// in registers where the architecture has lane primitives (x86_lanes.hpp).
template <class V, class T>
SKEWADAM_ALWAYS_INLINE V load_as(const T* p) {
  if constexpr (std::is_same_v<V, float>) {
    return to_float(*p);
  } else if constexpr (std::is_same_v<T, float>) {
    return V::load_unaligned(p);
  } else {
    using Ops = LaneOps<typename V::arch_type>;
    if constexpr (std::is_same_v<T, bf16> && Ops::native) {
      return Ops::widen_bf16(reinterpret_cast<const std::uint16_t*>(p));
    } else if constexpr (std::is_same_v<T, f16> && Ops::native_f16) {
      return Ops::widen_f16(reinterpret_cast<const std::uint16_t*>(p));
    } else {
      alignas(64) float buf[width_v<V>];
      for (index_t k = 0; k < width_v<V>; ++k) buf[k] = to_float(p[k]);
      return V::load_aligned(buf);
    }
  }
}

/// Stores fp32 lanes to an fp32 buffer.
template <class V>
SKEWADAM_ALWAYS_INLINE void store_f32(float* p, const V& v) {
  if constexpr (std::is_same_v<V, float>) *p = v;
  else v.store_unaligned(p);
}

/// Sum of the lanes, left to right (a fixed order on every architecture).
template <class V>
SKEWADAM_ALWAYS_INLINE float reduce_add(const V& v) {
  if constexpr (std::is_same_v<V, float>) {
    return v;
  } else {
    alignas(64) float buf[width_v<V>];
    v.store_aligned(buf);
    float s = 0.0f;
    for (index_t k = 0; k < width_v<V>; ++k) s += buf[k];
    return s;
  }
}

/// bf16 bits of fp32 lanes, rounded as `Rounding` rounds (`words`: the
/// lanes' random bits). The two rounding policies of the library are written
/// out on integer lanes, bit for bit their scalar definitions
/// (policies/stochastic_rounding.hpp, Eigen's round-to-nearest-even):
///   stochastic: (b + bits) >> 16 (bits: 16 random bits)
///   nearest:    (b + 0x7fff + ((b >> 16) & 1)) >> 16
/// NaN and infinities, under both, are what round_nearest stores.
template <class Rounding, class U, class F>
SKEWADAM_ALWAYS_INLINE U bf16_lanes(const F& x, const std::uint32_t* words) {
  const U b = xsimd::bitwise_cast<U>(x);
  U r;
  if constexpr (std::is_same_v<Rounding, StochasticRounding>) {
    r = (b + U::load_unaligned(words)) >> 16;
  } else {
    (void)words;
    r = (b + U(0x7fffu) + ((b >> 16) & U(1u))) >> 16;
  }
  const U exp_mask(0x7f800000u);
  if (xsimd::any((b & exp_mask) == exp_mask)) [[unlikely]] {
    // Rare lanes, fixed one by one with the scalar conversion (xsimd's
    // integer select on AVX-512BW does not compile where GCC's intrinsics
    // are macros, in builds without -O).
    constexpr std::size_t n = U::size;
    alignas(64) std::uint32_t bits[n];
    alignas(64) std::uint32_t out[n];
    b.store_aligned(bits);
    r.store_aligned(out);
    for (std::size_t k = 0; k < n; ++k)
      if ((bits[k] & 0x7f800000u) == 0x7f800000u) out[k] = bits_of(round_nearest<bf16>(bits_float(bits[k])));
    r = U::load_aligned(out);
  }
  return r;
}

/// Stores new parameter values with the rule's rounding policy. `element` is
/// the index of the first lane in the tensor (it keys the random bits).
/// bf16 with the library's rounding policies is rounded on integer lanes;
/// any other policy or type goes through the policy's scalar store().
template <class Rounding, class P, class V, class Rng>
SKEWADAM_ALWAYS_INLINE void store_param(P* p, const V& v, index_t element, Rng& rng) {
  if constexpr (std::is_same_v<P, float>) {
    store_f32(p, v);
  } else if constexpr (std::is_same_v<V, float>) {
    const std::uint32_t bits = Rounding::uses_random_bits ? rng(element) : 0u;
    *p = Rounding::template store<P>(v, bits);
  } else {
    using A = typename V::arch_type;
    using U = xsimd::batch<std::uint32_t, A>;
    constexpr bool known = std::is_same_v<Rounding, StochasticRounding> || std::is_same_v<Rounding, NearestRounding>;
    const std::uint32_t* words = nullptr;
    if constexpr (Rounding::uses_random_bits) words = rng.at(element, width_v<V>);
    if constexpr (std::is_same_v<P, bf16> && known && LaneOps<A>::native) {
      LaneOps<A>::narrow_store(reinterpret_cast<std::uint16_t*>(p), bf16_lanes<Rounding, U>(v, words));
    } else {
      alignas(64) float buf[width_v<V>];
      v.store_aligned(buf);
      for (index_t k = 0; k < width_v<V>; ++k) p[k] = Rounding::template store<P>(buf[k], words ? words[k] : 0u);
    }
  }
}

/// Calls body.template operator()<V>(j) on full vectors of [begin, end) and
/// body.template operator()<float>(j) on the tail: the same per-element code
/// for both.
template <class V, class Body>
SKEWADAM_ALWAYS_INLINE void for_lanes(index_t begin, index_t end, Body&& body) {
  constexpr index_t w = width_v<V>;
  index_t j = begin;
  if constexpr (w > 1) {
    for (; j + w <= end; j += w) body.template operator()<V>(j);
  }
  for (; j < end; ++j) body.template operator()<float>(j);
}

}  // namespace skewadam::backend::cpu
