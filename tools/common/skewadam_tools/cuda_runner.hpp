#pragma once
// The CUDA optimizer behind a host-only interface, so that the tools and
// tests compiled by the C++ compiler can run it (tools/cuda/cuda_runner.cu,
// built when SKEWADAM_WITH_CUDA is on). Buffers here are host memory; the
// runner copies them to and from the device.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <skewadam/engine/grad_norm_clip.hpp>
#include <skewadam/types/dtype.hpp>
#include <skewadam/math/hyperparameters.hpp>
#include <skewadam/state/param_state.hpp>
#include <skewadam/math/random.hpp>
#include <skewadam/state/state_layout.hpp>
#include <skewadam/math/step_scalars.hpp>

namespace skewadam::tools::cuda {

/// CUDA devices present (0 without a device or driver; never throws).
int device_count() noexcept;
/// "NVIDIA H200, 132 SMs, 139.8 GiB, sm_90" for device 0.
std::string device_description();

/// The rule applied to the one tensor of a run (all tiers use it).
enum class RuleKind { backbone, experts, router, exact_momentum, adamw };

struct RunSpec {
  RuleKind rule = RuleKind::experts;
  std::string name = "param";     ///< keys the rounding stream
  std::vector<std::int64_t> shape;
  Dtype dtype = Dtype::f32;       ///< of the parameter (and of the gradients unless grad_dtype says)
  std::optional<Dtype> grad_dtype;  ///< of the gradients: f32 or dtype (default: dtype)
  bool nearest = false;           ///< round 16-bit parameters to nearest instead of stochastically
  /// The momentum's storage (backbone and exact_momentum; docs/spec.md §5,
  /// E7): other than f32, the parameter is rounded stochastically.
  MomentumStorage momentum = MomentumStorage::f32;
  Hyperparameters hyper{};
  std::vector<double> lr;         ///< per step (steps values)
  std::int64_t steps = 0;
  std::uint64_t seed = 0x5eed5eedULL;
  const void* param0 = nullptr;   ///< numel values of dtype
  const void* grads = nullptr;    ///< steps * numel values of the gradients' dtype
  bool graph = false;             ///< steps 2.. replay a CUDA graph captured from one step
  /// Global gradient-norm clipping (docs/spec.md E6, E8): 0 off.
  double max_grad_norm = 0;
  ClipNorm clip_norm = ClipNorm::current;
};

struct RunResult {
  std::vector<std::uint8_t> params;  ///< the parameter after every step: steps * numel values of dtype
  ParamState state;                  ///< after the last step
};

/// Runs spec.steps steps of one tensor on device 0.
RunResult run(const RunSpec& spec);

/// StochasticRounding::store of x[i] with random_bits(key, i), on the GPU
/// (bits of bf16 or f16).
std::vector<std::uint16_t> stochastic_round(const std::vector<float>& x, Dtype dtype, RoundingKey key);

/// make_step_scalars(h, t) for each t, formed on the GPU (as the CUDA
/// backend's begin_step_kernel forms them).
std::vector<StepScalars> device_step_scalars(const Hyperparameters& h, const std::vector<std::int64_t>& steps);

/// Bad input must throw std::invalid_argument: returns the messages of the
/// errors raised by a host parameter pointer and a gradient of another dtype.
std::vector<std::string> bad_input_messages();

}  // namespace skewadam::tools::cuda
