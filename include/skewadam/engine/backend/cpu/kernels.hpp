#pragma once
// The CPU backend's loops for one (rule, parameter dtype, gradient dtype,
// architecture). The math comes from the rule's policies; this file only walks
// memory, reduces and stores.
//
// Passes over memory (minimal traffic per element in bench/skewadam_bench.cpp)
// ---------------------------------------------------------------------------
// Element-wise second moment (router, rank-1 tensors, AdamW):
//   statistics: read g (m, V), write m, V, accumulate sum(u^2) per chunk.
//               Without clipping this pass also writes p: one pass in all.
//   apply:      read g or m, V, p; write p.
// Factored second moment (backbone, experts):
//   statistics: read g (and m) once, write m; row sums give R_i, column sums
//               give C_j, and the clip's sum(u^2) is accumulated in the same
//               pass (below).
//   apply:      read g or m, p; write p.
//
// Why sum(u^2) needs no extra pass (factored)
// -------------------------------------------
// u_ij = n_ij / (row_i col_j), with n the numerator (g sqrt(bc2), or m scaled),
// row_i^2 = max(R_i / vbar, eps) and col_j^2 = max(C_j, eps). For a row where
// the floor does not bind, 1 / row_i^2 = vbar / R_i, so
//   sum_ij u_ij^2 = sum_j (1 / col_j^2) * vbar * D_j + sum_{i floored} sum_j u_ij^2
//   with D_j = sum_{i not floored} n_ij^2 / R_i.
// R_i is final as soon as row i has been read, so n_ij^2 / R_i is added to D_j
// while row i is still in cache (rows with R_i = 0 have n = 0 and add nothing).
// vbar and C_j are known only after the last row, which is when the sum is
// formed. Which rows are floored (R_i < eps * vbar) is known only then too:
// those rows are rare, and the row blocks that contain one are re-read, their
// D partial recomputed without them, and their own terms added exactly,
// element by element, as the apply pass computes them. The result equals the
// direct sum up to rounding order; tests/unit/test_cpu_clip_sum.cpp checks it
// against the direct definition, zero and floored rows included.
//
// The statistics pass reads rows in groups of K (8, or 4 with momentum): one
// sweep over the group's columns streams its K rows from memory (K prefetch
// streams, one load and store of colsum per K rows) and forms their R_i, a
// second sweep adds their terms to D_j while they are still in cache. On x86
// the two sweeps run one after the other. On NEON the second sweep of a
// group runs in the same loop as the first sweep of the next (sweep_pair),
// which takes fewer instructions per element there; on a 2-vCPU Zen 5 the
// paired loop made the pass 1.24x slower than the two sweeps apart (the
// cached loads and the memory streams slowed each other down;
// bench/RESULTS.md), so x86 does not pair. Every sum is still formed in row
// order, each of its terms by the same operations, so neither the grouping
// nor the pairing changes a bit.
//
// The apply pass divides by nothing per element: the factored denominator
// row_i * col_j is separable (the statistics algebra above relies on that
// too), so lr * u_ij / divisor = n_ij * (a_i * w_j) with w_j = 1 / col_j formed
// once per unit (c values) and a_i = lr / (row_i * divisor) once per row.
//
// Element access goes through a Ctx copied onto the stack at each kernel's
// entry (pointers and per-step scalars): stores through float pointers then
// cannot alias them, so the compiler keeps them in registers.
//
// Every sum is blocked (summation.hpp): its error is bounded by about 65 fp32
// ulps of the sum whatever the length of the row, the column or the tensor.
// Rows are read in blocks of sum_block rows, at the end of which the column
// sums and D_j of the block are folded into double arrays (the thread's
// Scratch::d); a unit's partials are rounded to fp32 once, at its end.
//
// Momentum stored in fewer bits (Bf16Momentum, Float8BlockMomentum,
// Int8BlockMomentum; the blocks of state_layout.hpp): an 8-bit block's codes
// need the largest |m'| of the block, so m is updated a block at a time,
// just before the first row of the block is read (update_momentum_blocks:
// the block's gradient is then in cache for the statistics), and every later
// read decodes the stored values.
// Units never split a block (TensorTask::row_align; element chunks are
// multiples of the block).
//
// Determinism: the work is cut by shape (engine/backend/cpu/work.hpp); per-unit partials
// are combined in unit order, so the bits do not depend on thread count.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "../../../detail/config.hpp"
#include "../../../rules/clip_divisors.hpp"
#include "../../../rules/update_rule.hpp"
#include "simd.hpp"
#include "summation.hpp"
#include "work.hpp"

