#pragma once
// The CUDA backend's kernels for one (rule, parameter dtype, gradient dtype).
// The per-element math is the rule's policies (the same SKEWADAM_HD functions
// the CPU backend calls); this file only walks memory, reduces and stores.
//
// Work is cut by shape only (WorkItem lists built when tensors are
// registered), and one launch covers every tensor of a group (tensors sharing
// a rule and dtypes), so a step is a handful of launches per group, whatever
// the number of tensors. Every reduction has a fixed order (per-block partials
// written to scratch, combined in index order; block sums by a fixed shuffle
// tree): the same inputs give the same bits on every run. No atomics.
//
// Factored rule (backbone, experts), per matrix cut into row blocks:
//   statistics  one block per row block: rows in groups of K, row sums of g^2
//               (block reduction) give R_i, column sums go to the block's
//               column partial, the momentum is updated, and when clipping,
//               D_j += n_ij^2 / R_i while the group's rows are in L1/L2 (the
//               algebra of backend/cpu/kernels.hpp: sum u^2 needs no extra
//               pass over memory).
//   vbar        one block per matrix: vbar, and (a warp per row block)
//               which row blocks hold rows where the eps floor binds.
//   columns     32 columns per block, the block's warps splitting the row
//               blocks: C_j from the column partials, 1 / col_j, and
//               sum_k D_kj / col_j^2; row blocks holding floored rows are
//               re-read for their columns and those rows' terms are formed
//               exactly (rare).
//   matrix sum  one block per matrix: sum u^2 = vbar * sum_j(...) + floored.
//   finalize    one thread per tensor: the clip divisor (tensor or matrix scope).
//   apply       one block per row block: p <- round(p * decay - n * (a_i * w_j)).
// Element-wise rule (router, rank-1 tensors, AdamW): statistics per chunk
// (and the whole update when the rule does not clip), finalize, apply.
//
// Stochastic rounding takes element e's bits from Philox block e / 4
// (random.hpp), one call per 4 consecutive elements, as the CPU does.
//
// Apart from nvcc, this header compiles with the host shim of
// tests/emulation/cuda_emulation.hpp, which runs the kernels on host threads
// (tests/emulation/test_cuda_kernels_emulated.cpp).

#if defined(__CUDACC__)
#include <cuda_runtime.h>
#endif

#include <cstdint>
#include <type_traits>

#include "../../config.hpp"
#include "../../dtype.hpp"
#include "../../hyperparameters.hpp"
#include "../../random.hpp"
#include "../../shape.hpp"
#include "../../step_scalars.hpp"
#include "../../update_rule.hpp"

