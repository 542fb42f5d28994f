#pragma once
// NearestRounding: a rule's "rounding on store" policy slot, round-to-nearest-even.
//
// Store: p_new = rne(p * (1 - lr*wd) - lr * u), one rounding of the fp32
// result (weight decay fused before it, extension E2). fp32 parameters are
// stored as computed. No state; no random bits.

#include <cstdint>

#include "../types/dtype.hpp"

namespace skewadam {

struct NearestRounding {
  static constexpr bool uses_random_bits = false;

  template <class T>
  SKEWADAM_HD static T store(float x, std::uint32_t /*random_bits*/) {
    return round_nearest<T>(x);
  }
};

}  // namespace skewadam