namespace skewadam::backend::cpu {

template <class Rule, class P, class G, class Arch>
struct Kernels {
  using V = vec_t<Arch>;
  using M = typename Rule::momentum;
  using S = typename Rule::second_moment;
  using C = typename Rule::clip;
  using R = typename Rule::rounding;
  /// Random bits for stochastic rounding: vector Philox for SIMD
  /// architectures, one block at a time for scalar code (same bits).
  using Rng = std::conditional_t<std::is_same_v<Arch, ScalarArch>, RandomStream, RandomWindow<Arch>>;

  static const KernelTable* table() {
    static constexpr KernelTable t{&statistics, &finalize, (S::factored || C::active) ? &apply : nullptr, &finish_cut};
    return &t;
  }

  /// How m is stored; `stored`: in fewer bits, in blocks (see the file
  /// comment), updated a block at a time (update_momentum_blocks) and read
  /// decoded (momentum_at).
  static constexpr MomentumStorage storage = M::has_state ? momentum_storage_v<M> : MomentumStorage::f32;
  static constexpr bool stored = storage != MomentumStorage::f32;
  static_assert(storage == MomentumStorage::f32 || storage == MomentumStorage::bfloat16 || eight_bit_blocks(storage),
                "skewadam CPU backend: unknown momentum storage");
  /// Words of a whole 8-bit block: its scale, then its codes.
  static constexpr index_t code_block_words = momentum_block_words(MomentumStorage::int8_blocks, momentum_block);
  /// The stored momentum's random streams (stored_momentum.hpp): the second
  /// is read by the maps that take 32 bits per element.
  struct MomentumRng {
    Rng first;
    Rng second;
    explicit MomentumRng(const RoundingKey& key) : first(momentum_key(key)), second(momentum_second_key(key)) {}
  };

  /// What the loops read, copied out of the task (see the file comment).
  struct Ctx {
    StepScalars s;
    const G* g;
    P* p;
    float* m;
    float* v;
    index_t rows;
    index_t cols;
    index_t element_base;
    // stored momentum: elements and words of m per matrix
    index_t mat = 0;
    index_t mwords = 0;
    bool one_matrix = true;
    explicit Ctx(const TensorTask& t)
        : s(t.scalars), g(static_cast<const G*>(t.grad)), p(static_cast<P*>(t.param)), m(t.m), v(t.v),
          rows(t.geom.rows), cols(t.geom.cols), element_base(t.element_base) {
      if constexpr (stored) {
        mat = t.geom.matrix_size();
        mwords = momentum_matrix_words(storage, mat);
        one_matrix = t.geom.batch == 1;
      }
    }
  };

  // ----------------------------------------------------------- element access
  template <class W>
  static SKEWADAM_ALWAYS_INLINE W grad_at(const Ctx& x, index_t off) {
    return load_as<W>(x.g + off) * vmath::splat<W>(x.s.grad_scale);
  }

  /// Stored momentum: the matrix of element `off` and its place in it.
  static SKEWADAM_ALWAYS_INLINE void locate(const Ctx& x, index_t off, index_t& b, index_t& e) {
    b = x.one_matrix ? 0 : off / x.mat;
    e = off - b * x.mat;
  }
  /// The bf16 values of matrix b (Bf16Momentum: two to a word, no scale).
  static SKEWADAM_ALWAYS_INLINE bf16* bf16_of(const Ctx& x, index_t b) {
    return reinterpret_cast<bf16*>(x.m + b * x.mwords);
  }
  /// 8-bit momentum: block k of matrix b, its scale in word 0, its codes after.
  static SKEWADAM_ALWAYS_INLINE float* code_block(const Ctx& x, index_t b, index_t k) {
    return x.m + b * x.mwords + k * code_block_words;
  }
  static SKEWADAM_ALWAYS_INLINE std::uint8_t* codes_of(float* block) {
    return reinterpret_cast<std::uint8_t*>(block + 1);
  }

  /// The stored momentum at `off`, as fp32 lanes.
  template <class W>
  static SKEWADAM_ALWAYS_INLINE W momentum_at(const Ctx& x, index_t off) {
    if constexpr (!stored) {
      return load_as<W>(x.m + off);
    } else {
      index_t b, e;
      locate(x, off, b, e);
      if constexpr (storage == MomentumStorage::bfloat16) {
        return load_as<W>(bf16_of(x, b) + e);
      } else {
        const index_t k = e / momentum_block;
        const index_t r = e - k * momentum_block;
        float* blk = code_block(x, b, k);
        if constexpr (std::is_same_v<W, float>) {
          return M::decode(codes_of(blk)[r], blk[0]);
        } else {
          constexpr index_t w = width_v<W>;
          alignas(64) float buf[w];
          if (r + w <= momentum_block) {
            const std::uint8_t* q = codes_of(blk) + r;
            const float scale = blk[0];
            for (index_t l = 0; l < w; ++l) buf[l] = M::decode(q[l], scale);
            return W::load_aligned(buf);
          }
          for (index_t l = 0; l < w; ++l) buf[l] = momentum_at<float>(x, off + l);  // the lanes span two blocks
          return W::load_aligned(buf);
        }
      }
    }
  }

