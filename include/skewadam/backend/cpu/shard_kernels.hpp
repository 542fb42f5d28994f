#pragma once
// The CPU kernels of one (rule, parameter dtype, gradient dtype), cut at the
// points where a sharded step (placement/sharded.hpp) exchanges partial sums
// between ranks: the statistics of a slice of rows, the finish of a matrix
// owned whole (exactly the single-process finalize), the finish of a matrix
// cut between ranks from the summed column sums and sum of R_i, and the apply
// pass. Each is the backend's own kernel (kernels.hpp) but for finish_cut,
// which is finalize_matrix with totals over ranks in place of one rank's sums.

#include "../../config.hpp"
#include "../../step_scalars.hpp"
#include "../work.hpp"
#include "kernels.hpp"

namespace skewadam::backend::cpu {

/// The CPU kernels of one (rule, parameter dtype, gradient dtype), cut at the
/// points where a sharded step exchanges partial sums.
struct ShardKernels {
  bool factored = false;
  bool clip = false;
  bool apply_pass = false;
  /// Factored: statistics of rows [r0, r1) of the task's matrix 0 into colsum, d.
  void (*rows)(const TensorTask&, index_t r0, index_t r1, float* colsum, float* d,
               Scratch scratch) = nullptr;
  /// Factored, a matrix owned whole: what the single-process backend does
  /// after the statistics pass (C_j, vbar, sum of u^2), from nb row blocks.
  void (*finalize_whole)(const TensorTask&, float* colsum, float* d, index_t nb,
                         Scratch scratch) = nullptr;
  /// Factored, a matrix cut between ranks: C_j from the summed column sums,
  /// vbar from the summed R_i, then this slice's sum of u^2 (returned).
  double (*finish_cut)(const TensorTask&, index_t rows, const float* colsum, double sum_r, float* d,
                       Scratch scratch) = nullptr;
  /// Element-wise: the statistics pass of one chunk.
  void (*elementwise)(const TensorTask&, const Unit&) = nullptr;
  /// The apply pass of one unit.
  void (*apply)(const TensorTask&, const Unit&, Scratch scratch) = nullptr;
};

template <class Rule, class P, class G, class Arch>
struct ShardKernelsOf {
  using K = Kernels<Rule, P, G, Arch>;
  using S = typename K::S;
  using C = typename K::C;

  static void rows(const TensorTask& t, index_t r0, index_t r1, float* colsum, float* d,
                   Scratch scratch) {
    if constexpr (S::factored) K::factored_rows(t, 0, r0, r1, colsum, d, scratch.d);
  }

  static void finalize_whole(const TensorTask& t, float* colsum, float* d, index_t nb,
                             Scratch scratch) {
    if constexpr (S::factored) K::finalize_matrix(t, 0, colsum, d, nb, scratch);
  }

  /// As K::finalize_matrix with one block, except that the column sums and
  /// the sum of R_i are totals over every rank's slice of a matrix of `rows`
  /// rows, and the returned sum of u^2 is this slice's share.
  static double finish_cut(const TensorTask& t, index_t rows, const float* colsum, double sum_r, float* d,
                           Scratch scratch) {
    if constexpr (S::factored) {
      const typename K::Ctx x(t);
      const StepScalars& s = x.s;
      const index_t c = x.cols;
      const float fr = static_cast<float>(rows);
      float* cs = t.v_col;
      for (index_t j = 0; j < c; ++j) cs[j] = S::update_statistic(cs[j], colsum[j] / fr, s);
      const float vbar = S::vbar(static_cast<float>(sum_r / static_cast<double>(rows)));
      t.matrices[0].vbar = vbar;
      if constexpr (C::active) {
        const float* rs = t.v_row;
        const index_t r = t.geom.rows;  // this slice's rows
        bool any = false;
        for (index_t i = 0; i < r && !any; ++i) any = rs[i] > 0.0f && S::row_floored(rs[i], vbar, s);
        double floored_sum = 0;
        if (any) {
          K::inverse_col_factors(t, x, 0, scratch.f);
          floored_sum = K::floored_rows(t, x, 0, 0, r, vbar, scratch.f, d, scratch.d);
        }
        double sum = 0;
        for (index_t j = 0; j < c; ++j) {
          const double col = static_cast<double>(S::col_factor(cs[j], s));
          sum += static_cast<double>(d[j]) / (col * col);
        }
        return static_cast<double>(vbar) * sum + floored_sum;
      }
    }
    return 0.0;
  }

  static void elementwise(const TensorTask& t, const Unit& u) {
    if constexpr (!S::factored) K::elementwise_statistics(t, u);
  }

  static void apply(const TensorTask& t, const Unit& u, Scratch scratch) {
    if constexpr (S::factored || C::active) K::apply(t, u, scratch);
  }

  static const ShardKernels* table() {
    static constexpr ShardKernels k{S::factored, C::active, S::factored || C::active, &rows, &finalize_whole,
                                    &finish_cut,  &elementwise, &apply};
    return &k;
  }
};

}  // namespace skewadam::backend::cpu