namespace skewadam::backend::cuda {

/// Threads per block. A 4096 x 4096 matrix has 256 row blocks, two per SM
/// on an H100/H200: wide blocks keep enough loads in flight to cover the
/// memory latency with so few of them.
inline constexpr int block_threads = 512;
inline constexpr int block_warps = block_threads / 32;
/// Elements per statistics block of an element-wise tensor.
inline constexpr index_t chunk_elems = index_t{1} << 14;
/// Target elements per row block of a factored matrix.
inline constexpr index_t row_block_elems = index_t{1} << 16;
/// Columns per block of the columns kernel (a warp's width; the block's
/// warps split the row blocks).
inline constexpr index_t column_block = 32;

/// Per-step values of one tensor, written on the device by prepare_kernel.
struct TaskStep {
  StepScalars s{};
  RoundingKey key{};
  ClipScope scope = ClipScope::tensor;
};

/// One tensor as the kernels see it: pointers into device memory.
struct DeviceTask {
  void* param = nullptr;
  const void* grad = nullptr;  ///< null: no gradient this step (skipped)
  MatrixGeometry geom{};
  int tier = 0;
  std::uint32_t id = 0;      ///< rounding stream (FNV-1a of the name)
  index_t row_blocks = 1;    ///< factored: row blocks per matrix
  index_t chunks = 1;        ///< element-wise: chunks per matrix
  // state
  float* m = nullptr;
  float* v = nullptr;
  float* v_row = nullptr;
  float* v_col = nullptr;
  // scratch
  float* col_partial = nullptr;  ///< [B * row_blocks * c]
  float* d_partial = nullptr;    ///< [B * row_blocks * c]
  float* inv_col = nullptr;      ///< [B * c] 1 / col_j
  double* col_term = nullptr;    ///< [2 * B * c] sum_k D_kj / col_j^2, then floored rows' u^2
  int* floored = nullptr;        ///< [B * row_blocks]
  float* vbar = nullptr;         ///< [B]
  double* matrix_sum = nullptr;  ///< [B] sum u^2 per matrix
  float* divisor = nullptr;      ///< [B]
  double* chunk_sum = nullptr;   ///< [B * chunks] element-wise
};

/// A block's work: rows [begin, end) of matrix `matrix` (row block `block`),
/// elements [begin, end) of matrix `matrix` (chunk `block`), or columns
/// [begin, end) of matrix `matrix`.
struct WorkItem {
  std::int32_t task = 0;
  index_t matrix = 0;
  index_t begin = 0;
  index_t end = 0;
  index_t block = 0;
};

/// Row blocks of a factored matrix: about row_block_elems elements each.
inline index_t row_blocks_of(const MatrixGeometry& g) {
  if (g.rows <= 1) return 1;
  const index_t want = (g.matrix_size() + row_block_elems - 1) / row_block_elems;
  return want < 1 ? 1 : (want > g.rows ? g.rows : want);
}
inline index_t chunks_of(const MatrixGeometry& g) {
  const index_t n = (g.matrix_size() + chunk_elems - 1) / chunk_elems;
  return n < 1 ? 1 : n;
}

/// Hyperparameters of the three tiers, passed by value to prepare_kernel.
struct TierHyper {
  Hyperparameters h[3];
};

namespace detail {

/// Sums x[k] over the block, in a fixed order; every thread gets the totals.
/// Contains two __syncthreads(): call from every thread of the block.
template <class T, int N>
__device__ SKEWADAM_ALWAYS_INLINE void block_sum(T (&x)[N]) {
  __shared__ T part[N * block_warps];
  for (int k = 0; k < N; ++k)
    for (int off = 16; off > 0; off >>= 1) x[k] += __shfl_xor_sync(0xffffffffu, x[k], off);
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  if ((threadIdx.x & 31u) == 0)
    for (int k = 0; k < N; ++k) part[k * block_warps + warp] = x[k];
  __syncthreads();
  for (int k = 0; k < N; ++k) {
    T s = part[k * block_warps];
    for (int w = 1; w < block_warps; ++w) s += part[k * block_warps + w];
    x[k] = s;
  }
  __syncthreads();
}

}  // namespace detail

/// Forms every tensor's step scalars and rounding key on the device and
/// advances its step count, for tensors with a gradient. `lr_device`, when
/// not null, holds the three tiers' lr (so that a captured step reads it).
/// (A template only so that the header can be included by several
/// translation units.)
template <int = 0>
__global__ void prepare_kernel(const DeviceTask* tasks, TaskStep* steps, std::int64_t* counts, int n,
                               TierHyper hyper, const double* lr_device, std::uint64_t seed, double grad_scale) {
  const int k = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (k >= n) return;
  const DeviceTask& t = tasks[k];
  if (t.grad == nullptr) return;
  const std::int64_t step = counts[k] + 1;
  counts[k] = step;
  Hyperparameters h = hyper.h[t.tier];
  if (lr_device != nullptr) h.lr = lr_device[t.tier];
  steps[k].s = make_step_scalars(h, step, grad_scale);
  steps[k].key = RoundingKey{seed, t.id, static_cast<std::uint64_t>(step)};
  steps[k].scope = h.clip_scope;
}

template <class Rule, class P, class G>
struct Math {
  using M = typename Rule::momentum;
  using S = typename Rule::second_moment;
  using C = typename Rule::clip;
  using R = typename Rule::rounding;
  static constexpr bool random = R::uses_random_bits && !std::is_same_v<P, float>;

