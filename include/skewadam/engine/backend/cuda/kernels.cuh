#pragma once
// The CUDA backend's kernels for one (rule, parameter dtype, gradient dtype).
// The per-element math is the rule's policies (the same SKEWADAM_HD functions
// the CPU backend calls); this file only walks memory, reduces and stores.
//
// The task layout the kernels are handed (DeviceTask, TaskStep, the launch
// shapes; task.hpp) and their units of work (WorkUnit, ../work_unit.hpp) are
// plain data. Work is cut by shape only (WorkUnit lists built when tensors
// are registered), and one launch covers every tensor of a group (tensors
// sharing a rule and dtypes), so a step is a handful of launches per group,
// whatever the number of tensors. Every reduction has a fixed order
// (per-block partials written to scratch, combined in index order; block sums
// by a fixed shuffle tree): the same inputs give the same bits on every run.
// The only atomics are counters that tell a matrix's last block to finish;
// they choose which block forms a sum, never the order of its terms.
//
// Error bounds (non-negative terms, S the exact sum, u = 2^-24), none of
// which grows with the length summed:
//   row sums of g^2   each thread adds at most sum_block terms in fp32 before
//                     folding them into a double; the block then adds its
//                     threads' sums by a 5-level shuffle tree and its 16
//                     warps in order: <= (sum_block + 5 + 16 + 1) u S = 86 u S
//   column sums       a group of at most 8 rows in fp32, folded into its row
//                     block's partial in double; the row blocks' partials
//                     added in double: <= 10 u S
//   D_j, sum u^2      the same groups and row blocks, then double throughout
//
// Scratch. A factored matrix's row blocks write their column partials (c
// doubles, and c more for the clip's D_j) to a workspace of the group, not
// of the tensor: the group's matrices share statistics_blocks row blocks
// (each at least one, and at most row_blocks_of() of its shape: rows of
// row_block_elems elements), in proportion to their elements (passes.hpp
// plans them). So the workspace is about statistics_blocks partials of the
// widest matrix, plus one per matrix, whatever the model's size, and each
// tensor keeps O(B (r + c)) scratch of its own (scratch_sizes()). A
// matrix's cut, and with it the order its column sums are added in, depends
// on its shape and on the sizes of the group's tensors (the whole tensors in
// a sharded placement), never on the rank count or which rank owns it.
//
// Factored rule (backbone, experts), per matrix cut into row blocks:
//   statistics  one block per row block: rows in groups of K, row sums of g^2
//               (block reduction) give R_i, column sums go to the block's
//               column partial, the momentum is updated, and when clipping,
//               D_j += n_ij^2 / R_i while the group's rows are in L1/L2 (the
//               algebra of engine/backend/cpu/kernels.hpp: sum u^2 needs no extra
//               pass over memory).
//   columns     32 columns per block, the block's warps splitting the row
//               blocks: vbar (every block sums the matrix's R_i in the same
//               order, so all get the same value), C_j from the column
//               partials, 1 / col_j, and sum_k D_kj / col_j^2; when the eps
//               floor binds on some row, the row blocks holding such rows
//               are re-read for their columns and those rows' terms are
//               formed exactly (rare). The last block of a matrix to finish
//               (a counter, reset by that block) forms the matrix's
//               sum u^2 = vbar * sum_j(...) + floored, in column order; the
//               last matrix of a tensor forms the clip divisors.
//   (sharded)   a piece of a matrix cut between ranks (shard_sums): after
//               the statistics, shard_sums_kernel forms this rank's column
//               sums and sum of R_i; the placement exchanges them, and the
//               columns pass forms C_j and vbar from the totals
//   apply       one block per row block, last row first (so that the second
//               read of the gradient finds the rows the statistics pass read
//               last still in L2): p <- round(p * decay - n * (a_i * w_j)).
// Rows whose length is a multiple of 4, on aligned parameters and gradients,
// are walked in quads: one 16-byte (fp32) or 8-byte (bf16, fp16) access per
// array per 4 elements, several quads' loads issued before the first use.
// Element-wise rule (router, rank-1 tensors, AdamW): statistics per chunk
// (and the whole update when the rule does not clip), finalize (one block
// per tensor: its matrices' sums of u^2 from the chunks', in parallel, and
// the clip divisors), apply.
//
// Stochastic rounding takes element e's 16 bits from Philox block e / 8
// (random.hpp), as the CPU does, and every block is evaluated once: the
// element-wise store and the factored apply take aligned groups of 8
// elements per thread (the factored apply's as two quads).
//
// Momentum stored in fewer bits (Bf16Momentum, Float8BlockMomentum,
// Int8BlockMomentum; the blocks of state_layout.hpp) is updated by a pass of
// its own before the statistics (momentum_kernel): a warp per block of 256
// elements, 8 per lane, the block's largest finite |m'| by a shuffle tree
// (32 random bits per element from two streams for the maps that read
// them); the statistics and the update then read the stored values,
// decoded. The gradient is read once more for those tensors (the
// backbone's, 5 % of an MoE's parameters).
//
// Apart from nvcc, this header compiles with the host shim of
// tools/common/skewadam_tools/cuda_emulation.hpp, which runs the kernels on
// the host (the emulated runtime of the tests and skewadam-replay
// --backend cuda-emulated).

#if defined(__CUDACC__)
#include <cuda_runtime.h>
#endif

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../../../detail/config.hpp"
#include "../../../math/hyperparameters.hpp"
#include "../../../math/random.hpp"
#include "../../../math/step_scalars.hpp"
#include "../../../rules/clip_divisors.hpp"
#include "../../../rules/update_rule.hpp"
#include "../../../types/dtype.hpp"
#include "../../../types/shape.hpp"
#include "task.hpp"

