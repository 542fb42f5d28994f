#pragma once
// How the CPU backend cuts a step into work, independently of thread count.
//
// A step is a list of TensorTasks (one per piece of a tensor with a gradient,
// engine/backend/backend.hpp) and a list of WorkUnits (work_unit.hpp): row blocks
// of factored matrices, element chunks of element-wise tensors. The cut
// depends only on shapes, every reduction is summed per unit and units are
// combined in a fixed order, so results are bit-identical for any number of
// threads and any scheduling.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../../../detail/config.hpp"
#include "../../../math/hyperparameters.hpp"
#include "../../../math/random.hpp"
#include "../../../math/step_scalars.hpp"
#include "../../../types/shape.hpp"
#include "../work_unit.hpp"

namespace skewadam::backend {

/// Per-matrix results of the statistics pass.
struct MatrixScratch {
  double sum_u2 = 0;   ///< sum of u^2 over the matrix (before clipping)
  float vbar = 0;      ///< max(mean_i R_i, 1e-15) (factored)
  float divisor = 1;   ///< clip divisor applied to this matrix
};

struct KernelTable;

struct TensorTask {
  void* param = nullptr;
  const void* grad = nullptr;
  MatrixGeometry geom{};
  bool factored = false;  ///< the rule's factored statistics apply (rank >= 2)
  ClipScope scope = ClipScope::tensor;
  StepScalars scalars{};
  RoundingKey key{};
  // state
  float* m = nullptr;      ///< [numel] or null
  float* v = nullptr;      ///< [numel] (element-wise) or null
  float* v_row = nullptr;  ///< [B * r] (factored)
  float* v_col = nullptr;  ///< [B * c] (factored)
  // scratch, allocated with the state
  MatrixScratch* matrices = nullptr;  ///< [B]
  float* col_partial = nullptr;       ///< [row_blocks * c] when row_blocks > 1
  float* d_partial = nullptr;         ///< [row_blocks * c] when row_blocks > 1
  double* unit_sum = nullptr;         ///< [chunks] (element-wise)
  index_t row_blocks = 1;             ///< factored, B == 1: row blocks of the matrix
  index_t chunks_per_matrix = 1;      ///< element-wise: chunks per matrix
  const KernelTable* kernel = nullptr;
  /// Flat index, in the whole parameter, of this task's element 0: the
  /// stochastic-rounding bits of element k are those of element
  /// element_base + k. Nonzero only when the task is a piece of a larger
  /// tensor (a shard, engine/placement/sharded.hpp).
  index_t element_base = 0;
  /// A row slice of a matrix cut between processes (statistics into
  /// col_partial and d_partial, finished from totals over the processes by
  /// KernelTable::finish_cut); full_rows: the whole matrix's rows.
  bool cut = false;
  index_t full_rows = 0;
  float grad_limit = 0;  ///< the non-finite policy's limit (gradient_check.hpp)
  /// Row blocks start at multiples of this many rows: 1, or, for momentum
  /// stored in blocks (MomentumStorage::int8_blocks), the least count of
  /// rows whose elements fill whole blocks, so that no block is split
  /// between units.
  index_t row_align = 1;
};

/// First row of row block k of nb over r rows, rounded down to a multiple of
/// `align` (block nb starts at r).
constexpr index_t row_block_start(index_t r, index_t k, index_t nb, index_t align) noexcept {
  if (k >= nb) return r;
  return r * k / nb / align * align;
}

/// The calling thread's scratch, never shared between threads: room for
/// Scratch::floats(cols) floats and Scratch::doubles(cols) doubles, cols
/// being the widest factored matrix registered.
struct Scratch {
  float* f = nullptr;
  double* d = nullptr;
  static constexpr index_t floats(index_t cols) { return 3 * cols; }
  static constexpr index_t doubles(index_t cols) { return 2 * cols; }
};

/// A Scratch for each of `threads` threads, on separate cache lines.
class ScratchSpace {
 public:
  void resize(int threads, index_t cols) {
    fstride_ = static_cast<std::size_t>((Scratch::floats(cols) + 15) / 16 * 16 + 16);
    dstride_ = static_cast<std::size_t>((Scratch::doubles(cols) + 7) / 8 * 8 + 8);
    const auto n = static_cast<std::size_t>(std::max(threads, 1));
    floats_.assign(fstride_ * n, 0.0f);
    doubles_.assign(dstride_ * n, 0.0);
  }
  std::size_t bytes() const noexcept { return 4 * floats_.size() + 8 * doubles_.size(); }
  Scratch at(int thread) {
    const auto k = static_cast<std::size_t>(thread);
    return Scratch{floats_.data() + k * fstride_, doubles_.data() + k * dstride_};
  }

