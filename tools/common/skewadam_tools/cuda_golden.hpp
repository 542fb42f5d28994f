#pragma once
// A golden case on the GPU (tools/cuda/cuda_runner.cu): the same run as
// run_golden_case() in golden_case.hpp, on the CUDA optimizer.

#include <cstring>
#include <stdexcept>

#include <skewadam_tools/cuda_runner.hpp>
#include <skewadam_tools/golden_case.hpp>

namespace skewadam::tools {

inline CaseRun run_golden_case_cuda(const GoldenCase& c, bool graph = false) {
  cuda::RunSpec s;
  s.rule = c.momentum ? (c.factored ? cuda::RuleKind::backbone : cuda::RuleKind::exact_momentum)
                      : (c.factored ? cuda::RuleKind::experts : cuda::RuleKind::router);
  s.name = c.name.empty() ? "param" : c.name;
  s.shape = c.shape;
  s.dtype = Dtype::f32;
  s.hyper = c.hyper;
  s.lr = c.lr_schedule;
  s.steps = c.steps;
  s.param0 = c.param0.data.data();
  s.grads = c.grads.data.data();
  s.graph = graph;
  const cuda::RunResult r = cuda::run(s);
  CaseRun run;
  run.params.resize(r.params.size() / sizeof(float));
  std::memcpy(run.params.data(), r.params.data(), r.params.size());
  if (!r.state.m.empty()) run.state["exp_avg"] = r.state.m;
  if (!r.state.v.empty()) run.state["v"] = r.state.v;
  if (!r.state.v_row.empty()) run.state["v_row"] = r.state.v_row;
  if (!r.state.v_col.empty()) run.state["v_col"] = r.state.v_col;
  return run;
}

}  // namespace skewadam::tools