namespace skewadam::backend::cuda {

namespace detail {

/// The shared memory block_sum works in, given by its caller (a __shared__
/// object, as CUB's TempStorage is), so that a kernel declares every byte of
/// shared memory it uses.
template <class T, int N>
struct BlockSumRoom {
  T part[N * block_warps];
};

/// Sums x[k] over the block, in a fixed order; every thread gets the totals.
/// Contains two __syncthreads(): call from every thread of the block.
template <class T, int N>
__device__ SKEWADAM_ALWAYS_INLINE void block_sum(T (&x)[N], BlockSumRoom<T, N>& room) {
  T* part = room.part;
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

/// wide[k] += part[k], part[k] = 0: the end of a block of a thread's terms.
template <int N>
__device__ SKEWADAM_ALWAYS_INLINE void fold(float (&part)[N], double (&wide)[N]) {
  for (int k = 0; k < N; ++k) {
    wide[k] += static_cast<double>(part[k]);
    part[k] = 0.0f;
  }
}
/// part[k] = wide[k] rounded to fp32.
template <int N>
__device__ SKEWADAM_ALWAYS_INLINE void round_into(const double (&wide)[N], float (&part)[N]) {
  for (int k = 0; k < N; ++k) part[k] = static_cast<float>(wide[k]);
}

/// Four consecutive elements, loaded or stored as one access (of 4 x sizeof(T)
/// bytes; p must be aligned to that: a GPU faults otherwise, and the host
/// emulation reports it, cuda_emulation.hpp).
template <class T>
struct alignas(4 * sizeof(T)) Quad {
  T v[4];
};
template <class T>
__device__ SKEWADAM_ALWAYS_INLINE Quad<T> load_quad(const T* p) {
#if defined(SKEWADAM_CUDA_EMULATION)
  emu::check_aligned(p, sizeof(Quad<T>));
  Quad<T> q;
  __builtin_memcpy(static_cast<void*>(&q), static_cast<const void*>(p), sizeof q);
  return q;
#else
  return *reinterpret_cast<const Quad<T>*>(p);
#endif
}
template <class T>
__device__ SKEWADAM_ALWAYS_INLINE void store_quad(T* p, const Quad<T>& q) {
#if defined(SKEWADAM_CUDA_EMULATION)
  emu::check_aligned(p, sizeof(Quad<T>));
  __builtin_memcpy(static_cast<void*>(p), static_cast<const void*>(&q), sizeof q);
#else
  *reinterpret_cast<Quad<T>*>(p) = q;
#endif
}
__device__ SKEWADAM_ALWAYS_INLINE bool aligned_to(const void* p, std::size_t n) {
  return reinterpret_cast<std::uintptr_t>(p) % n == 0;
}

}  // namespace detail

template <class Rule, class P, class G>
struct Math {
  using M = typename Rule::momentum;
  using S = typename Rule::second_moment;
  using C = typename Rule::clip;
  using R = typename Rule::rounding;
  static constexpr bool random = R::uses_random_bits && !std::is_same_v<P, float>;
  /// How m is stored; `stored`: in fewer bits, in blocks (state_layout.hpp).
  static constexpr MomentumStorage storage = M::has_state ? momentum_storage_v<M> : MomentumStorage::f32;
  static constexpr bool stored = storage != MomentumStorage::f32;
  static constexpr index_t code_block_words = momentum_block_words(MomentumStorage::int8_blocks, momentum_block);

  static __device__ SKEWADAM_ALWAYS_INLINE float grad_at(const DeviceTask& t, const StepScalars& s, index_t o) {
    return to_float(static_cast<const G*>(t.grad)[o]) * s.grad_scale;
  }
  /// Stored momentum: the first word of matrix b's momentum.
  static __device__ SKEWADAM_ALWAYS_INLINE float* momentum_of(const DeviceTask& t, index_t b) {
    return t.m + b * momentum_matrix_words(storage, t.geom.matrix_size());
  }
  /// The momentum of element o (of matrix b), decoded.
  static __device__ SKEWADAM_ALWAYS_INLINE float momentum_at(const DeviceTask& t, index_t b, index_t o) {
    if constexpr (!stored) {
      (void)b;
      return t.m[o];
    } else {
      const index_t e = o - b * t.geom.matrix_size();
      const float* w = momentum_of(t, b);
      if constexpr (storage == MomentumStorage::bfloat16) {
        return M::decode(reinterpret_cast<const bf16*>(w)[e]);
      } else {
        const float* blk = w + e / momentum_block * code_block_words;
        return M::decode(reinterpret_cast<const std::uint8_t*>(blk + 1)[e % momentum_block], blk[0]);
      }
    }
  }
  /// Numerator from the gradient and the already-updated momentum (element o
  /// of matrix b).
  static __device__ SKEWADAM_ALWAYS_INLINE float numerator_at(const DeviceTask& t, const StepScalars& s, index_t b,
                                                              index_t o) {
    float g = 0.0f;
    float m = 0.0f;
    if constexpr (M::numerator_reads_grad) g = grad_at(t, s, o);
    if constexpr (M::has_state) m = momentum_at(t, b, o);
    return M::numerator(g, m, s);
  }
  /// Whether the matrix rows of t can be walked in aligned quads.
  static __device__ SKEWADAM_ALWAYS_INLINE bool quads_ok(const DeviceTask& t) {
    return t.geom.cols % 4 == 0 && t.element_base % 4 == 0 && detail::aligned_to(t.param, 4 * sizeof(P)) &&
           detail::aligned_to(t.grad, 4 * sizeof(G));
  }
  static __device__ SKEWADAM_ALWAYS_INLINE detail::Quad<float> grad_quad(const DeviceTask& t, const StepScalars& s,
                                                                         index_t o) {
    const detail::Quad<G> g = detail::load_quad(static_cast<const G*>(t.grad) + o);
    detail::Quad<float> out;
    for (int l = 0; l < 4; ++l) out.v[l] = to_float(g.v[l]) * s.grad_scale;
    return out;
  }
  /// numerator_at for the 4 elements from o of matrix b (o a multiple of 4,
  /// quads_ok: stored momentum's 4 are in one block).
  static __device__ SKEWADAM_ALWAYS_INLINE detail::Quad<float> numerator_quad(const DeviceTask& t,
                                                                              const StepScalars& s, index_t b,
                                                                              index_t o) {
    detail::Quad<float> g{}, m{};
    if constexpr (M::numerator_reads_grad) g = grad_quad(t, s, o);
    if constexpr (M::has_state && !stored) m = detail::load_quad(t.m + o);
    if constexpr (stored)
      for (int l = 0; l < 4; ++l) m.v[l] = momentum_at(t, b, o + l);
    detail::Quad<float> n;
    for (int l = 0; l < 4; ++l) n.v[l] = M::numerator(g.v[l], m.v[l], s);
    return n;
  }
  /// p <- round(p * (1 - lr wd) - step), one rounding (extension E2).
  static __device__ SKEWADAM_ALWAYS_INLINE void update_param(const DeviceTask& t, const StepScalars& s, index_t o,
                                                             float step, std::uint32_t bits) {
    P* p = static_cast<P*>(t.param) + o;
    const float pn = to_float(*p) * s.decay - step;
    *p = R::template store<P>(pn, bits);
  }
  /// Calls f(o) -> lr * u for every element o of [e0, e1) and stores the
  /// parameter; threads take aligned groups of 8 (one Philox block).
  template <class F>
  static __device__ SKEWADAM_ALWAYS_INLINE void store_range(const DeviceTask& t, const TaskStep& st, index_t e0,
                                                            index_t e1, F&& f) {
    // groups of the whole tensor's elements (element_base + o), so that a
    // piece's rounding bits are those of the same elements in one process
    constexpr int n = static_cast<int>(elements_per_block);
    const index_t base = t.element_base;
    const index_t q1 = (base + e1 + n - 1) / n;
    for (index_t q = (base + e0) / n + threadIdx.x; q < q1; q += blockDim.x) {
      std::uint32_t bits[n] = {};
      if constexpr (random) {
        const auto blk = random_block(st.key, static_cast<std::uint64_t>(q));
        for (int l = 0; l < n; ++l) bits[l] = block_bits(blk, static_cast<std::uint64_t>(l));
      }
      for (int l = 0; l < n; ++l) {
        const index_t o = n * q + l - base;
        if (o < e0 || o >= e1) continue;
        update_param(t, st.s, o, f(o), bits[l]);
      }
    }
  }