  static __device__ SKEWADAM_ALWAYS_INLINE float grad_at(const DeviceTask& t, const StepScalars& s, index_t o) {
    return to_float(static_cast<const G*>(t.grad)[o]) * s.grad_scale;
  }
  /// Numerator from the gradient and the already-updated momentum.
  static __device__ SKEWADAM_ALWAYS_INLINE float numerator_at(const DeviceTask& t, const StepScalars& s, index_t o) {
    float g = 0.0f;
    float m = 0.0f;
    if constexpr (M::numerator_reads_grad) g = grad_at(t, s, o);
    if constexpr (M::has_state) m = t.m[o];
    return M::numerator(g, m, s);
  }
  /// p <- round(p * (1 - lr wd) - step), one rounding (extension E2).
  static __device__ SKEWADAM_ALWAYS_INLINE void update_param(const DeviceTask& t, const StepScalars& s, index_t o,
                                                             float step, std::uint32_t bits) {
    P* p = static_cast<P*>(t.param) + o;
    const float pn = to_float(*p) * s.decay - step;
    *p = R::template store<P>(pn, bits);
  }
  /// Calls f(o) -> lr * u for every element o of [e0, e1) and stores the
  /// parameter; threads take aligned groups of 4 (one Philox block).
  template <class F>
  static __device__ SKEWADAM_ALWAYS_INLINE void store_range(const DeviceTask& t, const TaskStep& st, index_t e0,
                                                            index_t e1, F&& f) {
    const index_t q1 = (e1 + 3) >> 2;
    for (index_t q = (e0 >> 2) + threadIdx.x; q < q1; q += blockDim.x) {
      std::uint32_t bits[4] = {0u, 0u, 0u, 0u};
      if constexpr (random) {
        const auto blk = random_block(st.key, static_cast<std::uint64_t>(q));
        for (int l = 0; l < 4; ++l) bits[l] = blk.v[l];
      }
      for (int l = 0; l < 4; ++l) {
        const index_t o = 4 * q + l;
        if (o < e0 || o >= e1) continue;
        update_param(t, st.s, o, f(o), bits[l]);
      }
    }
  }

  // ---------------------------------------------------------- factored rule
  static constexpr int group_rows = M::has_state ? 4 : 8;

  /// K rows from row i of matrix b (see the file comment).
  template <int K>
  static __device__ void statistics_group(const DeviceTask& t, const StepScalars& s, index_t b, index_t i,
                                          float* colp, float* dp) {
    const index_t c = t.geom.cols;
    const index_t off = (b * t.geom.rows + i) * c;
    float part[K];
    for (int q = 0; q < K; ++q) part[q] = 0.0f;
    for (index_t j = threadIdx.x; j < c; j += blockDim.x) {
      float cs = colp[j];
      for (int q = 0; q < K; ++q) {
        const index_t o = off + q * c + j;
        const float g = grad_at(t, s, o);
        const float g2 = g * g;
        part[q] += g2;
        cs = cs + g2;
        if constexpr (M::has_state) t.m[o] = M::update(t.m[o], g, s);
      }
      colp[j] = cs;
    }
    float* rs = t.v_row + b * t.geom.rows + i;
    float old[K];
    for (int q = 0; q < K; ++q) old[q] = rs[q];  // read before thread 0 writes (after the barrier)
    detail::block_sum<float, K>(part);
    const float fc = static_cast<float>(c);
    float inv_r[K];
    for (int q = 0; q < K; ++q) {
      const float r = S::update_statistic(old[q], part[q] / fc, s);
      inv_r[q] = r > 0.0f ? 1.0f / r : 0.0f;
      if (threadIdx.x == 0) rs[q] = r;
    }
    if constexpr (C::active) {
      for (index_t j = threadIdx.x; j < c; j += blockDim.x) {
        float dj = dp[j];
        for (int q = 0; q < K; ++q) {
          const float n = numerator_at(t, s, off + q * c + j);
          dj = dj + n * n * inv_r[q];
        }
        dp[j] = dj;
      }
    }
  }

  static __device__ void factored_statistics(const DeviceTask& t, const StepScalars& s, const WorkItem& it) {
    const index_t c = t.geom.cols;
    const index_t slot = (it.matrix * t.row_blocks + it.block) * c;
    float* colp = t.col_partial + slot;
    float* dp = t.d_partial + slot;
    for (index_t j = threadIdx.x; j < c; j += blockDim.x) {
      colp[j] = 0.0f;
      if constexpr (C::active) dp[j] = 0.0f;
    }
    index_t i = it.begin;
    for (; i + group_rows <= it.end; i += group_rows) statistics_group<group_rows>(t, s, it.matrix, i, colp, dp);
    for (; i < it.end; ++i) statistics_group<1>(t, s, it.matrix, i, colp, dp);
  }

