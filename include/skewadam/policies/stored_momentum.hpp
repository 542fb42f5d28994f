#pragma once
// What the momentum policies that store m in fewer bits than fp32 share
// (Bf16Momentum, Float8BlockMomentum, Int8BlockMomentum; state_layout.hpp
// gives their storage).
//
// The recursion is FullMomentum's, on the stored values decoded to fp32:
//
//   m' = beta1 m + (1 - beta1) g,   u = m * sqrt(1 - beta2^t) / (1 - beta1^t)
//
// with each product rounded on its own (vmath::mul_rn), so that no compiler
// fuses them into a multiply-add: m' is then the same bits on every CPU
// architecture and on the device, and so are the codes stored from it. m' is
// rounded to the storage with random bits of its own stream
// (momentum_key; a map that needs 32 bits per element takes 16 more from a
// second stream, momentum_second_key), independent of the parameter's
// stochastic rounding: in expectation the stored value is m' (each map
// states how exactly). The bits depend on (seed, step,
// tensor, element) alone, so any thread count, placement and backend store
// the same m.
//
// A policy of this kind provides, besides the hooks of no_momentum.hpp:
//   storage                        its MomentumStorage (state_layout.hpp)
//   random_bits_used               16, or 32 from two streams
// and the encoding of its storage (bf16_momentum.hpp, float8_block_momentum.hpp,
// int8_block_momentum.hpp).
// A backend updates m a block of momentum_block elements at a time, before
// anything reads the block's m of the step.

#include "../detail/config.hpp"
#include "../math/random.hpp"
#include "../math/step_scalars.hpp"
#include "../math/vmath.hpp"
#include "../state/state_layout.hpp"
#include "full_momentum.hpp"

namespace skewadam {

struct StoredMomentum : FullMomentum {
  template <class V>
  SKEWADAM_HD static V update(const V& m, const V& g, const StepScalars& s) {
    return vmath::mul_rn(vmath::splat<V>(s.beta1), m) + vmath::mul_rn(vmath::splat<V>(s.one_minus_beta1), g);
  }
};

/// The stored momentum's random stream: the parameter's rounding key with
/// its seed changed, so that the two streams are independent.
SKEWADAM_HD inline RoundingKey momentum_key(RoundingKey k) {
  k.seed ^= 0x6d6f6d656e74756dull;  // "momentum"
  return k;
}

/// The second stream, for the maps that read 32 random bits per element
/// (Float8BlockMomentum): the parameter's key with another seed change.
SKEWADAM_HD inline RoundingKey momentum_second_key(RoundingKey k) {
  k.seed ^= 0x6d6c6f7762697473ull;  // "mlowbits"
  return k;
}

/// How a momentum policy stores m: its `storage` member, or fp32.
template <class M>
constexpr MomentumStorage momentum_storage_of() {
  if constexpr (requires { M::storage; }) return M::storage;
  else return MomentumStorage::f32;
}
template <class M>
inline constexpr MomentumStorage momentum_storage_v = momentum_storage_of<M>();

}  // namespace skewadam
