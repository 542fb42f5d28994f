#pragma once
// The CUDA backend's passes over one group of pieces (those sharing a rule
// and dtypes: one launch per pass covers them all), and the work lists they
// walk, cut by shape only when tensors are registered:
//
//   units     factored: row blocks of the statistics pass; element-wise:
//             chunks of chunk_elems elements
//   columns   factored: blocks of column_block columns (the finish pass)
//   applies   factored: row blocks of the update; element-wise: the units
//   shards    factored pieces of matrices cut between processes: blocks of
//             column_block columns (shard_sums_kernel)
//
// A step runs every group's statistics (and shard sums), the placement's
// statistics exchange, every group's finish (columns_kernel, or
// finalize_kernel for an element-wise rule that clips), the clip exchange,
// and every group's apply (cuda_backend.hpp).

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "../../config.hpp"
#include "../../shape.hpp"
#include "kernels.cuh"

namespace skewadam::backend::cuda {

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
};

/// A group's lists in host memory, in the order they are uploaded.
struct GroupLists {
  bool factored = false;
  std::vector<WorkItem> units, columns, applies, shards;
  std::vector<std::int32_t> tasks;

  /// Appends piece `task` (its DeviceTask d; `cut`: a matrix cut between processes).
  void add(std::int32_t task, const DeviceTask& d, bool cut) {
    const MatrixGeometry& g = d.geom;
    tasks.push_back(task);
    auto by_columns = [&](std::vector<WorkItem>& out, index_t b) {
      for (index_t j = 0; j < g.cols; j += column_block)
        out.push_back(WorkItem{task, b, j, std::min(g.cols, j + column_block), 0});
    };
    for (index_t b = 0; b < g.batch; ++b) {
      if (factored) {
        const index_t na = apply_blocks_of(g);
        for (index_t q = 0; q < d.row_blocks; ++q)
          units.push_back(WorkItem{task, b, g.rows * q / d.row_blocks, g.rows * (q + 1) / d.row_blocks, q});
        for (index_t q = 0; q < na; ++q) applies.push_back(WorkItem{task, b, g.rows * q / na, g.rows * (q + 1) / na, q});
        by_columns(columns, b);
        if (cut) by_columns(shards, b);
      } else {
        for (index_t q = 0; q < d.chunks; ++q) {
          const WorkItem it{task, b, q * chunk_elems, std::min(g.matrix_size(), (q + 1) * chunk_elems), b * d.chunks + q};
          units.push_back(it);
          applies.push_back(it);
        }
      }
    }
  }

  /// units, columns, applies, shards: one array to upload. Throws when a
  /// pass would need more blocks than one launch has.
  std::vector<WorkItem> concatenated() const {
    if (units.size() + columns.size() + applies.size() + shards.size() > 0x7fffffffu)
      throw std::invalid_argument("parameters: too many work items for one launch");
    std::vector<WorkItem> all = units;
    for (const auto* l : {&columns, &applies, &shards}) all.insert(all.end(), l->begin(), l->end());
    return all;
  }
  /// Where the lists lie once `items` holds concatenated() and `ids` tasks.
  GroupArrays arrays(const WorkItem* items, const std::int32_t* ids) const {
    const auto n = [](const auto& v) { return static_cast<std::int32_t>(v.size()); };
    return GroupArrays{items, n(units), items + units.size(), n(columns),
                       items + units.size() + columns.size(), n(applies),
                       items + units.size() + columns.size() + applies.size(), n(shards), ids, n(tasks)};
  }
};

/// The passes of one (rule, parameter dtype, gradient dtype) on runtime R.
template <class R>
struct GroupPasses {
  using Stream = typename R::stream_type;
  using Pass = void (*)(const GroupArrays&, const DeviceTask*, const TaskStep*, Stream);
  bool factored = false;
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
      S::factored,
      [](const GroupArrays& g, const DeviceTask* t, const TaskStep* s, Stream st) {
        R::template launch<&statistics_kernel<Rule, P, G>>(static_cast<unsigned>(g.n_units), block_threads, st, t, s, g.units);
        if constexpr (S::factored)
          R::template launch<&shard_sums_kernel<Rule, P, G>>(static_cast<unsigned>(g.n_shards), block_threads, st, t, s, g.shards);
      },
      [](const GroupArrays& g, const DeviceTask* t, const TaskStep* s, Stream st) {
        if constexpr (S::factored)
          R::template launch<&columns_kernel<Rule, P, G>>(static_cast<unsigned>(g.n_columns), block_threads, st, t, s, g.columns);
        else if constexpr (C::active)
          R::template launch<&finalize_kernel<Rule, P, G>>(static_cast<unsigned>((g.n_tasks + 127) / 128), 128u, st, t, s, g.tasks,
                                                           static_cast<int>(g.n_tasks));
      },
      [](const GroupArrays& g, const DeviceTask* t, const TaskStep* s, Stream st) {
        if constexpr (S::factored || C::active)
          R::template launch<&apply_kernel<Rule, P, G>>(static_cast<unsigned>(g.n_applies), static_cast<unsigned>(apply_threads), st,
                                                        t, s, g.applies);
      }};
  return &p;
}

}  // namespace skewadam::backend::cuda
