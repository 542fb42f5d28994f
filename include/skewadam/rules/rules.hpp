#pragma once
// The paper's tiers, its ablations and the baselines: each one line.

#include "../policies/adam_second_moment.hpp"
#include "../policies/bf16_momentum.hpp"
#include "../policies/exact_second_moment.hpp"
#include "../policies/factored_second_moment.hpp"
#include "../policies/float8_block_momentum.hpp"
#include "../policies/full_momentum.hpp"
#include "../policies/int8_block_momentum.hpp"
#include "../policies/nearest_rounding.hpp"
#include "../policies/no_momentum.hpp"
#include "../policies/no_update_clip.hpp"
#include "../policies/rms_update_clip.hpp"
#include "../policies/stochastic_rounding.hpp"
#include "update_rule.hpp"

namespace skewadam {

// The paper's three tiers.
using BackboneRule = UpdateRule<FullMomentum, FactoredSecondMoment>;  ///< momentum + factored
using ExpertRule = UpdateRule<NoMomentum, FactoredSecondMoment>;      ///< factored only
using RouterRule = UpdateRule<NoMomentum, ExactSecondMoment>;         ///< exact only

// Building blocks of the ablations.
using UniformRule = UpdateRule<FullMomentum, FactoredSecondMoment>;    ///< momentum + factored
using AdafactorRule = UpdateRule<NoMomentum, FactoredSecondMoment>;    ///< no momentum, factored
using ExactMomentumRule = UpdateRule<FullMomentum, ExactSecondMoment>; ///< momentum + exact

/// The backbone's rule with its momentum in bf16, stochastically rounded.
using BackboneBf16Rule = BackboneRule::with_momentum<Bf16Momentum>;
/// The backbone's rule with its momentum in 8-bit floating-point codes, a
/// power-of-two scale per 256 elements.
using Backbone8bitRule = BackboneRule::with_momentum<Float8BlockMomentum>;
/// The same with linear 8-bit codes and an fp32 scale per 256 elements.
using BackboneLinear8bitRule = BackboneRule::with_momentum<Int8BlockMomentum>;

/// AdamW from the same parts: eps added to sqrt(v), no update clipping.
using AdamWRule = UpdateRule<FullMomentum, AdamSecondMoment, NoUpdateClip>;

}  // namespace skewadam
