#pragma once
// The CUDA backend's task layout: what its kernels (kernels.cuh) are handed,
// as plain data that host code includes too (passes.hpp cuts the work lists
// from it): the launch shapes, one tensor's per-step values (TaskStep) and
// device pointers (DeviceTask) and its own scratch. A block's work is a
// WorkUnit (../work_unit.hpp).

#include <cstddef>
#include <cstdint>

#include "../../../detail/config.hpp"
#include "../../../math/hyperparameters.hpp"
#include "../../../math/random.hpp"
#include "../../../math/step_scalars.hpp"
#include "../../../state/state_layout.hpp"
#include "../../../types/shape.hpp"
#include "../work_unit.hpp"

namespace skewadam::backend::cuda {

/// Threads per block. A 4096 x 4096 matrix has 256 row blocks, two per SM
/// on an H100/H200: wide blocks keep enough loads in flight to cover the
/// memory latency with so few of them.
inline constexpr int block_threads = 512;
inline constexpr int block_warps = block_threads / 32;
/// Elements per statistics block of an element-wise tensor.
inline constexpr index_t chunk_elems = index_t{1} << 12;
/// Elements per block of the stored momentum's pass: a block of momentum
/// (momentum_block elements) per warp.
inline constexpr index_t momentum_chunk_elems = momentum_block * block_warps;
/// Target elements per row block of a factored matrix's statistics, and the
/// most rows such a block takes: the finest cut of a matrix (a small group's
/// matrices still give enough blocks).
inline constexpr index_t row_block_elems = index_t{1} << 16;
inline constexpr index_t row_block_rows = 16;
/// Row blocks a group's factored matrices share in the statistics pass (see
/// the file comment): enough for several waves of blocks on a GPU of 132
/// multiprocessors, few enough that their column partials stay a small
/// fraction of the state.
inline constexpr index_t statistics_blocks = 1024;
/// Target elements per block of a factored matrix's update (no partials:
/// small blocks balance the GPU's multiprocessors).
inline constexpr index_t apply_block_elems = index_t{1} << 13;
/// Threads per block of the update kernel (no block reductions there), and
/// the blocks per multiprocessor its register budget is sized for.
inline constexpr int apply_threads = 256;
inline constexpr int apply_min_blocks = 4;
/// Columns per block of the columns kernel (a warp's width; the block's
/// warps split the row blocks).
inline constexpr index_t column_block = 32;
/// Terms of a row that one thread adds in fp32 before folding them into a
/// double (the CPU's blocked summation, engine/backend/cpu/summation.hpp): rows of
/// up to sum_block * block_threads = 32768 columns are one block.
inline constexpr index_t sum_block = 64;

/// Per-step values of one tensor (from the host, every step). `skip` is set
/// on the device (check_kernels.cuh) when a gradient of the step offends:
/// every kernel of the step then leaves the tensor as it is.
struct TaskStep {
  StepScalars s{};
  RoundingKey key{};
  ClipScope scope = ClipScope::tensor;
  int skip = 0;
};

/// One tensor as the kernels see it: pointers into device memory.
struct DeviceTask {
  void* param = nullptr;
  const void* grad = nullptr;  ///< null: no gradient this step (skipped)
  MatrixGeometry geom{};
  int tier = 0;              ///< tier_index (which StepControl hyperparameters)
  std::int32_t tensor = 0;   ///< the tensor it is a piece of (its step count)
  std::uint32_t id = 0;      ///< rounding stream (FNV-1a of the name)
  index_t row_blocks = 1;    ///< factored: the most row blocks per matrix (row_blocks_of; the plan may take fewer)
  index_t chunks = 1;        ///< element-wise: chunks per matrix
  /// Flat index in the whole tensor of this task's element 0 (a sharded
  /// placement's piece): stochastic rounding's position. 0 for a whole tensor.
  index_t element_base = 0;
  /// A sharded placement's piece of a matrix cut between ranks (else null):
  /// per matrix, c column sums of g^2 then the sum of R_i, in double;
  /// shard_sums_kernel writes this rank's, the placement replaces them with
  /// the totals over ranks, from which the columns pass forms C_j and vbar
  /// of a matrix of full_rows rows.
  double* shard_sums = nullptr;
  index_t full_rows = 0;
  /// Non-zero: the clip divisors come from the host (a sharded placement,
  /// whose clip sums span ranks); the finish passes only form matrix_sum.
  int host_divisors = 0;
  // state
  float* m = nullptr;
  float* v = nullptr;
  float* v_row = nullptr;
  float* v_col = nullptr;
  // scratch (the row blocks' column partials are the group's: WorkUnit::scratch)
  float* inv_col = nullptr;      ///< [B * c] 1 / col_j
  double* col_term = nullptr;    ///< [2 * B * c] sum_k D_kj / col_j^2, then floored rows' u^2
  unsigned* done = nullptr;      ///< [B + 1] finished column blocks per matrix, finished matrices (zero between steps)
  float* vbar = nullptr;         ///< [B]
  double* matrix_sum = nullptr;  ///< [B] sum u^2 per matrix
  float* divisor = nullptr;      ///< [B]
  double* chunk_sum = nullptr;   ///< [B * chunks] element-wise
};

/// Scratch of one tensor (DeviceTask's scratch pointers), in three arrays.
struct ScratchSizes {
  std::size_t floats = 0;
  std::size_t doubles = 0;
  std::size_t counters = 0;  ///< zeroed once; the kernels reset them
};

/// The scratch a tensor of geometry d.geom needs of its own: factored,
/// O(B c) (its row blocks' partials are the group's workspace); element-wise,
/// one double per chunk (d.chunks must be set).
inline ScratchSizes scratch_sizes(const DeviceTask& d, bool factored) {
  const auto B = static_cast<std::size_t>(d.geom.batch);
  const auto c = static_cast<std::size_t>(d.geom.cols);
  if (factored) return {B * c + 2 * B, 2 * B * c + B, B + 1};
  return {2 * B, B * static_cast<std::size_t>(d.chunks) + B, 0};
}

/// Points d's scratch pointers into arrays of scratch_sizes(d, factored).
inline void place_scratch(DeviceTask& d, bool factored, float* f, double* x, unsigned* counters) {
  const auto B = static_cast<std::size_t>(d.geom.batch);
  const auto c = static_cast<std::size_t>(d.geom.cols);
  if (factored) {
    d.inv_col = f;
    d.vbar = d.inv_col + B * c;
    d.divisor = d.vbar + B;
    d.col_term = x;
    d.matrix_sum = x + 2 * B * c;
    d.done = counters;
  } else {
    d.divisor = f;
    d.chunk_sum = x;
    d.matrix_sum = x + B * static_cast<std::size_t>(d.chunks);
  }
}

namespace detail {
/// Blocks of ceil(rows / k) ... rows with k = target / cols rows each, at
/// least one row and at most max_rows.
inline index_t blocks_of_rows(const MatrixGeometry& g, index_t target, index_t max_rows) {
  index_t per = g.cols > 0 ? target / g.cols : max_rows;
  per = per < 1 ? 1 : (per > max_rows ? max_rows : per);
  const index_t n = (g.rows + per - 1) / per;
  return n < 1 ? 1 : n;
}
}  // namespace detail

/// Row blocks of a factored matrix's statistics pass.
inline index_t row_blocks_of(const MatrixGeometry& g) {
  return detail::blocks_of_rows(g, row_block_elems, row_block_rows);
}
/// Row blocks of a factored matrix's update.
inline index_t apply_blocks_of(const MatrixGeometry& g) {
  return detail::blocks_of_rows(g, apply_block_elems, g.rows < 1 ? 1 : g.rows);
}
inline index_t chunks_of(const MatrixGeometry& g) {
  const index_t n = (g.matrix_size() + chunk_elems - 1) / chunk_elems;
  return n < 1 ? 1 : n;
}

}  // namespace skewadam::backend::cuda