  static __device__ void factored_vbar(const DeviceTask& t, const StepScalars& s, index_t b) {
    const index_t r = t.geom.rows;
    const float* rs = t.v_row + b * r;
    double acc[1] = {0.0};
    for (index_t i = threadIdx.x; i < r; i += blockDim.x) acc[0] += static_cast<double>(rs[i]);
    detail::block_sum<double, 1>(acc);
    const float vbar = S::vbar(static_cast<float>(acc[0] / static_cast<double>(r)));
    if (threadIdx.x == 0) t.vbar[b] = vbar;
    if constexpr (C::active) {
      // a warp per row block (no block-wide barrier per row block)
      const index_t nb = t.row_blocks;
      const int lane = static_cast<int>(threadIdx.x & 31u);
      for (index_t k = threadIdx.x >> 5; k < nb; k += block_warps) {
        int any = 0;
        for (index_t i = r * k / nb + lane; i < r * (k + 1) / nb; i += 32)
          any |= static_cast<int>(rs[i] > 0.0f && S::row_floored(rs[i], vbar, s));
        any = __any_sync(0xffffffffu, any);
        if (lane == 0) t.floored[b * nb + k] = any;
      }
    }
  }

  /// Columns [it.begin, it.end) (at most 32) of matrix it.matrix: C_j,
  /// 1 / col_j and the clip terms. Lane l of every warp takes column
  /// begin + l; warp w takes a fixed slice of the row blocks; the slices'
  /// sums are combined in warp order.
  static __device__ void factored_columns(const DeviceTask& t, const StepScalars& s, const WorkItem& it) {
    __shared__ float s_cs[block_warps][32];
    __shared__ float s_col[32];
    __shared__ double s_dj[block_warps][32];
    __shared__ double s_fl[block_warps][32];
    const index_t r = t.geom.rows;
    const index_t c = t.geom.cols;
    const index_t nb = t.row_blocks;
    const index_t b = it.matrix;
    const int lane = static_cast<int>(threadIdx.x & 31u);
    const int warp = static_cast<int>(threadIdx.x >> 5);
    const index_t j = it.begin + lane;
    const bool active = j < it.end;
    const index_t k0 = nb * warp / block_warps;
    const index_t k1 = nb * (warp + 1) / block_warps;

    float cs = 0.0f;
    if (active)
      for (index_t k = k0; k < k1; ++k) cs += t.col_partial[(b * nb + k) * c + j];
    s_cs[warp][lane] = cs;
    __syncthreads();
    if (warp == 0 && active) {
      float sum = s_cs[0][lane];
      for (int w = 1; w < block_warps; ++w) sum += s_cs[w][lane];
      float* vc = t.v_col + b * c + j;
      const float cn = S::update_statistic(*vc, sum / static_cast<float>(r), s);
      *vc = cn;
      const float col = S::col_factor(cn, s);
      t.inv_col[b * c + j] = 1.0f / col;
      s_col[lane] = col;
    }
    if constexpr (C::active) {
      __syncthreads();
      double dj = 0.0;
      double fl = 0.0;
      if (active) {
        const float col = s_col[lane];
        const float w = 1.0f / col;
        const float vbar = t.vbar[b];
        const float* rs = t.v_row + b * r;
        for (index_t k = k0; k < k1; ++k) {
          if (!t.floored[b * nb + k]) {
            dj += static_cast<double>(t.d_partial[(b * nb + k) * c + j]);
            continue;
          }
          // recompute this block's D_kj without its floored rows, whose
          // terms are formed exactly, as apply() forms u
          float d = 0.0f;
          for (index_t i = r * k / nb; i < r * (k + 1) / nb; ++i) {
            const float ri = rs[i];
            if (!(ri > 0.0f)) continue;
            const float n = numerator_at(t, s, (b * r + i) * c + j);
            if (S::row_floored(ri, vbar, s)) {
              const float inv_row = 1.0f / S::row_factor(ri, vbar, s);
              const float u = n * (inv_row * w);
              fl += static_cast<double>(u * u);
            } else {
              d = d + n * n * (1.0f / ri);
            }
          }
          dj += static_cast<double>(d);
        }
      }
      s_dj[warp][lane] = dj;
      s_fl[warp][lane] = fl;
      __syncthreads();
      if (warp == 0 && active) {
        double dsum = s_dj[0][lane];
        double fsum = s_fl[0][lane];
        for (int w = 1; w < block_warps; ++w) {
          dsum += s_dj[w][lane];
          fsum += s_fl[w][lane];
        }
        const double cd = static_cast<double>(s_col[lane]);
        t.col_term[b * c + j] = dsum / (cd * cd);
        t.col_term[t.geom.batch * c + b * c + j] = fsum;
      }
    }
  }