 private:
  std::size_t fstride_ = 0, dstride_ = 0;
  std::vector<float> floats_;
  std::vector<double> doubles_;
};

/// Function table of one (rule, parameter dtype, gradient dtype, arch).
struct KernelTable {
  /// Statistics pass (and, for an element-wise rule without clipping, the
  /// whole update).
  void (*statistics)(const TensorTask&, const WorkUnit&, Scratch scratch);
  /// Combines per-unit partials, finishes statistics, computes clip divisors.
  void (*finalize)(const TensorTask&, Scratch scratch);
  /// Applies the update; null when statistics() already did.
  void (*apply)(const TensorTask&, const WorkUnit&, Scratch scratch);
  /// A cut task, after its statistics: C_j and vbar from `totals` (c column
  /// sums of g^2 then the sum of R_i, over every process's rows), and its
  /// own sum of u^2.
  void (*finish_cut)(const TensorTask&, const double* totals, Scratch scratch);
};

/// Work-cutting constants (shape-only, never thread-dependent).
struct Cutting {
  static constexpr index_t max_row_blocks = 16;
  static constexpr index_t min_block_elems = index_t{1} << 18;
  static constexpr index_t chunk_elems = index_t{1} << 16;

  /// Row blocks of a factored piece's matrix: only a single large matrix is
  /// split (a bank is parallel across its matrices).
  static index_t row_blocks(const MatrixGeometry& g) {
    if (g.batch != 1 || g.rows <= 1) return 1;
    const index_t want = (g.matrix_size() + min_block_elems - 1) / min_block_elems;
    return std::clamp<index_t>(want, 1, std::min(max_row_blocks, g.rows));
  }
  static index_t chunks_per_matrix(const MatrixGeometry& g) {
    return std::max<index_t>(1, (g.matrix_size() + chunk_elems - 1) / chunk_elems);
  }
  /// Floats of per-piece column scratch (col_partial and d_partial each).
  static index_t partial_floats(const MatrixGeometry& g, bool cut = false) {
    const index_t nb = row_blocks(g);
    return nb > 1 || cut ? nb * g.cols : 0;
  }
};

/// Appends the units of `task` (index `task_index`) to `units`.
inline void append_units(const TensorTask& task, std::int32_t task_index, std::vector<WorkUnit>& units) {
  const MatrixGeometry& g = task.geom;
  if (task.factored) {
    const index_t nb = task.row_blocks;
    for (index_t b = 0; b < g.batch; ++b)
      for (index_t k = 0; k < nb; ++k)
        units.push_back(WorkUnit{task_index, b, row_block_start(g.rows, k, nb, task.row_align),
                                 row_block_start(g.rows, k + 1, nb, task.row_align), k});
  } else {
    const index_t n = g.matrix_size();
    const index_t nc = task.chunks_per_matrix;
    for (index_t b = 0; b < g.batch; ++b)
      for (index_t k = 0; k < nc; ++k) {
        const index_t begin = k * Cutting::chunk_elems;
        units.push_back(WorkUnit{task_index, b, begin, std::min(n, begin + Cutting::chunk_elems), b * nc + k});
      }
  }
}

}  // namespace skewadam::backend