  /// Numerator from the gradient and the already-updated momentum.
  template <class W>
  static SKEWADAM_ALWAYS_INLINE W numerator_at(const Ctx& x, index_t off) {
    W g = vmath::splat<W>(0.0f);
    W m = vmath::splat<W>(0.0f);
    if constexpr (M::numerator_reads_grad) g = grad_at<W>(x, off);
    if constexpr (M::has_state) m = momentum_at<W>(x, off);
    return M::numerator(g, m, x.s);
  }

  /// The random bits of an 8-bit map's rounding, lane by lane: the first
  /// stream's 16, or for a map that reads 32, those shifted up with the
  /// second stream's below.
  template <class W>
  static SKEWADAM_ALWAYS_INLINE vmath::bits_t<W> code_bits_at(MomentumRng& rng, index_t element) {
    const auto draw = [&](Rng& r) {
      if constexpr (std::is_same_v<W, float>) return r(element);
      else return vmath::load_bits<W>(r.at(element, width_v<W>));
    };
    if constexpr (M::random_bits_used == 32) return (draw(rng.first) << 16) | draw(rng.second);
    else return draw(rng.first);
  }

  /// The largest |buf[j]| of j < n over finite values (0 if none).
  static SKEWADAM_ALWAYS_INLINE float max_finite_abs(const float* buf, index_t n) {
    constexpr float inf = std::numeric_limits<float>::infinity();
    float amax = 0.0f;
    index_t j = 0;
    if constexpr (width_v<V> > 1) {
      V acc(0.0f);
      for (; j + width_v<V> <= n; j += width_v<V>) {
        const V a = xsimd::abs(V::load_aligned(buf + j));
        acc = xsimd::max(acc, xsimd::select(a < V(inf), a, V(0.0f)));
      }
      alignas(64) float lanes[width_v<V>];
      acc.store_aligned(lanes);
      for (float a : lanes) amax = a > amax ? a : amax;
    }
    for (; j < n; ++j) {
      const float a = std::fabs(buf[j]);
      amax = a < inf && a > amax ? a : amax;
    }
    return amax;
  }

  /// Stored momentum: the update of every block of matrix b that starts in
  /// [lo, hi) (offsets in the matrix), each whole: m' of its elements, then
  /// its stored values (policies/bf16_momentum.hpp, float8_block_momentum.hpp,
  /// int8_block_momentum.hpp), with the momentum's random streams.
  static void update_momentum_blocks(const Ctx& x, index_t b, index_t lo, index_t hi, MomentumRng& rng) {
    if constexpr (stored) {
      constexpr index_t n_max = momentum_block;
      const index_t base = b * x.mat;
      for (index_t k = (lo + n_max - 1) / n_max; k * n_max < hi; ++k) {
        const index_t start = k * n_max;
        const index_t n = std::min(n_max, x.mat - start);
        const index_t off = base + start;
        const index_t element = x.element_base + off;
        alignas(64) float buf[n_max];
        for_lanes<V>(0, n, [&]<class W>(index_t j) {
          store_f32(buf + j, M::update(momentum_at<W>(x, off + j), grad_at<W>(x, off + j), x.s));
        });
        if constexpr (storage == MomentumStorage::bfloat16) {
          bf16* q = bf16_of(x, b) + start;
          for_lanes<V>(0, n, [&]<class W>(index_t j) {
            store_param<StochasticRounding>(q + j, load_as<W>(buf + j), element + j, rng.first);
          });
        } else {
          const float amax = max_finite_abs(buf, n);
          const float inv = M::inverse(amax);
          float* blk = code_block(x, b, k);
          std::uint8_t* q = codes_of(blk);
          for_lanes<V>(0, n, [&]<class W>(index_t j) {
            const auto c = M::code(load_as<W>(buf + j), vmath::splat<W>(inv), code_bits_at<W>(rng, element + j));
            alignas(64) std::uint32_t lanes[width_v<W>];
            vmath::store_bits<W>(c, lanes);
            for (index_t l = 0; l < width_v<W>; ++l) q[j + l] = static_cast<std::uint8_t>(lanes[l]);
          });
          blk[0] = M::scale(amax);
        }
      }
    } else {
      (void)x, (void)b, (void)lo, (void)hi, (void)rng;
    }
  }

