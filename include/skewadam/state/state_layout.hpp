#pragma once
// What optimizer state a rule keeps for a tensor, and how many bytes it is.
//
// This is the one place where docs/spec.md §2's formulas live. The optimizer's
// state report, the planner (skewadam-plan) and the LibTorch adapter all call
// state_bytes(), so they cannot disagree.
//
//   FullMomentum                     m: 4 * numel
//   Bf16Momentum, Float8BlockMomentum, Int8BlockMomentum
//                                    m: 32-bit words in blocks of 256
//                                    elements of each matrix (below)
//   FactoredSecondMoment, rank >= 2  R, C: 4 * B * (r + c)   (B matrices r x c)
//   FactoredSecondMoment, rank 1     falls back to exact: 4 * numel
//   ExactSecondMoment                V: 4 * numel
//   step counter                     not counted (as in the paper)
//
// Momentum stored in fewer bits (MomentumStorage other than f32) is kept in
// blocks: each matrix's elements (the last two dimensions, flattened) are cut
// into blocks of momentum_block = 256 consecutive elements, the last block of
// a matrix shorter where its size is not a multiple, and each block is
// stored whole, in whole 32-bit words, one block after the other:
//   bf16         the block's elements as bf16, two to a word (a short block
//                padded with a zero half word): ceil(n / 2) words
//   float8_blocks, int8_blocks
//                one word, the block's fp32 scale, then its elements' 8-bit
//                codes, four to a word (a short block padded with zero
//                bytes): 1 + ceil(n / 4) words
// and f32 is the same rule with one element per word. So every block starts
// at a word that depends only on its matrix and its place in it
// (momentum_word_at), and a piece of a tensor that starts and ends on block
// boundaries (momentum_alignment) keeps its own blocks as one contiguous run
// of the tensor's words: a placement cuts m as it cuts any array.

#include <cstdint>

#include "../detail/config.hpp"
#include "../types/shape.hpp"

namespace skewadam {

/// How a rule stores its first moment m (see the top of this file).
enum class MomentumStorage : std::uint8_t {
  f32,          ///< one fp32 value per element
  bfloat16,     ///< bf16, stochastically rounded (Bf16Momentum)
  int8_blocks,  ///< linear int8 codes and an fp32 scale per block (Int8BlockMomentum)
  float8_blocks,  ///< 8-bit floating-point codes and a power-of-two scale per block (Float8BlockMomentum)
};

/// Whether m is stored as 8-bit codes with a scale per block.
constexpr bool eight_bit_blocks(MomentumStorage storage) noexcept {
  return storage == MomentumStorage::int8_blocks || storage == MomentumStorage::float8_blocks;
}

/// Elements per block of stored momentum: consecutive elements of one
/// matrix, the last block of a matrix shorter where its size is not a
/// multiple.
inline constexpr index_t momentum_block = 256;

/// 32-bit words of one block of n <= momentum_block elements.
constexpr index_t momentum_block_words(MomentumStorage storage, index_t n) noexcept {
  switch (storage) {
    case MomentumStorage::bfloat16: return (n + 1) / 2;
    case MomentumStorage::int8_blocks:
    case MomentumStorage::float8_blocks: return n > 0 ? 1 + (n + 3) / 4 : 0;
    case MomentumStorage::f32: break;
  }
  return n;
}

/// 32-bit words of the momentum of one matrix of `size` elements.
constexpr index_t momentum_matrix_words(MomentumStorage storage, index_t size) noexcept {
  return size / momentum_block * momentum_block_words(storage, momentum_block) +
         momentum_block_words(storage, size % momentum_block);
}

/// The word where the block holding element e of matrix b begins, for
/// matrices of `size` elements; for f32, element e's own word.
constexpr index_t momentum_word_at(MomentumStorage storage, index_t size, index_t b, index_t e) noexcept {
  if (storage == MomentumStorage::f32) return b * size + e;
  return b * momentum_matrix_words(storage, size) +
         e / momentum_block * momentum_block_words(storage, momentum_block);
}

/// Elements of a matrix that a piece's first element must be a multiple of,
/// so that the piece holds whole blocks of m: 1 for fp32 momentum (or none).
constexpr index_t momentum_alignment(MomentumStorage storage) noexcept {
  return storage == MomentumStorage::f32 ? 1 : momentum_block;
}

struct StateLayout {
  bool momentum = false;  ///< keeps a first moment m
  bool factored = false;  ///< second moment factored into row + column statistics (rank >= 2)
  MomentumStorage storage = MomentumStorage::f32;  ///< how m is stored, when kept
  friend constexpr bool operator==(StateLayout, StateLayout) = default;
};

/// Named layouts of the paper's policies and baselines.
namespace layouts {
inline constexpr StateLayout backbone{true, true};    ///< momentum + factored
inline constexpr StateLayout backbone_bf16{true, true, MomentumStorage::bfloat16};         ///< bf16 momentum + factored
inline constexpr StateLayout backbone_8bit{true, true, MomentumStorage::float8_blocks};  ///< 8-bit momentum + factored
inline constexpr StateLayout backbone_linear_8bit{true, true, MomentumStorage::int8_blocks};  ///< linear 8-bit codes
inline constexpr StateLayout experts{false, true};    ///< factored only
inline constexpr StateLayout router{false, false};    ///< exact only
inline constexpr StateLayout adamw{true, false};      ///< m and v: two fp32 buffers
inline constexpr StateLayout adafactor{false, true};  ///< factored, no momentum
}  // namespace layouts

/// True when a factored second moment applies to this shape (rank >= 2).
constexpr bool factors(StateLayout layout, const Shape& shape) noexcept {
  return layout.factored && shape.rank() >= 2;
}

/// 32-bit words of m for B matrices of r x c (0 without momentum).
constexpr index_t momentum_words(StateLayout layout, const MatrixGeometry& g) noexcept {
  if (!layout.momentum || g.numel() == 0) return 0;
  return g.batch * momentum_matrix_words(layout.storage, g.matrix_size());
}

constexpr index_t momentum_bytes(StateLayout layout, const Shape& shape) noexcept {
  return 4 * momentum_words(layout, shape.matrices());
}

/// The elements a piece of a tensor with this layout must start and end at
/// multiples of, within each matrix (momentum_alignment).
constexpr index_t piece_alignment(StateLayout layout) noexcept {
  return layout.momentum ? momentum_alignment(layout.storage) : 1;
}

constexpr index_t second_moment_bytes(StateLayout layout, const Shape& shape) noexcept {
  if (factors(layout, shape)) {
    const MatrixGeometry g = shape.matrices();
    return 4 * g.batch * (g.rows + g.cols);
  }
  return 4 * shape.numel();
}

/// Optimizer state bytes of one tensor (docs/spec.md §2).
constexpr index_t state_bytes(StateLayout layout, const Shape& shape) noexcept {
  if (shape.numel() == 0) return 0;
  return momentum_bytes(layout, shape) + second_moment_bytes(layout, shape);
}

}  // namespace skewadam
