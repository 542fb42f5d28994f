#pragma once
// The CUDA backend's passes over one group of pieces (those sharing a rule
// and dtypes: one launch per pass covers them all), and the work lists they
// walk, cut when tensors are registered, by shape only but for a factored
// matrix's statistics, whose row blocks are its share of the group's
// statistics_blocks (task.hpp):
//
//   units     factored: row blocks of the statistics pass, each with its
//             column partials in the group's workspace; element-wise:
//             chunks of chunk_elems elements
//   columns   factored: blocks of column_block columns (the finish pass)
//   applies   factored: row blocks of the update; element-wise: the units
//   shards    factored pieces of matrices cut between processes: blocks of
//             column_block columns (shard_sums_kernel)
//   momentum  momentum stored in fewer bits: chunks of momentum_chunk_elems
//             elements of each matrix, a block of momentum per warp
//             (momentum_kernel, before the statistics)
//
// A step runs every group's statistics (and shard sums), the placement's
// statistics exchange, every group's finish (columns_kernel, or
// finalize_kernel, a block per tensor, for an element-wise rule that clips),
// the clip exchange, and every group's apply (cuda_backend.hpp). So every
// group's partials are still to be read when the last group's statistics
// run: the groups' workspaces lie back to back.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "../../../detail/config.hpp"
#include "../../../types/shape.hpp"
#include "kernels.cuh"

namespace skewadam::backend::cuda {

/// The device arrays of one group's work lists, and its workspace.
struct GroupArrays {
  const WorkUnit* units = nullptr;
  std::int32_t n_units = 0;
  const WorkUnit* columns = nullptr;
  std::int32_t n_columns = 0;
  const WorkUnit* applies = nullptr;
  std::int32_t n_applies = 0;
  const WorkUnit* shards = nullptr;
  std::int32_t n_shards = 0;
  const WorkUnit* momentum = nullptr;
  std::int32_t n_momentum = 0;
  const std::int32_t* tasks = nullptr;
  std::int32_t n_tasks = 0;
  double* workspace = nullptr;  ///< GroupLists::workspace_doubles() doubles
};

/// Where one piece's work starts in each of a group's lists (GroupLists::
/// starts()): a piece's work is consecutive in every list.
struct ListStarts {
  std::int32_t units = 0, columns = 0, applies = 0, shards = 0, momentum = 0, tasks = 0;
};

/// The part of a group's lists `whole` between two pieces' starts, lo
/// (included) and hi (excluded): what a step of those pieces alone launches.
inline GroupArrays part_of(const GroupArrays& whole, const ListStarts& lo, const ListStarts& hi) {
  GroupArrays a = whole;
  a.units = whole.units + lo.units;
  a.n_units = hi.units - lo.units;
  a.columns = whole.columns + lo.columns;
  a.n_columns = hi.columns - lo.columns;
  a.applies = whole.applies + lo.applies;
  a.n_applies = hi.applies - lo.applies;
  a.shards = whole.shards + lo.shards;
  a.n_shards = hi.shards - lo.shards;
  a.momentum = whole.momentum + lo.momentum;
  a.n_momentum = hi.momentum - lo.momentum;
  a.tasks = whole.tasks + lo.tasks;
  a.n_tasks = hi.tasks - lo.tasks;
  return a;
}

/// A group's lists in host memory, in the order they are uploaded. Pieces
/// are added one by one; the lists are formed when they are first read
/// (plan()), since a factored matrix's row blocks depend on the whole group.
struct GroupLists {
  bool factored = false;
  bool stored = false;  ///< its rule stores momentum in fewer bits
  std::vector<WorkUnit> units, columns, applies, shards, momentum;
  std::vector<std::int32_t> tasks;