  /// p <- round(p * (1 - lr wd) - step), one rounding (extension E2);
  /// `step` is lr * u after clipping; `bits` serves the random bits (an Rng
  /// or a RandomRun).
  template <class W, class B>
  static SKEWADAM_ALWAYS_INLINE void update_param(const Ctx& x, index_t off, const W& step, B& bits) {
    P* p = x.p + off;
    const W pn = load_as<W>(p) * vmath::splat<W>(x.s.decay) - step;
    store_param<R>(p, pn, x.element_base + off, bits);
  }

  /// Whether stores draw random bits (a bf16 or fp16 parameter with a
  /// rounding policy that uses them).
  static constexpr bool draws_bits = R::uses_random_bits && !std::is_same_v<P, float>;

  /// for_lanes over offsets [begin, end) for a body that stores parameters:
  /// body.template operator()<W>(off, bits). Where the stores draw random
  /// bits on SIMD lanes, the vectors take them from runs of the window's
  /// buffer (RandomWindow::run): no check per vector, and no call inside the
  /// loop that would make the compiler keep its values in memory.
  template <class Body>
  static SKEWADAM_ALWAYS_INLINE void for_lanes_stored(Rng& rng, index_t element_base, index_t begin, index_t end,
                                                      Body&& body) {
    constexpr index_t w = width_v<V>;
    index_t j = begin;
    if constexpr (w > 1 && draws_bits) {
      while (j + w <= end) {
        const RandomRun run = rng.run(element_base + j, w);
        const index_t stop = j + std::min(run.count, end - j) / w * w;
        for (; j < stop; j += w) body.template operator()<V>(j, run);
      }
    } else if constexpr (w > 1) {
      for (; j + w <= end; j += w) body.template operator()<V>(j, rng);
    }
    for (; j < end; ++j) body.template operator()<float>(j, rng);
  }

  // ------------------------------------------------------- element-wise rule
  static void elementwise_statistics(const TensorTask& t, const WorkUnit& unit) {
    const Ctx x(t);
    const StepScalars& s = x.s;
    const index_t base = unit.matrix * t.geom.matrix_size();
    if constexpr (stored) {  // chunks hold whole blocks
      MomentumRng mrng(t.key);
      update_momentum_blocks(x, unit.matrix, unit.begin, unit.end, mrng);
    }
    // u and, without clipping, the update: the same per-element code
    const auto element = [&]<class W>(index_t off) {
      const W g = grad_at<W>(x, off);
      W m = vmath::splat<W>(0.0f);
      if constexpr (stored) {
        m = momentum_at<W>(x, off);
      } else if constexpr (M::has_state) {
        m = M::update(load_as<W>(x.m + off), g, s);
        store_f32(x.m + off, m);
      }
      const W v = S::update(load_as<W>(x.v + off), g * g, s);
      store_f32(x.v + off, v);
      return W(M::numerator(g, m, s) / S::denominator(v, s));
    };
    if constexpr (C::active) {
      BlockedSum<V> acc;
      for_blocks<V>(base + unit.begin, base + unit.end, [&]<class W>(index_t off) {
        const W u = element.template operator()<W>(off);
        acc.add(u * u);
      }, [&] { acc.fold(); });
      t.unit_sum[unit.block] = acc.sum();
    } else {
      Rng rng(t.key);
      for_lanes_stored(rng, x.element_base, base + unit.begin, base + unit.end, [&]<class W, class B>(index_t off, B& bits) {
        const W u = element.template operator()<W>(off);
        update_param(x, off, vmath::splat<W>(s.lr) * u, bits);
      });
    }
  }

  static void elementwise_apply(const TensorTask& t, const WorkUnit& unit) {
    const Ctx x(t);
    const index_t base = unit.matrix * t.geom.matrix_size();
    // lr * u / divisor, with lr / divisor formed once
    const float lr_eff = C::active ? x.s.lr / t.matrices[unit.matrix].divisor : x.s.lr;
    Rng rng(t.key);
    for_lanes_stored(rng, x.element_base, base + unit.begin, base + unit.end, [&]<class W, class B>(index_t off, B& bits) {
      const W u = numerator_at<W>(x, off) / S::denominator(load_as<W>(x.v + off), x.s);
      update_param(x, off, u * vmath::splat<W>(lr_eff), bits);
    });
  }

