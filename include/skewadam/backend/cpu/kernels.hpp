#pragma once
// The CPU backend's loops for one (rule, parameter dtype, gradient dtype,
// architecture). The math comes from the rule's policies; this file only walks
// memory, reduces and stores.
//
// Passes over memory
// ------------------
// Element-wise second moment (router, rank-1 tensors, AdamW):
//   statistics: read g (m, V), write m, V, accumulate sum(u^2) per chunk.
//               Without clipping this pass also writes p: one pass in all.
//   apply:      read g or m, V, p; write p.
// Factored second moment (backbone, experts):
//   statistics: read g (and m) once, write m; row sums give R_i, column sums
//               give C_j. The clip's sum(u^2) is accumulated in the same pass:
//   apply:      read g or m, p; write p.
//
// Why sum(u^2) needs no extra pass (factored)
// -------------------------------------------
// u_ij = n_ij / (row_i col_j), with n the numerator (g sqrt(bc2), or m scaled),
// row_i^2 = max(R_i / vbar, eps) and col_j^2 = max(C_j, eps). For a row where
// the floor does not bind, 1 / row_i^2 = vbar / R_i, so
//   sum_ij u_ij^2 = sum_j (1 / col_j^2) * ( vbar * D_j + sum_{i floored} n_ij^2 / (eps) )
//   with D_j = sum_{i not floored} n_ij^2 / R_i.
// R_i is final as soon as row i has been read, so n_ij^2 / R_i is added to D_j
// while row i is still in cache (rows with R_i = 0 have n = 0 and add nothing).
// vbar and C_j are known only after the last row, which is when the sum is
// formed. Which rows are floored (R_i < eps * vbar) is known only then too:
// those rows are rare, and the row blocks that contain one are re-read, their
// D partial recomputed without them, and their own terms added exactly,
// element by element, as the apply pass will compute them. The result equals
// the direct sum up to rounding order; tests/unit/test_cpu_backend.cpp checks
// it against a three-pass implementation, floored rows included.
//
// Determinism: the work is cut by shape (backend/work.hpp); per-unit partials
// are combined in unit order, so the bits do not depend on thread count.

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "../../config.hpp"
#include "../../update_rule.hpp"
#include "../work.hpp"
#include "simd.hpp"

namespace skewadam::backend::cpu {

template <class Rule, class P, class G, class Arch>
struct Kernels {
  using V = vec_t<Arch>;
  using M = typename Rule::momentum;
  using S = typename Rule::second_moment;
  using C = typename Rule::clip;
  using R = typename Rule::rounding;

  static const KernelTable* table() {
    static constexpr KernelTable t{&statistics, &finalize, (S::factored || C::active) ? &apply : nullptr};
    return &t;
  }

  // ----------------------------------------------------------- element access
  template <class W>
  static SKEWADAM_ALWAYS_INLINE W grad_at(const TensorTask& t, index_t off) {
    return load_as<W>(static_cast<const G*>(t.grad) + off) * vmath::splat<W>(t.scalars.grad_scale);
  }

  /// Numerator from the gradient and the already-updated momentum.
  template <class W>
  static SKEWADAM_ALWAYS_INLINE W numerator_at(const TensorTask& t, index_t off) {
    W g = vmath::splat<W>(0.0f);
    W m = vmath::splat<W>(0.0f);
    if constexpr (M::numerator_reads_grad) g = grad_at<W>(t, off);
    if constexpr (M::has_state) m = load_as<W>(t.m + off);
    return M::numerator(g, m, t.scalars);
  }

  /// p <- round(p * (1 - lr wd) - lr u), one rounding (extension E2).
  template <class W>
  static SKEWADAM_ALWAYS_INLINE void update_param(const TensorTask& t, index_t off, const W& u, RandomStream& rng) {
    P* p = static_cast<P*>(t.param) + off;
    const W pn = load_as<W>(p) * vmath::splat<W>(t.scalars.decay) - vmath::splat<W>(t.scalars.lr) * u;
    store_param<R>(p, pn, off, rng);
  }

  // ------------------------------------------------------- element-wise rule
  static void elementwise_statistics(const TensorTask& t, const Unit& unit) {
    const StepScalars& s = t.scalars;
    const index_t base = unit.matrix * t.geom.matrix_size();
    Accumulator<V> acc;
    RandomStream rng(t.key);
    for_lanes<V>(base + unit.begin, base + unit.end, [&]<class W>(index_t off) {
      const W g = grad_at<W>(t, off);
      W m = vmath::splat<W>(0.0f);
      if constexpr (M::has_state) {
        m = M::update(load_as<W>(t.m + off), g, s);
        store_f32(t.m + off, m);
      }
      const W v = S::update(load_as<W>(t.v + off), g * g, s);
      store_f32(t.v + off, v);
      const W u = M::numerator(g, m, s) / S::denominator(v, s);
      if constexpr (C::active) acc.add(u * u);
      else update_param(t, off, u, rng);
    });
    if constexpr (C::active) t.unit_sum[unit.block] = static_cast<double>(acc.total());
  }