  /// Appends piece `task` (its DeviceTask d: geometry, row_blocks (the most
  /// per matrix) or chunks, and full_rows when `cut`, a matrix cut between
  /// processes).
  void add(std::int32_t task, const DeviceTask& d, bool cut) {
    const MatrixGeometry& g = d.geom;
    tasks.push_back(task);
    const index_t whole_rows = cut && d.full_rows > 0 ? d.full_rows : g.rows;
    entries_.push_back(Entry{task, g, d.row_blocks, d.chunks, cut, whole_rows});
    if (!counted_) group_elements_ += MatrixGeometry{1, whole_rows, g.cols}.numel() * g.batch;
    planned_ = false;
  }
  /// A tensor of the group as registered (its matrices g), whether this
  /// process holds pieces of it or not, so that a process cuts a matrix it
  /// holds whole as one process holding every tensor would. Without count(),
  /// the pieces added are the group.
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
    momentum.clear();
    starts_.clear();
    workspace_ = 0;
    for (const Entry& e : entries_) {
      starts_.push_back(here());
      const MatrixGeometry& g = e.geom;
      if (stored)
        for (index_t b = 0; b < g.batch; ++b)
          for (index_t q = 0; q * momentum_chunk_elems < g.matrix_size(); ++q)
            momentum.push_back(WorkUnit{e.task, b, q * momentum_chunk_elems,
                                        std::min(g.matrix_size(), (q + 1) * momentum_chunk_elems), q, 0});
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
            units.push_back(WorkUnit{e.task, b, g.rows * q / nb, g.rows * (q + 1) / nb, q, base});
          for (index_t q = 0; q < na; ++q)
            applies.push_back(WorkUnit{e.task, b, g.rows * q / na, g.rows * (q + 1) / na, q, 0});
          for (index_t j = 0; j < g.cols; j += column_block) {
            const WorkUnit it{e.task, b, j, std::min(g.cols, j + column_block), nb, base};
            columns.push_back(it);
            if (e.cut) shards.push_back(it);
          }
        }
      } else {
        const index_t size = g.matrix_size();
        for (index_t b = 0; b < g.batch; ++b)
          for (index_t q = 0; q < e.chunks; ++q) {
            const WorkUnit it{e.task, b, q * chunk_elems, std::min(size, (q + 1) * chunk_elems), b * e.chunks + q, 0};
            units.push_back(it);
            applies.push_back(it);
          }
      }
    }
    starts_.push_back(here());
    planned_ = true;
  }

  /// Where each piece's work starts in the lists, in the order the pieces
  /// were added, then where the lists end: piece k's work lies between
  /// starts()[k] and starts()[k + 1].
  const std::vector<ListStarts>& starts() {
    plan();
    return starts_;
  }

  /// units, columns, applies, shards, momentum: one array to upload. Throws
  /// when a pass would need more blocks than one launch has.
  std::vector<WorkUnit> concatenated() {
    plan();
    if (units.size() + columns.size() + applies.size() + shards.size() + momentum.size() > 0x7fffffffu)
      throw std::invalid_argument("parameters: too many work items for one launch");
    std::vector<WorkUnit> all = units;
    for (const auto* l : {&columns, &applies, &shards, &momentum}) all.insert(all.end(), l->begin(), l->end());
    return all;
  }
  /// Doubles of the group's workspace (its row blocks' column partials).
  std::size_t workspace_doubles() {
    plan();
    return static_cast<std::size_t>(workspace_);
  }
  /// Where the lists lie once `items` holds concatenated() and `ids` tasks;
  /// `workspace`: workspace_doubles() doubles of device memory.
  GroupArrays arrays(const WorkUnit* items, const std::int32_t* ids, double* workspace = nullptr) const {
    const auto n = [](const auto& v) { return static_cast<std::int32_t>(v.size()); };
    const WorkUnit* at = items;
    GroupArrays a;
    for (auto [list, first, count] : {std::tuple{&units, &a.units, &a.n_units}, {&columns, &a.columns, &a.n_columns},
                                      {&applies, &a.applies, &a.n_applies}, {&shards, &a.shards, &a.n_shards},
                                      {&momentum, &a.momentum, &a.n_momentum}}) {
      *first = at;
      *count = n(*list);
      at += list->size();
    }
    a.tasks = ids;
    a.n_tasks = n(tasks);
    a.workspace = workspace;
    return a;
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

  ListStarts here() const {
    const auto n = [](const auto& v) { return static_cast<std::int32_t>(v.size()); };
    return ListStarts{n(units), n(columns), n(applies), n(shards), n(momentum),
                      static_cast<std::int32_t>(starts_.size())};
  }

  std::vector<Entry> entries_;
  std::vector<ListStarts> starts_;
  index_t group_elements_ = 0;
  bool counted_ = false;
  bool planned_ = false;
  index_t workspace_ = 0;
};

inline unsigned grid(std::int32_t n) { return static_cast<unsigned>(n); }

/// The passes of one (rule, parameter dtype, gradient dtype) on runtime R.
template <class R>
struct GroupPasses {
  using Stream = typename R::stream_type;
  using Pass = void (*)(const GroupArrays&, const DeviceTask*, const TaskStep*, Stream);
  bool factored = false;
  bool stored = false;        ///< momentum stored in fewer bits: the statistics pass runs the momentum pass first
  Pass statistics = nullptr;  ///< and the shard sums of cut pieces
  Pass finish = nullptr;
  Pass apply = nullptr;
};

template <class R, class Rule, class P, class G>
const GroupPasses<R>* passes_of() {
  using S = typename Rule::second_moment;
  using C = typename Rule::clip;
  using Stream = typename R::stream_type;
  static const GroupPasses<R> p{
      S::factored, Math<Rule, P, G>::stored,
      [](const GroupArrays& g, const DeviceTask* t, const TaskStep* s, Stream st) {
        if constexpr (Math<Rule, P, G>::stored)
          R::template launch<&momentum_kernel<Rule, P, G>>(grid(g.n_momentum), block_threads, st, t, s, g.momentum);
        R::template launch<&statistics_kernel<Rule, P, G>>(grid(g.n_units), block_threads, st, t, s, g.units,
                                                           g.workspace);
        if constexpr (S::factored)
          R::template launch<&shard_sums_kernel<Rule, P, G>>(grid(g.n_shards), block_threads, st, t, s, g.shards,
                                                             static_cast<const double*>(g.workspace));
      },
      [](const GroupArrays& g, const DeviceTask* t, const TaskStep* s, Stream st) {
        if constexpr (S::factored)
          R::template launch<&columns_kernel<Rule, P, G>>(grid(g.n_columns), block_threads, st, t, s, g.columns,
                                                          static_cast<const double*>(g.workspace));
        else if constexpr (C::active)
          R::template launch<&finalize_kernel<Rule, P, G>>(grid(g.n_tasks), block_threads, st, t, s, g.tasks);
      },
      [](const GroupArrays& g, const DeviceTask* t, const TaskStep* s, Stream st) {
        if constexpr (S::factored || C::active)
          R::template launch<&apply_kernel<Rule, P, G>>(grid(g.n_applies), static_cast<unsigned>(apply_threads), st,
                                                        t, s, g.applies);
      }};
  return &p;
}

}  // namespace skewadam::backend::cuda
