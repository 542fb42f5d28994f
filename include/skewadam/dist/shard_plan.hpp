#pragma once
// The plan that divides each tensor between processes: the same as
// <skewadam/engine/placement/shard_plan.hpp>.
#include "../engine/placement/shard_plan.hpp"