  // ---------------------------------------------------------- factored rule
  /// Rows the statistics pass reads together: K streams from memory keep
  /// the hardware prefetchers busy, and colsum / D are loaded and stored once
  /// per K rows. With momentum each row is two streams (g and m).
  static constexpr int group_rows = M::has_state ? 4 : 8;
  /// Whether sweep 2 of a group runs with sweep 1 of the next (sweep_pair):
  /// on NEON only (see the file comment).
  static constexpr bool paired_sweeps = C::active && std::is_same_v<Arch, arch_tag_t<CpuArch::neon>>;

  /// Sweep 1 at column j (W lanes) of the K rows at `off`: g^2 into acc[k]
  /// and, in row order, into colsum_j; momentum update.
  template <int K, class W>
  static SKEWADAM_ALWAYS_INLINE void sums_at(const Ctx& x, index_t off, index_t j, float* colsum, BlockedSum<V>* acc) {
    W cs = load_as<W>(colsum + j);
    for (int k = 0; k < K; ++k) {
      const index_t o = off + k * x.cols + j;
      const W g = grad_at<W>(x, o);
      const W g2 = g * g;
      acc[k].add(g2);
      cs = cs + g2;
      if constexpr (M::has_state && !stored) store_f32(x.m + o, M::update(load_as<W>(x.m + o), g, x.s));
    }
    store_f32(colsum + j, cs);
  }

  /// Sweep 2 at column j (W lanes) of the K rows at `off`: D_j += n_kj^2 *
  /// inv_r[k] in row order (inv_r[k] = 0 for a row with R = 0, whose terms
  /// are 0).
  template <int K, class W>
  static SKEWADAM_ALWAYS_INLINE void d_at(const Ctx& x, index_t off, index_t j, const float* inv_r, float* d) {
    W dj = load_as<W>(d + j);
    for (int k = 0; k < K; ++k) {
      const W n = numerator_at<W>(x, off + k * x.cols + j);
      dj = dj + n * n * vmath::splat<W>(inv_r[k]);
    }
    store_f32(d + j, dj);
  }

  /// Sweep 1 over K rows starting at `off`: row sums of g^2 into sums[k],
  /// colsum_j += g_kj^2 in row order, momentum update.
  template <int K>
  static SKEWADAM_ALWAYS_INLINE void group_sums(const Ctx& x, index_t off, float* colsum, double* sums) {
    BlockedSum<V> acc[K];
    for_blocks<V>(0, x.cols, [&]<class W>(index_t j) { sums_at<K, W>(x, off, j, colsum, acc); }, [&] {
      for (int k = 0; k < K; ++k) acc[k].fold();
    });
    for (int k = 0; k < K; ++k) sums[k] = acc[k].sum();
  }

  /// Sweep 2 over the same K rows (now in cache): D_j of them.
  template <int K>
  static SKEWADAM_ALWAYS_INLINE void group_d(const Ctx& x, index_t off, const float* inv_r, float* d) {
    for_lanes<V>(0, x.cols, [&]<class W>(index_t j) { d_at<K, W>(x, off, j, inv_r, d); });
  }

  /// Sweep 1 of the K rows at `off` (from memory) and sweep 2 of the K rows
  /// at `doff` that the previous sweep read (now in cache), in one pass over
  /// the columns: the cached half runs while the memory streams. Whole
  /// vectors take both halves in one loop; the scalar tail of each half runs
  /// in its own loop, as group_sums and group_d run it. The halves touch
  /// different rows and sums: every sum is formed exactly as by the two
  /// sweeps, in the same order, with the same folds.
  template <int K>
  static SKEWADAM_ALWAYS_INLINE void sweep_pair(const Ctx& x, index_t off, float* colsum, double* sums, index_t doff,
                                                const float* inv_r, float* d) {
    constexpr index_t w = width_v<V>;
    constexpr index_t span = sum_block * w;
    const index_t c = x.cols;
    BlockedSum<V> acc[K];
    for (index_t j0 = 0; j0 < c; j0 += span) {
      const index_t j1 = std::min(c, j0 + span);
      index_t j = j0;
      for (; j + w <= j1; j += w) {
        sums_at<K, V>(x, off, j, colsum, acc);
        d_at<K, V>(x, doff, j, inv_r, d);
      }
      for_lanes<float>(j, j1, [&]<class W>(index_t t) { sums_at<K, W>(x, off, t, colsum, acc); });
      for_lanes<float>(j, j1, [&]<class W>(index_t t) { d_at<K, W>(x, doff, t, inv_r, d); });
      for (int k = 0; k < K; ++k) acc[k].fold();
    }
    for (int k = 0; k < K; ++k) sums[k] = acc[k].sum();
  }