  // ---------------------------------------------------------- factored rule
  static constexpr int group_rows = M::has_state ? 4 : 8;
  /// Rows per group of the quad walk: a group's gradient rows must still be
  /// in L1 when the clip's sum re-reads them (4 rows of fp32, 8 of bf16/fp16
  /// for a 4096-column matrix make 64 KB per block).
  static constexpr int group_rows_quads = M::has_state || sizeof(G) == 4 ? 4 : 8;

  /// Rows i ... i + K - 1 of matrix b: R from the block's sums of g^2 (part,
  /// this thread's share), and 1 / R for the clip's D. Call from every thread.
  template <int K>
  static __device__ SKEWADAM_ALWAYS_INLINE void update_rows(const DeviceTask& t, const StepScalars& s, index_t b,
                                                            index_t i, float (&part)[K], float (&inv_r)[K]) {
    float* rs = t.v_row + b * t.geom.rows + i;
    float old[K];
    for (int q = 0; q < K; ++q) old[q] = rs[q];  // read before thread 0 writes (after the barrier)
    __shared__ detail::BlockSumRoom<float, K> room;
    detail::block_sum(part, room);
    const float fc = static_cast<float>(t.geom.cols);
    for (int q = 0; q < K; ++q) {
      const float r = S::update_statistic(old[q], part[q] / fc, s);
      inv_r[q] = r > 0.0f ? 1.0f / r : 0.0f;
      if (threadIdx.x == 0) rs[q] = r;
    }
  }

  /// K rows from row i of matrix b (see the file comment): their column sums
  /// of g^2 (and clip terms) in fp32, added to the row block's partials colp
  /// (and dp) in double.
  template <int K>
  static __device__ void statistics_group(const DeviceTask& t, const StepScalars& s, index_t b, index_t i,
                                          double* colp, double* dp) {
    const index_t c = t.geom.cols;
    const index_t off = (b * t.geom.rows + i) * c;
    float part[K];
    double wide[K];
    for (int q = 0; q < K; ++q) part[q] = 0.0f, wide[q] = 0.0;
    const index_t span = sum_block * static_cast<index_t>(blockDim.x);
    for (index_t j0 = 0; j0 < c; j0 += span) {
      const index_t j1 = j0 + span < c ? j0 + span : c;
      for (index_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
        float cs = 0.0f;
        for (int q = 0; q < K; ++q) {
          const index_t o = off + q * c + j;
          const float g = grad_at(t, s, o);
          const float g2 = g * g;
          part[q] += g2;
          cs = cs + g2;
          if constexpr (M::has_state && !stored) t.m[o] = M::update(t.m[o], g, s);
        }
        colp[j] += static_cast<double>(cs);
      }
      detail::fold(part, wide);
    }
    detail::round_into(wide, part);
    float inv_r[K];
    update_rows<K>(t, s, b, i, part, inv_r);
    if constexpr (C::active) {
      for (index_t j = threadIdx.x; j < c; j += blockDim.x) {
        float dj = 0.0f;
        for (int q = 0; q < K; ++q) {
          const float n = numerator_at(t, s, b, off + q * c + j);
          dj = dj + n * n * inv_r[q];
        }
        dp[j] += static_cast<double>(dj);
      }
    }
  }

