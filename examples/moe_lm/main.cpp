// moe_lm: trains a small Mixture-of-Experts language model from C++ with
// SkewAdam, torch::optim::AdamW, the Adafactor-like rule (no momentum
// anywhere) and the uniform ablation (momentum + factored everywhere), from
// the same initialisations on identical batches, and compares them the way
// the paper does: optimizer state, peak memory, throughput, validation
// perplexity (mean and spread over --seeds), load balance; with --tune, AdamW
// and Adafactor-like also at their best learning rate of a sweep.
//
// Each run (optimizer, learning rate, seed) trains in its own process (this
// program, started again with --worker: run.hpp), so that peak resident
// memory and throughput are its own. Results (report.hpp): a table, the lr
// sweep and a summary of the paper's two claims on stdout; results.csv,
// curves_mean.csv and val_ppl.png (when gnuplot is installed) in --out.

#include <dlfcn.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "corpus.hpp"
#include "device.hpp"
#include "memory_report.hpp"
#include "model.hpp"
#include "report.hpp"
#include "run.hpp"
#include "settings.hpp"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using moe_lm::Clock;
using moe_lm::RunResult;
using moe_lm::Settings;

/// The BLAS library this process loaded (from /proc/self/maps).
std::string loaded_blas() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    if (path.find("libblas") != std::string::npos || path.find("libopenblas") != std::string::npos ||
        path.find("libblis") != std::string::npos) {
      std::error_code ec;
      const auto real = fs::canonical(path, ec);
      return ec ? path : real.string();
    }
  }
  return "unknown";
}

/// OpenBLAS picks its kernels from the CPU's model number; a release older
/// than the CPU does not know it and falls back to a core without AVX
/// (Debian 12's 0.3.21 reports Prescott, SSE3 kernels, on some Intel Xeons of
/// 2023), whatever the CPU can run. Where the loaded OpenBLAS reports such a
/// core on a CPU with AVX-512 (or AVX2 and FMA), and OPENBLAS_CORETYPE is not
/// set, the runs (worker processes, which load OpenBLAS afresh) get the
/// OpenBLAS core of those instructions (measured for the demo on a Zen 5,
/// 20 steps, tokens/s: Prescott's 6,228, Haswell's 8,476, SkylakeX's 10,976,
/// Cooperlake's 13,246, OpenBLAS's own choice there). Returns what was found and
/// done, for the log.
std::string match_blas_to_cpu() {
  using corename_fn = char* (*)();
  const auto corename = reinterpret_cast<corename_fn>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (corename == nullptr) return "";
  const std::string core = corename();
  if (const char* set = std::getenv("OPENBLAS_CORETYPE"))
    return " (OpenBLAS core " + core + ", OPENBLAS_CORETYPE=" + set + ")";
  static const std::set<std::string> without_avx = {"Unknown",    "Katmai",  "Coppermine", "Northwood", "Prescott",
                                                    "Banias",     "Atom",    "Core2",      "Penryn",    "Dunnington",
                                                    "Nehalem",    "Athlon",  "Opteron",    "Barcelona", "Opteron_SSE3",
                                                    "Nano",       "Bobcat"};
  if (without_avx.count(core) == 0) return " (OpenBLAS core " + core + ")";
  __builtin_cpu_init();
  const char* matched = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    matched = __builtin_cpu_supports("avx512bf16") ? "Cooperlake" : "SkylakeX";
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    matched = "Haswell";
  if (matched == nullptr) return " (OpenBLAS core " + core + ")";
  setenv("OPENBLAS_CORETYPE", matched, 1);
  return " (OpenBLAS core " + core + ", a fallback that does not know this CPU: the runs use " + matched +
         "'s kernels, OPENBLAS_CORETYPE=" + matched + ")";
}

/// The 1-minute load average (other work competing for the cores).
std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string first;
  return in >> first ? first : std::string("unknown");
}

std::map<std::string, std::string> read_summary(const fs::path& file) {
  std::map<std::string, std::string> v;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) v[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return v;
}

/// Runs this program again as one run's worker; returns its peak RSS in KiB.
long spawn_worker(const std::string& self, const std::vector<std::string>& args) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(self.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), environ) != 0)
    throw std::runtime_error("cannot start " + self);
  int status = 0;
  rusage usage{};
  if (wait4(pid, &status, 0, &usage) != pid) throw std::runtime_error("lost the worker process");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) throw std::runtime_error("a training run failed");
  return usage.ru_maxrss;
}

/// The runs of the demo, in order: every optimizer at the default lr for
/// each seed, then (--tune) the baselines at the sweep's other lrs.
std::vector<RunResult> planned_runs(const Settings& s) {
  std::vector<RunResult> runs;
  auto add = [&](const std::string& o, double factor, std::uint64_t seed) {
    RunResult r;
    r.optimizer = o;
    r.factor = factor;
    r.seed = seed;
    r.tag = o + "-x" + moe_lm::lr_text(factor) + "-s" + std::to_string(seed);
    runs.push_back(std::move(r));
  };
  for (std::int64_t k = 0; k < s.seeds; ++k)
    for (const auto& o : s.optimizers) add(o, 1.0, s.seed + static_cast<std::uint64_t>(k));
  if (s.tune)
    for (const auto& o : s.optimizers)
      if (moe_lm::tuned_baseline(o))
        for (double f : s.tune_factors)
          if (f != 1.0)
            for (std::int64_t k = 0; k < s.seeds; ++k) add(o, f, s.seed + static_cast<std::uint64_t>(k));
  return runs;
}

