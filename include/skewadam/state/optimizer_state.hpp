#pragma once
// The optimizer's complete state as plain data: what Optimizer::export_state()
// returns and import_state() accepts, and what a checkpoint (checkpoint.hpp)
// stores. Parameter values are not part of it: they belong to the caller.
//
// Together with the registered parameters (names, tiers, shapes) and the
// optimizer's type (its tier rules) this determines every later step bit for
// bit: the stochastic-rounding bits of a step depend only on (seed, rounding
// stream, the parameter's step count, element index).

#include <array>
#include <cstdint>
#include <limits>
#include <vector>

#include "../math/hyperparameters.hpp"
#include "../types/tier.hpp"
#include "param_state.hpp"

namespace skewadam {

struct OptimizerState {
  struct Param {
    ParamState state;                 ///< m, v, v_row, v_col (fp32) and the parameter's step count
    std::uint32_t rounding_stream = 0;  ///< tensor id keying its rounding bits (FNV-1a of the name at add())
  };

  std::array<Hyperparameters, tier_count> hyperparameters{};  ///< indexed by tier_index(t)
  std::uint64_t seed = 0;    ///< stochastic-rounding seed
  std::int64_t steps = 0;    ///< step() calls applied so far: the lr schedule's position
  /// The global gradient norm the next step clips by under ClipNorm::previous
  /// (docs/spec.md E8; grad_norm_clip.hpp): NaN when there is none.
  double previous_grad_norm = std::numeric_limits<double>::quiet_NaN();
  std::vector<Param> params;  ///< one per registered parameter, in ParamId order
};

}  // namespace skewadam
