#pragma once
// The work lists of the CUDA kernels (kernels.cuh): which block does what,
// cut by shape only when tensors are registered. One group is the tensors
// sharing a rule and dtypes, whose kernels one launch per pass covers:
//
//   units     factored: row blocks of the statistics pass; element-wise:
//             chunks of chunk_elems elements
//   columns   factored: blocks of column_block columns (the columns pass)
//   applies   factored: row blocks of the update; element-wise: the units
//   shards    factored pieces of matrices cut between ranks (a sharded
//             placement): blocks of column_block columns (shard_sums_kernel)
//
// The front-end's engines (placement/local_cuda.hpp, sharded_cuda.hpp) build
// them here.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "../../config.hpp"
#include "../../shape.hpp"
#include "kernels.cuh"

namespace skewadam::backend::cuda {

/// Throws unless `blocks` work items fit one launch's grid.
inline void check_launch_size(std::size_t blocks) {
  if (blocks > 0x7fffffffu) throw std::invalid_argument("parameters: too many work items for one launch");
}

/// A group's lists in host memory, in the order they are uploaded.
struct GroupLists {
  bool factored = false;
  std::vector<WorkItem> units, columns, applies, shards;
  std::vector<std::int32_t> tasks;

  /// Appends tensor `task` (geometry g; row_blocks or chunks as in its
  /// DeviceTask); `cut`: a factored piece of a matrix cut between ranks.
  void add(std::int32_t task, const MatrixGeometry& g, index_t row_blocks, index_t chunks, bool cut = false) {
    tasks.push_back(task);
    if (factored && cut)
      for (index_t b = 0; b < g.batch; ++b)
        for (index_t j = 0; j < g.cols; j += column_block)
          shards.push_back(WorkItem{task, b, j, std::min(g.cols, j + column_block), 0});
    if (factored) {
      const index_t na = apply_blocks_of(g);
      for (index_t b = 0; b < g.batch; ++b) {
        for (index_t q = 0; q < row_blocks; ++q)
          units.push_back(WorkItem{task, b, g.rows * q / row_blocks, g.rows * (q + 1) / row_blocks, q});
        for (index_t q = 0; q < na; ++q) applies.push_back(WorkItem{task, b, g.rows * q / na, g.rows * (q + 1) / na, q});
        for (index_t j = 0; j < g.cols; j += column_block)
          columns.push_back(WorkItem{task, b, j, std::min(g.cols, j + column_block), 0});
      }
    } else {
      const index_t size = g.matrix_size();
      for (index_t b = 0; b < g.batch; ++b)
        for (index_t q = 0; q < chunks; ++q) {
          const WorkItem it{task, b, q * chunk_elems, std::min(size, (q + 1) * chunk_elems), b * chunks + q};
          units.push_back(it);
          applies.push_back(it);
        }
    }
  }

  /// units, columns, applies, shards: one array to upload. Throws when a
  /// pass would need more blocks than one launch has.
  std::vector<WorkItem> concatenated() const {
    check_launch_size(units.size() + columns.size() + applies.size() + shards.size());
    std::vector<WorkItem> all = units;
    all.insert(all.end(), columns.begin(), columns.end());
    all.insert(all.end(), applies.begin(), applies.end());
    all.insert(all.end(), shards.begin(), shards.end());
    return all;
  }
};

/// The device arrays of one group's work lists.
struct GroupArrays {
  const WorkItem* units = nullptr;
  std::int32_t n_units = 0;
  const WorkItem* columns = nullptr;
  std::int32_t n_columns = 0;
  const WorkItem* applies = nullptr;
  std::int32_t n_applies = 0;
  const WorkItem* shards = nullptr;
  std::int32_t n_shards = 0;
  const std::int32_t* tasks = nullptr;
  std::int32_t n_tasks = 0;

  /// Where l's lists lie once `items` holds l.concatenated() and `task_ids` l.tasks.
  static GroupArrays of(const GroupLists& l, const WorkItem* items, const std::int32_t* task_ids) {
    GroupArrays a;
    a.units = items;
    a.n_units = static_cast<std::int32_t>(l.units.size());
    a.columns = items + l.units.size();
    a.n_columns = static_cast<std::int32_t>(l.columns.size());
    a.applies = items + l.units.size() + l.columns.size();
    a.n_applies = static_cast<std::int32_t>(l.applies.size());
    a.shards = a.applies + l.applies.size();
    a.n_shards = static_cast<std::int32_t>(l.shards.size());
    a.tasks = task_ids;
    a.n_tasks = static_cast<std::int32_t>(l.tasks.size());
    return a;
  }
};

}  // namespace skewadam::backend::cuda