  /// R_i of the K rows starting at row i of matrix b from their sums of g^2,
  /// and inv_r[k] = 1 / R_i (0 for R_i = 0) for their sweep 2.
  template <int K>
  static SKEWADAM_ALWAYS_INLINE void finish_rows(const TensorTask& t, const Ctx& x, index_t b, index_t i,
                                                 const double* sums, float* inv_r) {
    const double fc = static_cast<double>(x.cols);
    float* rs = t.v_row + b * x.rows + i;
    for (int k = 0; k < K; ++k) {
      rs[k] = S::update_statistic(rs[k], static_cast<float>(sums[k] / fc), x.s);
      inv_r[k] = rs[k] > 0.0f ? 1.0f / rs[k] : 0.0f;
    }
  }

  /// K rows of the statistics pass, the first at row i of matrix b.
  template <int K>
  static SKEWADAM_ALWAYS_INLINE void statistics_group(const TensorTask& t, const Ctx& x, index_t b, index_t i,
                                                      float* colsum, float* d) {
    const index_t off = (b * x.rows + i) * x.cols;
    double sums[K];
    float inv_r[K];
    group_sums<K>(x, off, colsum, sums);
    finish_rows<K>(t, x, b, i, sums, inv_r);
    if constexpr (C::active) group_d<K>(x, off, inv_r, d);
  }

  /// Rows [i, e) of matrix b, at most sum_block, into colsum and d: groups
  /// of group_rows rows, then single rows. With paired_sweeps, the sweep 2
  /// of each group runs with the sweep 1 of the next (sweep_pair), and the
  /// block's last group's alone.
  static SKEWADAM_ALWAYS_INLINE void statistics_block(const TensorTask& t, const Ctx& x, index_t b, index_t i,
                                                      index_t e, float* colsum, float* d, MomentumRng& mrng) {
    constexpr int K = group_rows;
    // stored momentum: the blocks that start in rows [i0, i1), before
    // anything reads those rows' m (a block may run on into later rows)
    const auto momentum_rows = [&](index_t i0, index_t i1) {
      if constexpr (stored) update_momentum_blocks(x, b, i0 * x.cols, i1 * x.cols, mrng);
    };
    if constexpr (paired_sweeps) {
      const index_t c = x.cols;
      const index_t base = b * x.rows;
      double sums[K];
      float inv_r[K];
      index_t pending = -1;  // the group whose sweep 2 is due
      for (; i + K <= e; i += K) {
        momentum_rows(i, i + K);
        if (pending >= 0) sweep_pair<K>(x, (base + i) * c, colsum, sums, (base + pending) * c, inv_r, d);
        else group_sums<K>(x, (base + i) * c, colsum, sums);
        finish_rows<K>(t, x, b, i, sums, inv_r);
        pending = i;
      }
      if (pending >= 0) group_d<K>(x, (base + pending) * c, inv_r, d);
    } else {
      for (; i + K <= e; i += K) {
        momentum_rows(i, i + K);
        statistics_group<K>(t, x, b, i, colsum, d);
      }
    }
    for (; i < e; ++i) {
      momentum_rows(i, i + 1);
      statistics_group<1>(t, x, b, i, colsum, d);
    }
  }

  /// D_j += n_ij^2 * inv_r over the row at `off`.
  static SKEWADAM_ALWAYS_INLINE void accumulate_d(const Ctx& x, index_t off, float inv_r, float* d) {
    for_lanes<V>(0, x.cols, [&]<class W>(index_t j) {
      const W n = numerator_at<W>(x, off + j);
      store_f32(d + j, load_as<W>(d + j) + n * n * vmath::splat<W>(inv_r));
    });
  }

  /// 1 / col_j of matrix b into w[0, c).
  static SKEWADAM_ALWAYS_INLINE void inverse_col_factors(const TensorTask& t, const Ctx& x, index_t b, float* w) {
    const float* cs = t.v_col + b * x.cols;
    for_lanes<V>(0, x.cols, [&]<class W>(index_t j) {
      store_f32(w + j, vmath::splat<W>(1.0f) / S::col_factor(load_as<W>(cs + j), x.s));
    });
  }

  /// sum_j u_ij^2 of one row, u formed as apply() forms it (before clipping):
  /// n_ij * ((1 / row_i) * (1 / col_j)), `w` holding 1 / col_j.
  static double row_sum_u2(const TensorTask& t, const Ctx& x, index_t b, index_t i, float vbar, const float* w) {
    const index_t off = (b * x.rows + i) * x.cols;
    const float inv_row = 1.0f / S::row_factor(t.v_row[b * x.rows + i], vbar, x.s);
    BlockedSum<V> acc;
    for_blocks<V>(0, x.cols, [&]<class W>(index_t j) {
      const W u = numerator_at<W>(x, off + j) * (vmath::splat<W>(inv_row) * load_as<W>(w + j));
      acc.add(u * u);
    }, [&] { acc.fold(); });
    return acc.sum();
  }

