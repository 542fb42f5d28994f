#pragma once
// skewadam-replay's runs of a golden case (main.cpp holds the command line):
// the options, the run on the optimizer front-end over any backend, the
// report. Each backend's runs are instantiated in a translation unit of their
// own (cpu.cpp, cuda_emulated.cpp, cuda.cpp), so that they compile in
// parallel.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

#include <skewadam/checkpoint.hpp>
#include <skewadam_tools/golden_case.hpp>
#if defined(SKEWADAM_REPLAY_WITH_MPI)
#include "sharded_replay.hpp"
#endif

namespace skewadam::replay_tool {

using namespace skewadam::tools;

/// Metadata key naming the case a checkpoint was saved from.
inline constexpr const char* case_key = "skewadam-replay.case";

struct Options {
  std::string case_dir;
  std::string out_dir;
  int threads = 1;
  std::string backend = "cpu";
  std::optional<std::int64_t> stop_after;
  std::string save;
  std::string load;
  std::optional<std::int64_t> resume_at;
  bool shard = false;
  bool expert_rows = false;
};

/// A file in the temp folder, removed when done.
struct TempFile {
  std::filesystem::path path;
  explicit TempFile(const std::string& stem) {
    long pid = 0;
#if defined(__unix__) || defined(__APPLE__)
    pid = static_cast<long>(::getpid());
#endif
    path = std::filesystem::temp_directory_path() /
           ("skewadam-replay-" + std::to_string(pid) + "-" + stem + ".ckpt");
  }
  ~TempFile() {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
};

/// Throws unless 0 <= k <= steps (flag names the option).
void check_step(const char* flag, std::int64_t k, std::int64_t steps);
/// Compares steps [first, last) and, after the last step, the state.
std::vector<ArrayCheck> check_steps(const GoldenCase& c, const CaseRun& run, std::int64_t first, std::int64_t last);
/// "NAME: N steps, shape [...], momentum ..., factored ..., clip scope ..." (no newline).
void print_case(const GoldenCase& c);
/// One line per checked array, the outputs written to `out_dir` if given,
/// then PASS or FAIL; returns the exit status (0 pass, 1 out of tolerance).
int report(const GoldenCase& c, const std::vector<ArrayCheck>& checks, const CaseRun& run, std::int64_t first,
           std::int64_t last, const std::filesystem::path& out_dir);

/// The case on each backend (--backend cpu, cuda-emulated, cuda); each
/// returns the exit status.
int replay_cpu(const GoldenCase& c, const Options& o);
int replay_cuda_emulated(const GoldenCase& c, const Options& o);
int replay_cuda(const GoldenCase& c, const Options& o);

template <class Rule, class Backend>
class Replay {
 public:
  using Opt = Optimizer<TierRules<Rule, Rule, Rule>, Backend>;

  Replay(const GoldenCase& c, int threads)
      : c_(c),
        param_(c.initial_param()),
        grads_(c.typed_grads()),
        opt_(std::make_unique<Opt>(c.hyper, c.options(threads))) {
    id_ = opt_->add(c.param_name, Tier::backbone, param_.param_view(0, c.tensor_shape()));
  }

  std::int64_t steps_done() const { return opt_->steps(); }

  void run(std::int64_t first, std::int64_t last, CaseRun& run) {
    run_golden_steps(c_, *opt_, id_, param_, grads_, first, last, run);
    collect_state(c_, *opt_, id_, run);
  }

  /// Saves the state after the case's step `step`.
  void save(const std::filesystem::path& file, std::int64_t step) const {
    save_checkpoint(*opt_, file,
                    SaveOptions{.include_params = true,
                                .metadata = {{case_key, c_.name}, {case_step_key, std::to_string(step)}}});
  }

  /// Loads a checkpoint saved for this case; returns the case step it was
  /// saved after.
  std::int64_t load(const std::filesystem::path& file) {
    const CheckpointInfo info = read_checkpoint_info(file);
    if (const std::string* saved = info.find_metadata(case_key); saved && *saved != c_.name)
      throw CheckpointError(CheckpointError::Kind::mismatch,
                            file.string() + ": saved from case '" + *saved + "', not '" + c_.name + "'");
    const std::int64_t step = saved_case_step(info);
    if (step > c_.steps)
      throw CheckpointError(CheckpointError::Kind::mismatch, file.string() + ": saved after step " +
                                                                 std::to_string(step) + ", the case has " +
                                                                 std::to_string(c_.steps) + " steps");
    load_checkpoint(*opt_, file, LoadOptions{.params = ParamValues::require});
    return step;
  }

