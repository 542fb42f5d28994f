#pragma once
// Between a rank's share of a sharded tensor and the complete tensor: which
// segments of each complete array a rank holds (from the split alone, so no
// index is exchanged), gathering the complete array from every rank's share
// (one all_gather_v, placed in rank order), and cutting a rank's share out of
// a complete array. The sharded placement uses them for export_state,
// import_state (and so checkpoints) and gather_params; they do not depend on
// the backend that steps the pieces.
//
// A rank stores its share with its pieces concatenated, in piece order: m and
// v (and a parameter's own slice) element by element (m stored in blocks:
// block by block, state_layout.hpp), v_row row by row, and v_col as c values
// per piece (every rank owning rows of a matrix holds a copy of its column
// statistics; the first owner's is the one gathered).

#include <cstddef>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "../../comm/communicator.hpp"
#include "../../detail/config.hpp"
#include "../../types/shape.hpp"
#include "shard_plan.hpp"

namespace skewadam::dist {

/// An array of a tensor's state, or the parameter itself.
enum class ShardArray { m, v, v_row, v_col, param };

/// Whether a tensor keeps array a.
inline bool shard_keeps(const TensorSplit& split, bool momentum, ShardArray a) noexcept {
  switch (a) {
    case ShardArray::m: return momentum;
    case ShardArray::v: return !split.factored;
    case ShardArray::v_row:
    case ShardArray::v_col: return split.factored;
    case ShardArray::param: return true;
  }
  return false;
}

/// (offset, count) of every segment of the complete array that `rank` holds,
/// in the order of its storage. For v_col only the first owner of each
/// matrix is listed when `gathering` (the others hold copies).
inline std::vector<std::pair<index_t, index_t>> shard_segments(const TensorSplit& split, int rank, ShardArray a,
                                                         bool gathering) {
  std::vector<std::pair<index_t, index_t>> out;
  const MatrixGeometry& g = split.geom;
  for (const Piece& p : split.pieces(rank)) {
    switch (a) {
      case ShardArray::m:
        out.emplace_back(split.first_word(p), momentum_words(StateLayout{true, false, split.storage},
                                                             split.piece_geometry(p)));
        break;
      case ShardArray::v:
      case ShardArray::param: out.emplace_back(split.first_element(p), split.elements(p)); break;
      case ShardArray::v_row: out.emplace_back(p.matrix * g.rows + p.begin, p.size()); break;
      case ShardArray::v_col:
        if (!gathering || split.first_owner(p.matrix) == rank) out.emplace_back(p.matrix * g.cols, g.cols);
        break;
    }
  }
  return out;
}

/// Gathers array a (complete, `elem` bytes per value) into `full` on every
/// rank from every rank's share (collective). `local` is this rank's
/// storage; for ShardArray::param it is the complete parameter buffer, whose
/// own slices are read before any is written, so `local` may be `full`.
template <Communicator Comm>
void gather_shards(Comm& comm, const TensorSplit& split, ShardArray a, const std::byte* local, std::size_t elem,
            std::byte* full) {
  const int n = comm.size();
  const int me = comm.rank();
  std::vector<std::size_t> counts(static_cast<std::size_t>(n));
  std::vector<std::vector<std::pair<index_t, index_t>>> segs(static_cast<std::size_t>(n));
  for (int k = 0; k < n; ++k) {
    segs[static_cast<std::size_t>(k)] = shard_segments(split, k, a, true);
    std::size_t c = 0;
    for (auto [off, len] : segs[static_cast<std::size_t>(k)]) c += static_cast<std::size_t>(len) * elem;
    counts[static_cast<std::size_t>(k)] = c;
  }
  // this rank's contribution in segment order
  std::vector<std::byte> mine(counts[static_cast<std::size_t>(me)]);
  std::size_t at = 0;
  if (a == ShardArray::v_col) {
    // local v_col holds c values per piece; take the listed ones
    const std::vector<Piece> pieces = split.pieces(me);
    const std::size_t bytes = static_cast<std::size_t>(split.geom.cols) * elem;
    for (std::size_t q = 0; q < pieces.size(); ++q) {
      if (split.first_owner(pieces[q].matrix) != me) continue;
      std::memcpy(mine.data() + at, local + q * bytes, bytes);
      at += bytes;
    }
  } else if (a == ShardArray::param) {
    for (auto [off, len] : segs[static_cast<std::size_t>(me)]) {
      const std::size_t bytes = static_cast<std::size_t>(len) * elem;
      std::memcpy(mine.data() + at, local + static_cast<std::size_t>(off) * elem, bytes);
      at += bytes;
    }
  } else if (!mine.empty()) {
    std::memcpy(mine.data(), local, mine.size());
  }
  std::size_t total = 0;
  for (std::size_t c : counts) total += c;
  std::vector<std::byte> all(total);
  comm.all_gather_v(std::span<const std::byte>(mine), std::span<std::byte>(all), std::span<const std::size_t>(counts));
  at = 0;
  for (int k = 0; k < n; ++k)
    for (auto [off, len] : segs[static_cast<std::size_t>(k)]) {
      const std::size_t bytes = static_cast<std::size_t>(len) * elem;
      std::memcpy(full + static_cast<std::size_t>(off) * elem, all.data() + at, bytes);
      at += bytes;
    }
}

/// Rank `rank`'s share of a complete state array (its storage order).
inline std::vector<float> share_of(const TensorSplit& split, int rank, ShardArray a, const std::vector<float>& full) {
  std::vector<float> out;
  if (full.empty()) return out;
  for (auto [off, len] : shard_segments(split, rank, a, false))
    out.insert(out.end(), full.begin() + off, full.begin() + off + len);
  return out;
}

}  // namespace skewadam::dist
