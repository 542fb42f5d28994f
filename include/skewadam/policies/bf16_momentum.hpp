#pragma once
// Bf16Momentum: FullMomentum's first moment stored in bf16 (docs/spec.md §5, E7).
//
//   m' = beta1 m + (1 - beta1) g            (m: the stored value, decoded)
//   stored: m' rounded to bf16 stochastically (StochasticRounding's rule)
//   u = m * sqrt(1 - beta2^t) / (1 - beta1^t), with m decoded
//
// The rounding's 16 random bits per element come from the momentum's own
// stream (stored_momentum.hpp), so the stored value is unbiased and within
// one bf16 spacing of m' (a relative error below 2^-7).
// State: 2 bytes per element, in the blocks of state_layout.hpp (a matrix of
// odd size pads its last block with a zero half word). The paper's backbone
// momentum in half the bytes.

#include <cstdint>

#include "../detail/config.hpp"
#include "../state/state_layout.hpp"
#include "../types/dtype.hpp"
#include "stochastic_rounding.hpp"
#include "stored_momentum.hpp"

namespace skewadam {

struct Bf16Momentum : StoredMomentum {
  static constexpr MomentumStorage storage = MomentumStorage::bfloat16;
  /// Random bits each element's rounding reads.
  static constexpr int random_bits_used = 16;

  /// The stored value of m' = x, with its 16 random bits.
  SKEWADAM_HD static bf16 encode(float x, std::uint32_t random_bits) {
    return StochasticRounding::store<bf16>(x, random_bits);
  }
  SKEWADAM_HD static float decode(bf16 q) { return to_float(q); }
};

}  // namespace skewadam
