#pragma once
// What optimizer state a rule keeps for a tensor, and how many bytes it is.
//
// This is the one place where docs/spec.md §2's formulas live. The optimizer's
// state report, the planner (skewadam-plan) and the LibTorch adapter all call
// state_bytes(), so they cannot disagree.
//
//   FullMomentum                     m: 4 * numel
//   Int8BlockMomentum                m: int8 codes and an fp32 scale per block
//                                    of 256 of each matrix, in 32-bit words:
//                                    4 * (ceil(numel / 4) + B * ceil(r c / 256))
//   FactoredSecondMoment, rank >= 2  R, C: 4 * B * (r + c)   (B matrices r x c)
//   FactoredSecondMoment, rank 1     falls back to exact: 4 * numel
//   ExactSecondMoment                V: 4 * numel
//   step counter                     not counted (as in the paper)

#include <cstdint>

#include "config.hpp"
#include "shape.hpp"

namespace skewadam {

/// How a rule stores its first moment m.
enum class MomentumStorage : std::uint8_t {
  f32,          ///< one fp32 value per element
  int8_blocks,  ///< int8 codes, one fp32 scale per block of momentum_block elements of a matrix
};

/// Elements per scale of MomentumStorage::int8_blocks: consecutive elements
/// of one matrix (the last two dimensions), the last block of a matrix
/// shorter where its size is not a multiple.
inline constexpr index_t momentum_block = 256;

struct StateLayout {
  bool momentum = false;  ///< keeps a first moment m
  bool factored = false;  ///< second moment factored into row + column statistics (rank >= 2)
  MomentumStorage storage = MomentumStorage::f32;  ///< how m is stored, when kept
  friend constexpr bool operator==(StateLayout, StateLayout) = default;
};

/// Named layouts of the paper's policies and baselines.
namespace layouts {
inline constexpr StateLayout backbone{true, true};    ///< momentum + factored
inline constexpr StateLayout backbone_8bit{true, true, MomentumStorage::int8_blocks};  ///< 8-bit momentum + factored
inline constexpr StateLayout experts{false, true};    ///< factored only
inline constexpr StateLayout router{false, false};    ///< exact only
inline constexpr StateLayout adamw{true, false};      ///< m and v: two fp32 buffers
inline constexpr StateLayout adafactor{false, true};  ///< factored, no momentum
}  // namespace layouts

/// True when a factored second moment applies to this shape (rank >= 2).
constexpr bool factors(StateLayout layout, const Shape& shape) noexcept {
  return layout.factored && shape.rank() >= 2;
}

/// Blocks (and scales) of MomentumStorage::int8_blocks for B matrices of r x c.
constexpr index_t momentum_scales(const MatrixGeometry& g) noexcept {
  return g.batch * ((g.matrix_size() + momentum_block - 1) / momentum_block);
}

/// 32-bit words of m: numel floats, or (int8_blocks) the numel codes packed
/// four to a word, then the scales.
constexpr index_t momentum_words(StateLayout layout, const MatrixGeometry& g) noexcept {
  if (!layout.momentum || g.numel() == 0) return 0;
  if (layout.storage == MomentumStorage::int8_blocks) return (g.numel() + 3) / 4 + momentum_scales(g);
  return g.numel();
}

constexpr index_t momentum_bytes(StateLayout layout, const Shape& shape) noexcept {
  if (!layout.momentum) return 0;
  if (layout.storage == MomentumStorage::int8_blocks) return 4 * momentum_words(layout, shape.matrices());
  return 4 * shape.numel();
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
