// skewadam-replay: the checks of a run and its report (replay.hpp).

#include "replay.hpp"

namespace skewadam::replay_tool {

void check_step(const char* flag, std::int64_t k, std::int64_t steps) {
  if (k < 0 || k > steps)
    throw CaseError(std::string(flag) + " " + std::to_string(k) + ": the case has steps 1.." + std::to_string(steps));
}

std::vector<ArrayCheck> check_steps(const GoldenCase& c, const CaseRun& run, std::int64_t first, std::int64_t last) {
  const auto n = static_cast<std::ptrdiff_t>(c.numel());
  const std::vector<float> got(run.params.begin() + first * n, run.params.begin() + last * n);
  const std::vector<float> want(c.params.data.begin() + first * n, c.params.data.begin() + last * n);
  std::vector<ArrayCheck> out;
  out.push_back(compare_params(c, got, want));
  if (last == c.steps) {
    const auto all = check_golden_case(c, run);
    out.insert(out.end(), all.begin() + 1, all.end());  // the state files
  }
  return out;
}

static void write_outputs(const GoldenCase& c, const CaseRun& run, std::int64_t first, std::int64_t last,
                          const std::filesystem::path& out) {
  std::filesystem::create_directories(out);
  std::vector<std::int64_t> seq = c.shape;
  seq.insert(seq.begin(), last - first);
  write_npy(out / "params.npy", seq, run.params.data() + first * c.numel());
  for (const auto& [name, values] : run.state)
    write_npy(out / (name + ".npy"), skewadam::tools::detail::state_shape(name, c.shape), values.data());
}

void print_case(const GoldenCase& c) {
  std::printf("%s: %lld steps, shape [", c.name.c_str(), static_cast<long long>(c.steps));
  for (std::size_t i = 0; i < c.shape.size(); ++i)
    std::printf("%s%lld", i ? ", " : "", static_cast<long long>(c.shape[i]));
  std::printf("], %smomentum %s, factored %s, clip scope %s", c.rule == CaseRule::adamw ? "rule AdamW, " : "",
              c.momentum ? "yes" : "no", c.factored ? "yes" : "no",
              c.hyper.clip_scope == ClipScope::matrix ? "matrix" : "tensor");
  if (c.param_dtype != Dtype::f32 || c.grad_dtype != Dtype::f32)
    std::printf(", %s parameter, %s gradients, %s rounding", std::string(dtype_name(c.param_dtype)).c_str(),
                std::string(dtype_name(c.grad_dtype)).c_str(),
                c.rounding == CaseRounding::nearest ? "nearest" : "stochastic");
}

int report(const GoldenCase& c, const std::vector<ArrayCheck>& checks, const CaseRun& run, std::int64_t first,
           std::int64_t last, const std::filesystem::path& out_dir) {
  bool ok = true;
  for (const auto& a : checks) {
    if (!a.problem.empty())
      std::printf("  %-8s FAIL: %s\n", a.array.c_str(), a.problem.c_str());
    else if (!a.detail.empty())
      std::printf("  %-8s %s, %.4f of tolerance %s\n", a.array.c_str(), a.detail.c_str(), a.worst, a.ok ? "ok" : "FAIL");
    else
      std::printf("  %-8s worst error %.4f of tolerance (at index %lld) %s\n", a.array.c_str(), a.worst,
                  static_cast<long long>(a.worst_index), a.ok ? "ok" : "FAIL");
    ok = ok && a.ok;
  }
  if (!out_dir.empty()) write_outputs(c, run, first, last, out_dir);
  std::printf("%s\n", ok ? "PASS" : "FAIL");
  std::fflush(stdout);
  return ok ? 0 : 1;
}

}  // namespace skewadam::replay_tool