  /// Statistics of rows [r0, r1) of matrix b: R_i (final), column sums of g^2
  /// into colsum[0, c), the momentum update, and D_j into d[0, c) when
  /// clipping; `wide` is room for 2 c doubles. Rows are taken in blocks of
  /// sum_block, each block's column sums folded into doubles (summation.hpp).
  static void factored_rows(const TensorTask& t, index_t b, index_t r0, index_t r1, float* colsum, float* d,
                            double* wide) {
    const Ctx x(t);
    const index_t c = x.cols;
    std::fill(colsum, colsum + c, 0.0f);
    std::fill(d, d + c, 0.0f);
    std::fill(wide, wide + 2 * c, 0.0);
    MomentumRng mrng(t.key);
    for (index_t i = r0; i < r1; i += sum_block) {
      statistics_block(t, x, b, i, std::min(r1, i + sum_block), colsum, d, mrng);
      fold_columns(colsum, wide, c);
      if constexpr (C::active) fold_columns(d, wide + c, c);
    }
    round_columns(wide, colsum, c);
    if constexpr (C::active) round_columns(wide + c, d, c);
  }

  /// Rows [i0, i1) of matrix b after the statistics pass, for the clip sum
  /// when the eps floor binds on some of them: D_j of the rows that are not
  /// floored into d[0, c) (blocked; `wide` is room for c doubles), and the
  /// floored rows' own sum of u^2, formed as apply() forms u, returned.
  /// `w` holds 1 / col_j.
  static double floored_rows(const TensorTask& t, const Ctx& x, index_t b, index_t i0, index_t i1, float vbar,
                             const float* w, float* d, double* wide) {
    const index_t c = x.cols;
    const float* rs = t.v_row + b * x.rows;
    std::fill(d, d + c, 0.0f);
    std::fill(wide, wide + c, 0.0);
    double floored_sum = 0;
    for (index_t i = i0; i < i1;) {
      const index_t e = std::min(i1, i + sum_block);
      for (; i < e; ++i) {
        if (!(rs[i] > 0.0f)) continue;
        if (S::row_floored(rs[i], vbar, x.s)) floored_sum += row_sum_u2(t, x, b, i, vbar, w);
        else accumulate_d(x, (b * x.rows + i) * c, 1.0f / rs[i], d);
      }
      fold_columns(d, wide, c);
    }
    round_columns(wide, d, c);
    return floored_sum;
  }

