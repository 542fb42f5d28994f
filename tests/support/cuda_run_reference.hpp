#pragma once
// What the CUDA runner's runs (skewadam_tools/cuda_runner.hpp) are checked
// against: the same steps on the CPU backend, and deterministic test data.
// Shared by the GPU tests (tests/cuda/test_cuda.cpp) and their emulated
// counterparts (tests/emulation/).

#include <cstdint>
#include <cstring>
#include <vector>

#include <skewadam/skewadam.hpp>
#include <skewadam_tools/cuda_runner.hpp>

namespace skewadam::test {

namespace gpu = skewadam::tools::cuda;

/// xorshift64: deterministic test data.
struct Rng {
  std::uint64_t s;
  explicit Rng(std::uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ULL + 1) {}
  std::uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(next() >> 40) * 0x1p-24f; }
  int integer(int lo, int hi) { return lo + static_cast<int>(next() % static_cast<std::uint64_t>(hi - lo + 1)); }
};

inline const char* rule_name(gpu::RuleKind k) {
  switch (k) {
    case gpu::RuleKind::backbone: return "backbone";
    case gpu::RuleKind::experts: return "experts";
    case gpu::RuleKind::router: return "router";
    case gpu::RuleKind::exact_momentum: return "exact_momentum";
    case gpu::RuleKind::adamw: return "adamw";
  }
  return "?";
}

/// The same steps on the CPU backend (one thread, no non-finite check).
template <class T>
inline gpu::RunResult run_cpu(const gpu::RunSpec& spec) {
  auto go = [&]<class Rule>() {
    using Opt = skewadam::Optimizer<skewadam::TierRules<Rule, Rule, Rule>>;
    Opt opt(spec.hyper, skewadam::OptimizerOptions{.seed = spec.seed, .threads = 1,
                                                   .nonfinite = skewadam::NonFinitePolicy::unchecked});
    const skewadam::Shape shape(spec.shape.begin(), static_cast<index_t>(spec.shape.size()), "shape");
    const index_t n = shape.numel();
    std::vector<T> p(static_cast<std::size_t>(n));
    std::memcpy(p.data(), spec.param0, p.size() * sizeof(T));
    const T* grads = static_cast<const T*>(spec.grads);
    const auto id = opt.add(spec.name, skewadam::Tier::backbone, skewadam::TensorView<T>(p.data(), shape));
    gpu::RunResult out;
    out.params.resize(static_cast<std::size_t>(spec.steps * n) * sizeof(T));
    for (std::int64_t t = 0; t < spec.steps; ++t) {
      opt.set_grad(id, skewadam::TensorView<const T>(grads + t * n, shape));
      opt.set_lr(spec.lr[static_cast<std::size_t>(t)]);
      opt.step();
      std::memcpy(out.params.data() + static_cast<std::size_t>(t * n) * sizeof(T), p.data(), p.size() * sizeof(T));
    }
    const auto s = opt.state(id);
    out.state.m.assign(s.m.begin(), s.m.end());
    out.state.v.assign(s.v.begin(), s.v.end());
    out.state.v_row.assign(s.v_row.begin(), s.v_row.end());
    out.state.v_col.assign(s.v_col.begin(), s.v_col.end());
    out.state.step = s.step;
    return out;
  };
  switch (spec.rule) {
    case gpu::RuleKind::backbone: return go.template operator()<skewadam::BackboneRule>();
    case gpu::RuleKind::experts: return go.template operator()<skewadam::ExpertRule>();
    case gpu::RuleKind::router: return go.template operator()<skewadam::RouterRule>();
    case gpu::RuleKind::exact_momentum: return go.template operator()<skewadam::ExactMomentumRule>();
    case gpu::RuleKind::adamw: return go.template operator()<skewadam::AdamWRule>();
  }
  return {};
}

}  // namespace skewadam::test