 private:
  const GoldenCase& c_;
  TypedValues param_;
  const TypedValues grads_;
  std::unique_ptr<Opt> opt_;
  ParamId id_{};
};

#if defined(SKEWADAM_REPLAY_WITH_MPI)
template <class Rule, class Backend>
int replay_sharded(const GoldenCase& c, const Options& o) {
  ShardedReplayOptions so{.expert_rows = o.expert_rows, .stop_after = o.stop_after, .save = o.save, .load = o.load,
                          .case_key = case_key};
  const ShardedReplayResult r = run_sharded_case<Rule, Backend>(c, so);
  const auto checks = check_steps(c, r.run, r.first, r.last);
  if (r.rank != 0) return std::all_of(checks.begin(), checks.end(), [](const ArrayCheck& a) { return a.ok; }) ? 0 : 1;
  print_case(c);
  std::printf(", sharded over %d ranks (%s)%s\n", r.ranks, r.split.c_str(),
              std::is_same_v<Backend, backend::DefaultBackend> ? "" : ", CUDA backend, emulated on the host");
  std::printf("  steps %lld..%lld", static_cast<long long>(r.first + 1), static_cast<long long>(r.last));
  if (!o.load.empty()) std::printf(", loaded %s", o.load.c_str());
  if (!o.save.empty()) std::printf(", saved to %s", o.save.c_str());
  std::printf("\n  state bytes per rank:");
  for (index_t b : r.state_bytes) std::printf(" %lld", static_cast<long long>(b));
  std::printf("; exchanged per step: %lld bytes from each rank\n", static_cast<long long>(r.exchange_bytes));
  return report(c, checks, r.run, r.first, r.last, o.out_dir);
}
#endif

template <class Rule, class Backend>
int replay(const GoldenCase& c, const Options& o) {
  if (o.shard) {
#if defined(SKEWADAM_REPLAY_WITH_MPI)
    return replay_sharded<Rule, Backend>(c, o);
#else
    throw CaseError("--shard: this skewadam-replay was built without MPI (SKEWADAM_WITH_MPI)");
#endif
  }
  CaseRun run;
  std::int64_t first = 0, last = c.steps;
  std::string how;
  if (o.resume_at) {
    const std::int64_t k = *o.resume_at;
    check_step("--resume-at", k, c.steps);
    Replay<Rule, Backend> before(c, o.threads);
    before.run(0, k, run);
    const TempFile tmp(c.name);
    before.save(tmp.path, k);
    Replay<Rule, Backend> after(c, o.threads);
    if (after.load(tmp.path) != k) throw CaseError("--resume-at: the checkpoint did not restore step " + std::to_string(k));
    after.run(k, c.steps, run);
    how = "steps 1.." + std::to_string(k) + ", saved, loaded into a fresh optimizer, steps " + std::to_string(k + 1) +
          ".." + std::to_string(c.steps);
  } else {
    Replay<Rule, Backend> r(c, o.threads);
    if (!o.load.empty()) {
      first = r.load(o.load);
      how = "loaded " + o.load + " (after step " + std::to_string(first) + "), ";
    }
    if (o.stop_after) {
      check_step("--stop-after", *o.stop_after, c.steps);
      last = *o.stop_after;
      if (last < first)
        throw CaseError("--stop-after " + std::to_string(last) + ": the checkpoint is already at step " +
                        std::to_string(first));
    }
    r.run(first, last, run);
    how += last > first ? "steps " + std::to_string(first + 1) + ".." + std::to_string(last) : "no steps";
    if (!o.save.empty()) {
      r.save(o.save, last);
      how += ", saved to " + o.save;
    }
  }

  const auto checks = check_steps(c, run, first, last);
  print_case(c);
  if constexpr (std::is_same_v<Backend, backend::DefaultBackend>)
    std::printf(", threads %d, kernels %s\n", o.threads, backend::DefaultBackend::arch_name());
  else
    std::printf(", CUDA backend, emulated on the host\n");
  if (o.resume_at || !o.load.empty() || o.stop_after || !o.save.empty()) std::printf("  %s\n", how.c_str());
  return report(c, checks, run, first, last, o.out_dir);
}

}  // namespace skewadam::replay_tool
