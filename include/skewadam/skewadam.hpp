#pragma once
// Everything a CPU user needs:
//   #include <skewadam/skewadam.hpp>

#include "config.hpp"
#include "decode_momentum.hpp"
#include "dtype.hpp"
#include "hyperparameters.hpp"
#include "optimizer.hpp"
#include "param_state.hpp"
#include "random.hpp"
#include "rules.hpp"
#include "schedule.hpp"
#include "shape.hpp"
#include "state_layout.hpp"
#include "step_scalars.hpp"
#include "tensor_view.hpp"
#include "tier.hpp"
#include "tier_rules.hpp"
#include "update_rule.hpp"
#include "version.hpp"
