#pragma once
// The splits of tensors over ranks: which rank owns which pieces of each
// tensor (engine/pieces.hpp says what a split and a piece are), from shapes
// alone, and what a rank keeps and exchanges for them.

#include <cstdint>
#include <vector>

#include "../../detail/config.hpp"
#include "../../state/state_layout.hpp"
#include "../../types/shape.hpp"
#include "../../types/tier.hpp"
#include "../pieces.hpp"

namespace skewadam::dist {

// (the engine's vocabulary, by the names the sharded API has always used)
using skewadam::Piece;
using skewadam::Split;
using skewadam::TensorSplit;

/// How expert banks are sharded.
enum class ExpertSharding : int {
  experts = 0,  ///< whole experts per rank (expert parallelism), the default
  rows = 1,     ///< row slices of every expert, like the backbone
};

/// The split of a tensor of `shape` in `tier` whose rule keeps `layout`, over
/// `ranks` ranks. `whole_index` counts the single-matrix expert tensors
/// registered before this one (they are dealt out round-robin).
inline TensorSplit split_for(Tier tier, const Shape& shape, StateLayout layout, int ranks, ExpertSharding experts,
                             index_t whole_index) {
  TensorSplit s = whole_split(shape, layout);
  s.ranks = ranks;
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
