#pragma once
// WorkUnit: one piece of a pass's work, as both backends cut it: by shape
// alone, never by the number of threads or blocks that take the units. The
// CPU backend's threads take them dynamically (cpu/work.hpp); the CUDA
// backend runs one block per unit (cuda/passes.hpp cuts its lists).

#include <cstdint>

#include "../../detail/config.hpp"

namespace skewadam::backend {

/// Rows [begin, end) of matrix `matrix` of a factored piece (row block
/// `block`); elements [begin, end) of matrix `matrix` of an element-wise
/// piece (chunk `block` of the piece); or, in the CUDA backend's columns and
/// shard-sums passes, columns [begin, end) of matrix `matrix` (`block`: the
/// matrix's row blocks).
struct WorkUnit {
  std::int32_t task = 0;  ///< the piece: its index in the list of tasks the pass is handed
  index_t matrix = 0;
  index_t begin = 0;
  index_t end = 0;
  index_t block = 0;
  /// The CUDA backend's factored statistics and columns units: where the
  /// matrix's row blocks' partials start in the group's workspace (doubles;
  /// row block k's c column sums at scratch + 2 k c, its c clip terms D_kj
  /// after them). 0 elsewhere.
  index_t scratch = 0;
};

}  // namespace skewadam::backend
