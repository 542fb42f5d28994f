#pragma once
// Which rank owns which part of a tensor, from shapes alone.
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

#include <cstdint>
#include <numeric>
#include <vector>

#include "../../detail/config.hpp"
#include "../../state/state_layout.hpp"
#include "../../types/shape.hpp"
#include "../../types/tier.hpp"

namespace skewadam::dist {

enum class Split : int { rows = 0, matrices = 1, whole = 2 };

/// How expert banks are sharded.
enum class ExpertSharding : int {
  experts = 0,  ///< whole experts per rank (expert parallelism), the default
  rows = 1,     ///< row slices of every expert, like the backbone
};

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

/// The split of a tensor of `shape` in `tier` whose rule keeps `layout`, over
/// `ranks` ranks. `whole_index` counts the single-matrix expert tensors
/// registered before this one (they are dealt out round-robin).
inline TensorSplit split_for(Tier tier, const Shape& shape, StateLayout layout, int ranks, ExpertSharding experts,
                             index_t whole_index) {
  TensorSplit s;
  s.geom = shape.matrices();
  s.factored = factors(layout, shape);
  s.ranks = ranks;
  s.storage = layout.momentum ? layout.storage : MomentumStorage::f32;
  const index_t a = piece_alignment(layout);
  s.align = s.factored ? a / std::gcd(a, s.geom.cols > 0 ? s.geom.cols : a) : a;
  if (tier == Tier::experts && experts == ExpertSharding::experts) {
    if (s.geom.batch > 1) {
      s.split = Split::matrices;
    } else {
      s.split = Split::whole;
      s.owner = static_cast<int>(whole_index % ranks);
    }
  }
  return s;
}

/// Optimizer state bytes rank `rank` keeps for a tensor (docs/spec.md §2 on
/// its pieces; a factored piece keeps its rows' R and a copy of C).
inline index_t shard_state_bytes(const TensorSplit& s, StateLayout layout, int rank) {
  index_t b = 0;
  for (const Piece& p : s.pieces(rank)) {
    const index_t n = s.elements(p);
    b += 4 * momentum_words(layout, s.piece_geometry(p));
    b += s.factored ? 4 * (p.size() + s.geom.cols) : 4 * n;
  }
  return b;
}

/// Bytes one rank puts into the step's two exchanges (engine/placement/sharded.hpp),
/// for one tensor: every rank gathers `ranks` times this. One wire format,
/// double:
///   statistics exchange: per cut factored matrix, its c column sums of g^2
///                        and the sum of its R_i
///   clip exchange:       per matrix, this rank's sum of u^2, when the clip
///                        needs a sum over ranks
struct ExchangeBytes {
  index_t statistics = 0;
  index_t clip = 0;
};

inline ExchangeBytes exchange_bytes(const TensorSplit& s, bool clip_active, bool scope_per_matrix) {
  ExchangeBytes b;
  if (s.geom.numel() == 0) return b;
  if (s.factored && s.cuts_matrices()) b.statistics = s.geom.batch * 8 * (s.geom.cols + 1);
  const bool needs_clip_sum =
      clip_active && (s.cuts_matrices() || (s.split == Split::matrices && !scope_per_matrix && s.ranks > 1));
  if (needs_clip_sum) b.clip = 8 * s.geom.batch;
  return b;
}

}  // namespace skewadam::dist
