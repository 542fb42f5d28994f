#pragma once
// The steps of a RunSpec (cuda_runner.hpp) on the optimizer front-end over
// the CUDA backend on runtime R, every copy in stream order on the stream
// the steps run on: the initial parameter and each step's gradient uploaded
// there (from pageable memory: staged before the call returns), each step's
// parameter read back there (waiting for it). tools/cuda/cuda_runner.cu runs
// it on the CUDA runtime, the emulated tests on the emulated one (whose
// streams show a copy on another stream than the step's, as a GPU may).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include <skewadam/engine/backend/cuda/cuda_backend.hpp>
#include <skewadam/optimizer.hpp>
#include <skewadam/policies/nearest_rounding.hpp>
#include <skewadam/rules.hpp>
#include <skewadam/tiers/tier_rules.hpp>
#include <skewadam_tools/cuda_runner.hpp>

namespace skewadam::tools::cuda {

template <class R, class T, class G>
RunResult run_steps_typed(const RunSpec& spec, typename R::stream_type stream) {
  const Shape shape(spec.shape.begin(), static_cast<index_t>(spec.shape.size()), "shape");
  const index_t n = shape.numel();
  const auto bytes = static_cast<std::size_t>(n) * sizeof(T);
  const auto grad_bytes = static_cast<std::size_t>(n) * sizeof(G);
  if (spec.lr.size() != static_cast<std::size_t>(spec.steps))
    throw std::invalid_argument("lr: " + std::to_string(spec.lr.size()) + " values for " + std::to_string(spec.steps) +
                                " steps");
  RunResult out;
  out.params.resize(bytes * static_cast<std::size_t>(spec.steps));
  backend::cuda::DeviceArray<R, std::uint8_t> p(bytes), g(grad_bytes);
  backend::cuda::DeviceArray<R, double> lr(3);
  if (bytes > 0) R::to_device(p.data(), spec.param0, bytes, stream);

  auto go = [&]<class Rule>() {
    Optimizer<TierRules<Rule, Rule, Rule>, backend::CudaBackend<R>> opt(
        spec.hyper, OptimizerOptions{.seed = spec.seed,
                                     .max_grad_norm = spec.max_grad_norm,
                                     .clip_norm = spec.clip_norm,
                                     .stream = static_cast<void*>(stream)});
    const ParamId id = opt.add(spec.name, Tier::backbone, TensorView<T>(reinterpret_cast<T*>(p.data()), shape),
                               TensorView<const G>(reinterpret_cast<const G*>(g.data()), shape));
    std::optional<typename decltype(opt)::StepGraph> graph;
    if (spec.graph) opt.set_lr_device(lr.data());
    for (std::int64_t t = 0; t < spec.steps; ++t) {
      const auto* src = static_cast<const std::uint8_t*>(spec.grads) + static_cast<std::size_t>(t) * grad_bytes;
      if (grad_bytes > 0) R::to_device(g.data(), src, grad_bytes, stream);
      const double l = spec.lr[static_cast<std::size_t>(t)];
      if (spec.graph) {
        const double three[3] = {l, l, l};
        R::to_device(lr.data(), three, sizeof three, stream);
        if (t == 0) {
          opt.step();  // an ordinary step first; later steps replay a capture
        } else {
          if (!graph) graph.emplace(opt.capture_step());
          opt.replay(*graph);
        }
      } else {
        opt.set_lr(l);
        opt.step();
      }
      if (bytes > 0) R::to_host(out.params.data() + static_cast<std::size_t>(t) * bytes, p.data(), bytes, stream);
    }
    out.state = opt.export_state().params[static_cast<std::size_t>(id.index)].state;
  };
  auto rounded = [&]<class Rule>() {
    if (spec.momentum == MomentumStorage::bfloat16 && Rule::momentum::has_state)
      go.template operator()<typename Rule::template with_momentum<Bf16Momentum>>();
    else if (spec.momentum == MomentumStorage::int8_blocks && Rule::momentum::has_state)
      go.template operator()<typename Rule::template with_momentum<Int8BlockMomentum>>();
    else if (spec.momentum == MomentumStorage::float8_blocks && Rule::momentum::has_state)
      go.template operator()<typename Rule::template with_momentum<Float8BlockMomentum>>();
    else if (spec.nearest)
      go.template operator()<typename Rule::template with_rounding<NearestRounding>>();
    else
      go.template operator()<Rule>();
  };
  if (spec.momentum != MomentumStorage::f32 &&
      (spec.nearest || (spec.rule != RuleKind::backbone && spec.rule != RuleKind::exact_momentum)))
    throw std::invalid_argument("momentum: stored in fewer bits for the backbone and exact_momentum rules, with "
                                "stochastic rounding");
  switch (spec.rule) {
    case RuleKind::backbone: rounded.template operator()<BackboneRule>(); break;
    case RuleKind::experts: rounded.template operator()<ExpertRule>(); break;
    case RuleKind::router: rounded.template operator()<RouterRule>(); break;
    case RuleKind::exact_momentum: rounded.template operator()<ExactMomentumRule>(); break;
    case RuleKind::adamw: rounded.template operator()<AdamWRule>(); break;
  }
  return out;
}

/// spec's steps on runtime R, on `stream`.
template <class R>
RunResult run_steps(const RunSpec& spec, typename R::stream_type stream) {
  const Dtype grad = spec.grad_dtype.value_or(spec.dtype);
  if (grad != spec.dtype && grad != Dtype::f32)
    throw std::invalid_argument("grad_dtype: must be f32 or the parameter's dtype");
  const bool f32_grads = grad == Dtype::f32;
  switch (spec.dtype) {
    case Dtype::f32: return run_steps_typed<R, float, float>(spec, stream);
    case Dtype::bf16: return f32_grads ? run_steps_typed<R, bf16, float>(spec, stream) : run_steps_typed<R, bf16, bf16>(spec, stream);
    case Dtype::f16: return f32_grads ? run_steps_typed<R, f16, float>(spec, stream) : run_steps_typed<R, f16, f16>(spec, stream);
  }
  throw std::invalid_argument("dtype: unknown");
}

}  // namespace skewadam::tools::cuda