  /// Finishes matrix b from nb row-block partials (colsum[k*c..], d[k*c..]):
  /// C_j, vbar, and sum(u^2) with floored rows handled exactly. `scratch`
  /// gives room for c floats and c doubles. A cut task's C_j and vbar come
  /// from `totals` instead (c column sums, then the sum of R_i, of the whole
  /// matrix of t.full_rows rows), its sum of u^2 from its own rows.
  static void finalize_matrix(const TensorTask& t, index_t b, float* colsum, float* d, index_t nb, Scratch scratch,
                              const double* totals = nullptr) {
    const Ctx x(t);
    const StepScalars& s = x.s;
    const index_t r = x.rows;
    const index_t c = x.cols;
    const index_t all_rows = totals != nullptr ? t.full_rows : r;
    const float fr = static_cast<float>(all_rows);
    if (totals != nullptr)
      for (index_t j = 0; j < c; ++j) colsum[j] = static_cast<float>(totals[j]);
    else if (nb > 1)
      for (index_t j = 0; j < c; ++j) {
        double sum = 0;
        for (index_t k = 0; k < nb; ++k) sum += static_cast<double>(colsum[k * c + j]);
        colsum[j] = static_cast<float>(sum);
      }
    float* cs = t.v_col + b * c;
    for (index_t j = 0; j < c; ++j) cs[j] = S::update_statistic(cs[j], colsum[j] / fr, s);

    const float* rs = t.v_row + b * r;
    const double sum_r =
        totals != nullptr ? totals[c] : wide_sum(r, [&](index_t i) { return static_cast<double>(rs[i]); });
    const float vbar = S::vbar(static_cast<float>(sum_r / static_cast<double>(all_rows)));
    MatrixScratch& ms = t.matrices[b];
    ms.vbar = vbar;
    if constexpr (C::active) {
      double floored_sum = 0;
      bool inverted = false;
      for (index_t k = 0; k < nb; ++k) {
        const index_t i0 = row_block_start(r, k, nb, t.row_align);
        const index_t i1 = row_block_start(r, k + 1, nb, t.row_align);
        bool any = false;
        for (index_t i = i0; i < i1 && !any; ++i) any = rs[i] > 0.0f && S::row_floored(rs[i], vbar, s);
        if (!any) continue;
        if (!inverted) {
          inverse_col_factors(t, x, b, scratch.f);
          inverted = true;
        }
        floored_sum += floored_rows(t, x, b, i0, i1, vbar, scratch.f, d + k * c, scratch.d);
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

  /// p <- round(p * decay - n_ij * (a_i * w_j)), w_j = 1 / col_j and
  /// a_i = lr / (row_i * divisor) (see the file comment).
  static void factored_apply(const TensorTask& t, const WorkUnit& unit, float* w) {
    const Ctx x(t);
    const index_t b = unit.matrix;
    const index_t c = x.cols;
    const MatrixScratch& ms = t.matrices[b];
    const float div = C::active ? ms.divisor : 1.0f;
    const float vbar = ms.vbar;
    const float* rs = t.v_row + b * x.rows;
    inverse_col_factors(t, x, b, w);
    Rng rng(t.key);
    for (index_t i = unit.begin; i < unit.end; ++i) {
      const index_t off = (b * x.rows + i) * c;
      const float a = x.s.lr / (S::row_factor(rs[i], vbar, x.s) * div);
      for_lanes_stored(rng, x.element_base + off, 0, c, [&]<class W, class B>(index_t j, B& bits) {
        const W n = numerator_at<W>(x, off + j);
        update_param(x, off + j, n * (vmath::splat<W>(a) * load_as<W>(w + j)), bits);
      });
    }
  }

  // ------------------------------------------------------------ the table
  static void statistics(const TensorTask& t, const WorkUnit& unit, Scratch scratch) {
    if constexpr (S::factored) {
      const index_t c = t.geom.cols;
      if (t.row_blocks > 1 || t.cut) {
        float* col = t.col_partial + unit.block * c;
        float* d = t.d_partial + unit.block * c;
        factored_rows(t, unit.matrix, unit.begin, unit.end, col, d, scratch.d);
      } else {
        float* col = scratch.f;
        float* d = scratch.f + c;
        factored_rows(t, unit.matrix, 0, t.geom.rows, col, d, scratch.d);
        finalize_matrix(t, unit.matrix, col, d, 1, Scratch{scratch.f + 2 * c, scratch.d});
      }
    } else {
      (void)scratch;
      elementwise_statistics(t, unit);
    }
  }

  static void finalize(const TensorTask& t, Scratch scratch) {
    const MatrixGeometry& g = t.geom;
    if constexpr (S::factored) {
      if (t.row_blocks > 1) finalize_matrix(t, 0, t.col_partial, t.d_partial, t.row_blocks, scratch);
    } else if constexpr (C::active) {
      (void)scratch;
      const index_t nc = t.chunks_per_matrix;
      for (index_t b = 0; b < g.batch; ++b) {
        double sum = 0;
        for (index_t k = 0; k < nc; ++k) sum += t.unit_sum[b * nc + k];
        t.matrices[b].sum_u2 = sum;
      }
    } else {
      (void)scratch;
    }
    if constexpr (C::active)
      clip_divisors(
          t.scope, g, [&](double sum, index_t count) { return C::divisor(sum, count, t.scalars); },
          [&](index_t b) { return t.matrices[b].sum_u2; }, [&](index_t b, float d) { t.matrices[b].divisor = d; });
  }

  static void apply(const TensorTask& t, const WorkUnit& unit, Scratch scratch) {
    if constexpr (S::factored) factored_apply(t, unit, scratch.f);
    else elementwise_apply(t, unit);
  }

  static void finish_cut(const TensorTask& t, const double* totals, Scratch scratch) {
    if constexpr (S::factored) finalize_matrix(t, 0, t.col_partial, t.d_partial, t.row_blocks, scratch, totals);
  }
};

/// The kernels of a rule for parameters of element type P, gradients of G,
/// on architecture Arch: what a backend asks for. Not inline, so that the
/// compiled mode (skewadam/engine/backend/cpu/compiled.hpp) can instantiate it once, in its
/// library, and declare it extern for every translation unit that uses it.
template <class Rule, class P, class G, class Arch>
const KernelTable* kernel_table() noexcept;

template <class Rule, class P, class G, class Arch>
const KernelTable* kernel_table() noexcept {
  return Kernels<Rule, P, G, Arch>::table();
}

}  // namespace skewadam::backend::cpu