  static void elementwise_apply(const TensorTask& t, const Unit& unit) {
    const StepScalars& s = t.scalars;
    const index_t base = unit.matrix * t.geom.matrix_size();
    const float div = t.matrices[unit.matrix].divisor;
    RandomStream rng(t.key);
    for_lanes<V>(base + unit.begin, base + unit.end, [&]<class W>(index_t off) {
      W u = numerator_at<W>(t, off) / S::denominator(load_as<W>(t.v + off), s);
      if constexpr (C::active) u = u / vmath::splat<W>(div);
      update_param(t, off, u, rng);
    });
  }

  // ---------------------------------------------------------- factored rule
  /// D_j += n_ij^2 / R_i over one row.
  static void accumulate_d(const TensorTask& t, index_t off, float inv_r, float* d) {
    for_lanes<V>(0, t.geom.cols, [&]<class W>(index_t j) {
      const W n = numerator_at<W>(t, off + j);
      store_f32(d + j, load_as<W>(d + j) + n * n * vmath::splat<W>(inv_r));
    });
  }

  /// sum_j u_ij^2 of one row, exactly as apply() computes u (before clipping).
  static double row_sum_u2(const TensorTask& t, index_t b, index_t i, float vbar) {
    const StepScalars& s = t.scalars;
    const index_t c = t.geom.cols;
    const index_t off = (b * t.geom.rows + i) * c;
    const float row = S::row_factor(t.v_row[b * t.geom.rows + i], vbar, s);
    Accumulator<V> acc;
    for_lanes<V>(0, c, [&]<class W>(index_t j) {
      const W col = S::col_factor(load_as<W>(t.v_col + b * c + j), s);
      const W u = numerator_at<W>(t, off + j) / S::denominator(vmath::splat<W>(row), col);
      acc.add(u * u);
    });
    return static_cast<double>(acc.total());
  }

  /// Statistics of rows [r0, r1) of matrix b: R_i (final), column sums of g^2
  /// into colsum, the momentum update, and D_j into d when clipping.
  static void factored_rows(const TensorTask& t, index_t b, index_t r0, index_t r1, float* colsum, float* d) {
    const StepScalars& s = t.scalars;
    const index_t r = t.geom.rows;
    const index_t c = t.geom.cols;
    const float fc = static_cast<float>(c);
    for (index_t i = r0; i < r1; ++i) {
      const index_t off = (b * r + i) * c;
      Accumulator<V> acc;
      for_lanes<V>(0, c, [&]<class W>(index_t j) {
        const W g = grad_at<W>(t, off + j);
        const W g2 = g * g;
        acc.add(g2);
        store_f32(colsum + j, load_as<W>(colsum + j) + g2);
        if constexpr (M::has_state) store_f32(t.m + off + j, M::update(load_as<W>(t.m + off + j), g, s));
      });
      float& ri = t.v_row[b * r + i];
      ri = S::update_statistic(ri, acc.total() / fc, s);
      if constexpr (C::active) {
        if (ri > 0.0f) accumulate_d(t, off, 1.0f / ri, d);
      }
    }
  }

