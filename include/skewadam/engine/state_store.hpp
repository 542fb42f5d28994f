#pragma once
// StateStore<Memory>: the optimizer state as the engine (engine.hpp) owns it,
// in a backend's memory (its memory policy, memory/host_memory.hpp): every
// tensor's state arrays and every tensor's step count, and all the
// bookkeeping of them written once for every backend: where each piece's
// arrays start, the views, the exports and the staged imports.
//
// A tensor's arrays are its pieces' arrays concatenated in piece order: m and
// v element by element (m in its storage's words, state_layout.hpp), v_row
// row by row, v_col c values per matrix. The counts are one array of n + 1
// values: each tensor's count (the updates it has received), then the
// optimizer's applied steps. A backend is given where a piece's arrays are
// (pieces()) when the tensor is added and again whenever an import moves
// them, and where the counts are with each step (StepSettings::counts).

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "../detail/config.hpp"
#include "../state/param_state.hpp"
#include "../state/state_layout.hpp"
#include "backend/backend.hpp"

namespace skewadam {

/// Where a piece's arrays start in its tensor's arrays, in values of m (its
/// words), v, v_row and v_col; or the arrays' sizes.
struct PieceOffsets {
  index_t m = 0, v = 0, v_row = 0, v_col = 0;
};

/// Each piece's offsets in its tensor's arrays, then the arrays' sizes:
/// pieces.size() + 1 entries.
inline std::vector<PieceOffsets> piece_offsets(const StateLayout& layout, std::span<const backend::PieceSpec> pieces) {
  std::vector<PieceOffsets> at(1);
  for (const backend::PieceSpec& p : pieces) {
    PieceOffsets next = at.back();
    next.m += momentum_words(layout, p.geom);
    if (p.factored) {
      next.v_row += p.geom.batch * p.geom.rows;
      next.v_col += p.geom.batch * p.geom.cols;
    } else {
      next.v += p.geom.numel();
    }
    at.push_back(next);
  }
  return at;
}

template <class Memory>
class StateStore {
  template <class T>
  using Array = typename Memory::template array<T>;
  /// A tensor's arrays, in ParamState's order: m, v, v_row, v_col.
  using Arrays = std::array<Array<float>, 4>;
  static constexpr std::array<std::vector<float> ParamState::*, 4> members{&ParamState::m, &ParamState::v,
                                                                          &ParamState::v_row, &ParamState::v_col};
  static constexpr std::array<index_t PieceOffsets::*, 4> offsets{&PieceOffsets::m, &PieceOffsets::v,
                                                                  &PieceOffsets::v_row, &PieceOffsets::v_col};
  static constexpr std::array<float* backend::PieceState::*, 4> pointers{
      &backend::PieceState::m, &backend::PieceState::v, &backend::PieceState::v_row, &backend::PieceState::v_col};

 public:
  /// An import's arrays and counts, in the memory, until commit().
  struct Staged {
    std::vector<std::optional<Arrays>> arrays;
    std::vector<std::vector<backend::PieceState>> pieces;  ///< where the staged arrays' pieces are
    std::optional<Array<std::int64_t>> counts;
  };

  /// No tensor yet: the counts hold the applied steps alone (0).
  explicit StateStore(const Memory& memory) { memory.upload(counts_, std::vector<std::int64_t>{0}); }

  std::size_t size() const noexcept { return tensors_.size(); }

  /// Tensor n's arrays (zeros) for its pieces, and its count (0); the strong
  /// guarantee. pop_back() undoes the last add().
  void add(const Memory& memory, const StateLayout& layout, std::span<const backend::PieceSpec> pieces) {
    Tensor t;
    t.at = piece_offsets(layout, pieces);
    for (std::size_t k = 0; k < 4; ++k)
      memory.zeroed(t.arrays[k], static_cast<std::size_t>(t.at.back().*offsets[k]));
    std::vector<std::int64_t> c;
    memory.download(counts_, c);
    c.insert(c.end() - 1, 0);  // the new tensor's, before the applied steps
    Array<std::int64_t> next;
    memory.upload(next, std::move(c));
    tensors_.reserve(tensors_.size() + 1);
    tensors_.push_back(std::move(t));
    undo_counts_ = std::exchange(counts_, std::move(next));
  }
  void pop_back() noexcept {
    tensors_.pop_back();
    counts_ = std::move(undo_counts_);
  }

