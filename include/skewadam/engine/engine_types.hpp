#pragma once
// The plain data the front-end (optimizer.hpp), the engine (engine.hpp) and
// the backends (engine/backend/backend.hpp) hand each other.

#include <array>
#include <cstdint>
#include <optional>

#include "../detail/config.hpp"
#include "../math/hyperparameters.hpp"
#include "../math/step_scalars.hpp"
#include "../state/state_layout.hpp"
#include "../types/tensor_view.hpp"
#include "../types/tier.hpp"

namespace skewadam {

/// A rule's update clipping, as the engine needs it (it forms the clip
/// divisors from the sums of u^2): whether the rule clips, and its
/// Clip::divisor.
struct UpdateClip {
  bool active = false;
  float (*divisor)(double sum_u2, index_t count, const StepScalars& s) = nullptr;
};

/// A tensor being registered: already checked by the front-end, with what
/// its rule keeps (layout) and how it clips.
struct TensorRegistration {
  index_t index = 0;  ///< its position (ParamId)
  Tier tier = Tier::backbone;
  StateLayout layout{};
  ParamView param;
  UpdateClip clip{};
};

/// One tensor of a step (or of a gradient-norm sum). Its scalars and
/// rounding key are formed by the backend from its own step count.
struct StepItem {
  index_t index = 0;  ///< its position (ParamId)
  Tier tier = Tier::backbone;
  ParamView param;
  GradView grad;
  std::uint32_t stream = 0;  ///< its rounding stream (RoundingKey::tensor)
};

/// What a step needs besides its items.
struct StepSettings {
  std::array<Hyperparameters, tier_count> hyper{};  ///< by tier_index, lr schedules applied
  double grad_scale = 1.0;                          ///< global-norm clipping's, given
  std::uint64_t seed = 0;                           ///< stochastic rounding's
  /// > 0: the step clips the global gradient norm to it itself (the scale
  /// replaces grad_scale); clip_sum_squares() then reads the sum of g^2
  double max_norm = 0;
  /// Whether an applied step advances the optimizer's step count besides
  /// its tensors' counts (false: a step of one tensor inside an optimizer
  /// step still under way, Optimizer::step(ParamId)).
  bool counts_step = true;
  /// The step counts (the engine's StateStore::counts(), in the backend's
  /// memory): each tensor's, then the applied steps. The engine sets it.
  std::int64_t* counts = nullptr;
};

/// The first offending gradient element of a step.
struct Offender {
  index_t index = -1;    ///< the tensor
  index_t element = -1;  ///< flat index of its first offending element
  float value = 0;       ///< that element after global-norm scaling
};

/// The verdicts of an optimizer step taken inside backward, one tensor at a
/// time: the first tensor skipped for a non-finite gradient, in the order
/// they were stepped, and how many were.
struct OpenVerdicts {
  std::optional<Offender> first;
  index_t skipped = 0;
};

/// Why a captured step cannot replay.
struct ReplayProblem {
  index_t index = -1;  ///< the tensor whose gradient is not the captured one (pointer or dtype), or
                       ///< -1: the engine changed since the capture (a parameter added, a gradient
                       ///< changed dtype, or a state imported)
};

}  // namespace skewadam
