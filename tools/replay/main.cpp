// skewadam-replay CASE_DIR [--out DIR] [--threads N]
//
// Runs one golden conformance case exactly as the golden README says, prints
// the worst error of each array as a fraction of its tolerance, and exits 0
// only if every array is within tolerance (1: out of tolerance, 2: bad input).

#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>

#include <skewadam_tools/golden_case.hpp>

int main(int argc, char** argv) {
  CLI::App app{"Run a SkewAdam golden conformance case and compare with its expected outputs"};
  std::string case_dir;
  std::string out_dir;
  int threads = 1;
  app.add_option("case", case_dir, "case folder (case.json, param0.npy, grads.npy, ...)")->required();
  app.add_option("--out", out_dir, "write the computed params.npy and state files here, golden layout");
  app.add_option("--threads", threads, "CPU threads (0: hardware)")->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    using namespace skewadam::tools;
    const GoldenCase c = load_golden_case(case_dir);
    const CaseRun run = run_golden_case(c, threads);
    const auto checks = check_golden_case(c, run);
    bool ok = true;
    std::printf("%s: %lld steps, shape [", c.name.c_str(), static_cast<long long>(c.steps));
    for (std::size_t i = 0; i < c.shape.size(); ++i)
      std::printf("%s%lld", i ? ", " : "", static_cast<long long>(c.shape[i]));
    std::printf("], momentum %s, factored %s, clip scope %s, threads %d\n", c.momentum ? "yes" : "no",
                c.factored ? "yes" : "no", c.hyper.clip_scope == skewadam::ClipScope::matrix ? "matrix" : "tensor",
                threads);
    for (const auto& r : checks) {
      if (!r.problem.empty())
        std::printf("  %-8s FAIL: %s\n", r.array.c_str(), r.problem.c_str());
      else
        std::printf("  %-8s worst error %.4f of tolerance (at index %lld) %s\n", r.array.c_str(), r.worst,
                    static_cast<long long>(r.worst_index), r.ok ? "ok" : "FAIL");
      ok = ok && r.ok;
    }
    if (!out_dir.empty()) write_case_outputs(c, run, out_dir);
    std::printf("%s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "skewadam-replay: %s\n", e.what());
    return 2;
  }
}
