// skewadam-replay CASE_DIR [--out DIR] [--threads N] [--backend cpu|cuda|cuda-emulated]
//                 [--stop-after K] [--save FILE] [--load FILE] [--resume-at K]
// skewadam-replay --list-archs
//
// The CPU kernels are those of the widest architecture compiled in and
// supported here; SKEWADAM_CPU_ARCH=NAME runs another (--list-archs prints
// the names, backend/cpu/arch.hpp). A level this program or processor cannot
// run exits 77 (skipped).
//
// --backend cuda runs the case on the GPU (a build with SKEWADAM_WITH_CUDA);
// it exits 77 when there is no CUDA device (ctest's code for a skipped test).
// --backend cuda-emulated runs it on the optimizer front-end over the CUDA
// backend, its kernels on the host (the emulated runtime,
// skewadam_tools/emulated_runtime.hpp); the checkpoint flags work as on the
// CPU, and its checkpoints load on either backend.
//
// Runs one golden conformance case exactly as the golden README says, prints
// the worst error of each array as a fraction of its tolerance, and exits 0
// only if every array is within tolerance (1: out of tolerance, 2: bad input,
// including an unreadable, corrupt or foreign checkpoint).
//
// Checkpoints (include/skewadam/checkpoint.hpp):
//   --stop-after K   run steps 1..K only, and check those
//   --save FILE      after the last step run, save the parameter and the
//                    optimizer state to FILE
//   --load FILE      start from FILE (saved by --save for this case) and run
//                    the remaining steps
//   --resume-at K    run steps 1..K, save to a temporary file, load it into a
//                    fresh optimizer and parameter, run steps K+1..N: the
//                    outputs must be those of an uninterrupted run, bit for bit
// --out writes what this run computed: params.npy holds the steps it ran
// (all N unless --stop-after or --load), the state files the state after the
// last of them.
//
// Sharded (built with SKEWADAM_WITH_MPI), under mpirun -np N:
//   --shard          run the case sharded over MPI_COMM_WORLD (the sharded
//                    placement, dist/sharded_optimizer.hpp; with --backend
//                    cuda-emulated, placement/sharded.hpp over the
//                    emulated CUDA backend); rank 0 reports and writes
//                    --out; --stop-after, --save and --load work as above
//                    (checkpoints saved with any rank count load with any)
//   --expert-rows    shard a bank [E, r, c] by rows instead of whole experts

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

#if defined(SKEWADAM_REPLAY_WITH_CUDA)
#include <skewadam_tools/cuda_golden.hpp>
#endif
#include <skewadam/checkpoint.hpp>
#include <skewadam_tools/cpu_arch_env.hpp>
#include <skewadam_tools/emulated_runtime.hpp>
#include <skewadam_tools/golden_case.hpp>
#if defined(SKEWADAM_REPLAY_WITH_MPI)
#include "sharded_replay.hpp"
#endif

namespace {

using namespace skewadam;
using namespace skewadam::tools;

/// Metadata key naming the case a checkpoint was saved from.
constexpr const char* case_key = "skewadam-replay.case";

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

void check_step(const char* flag, std::int64_t k, std::int64_t steps) {
  if (k < 0 || k > steps)
    throw CaseError(std::string(flag) + " " + std::to_string(k) + ": the case has steps 1.." + std::to_string(steps));
}

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

  void save(const std::filesystem::path& file) const {
    save_checkpoint(*opt_, file, SaveOptions{.include_params = true, .metadata = {{case_key, c_.name}}});
  }

  /// Loads a checkpoint saved for this case; returns its step count.
  std::int64_t load(const std::filesystem::path& file) {
    const CheckpointInfo info = read_checkpoint_info(file);
    if (const std::string* saved = info.find_metadata(case_key); saved && *saved != c_.name)
      throw CheckpointError(CheckpointError::Kind::mismatch,
                            file.string() + ": saved from case '" + *saved + "', not '" + c_.name + "'");
    if (info.steps > c_.steps)
      throw CheckpointError(CheckpointError::Kind::mismatch, file.string() + ": saved after step " +
                                                                 std::to_string(info.steps) + ", the case has " +
                                                                 std::to_string(c_.steps) + " steps");
    load_checkpoint(*opt_, file, LoadOptions{.params = ParamValues::require});
    return opt_->steps();
  }

 private:
  const GoldenCase& c_;
  TypedValues param_;
  const TypedValues grads_;
  std::unique_ptr<Opt> opt_;
  ParamId id_{};
};

/// Compares steps [first, last) and, after the last step, the state.
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