int run_driver(const Settings& s, const std::vector<std::string>& passthrough) {
  // Workers wait for OpenMP work by sleeping rather than spinning, unless told
  // otherwise: spinning threads of torch, OpenBLAS and the optimizer (one
  // OpenMP runtime) cost little on an idle machine but, measured on a shared
  // 2-core machine, made a step 13x slower than with sleeping threads.
  setenv("OMP_WAIT_POLICY", "passive", 0);
  const std::string blas_core = match_blas_to_cpu();
  at::set_num_threads(s.threads);
  // The model's shape on torch's meta device: no memory, whatever its size.
  moe_lm::ModelConfig shape = s.model;
  shape.device = torch::kMeta;
  moe_lm::MoELM model(shape);
  const skewadam::Plan plan = moe_lm::plan_of(*model);
  std::cout << "moe_lm: decoder-only MoE LM (preset " << s.preset << "), " << s.model.layers
            << " blocks (odd ones MoE), d_model " << s.model.d_model << ", " << s.model.heads << " heads ("
            << s.model.key_value_heads() << " key/value), " << s.model.experts << " SwiGLU experts (ff "
            << s.model.expert_ff << ") top-" << s.model.top_k << ", byte tokens (vocabulary " << s.model.vocab
            << "), tied LM head, " << (s.model.dtype == torch::kFloat ? "fp32" : "bf16")
            << " weights (LayerNorms and router fp32)\n"
            << "params:  " << plan.total_params << " (backbone " << plan.tiers.backbone.params << ", experts "
            << plan.tiers.experts.params << ", router " << plan.tiers.router.params << ")\n"
            << moe_lm::plan_text(plan, s.optimizers);
  if (s.plan_only) return 0;
  moe_lm::resolve_device(s.device);  // refused here, before any run, when there is no such device
  const moe_lm::Corpus corpus = moe_lm::load_corpus(s.data, s.model.context);
  std::vector<RunResult> results = planned_runs(s);
  const skewadam::WarmupCosine schedule = moe_lm::schedule_of(s);
  std::cout << "device:  " << s.device << "\n"
            << "corpus:  " << corpus.source << ": " << corpus.train.size() << " bytes train, " << corpus.val.size()
            << " bytes held out\n"
            << "run:     " << s.steps << " steps x " << s.batch << " x " << s.model.context << " tokens, lr " << s.lr
            << " (warm-up " << schedule.warmup_steps << " steps, cosine to 0 at step " << schedule.total_steps
            << "), weight decay " << s.weight_decay
            << " (router 0), grad-norm clip " << s.max_grad_norm
            << (s.in_backward_clip == "previous" ? " (by the previous step's norm for a run stepping inside backward)"
                                                 : " (none for a run stepping inside backward: the per-tensor "
                                                   "update clip)")
            << (s.accumulate > 1 ? ", " + std::to_string(s.accumulate) + " micro-batches a whole step" : std::string())
            << (s.model.checkpoint ? ", activation checkpointing" : "") << ", eps " << s.eps
            << " (the library's rules; AdamW 1e-8)\n"
            << "runs:    " << results.size() << ": " << s.seeds << (s.seeds == 1 ? " seed" : " seeds") << " from "
            << s.seed << " (initialisation and batch order)";
  if (s.tune) {
    std::cout << ", AdamW and Adafactor-like also at lr x";
    for (std::size_t i = 0; i < s.tune_factors.size(); ++i) std::cout << (i ? ", " : "") << s.tune_factors[i];
  }
  std::cout << "\nthreads: " << s.threads << " (torch and optimizer), OMP_WAIT_POLICY="
            << std::getenv("OMP_WAIT_POLICY") << "; BLAS: " << loaded_blas() << blas_core << "\n\n"
            << std::flush;

  const std::string self = fs::canonical("/proc/self/exe").string();
  fs::create_directories(s.out);
  const std::string load_before = load_average();
  const auto started = Clock::now();
  // On the CPU, each run's peak is computed before it starts and compared
  // with what the machine has left: a run that cannot fit is refused, with
  // its need, instead of being killed by the out-of-memory killer.
  const bool on_cpu = s.device == "cpu";
  double rest = moe_lm::first_rest_estimate(plan);
  bool rest_measured = false;
  std::map<std::string, moe_lm::MemoryNeed> needs;
  double available = 0;
  for (std::size_t i = 0; i < results.size(); ++i) {
    RunResult& r = results[i];
    if (on_cpu) {
      const moe_lm::MemoryNeed need = moe_lm::memory_need(*model, plan, r.optimizer, rest);
      needs[r.tag] = need;
      r.needed_bytes = need.total();
      available = moe_lm::available_memory_bytes();
      if (need.total() > available) {
        r.refused = true;
        r.summary["state_bytes"] = std::to_string(std::llround(moe_lm::planned_state_bytes(plan, r.optimizer)));
        std::cout << "[" << i + 1 << "/" << results.size() << " " << moe_lm::display_name(r.optimizer)
                  << "] refused: it needs " << moe_lm::gib_text(need.total()) << " GiB (weights "
                  << moe_lm::gib_text(need.weights) << ", gradients " << moe_lm::gib_text(need.grads) << ", state "
                  << moe_lm::gib_text(need.state) << ", rest " << moe_lm::gib_text(need.rest)
                  << (rest_measured ? " as measured" : " estimated") << "), " << moe_lm::gib_text(available)
                  << " GiB are available\n"
                  << std::flush;
        continue;
      }
    }
    std::vector<std::string> args = passthrough;  // the options given; those below override them
    std::ostringstream lr;
    lr << std::setprecision(17) << s.lr * r.factor;
    args.insert(args.end(), {"--worker", r.optimizer, "--lr", lr.str(), "--seed", std::to_string(r.seed), "--tag",
                             r.tag, "--run-index", std::to_string(i), "--runs", std::to_string(results.size()),
                             "--threads", std::to_string(s.threads)});
    r.peak_rss_kib = spawn_worker(self, args);
    r.summary = read_summary(fs::path(s.out) / ("summary_" + r.tag + ".txt"));
    if (on_cpu) {  // the rest this model measured, for the need of the runs after it
      const double measured = static_cast<double>(r.peak_rss_kib) * 1024.0 - r.number("weights_bytes") -
                              r.number("grads_bytes") - r.number("state_bytes");
      if (std::isfinite(measured)) {
        rest = rest_measured ? std::max(rest, measured) : measured;
        rest_measured = true;
      }
    }
  }
  std::vector<RunResult> ran;  // the table and the curves: the runs that trained
  for (const RunResult& r : results)
    if (!r.refused) ran.push_back(r);
  const double wall = std::chrono::duration<double>(Clock::now() - started).count();

  const std::vector<moe_lm::Row> rows = moe_lm::table_rows(s, ran);
  std::cout << "\n" << moe_lm::table(s, rows) << "\n";
  if (s.tune) std::cout << moe_lm::sweep_table(s, ran) << "\n";
  std::cout << moe_lm::claims(rows) << moe_lm::momentum_storage_claim(rows) << "\n"
            << "total wall time " << moe_lm::duration(wall) << "; load average " << load_before << " before, "
            << load_average() << " after\n";
  moe_lm::write_results(s, results);
  std::cout << "results: " << fs::absolute(fs::path(s.out) / "results.csv").string() << ", "
            << fs::absolute(fs::path(s.out) / "curves_mean.csv").string() << "\n";
  moe_lm::write_curves_and_plot(s, rows);
  if (on_cpu) {
    std::vector<moe_lm::RunMemory> memory;
    for (const RunResult& r : results) {
      if (r.factor != 1.0 || r.seed != s.seed) continue;  // the first seed's runs at the default lr
      moe_lm::RunMemory m;
      const moe_lm::MemoryNeed& need = needs.at(r.tag);
      m.name = r.optimizer;
      m.refused = r.refused;
      m.needed = r.needed_bytes;
      m.weights = r.refused ? need.weights : r.number("weights_bytes");
      m.grads = r.refused ? need.grads : r.number("grads_bytes");
      m.state = r.refused ? need.state : r.number("state_bytes");
      m.rss_peak = r.refused ? -1 : static_cast<double>(r.peak_rss_kib) * 1024.0;
      memory.push_back(m);
    }
    std::cout << "\npeak memory during training (" << s.steps << " steps of " << s.batch << " x " << s.model.context
              << " tokens):\n"
              << moe_lm::cpu_memory_table(memory, available);
  }
  if (s.device == "cuda") {
    std::vector<moe_lm::RunMemory> memory;
    for (const moe_lm::Row& row : rows) {
      if (row.tuned || row.runs.empty()) continue;
      const RunResult& r = *row.runs.front();  // the first seed's run
      moe_lm::RunMemory m;
      m.name = r.optimizer;
      m.weights = r.number("weights_bytes");
      m.grads = r.number("grads_bytes");
      m.state = r.number("state_bytes");
      m.allocator_peak = r.number("allocator_peak_bytes");
      m.library_device = r.number("library_device_bytes");
      m.smi_mib = r.number("smi_mib");
      m.smi_what = r.summary.count("smi_what") ? r.summary.at("smi_what") : "n/a";
      memory.push_back(m);
    }
    std::cout << "\npeak device memory during training (" << s.steps << " steps of " << s.batch << " x "
              << s.model.context << " tokens):\n"
              << moe_lm::memory_table(memory);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Settings s;
    if (!moe_lm::parse(argc, argv, s)) return 0;  // --help
    if (!s.worker.empty()) return moe_lm::run_worker(s);
    std::vector<std::string> passthrough(argv + 1, argv + argc);
    return run_driver(s, passthrough);
  } catch (const std::exception& e) {
    std::cerr << "moe_lm: " << e.what() << "\n";
    return 2;
  }
}
