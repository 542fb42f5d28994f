#pragma once
// The work lists of the CUDA kernels (kernels.cuh): which block does what,
// cut when tensors are registered, by shape only but for a factored matrix's
// statistics, whose row blocks are its share of the group's
// statistics_blocks. One group is the tensors sharing a rule and dtypes,
// whose kernels one launch per pass covers:
//
//   units     factored: row blocks of the statistics pass, each with its
//             column partials in the group's workspace; element-wise:
//             chunks of chunk_elems elements
//   columns   factored: blocks of column_block columns (the columns pass)
//   applies   factored: row blocks of the update; element-wise: the units
//   shards    factored pieces of matrices cut between ranks (a sharded
//             placement): blocks of column_block columns (shard_sums_kernel)
//
// The front-end's engines (placement/local_cuda.hpp, sharded_cuda.hpp) build
// them here.

#include <algorithm>
#include <cmath>
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

/// A group's lists in host memory, in the order they are uploaded. Tensors
/// are added one by one; the lists are formed when they are first read
/// (plan()), since a factored matrix's row blocks depend on the whole group.
struct GroupLists {
  bool factored = false;
  std::vector<WorkItem> units, columns, applies, shards;
  std::vector<std::int32_t> tasks;

  /// Appends tensor `task` (geometry g; row_blocks, the most row blocks of
  /// each matrix, or chunks as in its DeviceTask); `cut`: a factored piece of
  /// a matrix cut between ranks, of whole_rows rows in all.
  void add(std::int32_t task, const MatrixGeometry& g, index_t row_blocks, index_t chunks, bool cut = false,
           index_t whole_rows = 0) {
    tasks.push_back(task);
    entries_.push_back(Entry{task, g, row_blocks, chunks, cut, cut && whole_rows > 0 ? whole_rows : g.rows});
    if (!counted_) group_elements_ += MatrixGeometry{1, entries_.back().whole_rows, g.cols}.numel() * g.batch;
    planned_ = false;
  }
  /// A sharded placement: a tensor of the group as registered (geometry g),
  /// whether this rank holds pieces of it or not, so that every rank cuts a
  /// matrix it owns whole as one process would. Call for each before add().
  void count(const MatrixGeometry& g) {
    if (!counted_) group_elements_ = 0;
    counted_ = true;
    group_elements_ += g.numel();
    planned_ = false;
  }

  /// Forms the lists (once): each factored matrix's row blocks are its share
  /// of statistics_blocks by elements, at least 1 and at most its
  /// row_blocks; a piece of a cut matrix takes its rows' share of the whole
  /// matrix's.
  void plan() {
    if (planned_) return;
    units.clear();
    columns.clear();
    applies.clear();
    shards.clear();
    workspace_ = 0;
    for (const Entry& e : entries_) {
      const MatrixGeometry& g = e.geom;
      if (factored) {
        const index_t nb = row_blocks(e);
        // c column sums and c clip terms per row block, from a multiple of
        // 4 doubles (the quad walks load them as quads)
        const index_t per_matrix = (2 * nb * g.cols + 3) / 4 * 4;
        const index_t na = apply_blocks_of(g);
        for (index_t b = 0; b < g.batch; ++b) {
          const index_t base = workspace_;
          workspace_ += per_matrix;
          for (index_t q = 0; q < nb; ++q)
            units.push_back(WorkItem{e.task, b, g.rows * q / nb, g.rows * (q + 1) / nb, q, base});
          for (index_t q = 0; q < na; ++q)
            applies.push_back(WorkItem{e.task, b, g.rows * q / na, g.rows * (q + 1) / na, q, 0});
          for (index_t j = 0; j < g.cols; j += column_block) {
            const WorkItem it{e.task, b, j, std::min(g.cols, j + column_block), nb, base};
            columns.push_back(it);
            if (e.cut) shards.push_back(it);
          }
        }
      } else {
        const index_t size = g.matrix_size();
        for (index_t b = 0; b < g.batch; ++b)
          for (index_t q = 0; q < e.chunks; ++q) {
            const WorkItem it{e.task, b, q * chunk_elems, std::min(size, (q + 1) * chunk_elems), b * e.chunks + q, 0};
            units.push_back(it);
            applies.push_back(it);
          }
      }
    }
    planned_ = true;
  }

  /// units, columns, applies, shards: one array to upload. Throws when a
  /// pass would need more blocks than one launch has.
  std::vector<WorkItem> concatenated() {
    plan();
    check_launch_size(units.size() + columns.size() + applies.size() + shards.size());
    std::vector<WorkItem> all = units;
    all.insert(all.end(), columns.begin(), columns.end());
    all.insert(all.end(), applies.begin(), applies.end());
    all.insert(all.end(), shards.begin(), shards.end());
    return all;
  }
  /// Doubles of the group's workspace (the row blocks' column partials).
  std::size_t workspace_doubles() {
    plan();
    return static_cast<std::size_t>(workspace_);
  }

 private:
  struct Entry {
    std::int32_t task;
    MatrixGeometry geom;
    index_t most_blocks;
    index_t chunks;
    bool cut;
    index_t whole_rows;
  };
  /// Row blocks of each matrix of e.
  index_t row_blocks(const Entry& e) const {
    const MatrixGeometry& g = e.geom;
    if (g.rows == 0 || g.cols == 0 || group_elements_ <= 0) return 1;
    const MatrixGeometry whole{1, e.whole_rows, g.cols};
    const double share = static_cast<double>(statistics_blocks) * static_cast<double>(whole.numel()) /
                         static_cast<double>(group_elements_);
    double nb = std::ceil(share);
    if (e.cut) nb = std::ceil(nb * static_cast<double>(g.rows) / static_cast<double>(e.whole_rows));
    const double most = static_cast<double>(std::max<index_t>(1, e.most_blocks));
    return static_cast<index_t>(std::clamp(nb, 1.0, most));
  }

  std::vector<Entry> entries_;
  index_t group_elements_ = 0;
  bool counted_ = false;
  bool planned_ = false;
  index_t workspace_ = 0;
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
  double* workspace = nullptr;  ///< l.workspace_doubles() doubles

  /// Where l's lists lie once `items` holds l.concatenated() and `task_ids`
  /// l.tasks; `workspace`: l.workspace_doubles() doubles of device memory.
  static GroupArrays of(const GroupLists& l, const WorkItem* items, const std::int32_t* task_ids,
                        double* workspace = nullptr) {
    GroupArrays a;
    a.workspace = workspace;
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
