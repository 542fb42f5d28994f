#pragma once
// The CUDA backend's step bookkeeping, on the device: every tensor's step
// count, the optimizer's, and the outcome of the last step live in device
// memory beside the state, so that a step needs nothing from the host once
// its tables are in place. It never waits for the device, and a captured
// step (a CUDA graph) replays with counts that stay right.
//
//   StepControl        what the host sets (uploaded only when it changes):
//                      the tiers' hyperparameters, the global-norm scale of
//                      the next step (or the norm every step clips to, the
//                      scale then formed here from the step's sum of g^2),
//                      the rounding seed and, optionally, a device array the
//                      tiers' learning rates are read from
//   begin_step_kernel  each stepped piece's scalars and rounding key from its
//                      tensor's own count t + 1 (make_step_scalars, the
//                      host's formula); clears the skip flags and the outcome
//   fold_verdict_kernel  the step inside backward: each tensor's outcome
//                      folded into the open step's (OpenOutcome), read once
//                      when the step ends
//   end_step_kernel    unless the step was rejected (the outcome decide_kernel
//                      wrote), every stepped tensor's count and the
//                      optimizer's advance by one (the optimizer's only
//                      when the step counts one, StepSettings::counts_step)

#include <cstdint>

#include "../../../detail/config.hpp"
#include "../../../math/hyperparameters.hpp"
#include "../../../math/random.hpp"
#include "../../../math/step_scalars.hpp"
#include "check_kernels.cuh"
#include "kernels.cuh"

namespace skewadam::backend::cuda {

struct StepControl {
  Hyperparameters hyper[3]{};    ///< by tier_index
  double grad_scale = 1.0;       ///< of the next step (global-norm clipping)
  std::uint64_t seed = 0;
  const double* lr = nullptr;    ///< when set: the tiers' lr, read as each step runs
  double max_norm = 0;           ///< > 0: the scale is step_grad_scale(...) of *norm_sq
  const double* norm_sq = nullptr;  ///< the step's sum of g^2 (squares_kernel, total_kernel)
};

/// Field by field (the struct has padding).
inline bool same_control(const StepControl& a, const StepControl& b) noexcept {
  auto same = [](const Hyperparameters& x, const Hyperparameters& y) {
    return x.lr == y.lr && x.beta1 == y.beta1 && x.beta2 == y.beta2 && x.eps == y.eps &&
           x.weight_decay == y.weight_decay && x.clip_threshold == y.clip_threshold && x.clip_scope == y.clip_scope;
  };
  for (int k = 0; k < 3; ++k)
    if (!same(a.hyper[k], b.hyper[k])) return false;
  return a.grad_scale == b.grad_scale && a.seed == b.seed && a.lr == b.lr && a.max_norm == b.max_norm &&
         a.norm_sq == b.norm_sq;
}

/// counts[k]: updates tensor k has received; counts[n]: applied steps. One
/// thread per piece (n pieces): its scalars from its tensor's count.
template <int = 0>
__global__ void begin_step_kernel(const DeviceTask* tasks, const StepControl* control, const std::int64_t* counts,
                                  TaskStep* steps, int n, CheckOutcome* outcome) {
  const int k = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (k == 0) *outcome = CheckOutcome{};
  if (k >= n) return;
  const DeviceTask& t = tasks[k];
  if (t.grad == nullptr) return;
  const std::int64_t step = counts[t.tensor] + 1;
  Hyperparameters h = control->hyper[t.tier];
  if (control->lr != nullptr) h.lr = control->lr[t.tier];
  const double scale = step_grad_scale(control->grad_scale, control->max_norm,
                                       control->max_norm > 0 ? *control->norm_sq : 0.0);
  steps[k] = TaskStep{make_step_scalars(h, step, scale),
                      RoundingKey{control->seed, t.id, static_cast<std::uint64_t>(step)}, h.clip_scope, 0};
}

/// stepped[k]: whether tensor k (of n) is in the step.
template <int = 0>
__global__ void end_step_kernel(const int* stepped, std::int64_t* counts, int n, const CheckOutcome* outcome,
                                int counts_step) {
  if (outcome->bad) return;
  for (int k = static_cast<int>(threadIdx.x); k < n; k += static_cast<int>(blockDim.x))
    if (stepped[k]) ++counts[k];
  if (threadIdx.x == 0 && counts_step) ++counts[n];
}

/// The verdicts of an optimizer step taken inside backward, one tensor per
/// step, kept on the device until the step ends (Engine::open_verdicts).
struct OpenOutcome {
  std::int32_t skipped = 0;  ///< tensors skipped for a non-finite gradient
  std::int32_t tensor = -1;  ///< the first of them
  index_t element = -1;      ///< its first offending element, flat in the tensor
  float value = 0;
};

/// Adds the outcome of the step just enqueued to the open step's.
template <int = 0>
__global__ void fold_verdict_kernel(const CheckOutcome* outcome, const DeviceTask* tasks, OpenOutcome* open) {
  if (threadIdx.x != 0 || !outcome->bad) return;
  if (open->skipped == 0) {
    const DeviceTask& t = tasks[outcome->task];
    open->tensor = t.tensor;
    open->element = t.element_base + outcome->element;
    open->value = outcome->value;
  }
  ++open->skipped;
}

}  // namespace skewadam::backend::cuda