  static __device__ void factored_matrix_sum(const DeviceTask& t, index_t b) {
    const index_t c = t.geom.cols;
    const double* term = t.col_term + b * c;
    const double* fl = t.col_term + t.geom.batch * c + b * c;
    double acc[2] = {0.0, 0.0};
    for (index_t j = threadIdx.x; j < c; j += blockDim.x) {
      acc[0] += term[j];
      acc[1] += fl[j];
    }
    detail::block_sum<double, 2>(acc);
    if (threadIdx.x == 0) t.matrix_sum[b] = static_cast<double>(t.vbar[b]) * acc[0] + acc[1];
  }

  static __device__ void factored_apply(const DeviceTask& t, const TaskStep& st, const WorkItem& it) {
    const StepScalars& s = st.s;
    const index_t b = it.matrix;
    const index_t r = t.geom.rows;
    const index_t c = t.geom.cols;
    const float div = C::active ? t.divisor[b] : 1.0f;
    const float vbar = t.vbar[b];
    const float* rs = t.v_row + b * r;
    const float* w = t.inv_col + b * c;
    for (index_t i = it.begin; i < it.end; ++i) {
      const float a = s.lr / (S::row_factor(rs[i], vbar, s) * div);
      const index_t row0 = (b * r + i) * c;
      store_range(t, st, row0, row0 + c,
                  [&](index_t o) { return numerator_at(t, s, o) * (a * w[o - row0]); });
    }
  }

  // ------------------------------------------------------ element-wise rule
  static __device__ void elementwise_statistics(const DeviceTask& t, const TaskStep& st, const WorkItem& it) {
    const StepScalars& s = st.s;
    const index_t base = it.matrix * t.geom.matrix_size();
    const index_t e0 = base + it.begin;
    const index_t e1 = base + it.end;
    auto update = [&](index_t o) {
      const float g = grad_at(t, s, o);
      float m = 0.0f;
      if constexpr (M::has_state) {
        m = M::update(t.m[o], g, s);
        t.m[o] = m;
      }
      const float v = S::update(t.v[o], g * g, s);
      t.v[o] = v;
      return M::numerator(g, m, s) / S::denominator(v, s);
    };
    if constexpr (C::active) {
      float acc[1] = {0.0f};
      for (index_t o = e0 + threadIdx.x; o < e1; o += blockDim.x) {
        const float u = update(o);
        acc[0] += u * u;
      }
      detail::block_sum<float, 1>(acc);
      if (threadIdx.x == 0) t.chunk_sum[it.block] = static_cast<double>(acc[0]);
    } else {
      store_range(t, st, e0, e1, [&](index_t o) { return s.lr * update(o); });
    }
  }

  static __device__ void elementwise_apply(const DeviceTask& t, const TaskStep& st, const WorkItem& it) {
    const StepScalars& s = st.s;
    const index_t base = it.matrix * t.geom.matrix_size();
    const float lr_eff = C::active ? s.lr / t.divisor[it.matrix] : s.lr;
    store_range(t, st, base + it.begin, base + it.end, [&](index_t o) {
      const float u = numerator_at(t, s, o) / S::denominator(t.v[o], s);
      return u * lr_eff;
    });
  }