  /// Where tensor i's pieces' arrays are (null where it has no such array).
  std::vector<backend::PieceState> pieces(std::size_t i) { return pieces_of(tensors_[i].arrays, tensors_[i].at); }
  /// The counts (n + 1 values), in the memory.
  std::int64_t* counts() noexcept { return counts_.data(); }

  /// Tensor i's arrays where they are.
  ParamStateView view(std::size_t i) const {
    const Arrays& a = tensors_[i].arrays;
    return {Memory::view(a[0]), Memory::view(a[1]), Memory::view(a[2]), Memory::view(a[3]), 0};
  }
  /// A host copy of tensor i's arrays (its step is not set).
  ParamState share(const Memory& memory, std::size_t i) const {
    ParamState s;
    for (std::size_t k = 0; k < 4; ++k) memory.download(tensors_[i].arrays[k], s.*members[k]);
    return s;
  }
  /// Bytes of the counts (with those kept to undo the last add()).
  index_t counts_bytes() const noexcept {
    return static_cast<index_t>((counts_.size() + undo_counts_.size()) * sizeof(std::int64_t));
  }
  /// Bytes of tensor i's arrays.
  index_t bytes(std::size_t i) const noexcept {
    std::size_t b = 0;
    for (const Array<float>& a : tensors_[i].arrays) b += a.size() * sizeof(float);
    return static_cast<index_t>(b);
  }

  Staged stage_begin() const {
    Staged s;
    s.arrays.resize(tensors_.size());
    s.pieces.resize(tensors_.size());
    return s;
  }
  /// Tensor i's arrays from `share` (checked by the caller), into the memory.
  void stage(const Memory& memory, Staged& staged, std::size_t i, ParamState&& share) const {
    Arrays a;
    for (std::size_t k = 0; k < 4; ++k) memory.upload(a[k], std::move(share.*members[k]));
    staged.pieces[i] = pieces_of(a, tensors_[i].at);  // (a swap keeps the arrays where they are)
    staged.arrays[i] = std::move(a);
  }
  /// Every tensor's count and the applied steps.
  void stage_counts(const Memory& memory, Staged& staged, std::span<const std::int64_t> counts,
                    std::int64_t steps) const {
    std::vector<std::int64_t> all(counts.begin(), counts.end());
    all.push_back(steps);
    Array<std::int64_t> d;
    memory.upload(d, std::move(all));
    staged.counts.emplace(std::move(d));
  }
  /// Swaps the staged arrays and counts in (the old ones are freed with
  /// `staged`); whether tensor i's arrays moved is staged.arrays[i].
  void commit(Staged& staged) noexcept {
    for (std::size_t i = 0; i < tensors_.size(); ++i)
      if (staged.arrays[i]) std::swap(tensors_[i].arrays, *staged.arrays[i]);
    if (staged.counts) std::swap(counts_, *staged.counts);
  }
  /// Every tensor's count into out; returns the applied steps.
  std::int64_t counts(const Memory& memory, std::span<std::int64_t> out) const {
    std::vector<std::int64_t> all;
    memory.download(counts_, all);
    const std::size_t n = tensors_.size();
    std::copy_n(all.begin(), n, out.begin());
    return all[n];
  }

  /// Frees everything (with the memory's device current, its work done).
  void clear() noexcept {
    tensors_.clear();
    counts_ = {};
    undo_counts_ = {};
  }

 private:
  struct Tensor {
    Arrays arrays;
    std::vector<PieceOffsets> at;  ///< each piece's offsets, then the sizes
  };
  static std::vector<backend::PieceState> pieces_of(Arrays& arrays, const std::vector<PieceOffsets>& at) {
    std::vector<backend::PieceState> out(at.size() - 1);
    for (std::size_t q = 0; q < out.size(); ++q)
      for (std::size_t k = 0; k < 4; ++k) {
        Array<float>& a = arrays[k];
        out[q].*pointers[k] = a.empty() ? nullptr : a.data() + at[q].*offsets[k];
      }
    return out;
  }
  std::vector<Tensor> tensors_;
  Array<std::int64_t> counts_;
  Array<std::int64_t> undo_counts_;  ///< the counts before the last add()
};

}  // namespace skewadam