  /// statistics_group over aligned quads (quads_ok): each thread's loads of
  /// the K rows are issued together.
  template <int K>
  static __device__ void statistics_group_quads(const DeviceTask& t, const StepScalars& s, index_t b, index_t i,
                                                double* colp, double* dp) {
    const index_t c = t.geom.cols;
    const index_t off = (b * t.geom.rows + i) * c;
    float part[K];
    double wide[K];
    for (int q = 0; q < K; ++q) part[q] = 0.0f, wide[q] = 0.0;
    const index_t span = sum_block * static_cast<index_t>(blockDim.x);  // sum_block / 4 quads per thread
    for (index_t j0 = 0; j0 < c; j0 += span) {
      const index_t j1 = j0 + span < c ? j0 + span : c;
      for (index_t j = j0 + 4 * static_cast<index_t>(threadIdx.x); j < j1; j += 4 * static_cast<index_t>(blockDim.x)) {
        detail::Quad<float> g[K];
        for (int q = 0; q < K; ++q) g[q] = grad_quad(t, s, off + q * c + j);
        [[maybe_unused]] detail::Quad<float> m[K];
        if constexpr (M::has_state && !stored)
          for (int q = 0; q < K; ++q) m[q] = detail::load_quad(t.m + off + q * c + j);
        detail::Quad<float> cs{};
        for (int q = 0; q < K; ++q)
          for (int l = 0; l < 4; ++l) {
            const float g2 = g[q].v[l] * g[q].v[l];
            part[q] += g2;
            cs.v[l] = cs.v[l] + g2;
            if constexpr (M::has_state && !stored) m[q].v[l] = M::update(m[q].v[l], g[q].v[l], s);
          }
        detail::Quad<double> acc = detail::load_quad(colp + j);
        for (int l = 0; l < 4; ++l) acc.v[l] += static_cast<double>(cs.v[l]);
        detail::store_quad(colp + j, acc);
        if constexpr (M::has_state && !stored)
          for (int q = 0; q < K; ++q) detail::store_quad(t.m + off + q * c + j, m[q]);
      }
      detail::fold(part, wide);
    }
    detail::round_into(wide, part);
    float inv_r[K];
    update_rows<K>(t, s, b, i, part, inv_r);
    if constexpr (C::active) {
      for (index_t j = 4 * static_cast<index_t>(threadIdx.x); j < c; j += 4 * static_cast<index_t>(blockDim.x)) {
        detail::Quad<float> n[K];
        for (int q = 0; q < K; ++q) n[q] = numerator_quad(t, s, b, off + q * c + j);
        detail::Quad<float> dj{};
        for (int q = 0; q < K; ++q)
          for (int l = 0; l < 4; ++l) dj.v[l] = dj.v[l] + n[q].v[l] * n[q].v[l] * inv_r[q];
        detail::Quad<double> acc = detail::load_quad(dp + j);
        for (int l = 0; l < 4; ++l) acc.v[l] += static_cast<double>(dj.v[l]);
        detail::store_quad(dp + j, acc);
      }
    }
  }

  static __device__ void factored_statistics(const DeviceTask& t, const StepScalars& s, const WorkUnit& it,
                                             double* workspace) {
    const index_t c = t.geom.cols;
    double* colp = workspace + it.scratch + 2 * it.block * c;
    double* dp = colp + c;
    for (index_t j = threadIdx.x; j < c; j += blockDim.x) {
      colp[j] = 0.0;
      if constexpr (C::active) dp[j] = 0.0;
    }
    __syncthreads();  // the quad walk below maps columns to threads differently
    index_t i = it.begin;
    if (quads_ok(t)) {
      for (; i + group_rows_quads <= it.end; i += group_rows_quads)
        statistics_group_quads<group_rows_quads>(t, s, it.matrix, i, colp, dp);
      for (; i < it.end; ++i) statistics_group_quads<1>(t, s, it.matrix, i, colp, dp);
    } else {
      for (; i + group_rows <= it.end; i += group_rows) statistics_group<group_rows>(t, s, it.matrix, i, colp, dp);
      for (; i < it.end; ++i) statistics_group<1>(t, s, it.matrix, i, colp, dp);
    }
  }