  /// Clip divisors of one tensor (one thread).
  static __device__ void finalize(const DeviceTask& t, const TaskStep& st) {
    if constexpr (C::active) {
      const MatrixGeometry& g = t.geom;
      if constexpr (!S::factored) {
        for (index_t b = 0; b < g.batch; ++b) {
          double sum = 0.0;
          for (index_t k = 0; k < t.chunks; ++k) sum += t.chunk_sum[b * t.chunks + k];
          t.matrix_sum[b] = sum;
        }
      }
      if (st.scope == ClipScope::tensor) {
        double sum = 0.0;
        for (index_t b = 0; b < g.batch; ++b) sum += t.matrix_sum[b];
        const float div = C::divisor(sum, g.numel(), st.s);
        for (index_t b = 0; b < g.batch; ++b) t.divisor[b] = div;
      } else {
        for (index_t b = 0; b < g.batch; ++b) t.divisor[b] = C::divisor(t.matrix_sum[b], g.matrix_size(), st.s);
      }
    }
  }
};

// ------------------------------------------------------------------ kernels
// One block per work item; blocks of tensors without a gradient return at
// once (the whole block, before any barrier).

template <class Rule, class P, class G>
__global__ void __launch_bounds__(block_threads)
    statistics_kernel(const DeviceTask* tasks, const TaskStep* steps, const WorkItem* items) {
  using X = Math<Rule, P, G>;
  const WorkItem it = items[blockIdx.x];
  if (tasks[it.task].grad == nullptr) return;
  const DeviceTask t = tasks[it.task];  // a copy: stores through float* cannot alias it
  const TaskStep st = steps[it.task];
  if constexpr (X::S::factored) X::factored_statistics(t, st.s, it);
  else X::elementwise_statistics(t, st, it);
}

template <class Rule, class P, class G>
__global__ void __launch_bounds__(block_threads)
    vbar_kernel(const DeviceTask* tasks, const TaskStep* steps, const WorkItem* items) {
  using X = Math<Rule, P, G>;
  const WorkItem it = items[blockIdx.x];
  if (tasks[it.task].grad == nullptr) return;
  const DeviceTask t = tasks[it.task];  // a copy: stores through float* cannot alias it
  const StepScalars s = steps[it.task].s;
  X::factored_vbar(t, s, it.matrix);
}

template <class Rule, class P, class G>
__global__ void __launch_bounds__(block_threads)
    columns_kernel(const DeviceTask* tasks, const TaskStep* steps, const WorkItem* items) {
  using X = Math<Rule, P, G>;
  const WorkItem it = items[blockIdx.x];
  if (tasks[it.task].grad == nullptr) return;
  const DeviceTask t = tasks[it.task];  // a copy: stores through float* cannot alias it
  const StepScalars s = steps[it.task].s;
  X::factored_columns(t, s, it);
}

template <class Rule, class P, class G>
__global__ void __launch_bounds__(block_threads)
    matrix_sum_kernel(const DeviceTask* tasks, const WorkItem* items) {
  using X = Math<Rule, P, G>;
  const WorkItem it = items[blockIdx.x];
  if (tasks[it.task].grad == nullptr) return;
  const DeviceTask t = tasks[it.task];  // a copy: stores through float* cannot alias it
  X::factored_matrix_sum(t, it.matrix);
}

template <class Rule, class P, class G>
__global__ void finalize_kernel(const DeviceTask* tasks, const TaskStep* steps, const std::int32_t* group_tasks,
                                int n) {
  using X = Math<Rule, P, G>;
  const int k = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (k >= n) return;
  const std::int32_t task = group_tasks[k];
  const DeviceTask& t = tasks[task];
  if (t.grad == nullptr) return;
  X::finalize(t, steps[task]);
}

template <class Rule, class P, class G>
__global__ void __launch_bounds__(block_threads)
    apply_kernel(const DeviceTask* tasks, const TaskStep* steps, const WorkItem* items) {
  using X = Math<Rule, P, G>;
  const WorkItem it = items[blockIdx.x];
  if (tasks[it.task].grad == nullptr) return;
  const DeviceTask t = tasks[it.task];  // a copy: stores through float* cannot alias it
  const TaskStep st = steps[it.task];
  if constexpr (X::S::factored) X::factored_apply(t, st, it);
  else X::elementwise_apply(t, st, it);
}

}  // namespace skewadam::backend::cuda
