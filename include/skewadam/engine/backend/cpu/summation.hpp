#pragma once
// Blocked summation for the CPU kernels. Every reduction of a step (row sums
// of g^2, column sums, the clip's D_j and sum of u^2, the sum of R_i, the
// global gradient norm) is formed so that its error does not grow with the
// length summed, on every architecture.
//
// Error bound
// -----------
// Terms are added into fp32 lanes in blocks of at most sum_block = 64 terms
// per lane; at the end of each block the lanes are added, in double, to a
// double total. Column sums (across rows) are blocked the same way: 64 rows
// into an fp32 array, which is then folded into a double array. Every sum of
// the optimizer has non-negative terms (squares, or squares over a positive
// R_i), so with S the exact sum of n terms, w lanes and u = 2^-24:
//
//   |computed - S| <= [ (sum_block - 1) u  +  (n / (sum_block w) + w) 2^-53 ] S  (+ u S when rounded to fp32)
//                  <= 65 u S  (3.9e-6 S)        for every n <= 2^35 w,
//
// whatever the row or column length. A single fp32 accumulator per lane has
// the bound (n / w) u S instead, which grows with the length and with
// narrower SIMD: 5792 u (3.5e-4) for a row of 46341 elements on AVX2's 8
// lanes, 2896 u on AVX-512's 16; in practice that put R_i 1.2e-5 away from
// the exact value on AVX2 (tests/large/test_huge_tensor.cpp). The typical error is about
// sqrt(sum_block) u = 5e-7 for the blocked sums.
//
// Sums of double terms (sum of R_i, the global gradient norm) are blocked too:
// blocks of wide_block terms, each block's sum added to a double total,
// bound (wide_block + n / wide_block) 2^-53 S.
//
// The order of every sum depends on the shape and the architecture only,
// never on the number of threads.

#include <algorithm>

#include "../../../detail/config.hpp"
#include "../../../types/dtype.hpp"
#include "../../../types/tensor_view.hpp"
#include "simd.hpp"

namespace skewadam::backend::cpu {

/// Terms per fp32 lane (or rows, for column sums) in one block.
inline constexpr index_t sum_block = 64;
/// Terms per block of a double sum.
inline constexpr index_t wide_block = 4096;

/// Sum of the lanes in double, left to right.
template <class V>
SKEWADAM_ALWAYS_INLINE double reduce_add_wide(const V& v) {
  if constexpr (std::is_same_v<V, float>) {
    return static_cast<double>(v);
  } else {
    alignas(64) float buf[width_v<V>];
    v.store_aligned(buf);
    double s = 0.0;
    for (index_t k = 0; k < width_v<V>; ++k) s += static_cast<double>(buf[k]);
    return s;
  }
}

/// A blocked sum: add() terms (full vectors or tail elements) into fp32
/// lanes, fold() at the end of each block (for_blocks calls it), sum() at
/// the end.
template <class V>
struct BlockedSum {
  V lanes = vmath::splat<V>(0.0f);
  float tail = 0.0f;
  double total = 0.0;
  template <class W>
  SKEWADAM_ALWAYS_INLINE void add(const W& x) {
    if constexpr (std::is_same_v<W, V>) lanes += x;
    else tail += x;
  }
  SKEWADAM_ALWAYS_INLINE void fold() {
    total += reduce_add_wide(lanes) + static_cast<double>(tail);
    lanes = vmath::splat<V>(0.0f);
    tail = 0.0f;
  }
  double sum() const { return total + reduce_add_wide(lanes) + static_cast<double>(tail); }
};

/// for_lanes over [begin, end) in blocks of sum_block vectors, calling
/// fold() after each block.
template <class V, class Body, class Fold>
SKEWADAM_ALWAYS_INLINE void for_blocks(index_t begin, index_t end, Body&& body, Fold&& fold) {
  constexpr index_t span = sum_block * width_v<V>;
  for (index_t j = begin; j < end; j += span) {
    for_lanes<V>(j, std::min(end, j + span), body);
    fold();
  }
}

/// wide[j] += part[j], part[j] = 0 for j < n: the end of a block of rows.
inline void fold_columns(float* part, double* wide, index_t n) {
  for (index_t j = 0; j < n; ++j) {
    wide[j] += static_cast<double>(part[j]);
    part[j] = 0.0f;
  }
}

/// out[j] = wide[j] rounded to fp32.
inline void round_columns(const double* wide, float* out, index_t n) {
  for (index_t j = 0; j < n; ++j) out[j] = static_cast<float>(wide[j]);
}

/// sum_{i < n} term(i) in double, blocked.
template <class Term>
double wide_sum(index_t n, Term&& term) {
  double total = 0.0;
  for (index_t i0 = 0; i0 < n; i0 += wide_block) {
    const index_t i1 = std::min(n, i0 + wide_block);
    double s = 0.0;
    for (index_t i = i0; i < i1; ++i) s += term(i);
    total += s;
  }
  return total;
}

/// Sum of squares of elements [first, first + n) of a gradient in host
/// memory (all of it by default), in double, blocked: the global gradient
/// norm's terms (E6).
inline double grad_sum_squares(const GradView& g, index_t first = 0, index_t n = -1) {
  if (n < 0) n = g.numel() - first;
  const auto squares = [&]<class T>(const T* x) {
    return wide_sum(n, [x](index_t i) {
      const double v = static_cast<double>(to_float(x[i]));
      return v * v;
    });
  };
  switch (g.dtype) {
    case Dtype::bf16: return squares(g.as<bf16>() + first);
    case Dtype::f16: return squares(g.as<f16>() + first);
    case Dtype::f32: break;
  }
  return squares(g.as<float>() + first);
}

}  // namespace skewadam::backend::cpu
