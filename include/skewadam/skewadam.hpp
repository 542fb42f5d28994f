#pragma once
// Everything a CPU user needs:
//   #include <skewadam/skewadam.hpp>

#include "detail/config.hpp"
#include "math/hyperparameters.hpp"
#include "math/random.hpp"
#include "math/schedule.hpp"
#include "math/step_scalars.hpp"
#include "optimizer.hpp"
#include "rules/decode_momentum.hpp"
#include "rules/rules.hpp"
#include "rules/update_rule.hpp"
#include "state/param_state.hpp"
#include "state/state_layout.hpp"
#include "tiers/tier_rules.hpp"
#include "types/dtype.hpp"
#include "types/shape.hpp"
#include "types/tensor_view.hpp"
#include "types/tier.hpp"
#include "version.hpp"