  /// Finishes matrix b from nb row-block partials (colsum[k*c..], d[k*c..]):
  /// C_j, vbar, and sum(u^2) with floored rows handled exactly.
  static void finalize_matrix(const TensorTask& t, index_t b, float* colsum, float* d, index_t nb) {
    const StepScalars& s = t.scalars;
    const index_t r = t.geom.rows;
    const index_t c = t.geom.cols;
    const float fr = static_cast<float>(r);
    for (index_t k = 1; k < nb; ++k)
      for (index_t j = 0; j < c; ++j) colsum[j] += colsum[k * c + j];
    float* cs = t.v_col + b * c;
    for (index_t j = 0; j < c; ++j) cs[j] = S::update_statistic(cs[j], colsum[j] / fr, s);

    const float* rs = t.v_row + b * r;
    double sum_r = 0;
    for (index_t i = 0; i < r; ++i) sum_r += rs[i];
    const float vbar = S::vbar(static_cast<float>(sum_r / static_cast<double>(r)));
    MatrixScratch& ms = t.matrices[b];
    ms.vbar = vbar;
    if constexpr (C::active) {
      double floored_sum = 0;
      for (index_t k = 0; k < nb; ++k) {
        const index_t i0 = r * k / nb;
        const index_t i1 = r * (k + 1) / nb;
        bool any = false;
        for (index_t i = i0; i < i1 && !any; ++i) any = rs[i] > 0.0f && S::row_floored(rs[i], vbar, s);
        if (!any) continue;
        float* dk = d + k * c;
        std::fill(dk, dk + c, 0.0f);
        for (index_t i = i0; i < i1; ++i) {
          if (!(rs[i] > 0.0f)) continue;
          if (S::row_floored(rs[i], vbar, s)) floored_sum += row_sum_u2(t, b, i, vbar);
          else accumulate_d(t, (b * r + i) * c, 1.0f / rs[i], dk);
        }
      }
      double sum = 0;
      for (index_t j = 0; j < c; ++j) {
        double dj = 0;
        for (index_t k = 0; k < nb; ++k) dj += static_cast<double>(d[k * c + j]);
        const double col = static_cast<double>(S::col_factor(cs[j], s));
        sum += dj / (col * col);
      }
      ms.sum_u2 = static_cast<double>(vbar) * sum + floored_sum;
    }
  }

  static void factored_apply(const TensorTask& t, const Unit& unit) {
    const StepScalars& s = t.scalars;
    const index_t b = unit.matrix;
    const index_t r = t.geom.rows;
    const index_t c = t.geom.cols;
    const MatrixScratch& ms = t.matrices[b];
    const float* cs = t.v_col + b * c;
    RandomStream rng(t.key);
    for (index_t i = unit.begin; i < unit.end; ++i) {
      const index_t off = (b * r + i) * c;
      const float row = S::row_factor(t.v_row[b * r + i], ms.vbar, s);
      for_lanes<V>(0, c, [&]<class W>(index_t j) {
        const W col = S::col_factor(load_as<W>(cs + j), s);
        W u = numerator_at<W>(t, off + j) / S::denominator(vmath::splat<W>(row), col);
        if constexpr (C::active) u = u / vmath::splat<W>(ms.divisor);
        update_param(t, off + j, u, rng);
      });
    }
  }

  // ------------------------------------------------------------ the table
  static void statistics(const TensorTask& t, const Unit& unit, float* scratch) {
    if constexpr (S::factored) {
      const index_t c = t.geom.cols;
      if (t.row_blocks > 1) {
        float* col = t.col_partial + unit.block * c;
        float* d = t.d_partial + unit.block * c;
        std::fill(col, col + c, 0.0f);
        std::fill(d, d + c, 0.0f);
        factored_rows(t, unit.matrix, unit.begin, unit.end, col, d);
      } else {
        float* col = scratch;
        float* d = scratch + c;
        std::fill(col, col + 2 * c, 0.0f);
        factored_rows(t, unit.matrix, 0, t.geom.rows, col, d);
        finalize_matrix(t, unit.matrix, col, d, 1);
      }
    } else {
      (void)scratch;
      elementwise_statistics(t, unit);
    }
  }

  static void finalize(const TensorTask& t) {
    const MatrixGeometry& g = t.geom;
    if constexpr (S::factored) {
      if (t.row_blocks > 1) finalize_matrix(t, 0, t.col_partial, t.d_partial, t.row_blocks);
    } else if constexpr (C::active) {
      const index_t nc = t.chunks_per_matrix;
      for (index_t b = 0; b < g.batch; ++b) {
        double sum = 0;
        for (index_t k = 0; k < nc; ++k) sum += t.unit_sum[b * nc + k];
        t.matrices[b].sum_u2 = sum;
      }
    }
    if constexpr (C::active) {
      if (t.scope == ClipScope::tensor) {
        double sum = 0;
        for (index_t b = 0; b < g.batch; ++b) sum += t.matrices[b].sum_u2;
        const float div = C::divisor(sum, g.numel(), t.scalars);
        for (index_t b = 0; b < g.batch; ++b) t.matrices[b].divisor = div;
      } else {
        for (index_t b = 0; b < g.batch; ++b)
          t.matrices[b].divisor = C::divisor(t.matrices[b].sum_u2, g.matrix_size(), t.scalars);
      }
    }
  }

  static void apply(const TensorTask& t, const Unit& unit) {
    if constexpr (S::factored) factored_apply(t, unit);
    else elementwise_apply(t, unit);
  }
};

}  // namespace skewadam::backend::cpu