  /// Columns [it.begin, it.end) (at most 32) of matrix it.matrix: vbar, C_j,
  /// 1 / col_j and the clip terms; the matrix's last block to finish forms
  /// its sum u^2, the tensor's last matrix the clip divisors. Lane l of every
  /// warp takes column begin + l; warp w takes a fixed slice of the row
  /// blocks; the slices' sums are combined in warp order.
  static __device__ void factored_columns(const DeviceTask& t, const TaskStep& st, const WorkUnit& it,
                                          const double* workspace) {
    const StepScalars& s = st.s;
    __shared__ double s_cs[block_warps][32];
    __shared__ float s_col[32];
    __shared__ double s_dj[block_warps][32];
    __shared__ double s_fl[block_warps][32];
    __shared__ int s_last;
    __shared__ detail::BlockSumRoom<double, 1> s_sum;
    const index_t r = t.geom.rows;
    const index_t c = t.geom.cols;
    const index_t nb = it.block;
    const index_t b = it.matrix;
    const float* rs = t.v_row + b * r;
    const double* partials = workspace + it.scratch;  // row block k: c sums of g^2, then c terms D_kj
    const int lane = static_cast<int>(threadIdx.x & 31u);
    const int warp = static_cast<int>(threadIdx.x >> 5);
    const index_t j = it.begin + lane;
    const bool active = j < it.end;
    const index_t k0 = nb * warp / block_warps;
    const index_t k1 = nb * (warp + 1) / block_warps;

    // a sharded piece of a cut matrix: the totals over ranks
    const double* shard = t.shard_sums != nullptr ? t.shard_sums + b * (c + 1) : nullptr;
    const index_t rows_all = shard != nullptr ? t.full_rows : r;

    // vbar: every block of the matrix forms the same sum in the same order
    double mean[1] = {0.0};
    if (shard != nullptr) {
      mean[0] = shard[c];
    } else {
      for (index_t i = threadIdx.x; i < r; i += blockDim.x) mean[0] += static_cast<double>(rs[i]);
      detail::block_sum(mean, s_sum);
    }
    const float vbar = S::vbar(static_cast<float>(mean[0] / static_cast<double>(rows_all)));
    if (it.begin == 0 && threadIdx.x == 0) t.vbar[b] = vbar;

    double cs = 0.0;
    if (shard != nullptr) {
      if (warp == 0 && active) cs = shard[j];
    } else if (active) {
      // four loads in flight, summed in k order
      const double* cp = partials + j;
      const index_t stride = 2 * c;
      index_t k = k0;
      for (; k + 4 <= k1; k += 4) {
        const double x0 = cp[k * stride], x1 = cp[(k + 1) * stride], x2 = cp[(k + 2) * stride],
                     x3 = cp[(k + 3) * stride];
        cs += x0;
        cs += x1;
        cs += x2;
        cs += x3;
      }
      for (; k < k1; ++k) cs += cp[k * stride];
    }
    s_cs[warp][lane] = cs;
    __syncthreads();
    if (warp == 0 && active) {
      double sum = s_cs[0][lane];
      for (int w = 1; w < block_warps; ++w) sum += s_cs[w][lane];
      float* vc = t.v_col + b * c + j;
      const float cn = S::update_statistic(*vc, static_cast<float>(sum) / static_cast<float>(rows_all), s);
      *vc = cn;
      const float col = S::col_factor(cn, s);
      t.inv_col[b * c + j] = 1.0f / col;
      s_col[lane] = col;
    }
    if constexpr (C::active) {
      // does the eps floor bind on any row of the matrix? (rare; the block
      // sum's barriers also publish s_col)
      float any_floored[1] = {0.0f};
      for (index_t i = threadIdx.x; i < r; i += blockDim.x)
        if (rs[i] > 0.0f && S::row_floored(rs[i], vbar, s)) any_floored[0] = 1.0f;
      __shared__ detail::BlockSumRoom<float, 1> s_any;
      detail::block_sum(any_floored, s_any);
      double dj = 0.0;
      double fl = 0.0;
      if (active && !(any_floored[0] > 0.0f)) {
        // no floored row (the usual case): four loads in flight, summed in k order
        const double* dpk = partials + c + j;
        const index_t stride = 2 * c;
        index_t k = k0;
        for (; k + 4 <= k1; k += 4) {
          const double x0 = dpk[k * stride], x1 = dpk[(k + 1) * stride], x2 = dpk[(k + 2) * stride],
                       x3 = dpk[(k + 3) * stride];
          dj += x0;
          dj += x1;
          dj += x2;
          dj += x3;
        }
        for (; k < k1; ++k) dj += dpk[k * stride];
      } else if (active) {
        const float col = s_col[lane];
        const float w = 1.0f / col;
        for (index_t k = k0; k < k1; ++k) {
          const index_t i0 = r * k / nb;
          const index_t i1 = r * (k + 1) / nb;
          bool floored = false;
          for (index_t i = i0; i < i1 && !floored; ++i) floored = rs[i] > 0.0f && S::row_floored(rs[i], vbar, s);
          if (!floored) {
            dj += partials[k * 2 * c + c + j];
            continue;
          }
          // recompute this block's D_kj without its floored rows, whose
          // terms are formed exactly, as apply() forms u; groups of 8 rows
          // in fp32, then double, as the statistics pass adds them
          float d = 0.0f;
          for (index_t i = i0; i < i1; ++i) {
            const float ri = rs[i];
            if (ri > 0.0f) {
              const float n = numerator_at(t, s, b, (b * r + i) * c + j);
              if (S::row_floored(ri, vbar, s)) {
                const float inv_row = 1.0f / S::row_factor(ri, vbar, s);
                const float u = n * (inv_row * w);
                fl += static_cast<double>(u * u);
              } else {
                d = d + n * n * (1.0f / ri);
              }
            }
            if ((i - i0) % 8 == 7) {
              dj += static_cast<double>(d);
              d = 0.0f;
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
        __threadfence();
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        const auto blocks = static_cast<unsigned>((c + column_block - 1) / column_block);
        s_last = atomicAdd(t.done + b, 1u) == blocks - 1u ? 1 : 0;
      }
      __syncthreads();
      if (!s_last) return;
      // the matrix's last block: sum u^2 = vbar * sum_j(...) + floored rows
      __threadfence();
      const double* term = t.col_term + b * c;
      const double* flt = t.col_term + t.geom.batch * c + b * c;
      double acc[2] = {0.0, 0.0};
      for (index_t jj = threadIdx.x; jj < c; jj += blockDim.x) {
        acc[0] += __ldcg(term + jj);
        acc[1] += __ldcg(flt + jj);
      }
      __shared__ detail::BlockSumRoom<double, 2> s_acc;
      detail::block_sum(acc, s_acc);
      if (threadIdx.x == 0) {
        t.matrix_sum[b] = static_cast<double>(vbar) * acc[0] + acc[1];
        t.done[b] = 0u;
        __threadfence();
        const auto matrices = static_cast<unsigned>(t.geom.batch);
        s_last = atomicAdd(t.done + t.geom.batch, 1u) == matrices - 1u ? 1 : 0;
      }
      __syncthreads();
      if (!s_last) return;
      // the tensor's last matrix: the clip divisors, by the whole block
      __threadfence();
      if (threadIdx.x == 0) t.done[t.geom.batch] = 0u;
      if (!t.host_divisors) finalize(t, st);
    }
  }

  /// A sharded piece of a matrix cut between ranks: columns [it.begin,
  /// it.end) of this rank's column sums of g^2 (its row blocks' partials, in
  /// order, in double) into shard_sums; the block of the first columns also
  /// this rank's sum of R_i.
  static __device__ void factored_shard_sums(const DeviceTask& t, const WorkUnit& it, const double* workspace) {
    const index_t r = t.geom.rows;
    const index_t c = t.geom.cols;
    const index_t nb = it.block;
    const index_t b = it.matrix;
    double* out = t.shard_sums + b * (c + 1);
    for (index_t j = it.begin + threadIdx.x; j < it.end; j += blockDim.x) {
      const double* cp = workspace + it.scratch + j;
      double cs = 0.0;
      for (index_t k = 0; k < nb; ++k) cs += cp[k * 2 * c];
      out[j] = cs;
    }
    if (it.begin == 0) {
      const float* rs = t.v_row + b * r;
      double sum[1] = {0.0};
      for (index_t i = threadIdx.x; i < r; i += blockDim.x) sum[0] += static_cast<double>(rs[i]);
      __shared__ detail::BlockSumRoom<double, 1> room;
      detail::block_sum(sum, room);
      if (threadIdx.x == 0) out[c] = sum[0];
    }
  }

  /// What every walk of matrix b's update reads once: its clip divisor and
  /// vbar, its rows' statistics and its columns' 1 / col_j.
  struct ApplyMatrix {
    float div, vbar;
    const float* rs;  ///< R_i of the matrix's rows
    const float* w;   ///< 1 / col_j of its columns
    /// lr / (row_i * divisor), for a row whose statistic is r
    __device__ SKEWADAM_ALWAYS_INLINE float row_scale(float r, const StepScalars& s) const {
      return s.lr / (S::row_factor(r, vbar, s) * div);
    }
  };
  static __device__ SKEWADAM_ALWAYS_INLINE ApplyMatrix apply_matrix(const DeviceTask& t, index_t b) {
    return {C::active ? t.divisor[b] : 1.0f, t.vbar[b], t.v_row + b * t.geom.rows, t.inv_col + b * t.geom.cols};
  }

  static __device__ void factored_apply(const DeviceTask& t, const TaskStep& st, const WorkUnit& it) {
    if (quads_ok(t)) {
      if constexpr (random)
        factored_apply_octets(t, st, it);
      else
        factored_apply_quads(t, st, it);
      return;
    }
    const StepScalars& s = st.s;
    const index_t b = it.matrix;
    const index_t c = t.geom.cols;
    const ApplyMatrix m = apply_matrix(t, b);
    // Last row first: the statistics pass read this block's rows in order,
    // so the most recently read gradient rows are the likeliest still in L2.
    for (index_t i = it.end; i-- > it.begin;) {
      const float a = m.row_scale(m.rs[i], s);
      const index_t row0 = (b * t.geom.rows + i) * c;
      store_range(t, st, row0, row0 + c,
                  [&](index_t o) { return numerator_at(t, s, b, o) * (a * m.w[o - row0]); });
    }
  }

  /// factored_apply over aligned quads, last quad first, for a rule that
  /// draws no random bits: each thread takes `unroll` quads per round and
  /// issues all their loads before the first use.
  static __device__ void factored_apply_quads(const DeviceTask& t, const TaskStep& st, const WorkUnit& it) {
    constexpr int unroll = 2;
    const StepScalars& s = st.s;
    const index_t b = it.matrix;
    const index_t c = t.geom.cols;
    const index_t cq = c >> 2;
    const ApplyMatrix m = apply_matrix(t, b);
    const float* rs = m.rs + it.begin;
    P* param = static_cast<P*>(t.param);
    const index_t first = (b * t.geom.rows + it.begin) * c;  // the block's first element
    const index_t nq = (it.end - it.begin) * cq;   // the block's quads
    const bool narrow = nq <= index_t{0xffffffff};
    const auto stride = static_cast<index_t>(blockDim.x);
    for (index_t k = threadIdx.x; k < nq; k += unroll * stride) {
      bool ok[unroll];
      index_t lq[unroll], row[unroll];
      detail::Quad<float> n[unroll], wq[unroll];
      detail::Quad<P> pq[unroll];
      float rv[unroll];
      for (int u = 0; u < unroll; ++u) {
        const index_t kk = k + u * stride;
        ok[u] = kk < nq;
        lq[u] = ok[u] ? nq - 1 - kk : 0;
        if (narrow) {
          const auto x = static_cast<std::uint32_t>(lq[u]);
          row[u] = static_cast<index_t>(x / static_cast<std::uint32_t>(cq));
        } else {
          row[u] = lq[u] / cq;
        }
      }
      for (int u = 0; u < unroll; ++u)
        if (ok[u]) {
          const index_t o = first + 4 * lq[u];
          rv[u] = rs[row[u]];
          wq[u] = detail::load_quad(m.w + 4 * (lq[u] - row[u] * cq));
          n[u] = numerator_quad(t, s, b, o);
          pq[u] = detail::load_quad(param + o);
        }
      for (int u = 0; u < unroll; ++u)
        if (ok[u]) {
          const index_t o = first + 4 * lq[u];
          const float a = m.row_scale(rv[u], s);
          detail::Quad<P> out;
          for (int l = 0; l < 4; ++l) {
            const float step = n[u].v[l] * (a * wq[u].v[l]);
            const float pn = to_float(pq[u].v[l]) * s.decay - step;
            out.v[l] = R::template store<P>(pn, 0u);
          }
          detail::store_quad(param + o, out);
        }
    }
  }

  /// factored_apply over aligned quads for a rule that draws random bits:
  /// each thread takes the two quads of one Philox block (the 8 elements of
  /// block k, random.hpp), last block first, issues both quads' loads, then
  /// evaluates the block once for both.
  static __device__ void factored_apply_octets(const DeviceTask& t, const TaskStep& st, const WorkUnit& it) {
    const StepScalars& s = st.s;
    const index_t b = it.matrix;
    const index_t r = t.geom.rows;
    const index_t c = t.geom.cols;
    const ApplyMatrix m = apply_matrix(t, b);
    P* param = static_cast<P*>(t.param);
    const index_t first = (b * r + it.begin) * c;  // the block's elements [first, last)
    const index_t last = (b * r + it.end) * c;
    const index_t base = t.element_base;  // a multiple of 4 (quads_ok), as are first and c
    const bool narrow = last - first <= index_t{0xffffffff};
    const index_t k0 = (base + first) >> 3;
    for (index_t k = ((base + last - 1) >> 3) - static_cast<index_t>(threadIdx.x); k >= k0;
         k -= static_cast<index_t>(blockDim.x)) {
      bool ok[2];
      index_t o[2], i[2];
      detail::Quad<float> n[2], wq[2];
      detail::Quad<P> pq[2];
      float rv[2];
      for (int h = 0; h < 2; ++h) {
        o[h] = 8 * k + 4 * h - base;
        ok[h] = o[h] >= first && o[h] < last;
        const index_t lo = ok[h] ? o[h] - first : 0;
        if (narrow)
          i[h] = static_cast<index_t>(static_cast<std::uint32_t>(lo) / static_cast<std::uint32_t>(c));
        else
          i[h] = lo / c;
      }
      for (int h = 0; h < 2; ++h)
        if (ok[h]) {
          rv[h] = m.rs[it.begin + i[h]];
          wq[h] = detail::load_quad(m.w + (o[h] - first - i[h] * c));
          n[h] = numerator_quad(t, s, b, o[h]);
          pq[h] = detail::load_quad(param + o[h]);
        }
      const auto blk = random_block(st.key, static_cast<std::uint64_t>(k));
      for (int h = 0; h < 2; ++h)
        if (ok[h]) {
          const float a = m.row_scale(rv[h], s);
          detail::Quad<P> out;
          for (int l = 0; l < 4; ++l) {
            const float step = n[h].v[l] * (a * wq[h].v[l]);
            const float pn = to_float(pq[h].v[l]) * s.decay - step;
            out.v[l] = R::template store<P>(pn, block_bits(blk, static_cast<std::uint64_t>(4 * h + l)));
          }
          detail::store_quad(param + o[h], out);
        }
    }
  }

  // ------------------------------------------------------ stored momentum
  /// Stored momentum: the blocks of matrix it.matrix that start in elements
  /// [it.begin, it.end), warp w taking the w-th, lane l its elements
  /// 8 l ... 8 l + 7: m' from the stored values and the gradient, then the
  /// block's stored values (policies/bf16_momentum.hpp,
  /// float8_block_momentum.hpp, int8_block_momentum.hpp), with the random
  /// bits of element_base + the element's index in the tensor, from the
  /// momentum's streams.
  static __device__ void momentum_blocks(const DeviceTask& t, const TaskStep& st, const WorkUnit& it) {
    if constexpr (stored) {
      constexpr int per_lane = static_cast<int>(momentum_block / 32);
      const StepScalars& s = st.s;
      const RoundingKey key = momentum_key(st.key);
      const index_t size = t.geom.matrix_size();
      const index_t b = it.matrix;
      const int lane = static_cast<int>(threadIdx.x & 31u);
      const index_t k = it.begin / momentum_block + static_cast<index_t>(threadIdx.x >> 5);
      const index_t start = k * momentum_block;
      if (start >= it.end) return;  // the whole warp: no shuffle below is left waiting
      const index_t n = size - start < momentum_block ? size - start : momentum_block;
      const index_t first = b * size + start + per_lane * lane;  // this lane's first element
      const index_t element = t.element_base + first;            // its index in the whole tensor
      static_assert(per_lane == elements_per_block, "a lane's elements are one Philox block's");
      float mp[per_lane];
      std::uint32_t bits[per_lane];
      for (int q = 0; q < per_lane; ++q) {
        const bool in = per_lane * lane + q < n;
        mp[q] = in ? M::update(momentum_at(t, b, first + q), grad_at(t, s, first + q), s) : 0.0f;
      }
      const auto draw = [&](const RoundingKey& stream, std::uint32_t* out) {
        if (element % elements_per_block == 0) {  // one Philox block serves the lane
          const auto blk = random_block(stream, static_cast<std::uint64_t>(element / elements_per_block));
          for (int q = 0; q < per_lane; ++q) out[q] = block_bits(blk, static_cast<std::uint64_t>(q));
        } else {
          for (int q = 0; q < per_lane; ++q) out[q] = random_bits(stream, element + q);
        }
      };
      draw(key, bits);
      if constexpr (M::random_bits_used == 32) {
        std::uint32_t low[per_lane];  // the second stream's bits, below the first's
        draw(momentum_second_key(st.key), low);
        for (int q = 0; q < per_lane; ++q) bits[q] = bits[q] << 16 | low[q];
      }
      float* w = momentum_of(t, b);
      if constexpr (storage == MomentumStorage::bfloat16) {
        bf16* out = reinterpret_cast<bf16*>(w) + start + per_lane * lane;
        for (int q = 0; q < per_lane; ++q)
          if (per_lane * lane + q < n) out[q] = M::encode(mp[q], bits[q]);
      } else {
        float amax = 0.0f;  // over finite values
        for (int q = 0; q < per_lane; ++q) {
          const float a = ::fabsf(mp[q]);
          amax = a < vmath::from_bits<float>(0x7f800000u) && a > amax ? a : amax;
        }
        for (int off = 16; off > 0; off >>= 1) {
          const float other = __shfl_xor_sync(0xffffffffu, amax, off);
          amax = other > amax ? other : amax;
        }
        const float inv = M::inverse(amax);
        float* blk = w + k * code_block_words;
        std::uint8_t* out = reinterpret_cast<std::uint8_t*>(blk + 1) + per_lane * lane;
        for (int q = 0; q < per_lane; ++q)
          if (per_lane * lane + q < n) out[q] = static_cast<std::uint8_t>(M::code(mp[q], inv, bits[q]));
        if (lane == 0) blk[0] = M::scale(amax);
      }
    } else {
      (void)t, (void)st, (void)it;
    }
  }

  // ------------------------------------------------------ element-wise rule
  static __device__ void elementwise_statistics(const DeviceTask& t, const TaskStep& st, const WorkUnit& it) {
    const StepScalars& s = st.s;
    const index_t base = it.matrix * t.geom.matrix_size();
    const index_t e0 = base + it.begin;
    const index_t e1 = base + it.end;
    auto update = [&](index_t o) {
      const float g = grad_at(t, s, o);
      float m = 0.0f;
      if constexpr (stored) {
        m = momentum_at(t, it.matrix, o);  // updated by the momentum pass
      } else if constexpr (M::has_state) {
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
      __shared__ detail::BlockSumRoom<float, 1> room;
      detail::block_sum(acc, room);
      if (threadIdx.x == 0) t.chunk_sum[it.block] = static_cast<double>(acc[0]);
    } else {
      store_range(t, st, e0, e1, [&](index_t o) { return s.lr * update(o); });
    }
  }

  static __device__ void elementwise_apply(const DeviceTask& t, const TaskStep& st, const WorkUnit& it) {
    const StepScalars& s = st.s;
    const index_t base = it.matrix * t.geom.matrix_size();
    const float lr_eff = C::active ? s.lr / t.divisor[it.matrix] : s.lr;
    store_range(t, st, base + it.begin, base + it.end, [&](index_t o) {
      const float u = numerator_at(t, s, it.matrix, o) / S::denominator(t.v[o], s);
      return u * lr_eff;
    });
  }

  /// Clip divisors of one tensor, by one whole block of block_threads threads
  /// (every thread calls it): for the element-wise rule, each matrix's
  /// sum u^2 from its chunks' sums first (warp w takes matrices w, w + 16,
  /// ...; lane l adds chunks l, l + 32, ... in order, then a shuffle tree);
  /// then the divisors, a tensor-scope clip's from the matrices' sums added
  /// in matrix order by one thread, as every backend and placement adds them
  /// (rules/clip_divisors.hpp). Fixed orders throughout.
  static __device__ void finalize(const DeviceTask& t, const TaskStep& st) {
    if constexpr (C::active) {
      const MatrixGeometry& g = t.geom;
      if constexpr (!S::factored) {
        const auto lane = static_cast<index_t>(threadIdx.x & 31u);
        for (index_t b = threadIdx.x >> 5; b < g.batch; b += block_warps) {
          const double* part = t.chunk_sum + b * t.chunks;
          double sum = 0.0;
          for (index_t k = lane; k < t.chunks; k += 32) sum += __ldcg(part + k);
          for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
          if (lane == 0) t.matrix_sum[b] = sum;
        }
        __syncthreads();
      }
      if (t.host_divisors) return;
      if (st.scope == ClipScope::tensor) {
        // the sum in matrix order (rules/clip_divisors.hpp), by one thread
        __shared__ float div;
        if (threadIdx.x == 0)
          div = C::divisor(tensor_sum_u2(g.batch, [&](index_t b) { return __ldcg(t.matrix_sum + b); }), g.numel(),
                           st.s);
        __syncthreads();
        for (index_t b = threadIdx.x; b < g.batch; b += blockDim.x) t.divisor[b] = div;
        __syncthreads();  // div is read by every thread before a later tensor's finalize writes it
      } else {
        for (index_t b = threadIdx.x; b < g.batch; b += blockDim.x)
          t.divisor[b] = C::divisor(__ldcg(t.matrix_sum + b), g.matrix_size(), st.s);
      }
    }
  }
};

// ------------------------------------------------------------------ kernels
// One block per work item; blocks of tensors without a gradient, or of a step
// whose gradients offend (TaskStep::skip), return at once (the whole block,
// before any barrier).

// `workspace`: the group's (WorkUnit::scratch).

template <class Rule, class P, class G>
__global__ void __launch_bounds__(block_threads)
    statistics_kernel(const DeviceTask* tasks, const TaskStep* steps, const WorkUnit* items, double* workspace) {
  using X = Math<Rule, P, G>;
  const WorkUnit it = items[blockIdx.x];
  if (tasks[it.task].grad == nullptr || steps[it.task].skip) return;
  const DeviceTask t = tasks[it.task];  // a copy: stores through float* cannot alias it
  const TaskStep st = steps[it.task];
  if constexpr (X::S::factored) X::factored_statistics(t, st.s, it, workspace);
  else X::elementwise_statistics(t, st, it);
}

/// Stored momentum: the momentum pass (Math::momentum_blocks), before the
/// statistics.
template <class Rule, class P, class G>
__global__ void __launch_bounds__(block_threads)
    momentum_kernel(const DeviceTask* tasks, const TaskStep* steps, const WorkUnit* items) {
  using X = Math<Rule, P, G>;
  const WorkUnit it = items[blockIdx.x];
  if (tasks[it.task].grad == nullptr || steps[it.task].skip) return;
  const DeviceTask t = tasks[it.task];
  const TaskStep st = steps[it.task];
  X::momentum_blocks(t, st, it);
}

template <class Rule, class P, class G>
__global__ void __launch_bounds__(block_threads)
    columns_kernel(const DeviceTask* tasks, const TaskStep* steps, const WorkUnit* items, const double* workspace) {
  using X = Math<Rule, P, G>;
  const WorkUnit it = items[blockIdx.x];
  if (tasks[it.task].grad == nullptr || steps[it.task].skip) return;
  const DeviceTask t = tasks[it.task];  // a copy: stores through float* cannot alias it
  const TaskStep st = steps[it.task];
  X::factored_columns(t, st, it, workspace);
}

template <class Rule, class P, class G>
__global__ void __launch_bounds__(block_threads)
    shard_sums_kernel(const DeviceTask* tasks, const TaskStep* steps, const WorkUnit* items,
                      const double* workspace) {
  using X = Math<Rule, P, G>;
  const WorkUnit it = items[blockIdx.x];
  if (tasks[it.task].grad == nullptr || steps[it.task].skip) return;
  const DeviceTask t = tasks[it.task];
  if constexpr (X::S::factored) X::factored_shard_sums(t, it, workspace);
}

/// One block of block_threads threads per tensor of the group (group_tasks).
template <class Rule, class P, class G>
__global__ void __launch_bounds__(block_threads)
    finalize_kernel(const DeviceTask* tasks, const TaskStep* steps, const std::int32_t* group_tasks) {
  using X = Math<Rule, P, G>;
  const std::int32_t task = group_tasks[blockIdx.x];
  if (tasks[task].grad == nullptr || steps[task].skip) return;
  const DeviceTask t = tasks[task];
  X::finalize(t, steps[task]);
}

template <class Rule, class P, class G>
__global__ void __launch_bounds__(apply_threads, apply_min_blocks)
    apply_kernel(const DeviceTask* tasks, const TaskStep* steps, const WorkUnit* items) {
  using X = Math<Rule, P, G>;
  const WorkUnit it = items[blockIdx.x];
  if (tasks[it.task].grad == nullptr || steps[it.task].skip) return;
  const DeviceTask t = tasks[it.task];  // a copy: stores through float* cannot alias it
  const TaskStep st = steps[it.task];
  if constexpr (X::S::factored) X::factored_apply(t, st, it);
  else X::elementwise_apply(t, st, it);
}

}  // namespace skewadam::backend::cuda
