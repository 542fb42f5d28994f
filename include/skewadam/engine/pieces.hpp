#pragma once
// The engine's pieces: what a process steps of each tensor, decided from
// shapes alone. Every placement speaks of a tensor's split and its pieces in
// these terms, the local one (one process, whole matrices) and the sharded
// one (engine/placement/shard_plan.hpp decides the splits over ranks).
//
// Shards follow the matrix structure, so that SkewAdam's factored statistics
// stay computable (a flat-buffer shard would cut rows and columns anywhere):
//
//   Split::rows      every matrix of the tensor is cut into `ranks` row
//                    slices, rank k owning rows [r k / N, r (k + 1) / N). Row
//                    statistics R_i stay local; the column statistics (c
//                    floats per matrix) and the clip's sum of u^2 are summed
//                    over the ranks. An element-wise rule (exact second
//                    moment, rank-1 tensors) cuts each matrix's elements the
//                    same way. Backbone and router tensors, and expert banks
//                    under ExpertSharding::rows.
//   Split::matrices  a bank [E, r, c] is dealt out by whole experts, rank k
//                    owning experts [E k / N, E (k + 1) / N): no statistic
//                    crosses ranks, only the clip's sum over the bank when the
//                    clip scope is the whole tensor (docs/spec.md §3.2, step 6).
//   Split::whole     one rank owns the tensor (a separately stored expert,
//                    dealt out round-robin): no communication at all.
//
// A Piece is what one rank owns of one matrix: rows [begin, end) of matrix
// `matrix` (factored rule) or its elements [begin, end) (element-wise rule).
// Every rank computes every rank's pieces, so gathers need no index exchange.
// Where the momentum is stored in blocks of 256 elements of a matrix
// (state_layout.hpp), the cuts are moved down to the nearest block boundary
// (TensorSplit::align), so that every piece holds whole blocks.
//
// A process's share of a tensor's state is its pieces' arrays concatenated
// in piece order (engine/backend/backend.hpp: piece_offsets).

#include <cstddef>
#include <numeric>
#include <vector>

#include "../detail/config.hpp"
#include "../state/state_layout.hpp"
#include "../types/shape.hpp"

namespace skewadam {

enum class Split : int { rows = 0, matrices = 1, whole = 2 };

struct Piece {
  index_t matrix = 0;
  index_t begin = 0;  ///< first row (factored) or element (element-wise) of the matrix
  index_t end = 0;
  index_t size() const noexcept { return end - begin; }
};

/// The split of one tensor over `ranks` ranks.
struct TensorSplit {
  MatrixGeometry geom{};
  bool factored = false;  ///< pieces are row ranges (else element ranges)
  Split split = Split::rows;
  int owner = 0;          ///< Split::whole: the owning rank
  int ranks = 1;
  /// How m is stored (f32 without momentum), and the rows (factored) or
  /// elements (element-wise) a cut of a matrix must fall at a multiple of
  /// (piece_alignment of the layout).
  MomentumStorage storage = MomentumStorage::f32;
  index_t align = 1;

  /// Rows (factored) or elements (element-wise) of one matrix.
  index_t extent() const noexcept { return factored ? geom.rows : geom.rows * geom.cols; }

  /// True when some matrix is cut between ranks (its statistics need a sum
  /// over ranks).
  bool cuts_matrices() const noexcept { return split == Split::rows && ranks > 1; }

  /// Where rank k's rows or elements of each matrix begin (Split::rows).
  index_t cut(index_t k) const noexcept {
    if (k >= ranks) return extent();
    return extent() * k / ranks / align * align;
  }

  /// The pieces rank `rank` owns, in matrix order; empty ranges left out.
  std::vector<Piece> pieces(int rank) const {
    std::vector<Piece> out;
    const index_t n = ranks;
    const index_t k = rank;
    const index_t ext = extent();
    if (geom.numel() == 0) return out;
    switch (split) {
      case Split::rows:
        for (index_t b = 0; b < geom.batch; ++b) {
          const Piece p{b, cut(k), cut(k + 1)};
          if (p.size() > 0) out.push_back(p);
        }
        break;
      case Split::matrices:
        for (index_t b = geom.batch * k / n; b < geom.batch * (k + 1) / n; ++b) out.push_back(Piece{b, 0, ext});
        break;
      case Split::whole:
        if (rank == owner)
          for (index_t b = 0; b < geom.batch; ++b) out.push_back(Piece{b, 0, ext});
        break;
    }
    return out;
  }

  /// The lowest rank owning part of matrix b (it contributes the matrix's
  /// replicated column statistics to gathers).
  int first_owner(index_t b) const {
    switch (split) {
      case Split::rows:
        for (int k = 0; k < ranks; ++k)
          if (cut(k + 1) > cut(k)) return k;
        return 0;
      case Split::matrices:
        for (int k = 0; k < ranks; ++k)
          if (b < geom.batch * (k + 1) / ranks) return k;
        return ranks - 1;
      case Split::whole: return owner;
    }
    return 0;
  }

  /// Flat index in the tensor of a piece's first element.
  index_t first_element(const Piece& p) const noexcept {
    return factored ? (p.matrix * geom.rows + p.begin) * geom.cols : p.matrix * geom.rows * geom.cols + p.begin;
  }
  /// Elements of a piece.
  index_t elements(const Piece& p) const noexcept { return factored ? p.size() * geom.cols : p.size(); }
  /// A piece as one matrix of its own (rows x cols, or 1 x elements).
  MatrixGeometry piece_geometry(const Piece& p) const noexcept {
    return factored ? MatrixGeometry{1, p.size(), geom.cols} : MatrixGeometry{1, 1, p.size()};
  }
  /// Where a piece's m begins among the tensor's words (state_layout.hpp).
  index_t first_word(const Piece& p) const noexcept {
    return momentum_word_at(storage, geom.matrix_size(), p.matrix, factored ? p.begin * geom.cols : p.begin);
  }
};

/// A tensor of `shape` whose rule keeps `layout`, all in one process: every
/// matrix whole (Split::rows over one rank). The sharded placement starts
/// from it (dist::split_for).
inline TensorSplit whole_split(const Shape& shape, StateLayout layout) {
  TensorSplit s;
  s.geom = shape.matrices();
  s.factored = factors(layout, shape);
  s.storage = layout.momentum ? layout.storage : MomentumStorage::f32;
  const index_t a = piece_alignment(layout);
  s.align = s.factored ? a / std::gcd(a, s.geom.cols > 0 ? s.geom.cols : a) : a;
  return s;
}

/// Sizes of a tensor's complete state arrays (0: not kept).
struct FullSizes {
  std::size_t m = 0, v = 0, v_row = 0, v_col = 0;
};

inline FullSizes full_sizes(const TensorSplit& split, bool momentum) {
  FullSizes s;
  const MatrixGeometry& g = split.geom;
  const auto n = static_cast<std::size_t>(g.numel());
  if (n == 0) return s;
  if (momentum) s.m = static_cast<std::size_t>(momentum_words(StateLayout{true, false, split.storage}, g));
  if (split.factored) {
    s.v_row = static_cast<std::size_t>(g.batch * g.rows);
    s.v_col = static_cast<std::size_t>(g.batch * g.cols);
  } else {
    s.v = n;
  }
  return s;
}

}  // namespace skewadam
