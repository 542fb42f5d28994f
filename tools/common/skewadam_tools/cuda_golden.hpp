#pragma once
// A golden case on the GPU (tools/cuda/cuda_runner.cu): the same run as
// run_golden_case() in golden_case.hpp, on the CUDA optimizer: the case's
// rule, rounding, seed, parameter name and dtypes.

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <skewadam_tools/cuda_runner.hpp>
#include <skewadam_tools/golden_case.hpp>

namespace skewadam::tools {

inline CaseRun run_golden_case_cuda(const GoldenCase& c, bool graph = false) {
  cuda::RunSpec s;
  if (c.rule == CaseRule::adamw)
    s.rule = cuda::RuleKind::adamw;
  else
    s.rule = c.momentum ? (c.factored ? cuda::RuleKind::backbone : cuda::RuleKind::exact_momentum)
                        : (c.factored ? cuda::RuleKind::experts : cuda::RuleKind::router);
  s.name = c.param_name;
  s.shape = c.shape;
  s.dtype = c.param_dtype;
  s.grad_dtype = c.grad_dtype;
  s.nearest = c.rounding == CaseRounding::nearest;
  s.momentum = c.momentum_storage;
  s.seed = c.seed;
  s.max_grad_norm = c.max_grad_norm;
  s.clip_norm = c.clip_norm;
  s.hyper = c.hyper;
  s.lr = c.lr_schedule;
  s.steps = c.steps;
  const TypedValues param0 = c.initial_param();
  const TypedValues grads = c.typed_grads();
  s.param0 = param0.data();
  s.grads = grads.data();
  s.graph = graph;
  const cuda::RunResult r = cuda::run(s);
  CaseRun run;
  const std::size_t count = static_cast<std::size_t>(c.steps * c.numel());
  if (r.params.size() != count * static_cast<std::size_t>(dtype_size(c.param_dtype)))
    throw std::runtime_error("run_golden_case_cuda: the run returned " + std::to_string(r.params.size()) + " bytes");
  run.params.resize(count);  // 16-bit values widened to fp32
  if (c.param_dtype == Dtype::f32) {
    std::memcpy(run.params.data(), r.params.data(), r.params.size());
  } else {
    for (std::size_t i = 0; i < count; ++i) {
      std::uint16_t b;
      std::memcpy(&b, r.params.data() + 2 * i, 2);
      run.params[i] = c.param_dtype == Dtype::bf16 ? to_float(from_bits<bf16>(b)) : to_float(from_bits<f16>(b));
    }
  }
  collect_state(c, r.state, run);
  return run;
}

}  // namespace skewadam::tools
