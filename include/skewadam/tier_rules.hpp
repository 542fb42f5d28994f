#pragma once
// Kept where it was before the headers were grouped by layer: the same as
// <skewadam/tiers/tier_rules.hpp>.
#include "tiers/tier_rules.hpp"