void write_outputs(const GoldenCase& c, const CaseRun& run, std::int64_t first, std::int64_t last,
                   const std::filesystem::path& out) {
  std::filesystem::create_directories(out);
  std::vector<std::int64_t> seq = c.shape;
  seq.insert(seq.begin(), last - first);
  write_npy(out / "params.npy", seq, run.params.data() + first * c.numel());
  for (const auto& [name, values] : run.state)
    write_npy(out / (name + ".npy"), skewadam::tools::detail::state_shape(name, c.shape), values.data());
}

/// "NAME: N steps, shape [...], momentum ..., factored ..., clip scope ..." (no newline).
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

/// One line per checked array, the outputs written to `out_dir` if given,
/// then PASS or FAIL; returns the exit status (0 pass, 1 out of tolerance).
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
    before.save(tmp.path);
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
      r.save(o.save);
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

/// The whole case on the GPU (--backend cuda).
int replay_cuda(const GoldenCase& c, const Options& o) {
  if (o.resume_at || o.stop_after || !o.save.empty() || !o.load.empty())
    throw CaseError("--backend cuda: --stop-after, --save, --load and --resume-at are CPU-only");
  if (o.shard)
    throw CaseError("--backend cuda: --shard runs on the CPU or cuda-emulated backend here (on a GPU, the sharded "
                    "engine is tested by skewadam-sharded-gpu-tests)");
#if defined(SKEWADAM_REPLAY_WITH_CUDA)
  if (cuda::device_count() == 0) {
    std::printf("SKIP: --backend cuda: no CUDA device\n");
    return 77;
  }
  const CaseRun run = run_golden_case_cuda(c);
  const auto checks = check_steps(c, run, 0, c.steps);
  std::printf("%s: %lld steps on %s\n", c.name.c_str(), static_cast<long long>(c.steps),
              cuda::device_description().c_str());
  return report(c, checks, run, 0, c.steps, o.out_dir);
#else
  (void)c;
  throw CaseError("--backend cuda: this skewadam-replay was built without CUDA (SKEWADAM_WITH_CUDA=OFF)");
#endif
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Run a SkewAdam golden conformance case and compare with its expected outputs"};
  Options o;
  app.add_option("case", o.case_dir, "case folder (case.json, param0.npy, grads.npy, ...)")->required();
  app.add_option("--out", o.out_dir, "write the computed params.npy and state files here, golden layout");
  app.add_option("--threads", o.threads, "CPU threads (0: hardware)")->check(CLI::NonNegativeNumber);
  app.add_option("--backend", o.backend,
                 "cpu; cuda: run the case on the GPU; cuda-emulated: the CUDA backend's kernels on the host")
      ->check(CLI::IsMember({"cpu", "cuda", "cuda-emulated"}));
  auto* stop = app.add_option("--stop-after", o.stop_after, "run steps 1..K only");
  auto* save = app.add_option("--save", o.save, "after the last step run, save the parameter and optimizer state");
  auto* load = app.add_option("--load", o.load, "start from a checkpoint saved by --save for this case");
  auto* resume = app.add_option("--resume-at", o.resume_at,
                                "run steps 1..K, save, load into a fresh optimizer, run the rest");
  resume->excludes(stop)->excludes(save)->excludes(load);
  auto* shard = app.add_flag("--shard", o.shard, "run sharded over the MPI ranks (under mpirun)");
  app.add_flag("--expert-rows", o.expert_rows, "with --shard: shard an expert bank by rows, not by experts")
      ->needs(shard);
  shard->excludes(resume);
  app.add_flag_callback(
         "--list-archs",
         [] {
           for (const auto a : backend::cpu::available_archs()) std::printf("%s\n", backend::cpu::level_name(a));
           throw CLI::Success();
         },
         "print the CPU kernel architectures this program can run here, widest first, and exit "
         "(SKEWADAM_CPU_ARCH=NAME selects one)")
      ->trigger_on_parse();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (const auto why = requested_arch_unavailable(); why && o.backend == "cpu") {
    std::printf("skipped: %s\n", why->c_str());
    return 77;
  }
  try {
    const GoldenCase c = load_golden_case(o.case_dir);
    if (o.backend == "cuda") return replay_cuda(c, o);
    if (o.backend == "cuda-emulated")
      return with_case_rule(c, [&]<class Rule>() { return replay<Rule, EmulatedCuda>(c, o); });
    return with_case_rule(c, [&]<class Rule>() { return replay<Rule, backend::DefaultBackend>(c, o); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "skewadam-replay: %s\n", e.what());
    return 2;
  }
}
