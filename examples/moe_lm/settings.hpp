#pragma once
// moe_lm's command line: the settings of a run, its presets and their parsing.

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <skewadam/math/schedule.hpp>

#include "model.hpp"

namespace moe_lm {

struct Settings {
  std::string data;  // empty: the King James Bible
  std::string out = "moe_lm_out";
  std::string preset = "small";
  std::string device = "cpu";
  std::vector<std::string> optimizers{"skewadam", "adamw", "adafactor", "uniform"};
  std::int64_t steps = 800;
  std::int64_t batch = 16;
  std::int64_t eval_every = 50;
  std::int64_t eval_windows = 128;    // validation windows at each evaluation
  std::int64_t final_windows = 1024;  // validation windows at the end
  double lr = 1e-3;     // the best of {5e-4, 1e-3, 3e-3, 1e-2} for AdamW here; the same for every optimizer
  double eps = 1e-30;   // the library's rules: floor under the second-moment estimate (see --help)
  double warmup = 0.03;   // share of the schedule's steps
  std::int64_t warmup_steps = 0;    // > 0: the warm-up in steps, instead of the share
  std::int64_t schedule_steps = 0;  // > 0: the schedule's length, the run its first `steps` (0: `steps`)
  double weight_decay = 0.05;  // backbone and experts; the router has none
  double max_grad_norm = 1.0;
  /// What a run stepping inside backward clips by: "none" (the rules'
  /// per-tensor update clipping alone) or "previous", the previous step's
  /// global norm (the library's ClipNorm::previous), which trained worse on
  /// the default model (docs/demo.md). A whole step clips by its own norm.
  std::string in_backward_clip = "none";
  /// Micro-batches per step of a run taking the whole step (gradient
  /// accumulation): each of batch / accumulate sequences, their gradients
  /// summed. A run stepping inside backward takes the step's tokens in one.
  std::int64_t accumulate = 1;
  double balance_coef = 0.01;
  int threads = 0;  // 0: every core
  std::uint64_t seed = 1234;  // the first seed; --seeds N trains from seed, seed + 1, ...
  std::int64_t seeds = 1;
  bool tune = false;  // also run AdamW and Adafactor-like at lr x tune_factors
  std::vector<double> tune_factors{0.5, 1.0, 2.0, 4.0};
  bool plan_only = false;  // print the model's memory plan and stop
  bool return_freed_memory = false;  // every freed block of 1 MiB or more goes back to the system (run.hpp)
  ModelConfig model{};
  // internal: set when this process is one optimizer's run
  std::string worker;
  std::string tag;  // the run's name in its files
  int run_index = 0;
  int runs = 1;
};

inline const std::map<std::string, std::string> display_names{
    {"skewadam", "SkewAdam"},
    {"skewadam-bf16", "SkewAdam, bf16 momentum"},
    {"skewadam-8bit", "SkewAdam, 8-bit momentum"},
    {"skewadam-linear8bit", "SkewAdam, linear 8-bit momentum"},
    {"adamw", "AdamW (torch)"},
    {"adafactor", "Adafactor-like"},
    {"uniform", "Uniform ablation"},
    {"expert-momentum", "Experts + momentum"},
    {"factored-router", "Factored router"},
    {"no-optimizer", "No optimizer, gradients dropped"},
};

/// Whether a run of this optimizer steps (or drops) each gradient inside
/// backward, as soon as it is complete, instead of holding every gradient
/// until step(). Such a run cannot clip by its own step's global norm, known
/// only after the last gradient has been consumed: SkewAdam's per-tensor
/// update clip applies, and it may clip by the previous step's global norm
/// (Settings::in_backward_clip).
inline constexpr std::string_view in_backward_suffix = "-in-backward";
inline bool in_backward(const std::string& optimizer) {
  const std::size_t n = in_backward_suffix.size();
  return optimizer == "no-optimizer" ||
         (optimizer.size() > n && optimizer.compare(optimizer.size() - n, n, in_backward_suffix) == 0);
}

/// The optimizer whose rule and state a run uses ("skewadam" for
/// "skewadam-in-backward"); "no-optimizer" keeps none.
inline std::string rule_of(const std::string& optimizer) {
  if (optimizer == "no-optimizer") return optimizer;
  return in_backward(optimizer) ? optimizer.substr(0, optimizer.size() - in_backward_suffix.size()) : optimizer;
}

/// Whether the demo knows this optimizer: one of display_names, or a library
/// optimizer's name with -in-backward (torch's AdamW has no such step).
inline bool known_optimizer(const std::string& optimizer) {
  const std::string rule = rule_of(optimizer);
  if (!display_names.count(rule)) return false;
  return !in_backward(optimizer) || optimizer == "no-optimizer" || rule != "adamw";
}

inline std::string display_name(const std::string& optimizer) {
  if (optimizer == "no-optimizer" || !in_backward(optimizer)) return display_names.at(optimizer);
  return display_names.at(rule_of(optimizer)) + ", step in backward";
}

/// Sets the defaults of a preset; options given on the command line override them.
inline void apply_preset(Settings& s, const std::string& name) {
  s.preset = name;
  ModelConfig& m = s.model;
  // The defaults above: the paper's proportions at 5.0 M parameters, 94.8 %
  // of them in 16 wide experts (SkewAdam keeps 3.1 % of AdamW's state), each
  // seeing about 256 tokens a step; about 10 minutes of training on 2 cores.
  if (name == "small") return;
  if (name == "gpu") {
    // 79 M parameters, 96 % of them in the experts (the paper: 95 %); a few
    // minutes per optimizer on one GPU.
    m.d_model = 512;
    m.heads = 8;
    m.context = 256;
    m.layers = 2;
    m.dense_ff = 512;
    m.experts = 64;
    m.expert_ff = 768;
    s.steps = 1500;
    s.batch = 32;
    s.eval_every = 100;
    return;
  }
  if (name == "paper") {
    // The paper's 6.78B-parameter model (docs/spec.md §6): GPT-2's padded
    // vocabulary size (the byte tokens use its first 256 rows), d_model 4096,
    // 256 learned positions, two blocks (a dense SwiGLU, then 128 experts of
    // ff 4096, top-2), 32 query heads sharing 8 key/value heads, bf16 weights
    // with fp32 LayerNorms and router. A few steps per optimizer, with peak
    // device memory measured.
    m.vocab = 50304;
    m.d_model = 4096;
    m.heads = 32;
    m.kv_heads = 8;
    m.context = 256;
    m.layers = 2;
    m.dense_ff = 4096;
    m.experts = 128;
    m.expert_ff = 4096;
    m.dtype = torch::kBFloat16;
    m.separate_experts = true;  // 384 tensors of 4096 x 4096: each expert's gradient freed after its step
    // Without an optimizer (the rest of the memory), SkewAdam stepping in
    // backward with 8-bit and with fp32 backbone momentum, then the two the
    // paper measured, each refused up front where it cannot fit.
    s.optimizers = {"no-optimizer", "skewadam-8bit-in-backward", "skewadam-in-backward", "skewadam", "adamw"};
    s.steps = 4;
    s.lr = 3e-4;  // the paper's
    // The paper's recipe: 300 warm-up steps (a short run trains inside them;
    // the cosine's length is a run's own, 3000 steps here), 32 x 256 = 8,192
    // tokens a step, activation checkpointing.
    s.warmup_steps = 300;
    s.schedule_steps = 3000;
    s.model.checkpoint = true;
    s.return_freed_memory = true;
    s.batch = 32;
    s.eval_every = 4;
    s.eval_windows = 8;
    s.final_windows = 8;
    return;
  }
  throw std::invalid_argument("--preset " + name + ": expected small, gpu or paper");
}

inline void usage() {
  std::cout <<
      R"(usage: moe_lm [options]
Trains a MoE language model with SkewAdam, AdamW, Adafactor-like and the
uniform ablation from the same initialisation on identical batches.

  --preset NAME       small (default: 5.0 M parameters, 94.8 % in 16 experts; about 10
                      minutes on 2 cores),
                      gpu (79 M parameters, 96 % in the experts; for --device cuda),
                      paper (the paper's 6.78B-parameter model, bf16 weights, experts
                      stored separately, and its recipe: 8,192 tokens a step with
                      activation checkpointing, 300 warm-up steps; a few steps without
                      an optimizer, with SkewAdam stepping inside backward, with
                      SkewAdam and with AdamW, reporting the peak memory by part
                      against the paper's figures; a run that cannot fit in this
                      machine's memory is refused before it starts, with what it
                      would need)
  --device DEV        cpu (default) or cuda (needs a CUDA build of LibTorch: scripts/demo
                      --device cuda builds against the installed Python torch)
  --plan-only         print the model's parameters and planned memory, then stop
                      (the model is built on torch's meta device: nothing is allocated)
  --data FILE         train on this text file (default: the King James Bible from `bible`)
  --out DIR           results folder (default moe_lm_out)
  --optimizers LIST   comma-separated, from skewadam, adamw, adafactor, uniform,
                      expert-momentum, factored-router (default: the first four),
                      skewadam-bf16, skewadam-8bit and skewadam-linear8bit (SkewAdam
                      with the backbone's momentum stored in bf16, in 8-bit
                      floating-point codes or in linear 8-bit codes, a scale per 256),
                      OPTIMIZER-in-backward for a library optimizer (skewadam-in-backward:
                      SkewAdam stepping each parameter inside backward, as soon as its
                      gradient is complete, then freeing it; no global gradient-norm
                      clipping) and no-optimizer (gradients dropped inside backward: the
                      memory of the model alone)
  --in-backward       every library optimizer of the list steps inside backward (as
                      OPTIMIZER-in-backward)
  --in-backward-clip C  what a run stepping inside backward clips by: none (default: the
                      rules' per-tensor update clipping alone) or previous (the previous
                      step's global gradient norm, to --max-grad-norm; it trained worse
                      on the default model: docs/demo.md)
  --max-grad-norm N   the global gradient-norm clip (default 1; 0: off)
  --accumulate N      micro-batches per step of a run taking the whole step (gradient
                      accumulation): --batch is split into N of --batch / N sequences; a
                      run stepping inside backward takes the step's tokens in one backward
  --checkpoint on|off activation checkpointing: each block keeps only its input and runs
                      again in backward, the LM head's loss is formed in chunks of 512
                      tokens (default off; the paper preset: on)
  --steps N           training steps per optimizer (default 800)
  --batch B           sequences per step (default 16)
  --context T         tokens per sequence (default 128)
  --lr LR             peak learning rate of every optimizer, linear warm-up (--warmup)
                      then cosine to 0 (default 1e-3; the paper preset: 3e-4). 0: the
                      optimizers step, but the weights and so the routing stay as
                      initialised, as in the no-optimizer run: the peaks then differ by
                      the optimizers' own memory alone
  --warmup F          the warm-up's share of the schedule, at least one step (default 0.03)
  --warmup-steps N    the warm-up in steps (instead of --warmup)
  --schedule-steps T  the schedule's length (default --steps): a run of fewer steps trains
                      the schedule's first --steps (e.g. --steps 30 --warmup-steps 300
                      --schedule-steps 300: the first 30 steps of a 300-step warm-up)
  --eval-every N      steps between validation evaluations (default 50)
  --eval-windows N    held-out windows of each evaluation during training (default 128)
  --final-windows N   held-out windows of the final evaluation, the table's perplexity
                      (default 1024)
  --eps E             eps of the library's rules, the floor under the second-moment
                      estimate (default 1e-30, as Adafactor's). The reference's 1e-8
                      is above 90-98 % of this model's expert column statistics
                      (median about 1e-10), which shrinks the experts' updates about
                      tenfold. AdamW keeps its 1e-8, added to sqrt(v).
  --threads N         torch and optimizer threads (default: the cores this process may use)
  --seed S            initialisation and batch seed (default 1234)
  --seeds N           train every optimizer from N seeds (S, S+1, ...: initialisations and
                      batch orders); the table gives the mean and standard deviation of
                      the validation perplexity, the plot shades the spread (default 1)
  --tune              also train AdamW and Adafactor-like at lr x 0.5, 2 and 4, and report
                      each at its best lr as a "tuned" row (SkewAdam keeps the default lr)
  --tune-factors LIST comma-separated lr factors of --tune (default 0.5,1,2,4)
  --dtype T           weights' dtype: fp32 (default) or bf16 (LayerNorms and router stay fp32)
  --separate-experts  each expert's matrices as tensors of their own (default: stacked
                      banks; the paper preset: separate)
  --d-model D, --layers L, --experts E, --expert-ff F, --dense-ff F, --heads H,
  --kv-heads K, --vocab V
                      model shape (defaults 128, 2, 16, 768, 192, 4, 4, 256)
)";
}

inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

/// `text` as a finite number, at least `least` (above it when `strict`);
/// throws std::invalid_argument naming `what`.
inline double number_at_least(const std::string& text, const std::string& what, double least, bool strict) {
  std::size_t used = 0;
  double x = 0;
  try {
    x = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !std::isfinite(x) || x < least || (strict && x == least))
    throw std::invalid_argument(what + (strict ? ": expected a positive number" : ": expected a number >= 0"));
  return x;
}
/// `text` as a finite number > 0; throws std::invalid_argument naming `what`.
inline double positive_number(const std::string& text, const std::string& what) {
  return number_at_least(text, what, 0.0, true);
}

/// The learning-rate schedule of every run: linear warm-up, then cosine to 0
/// at its end; a run trains its first `steps`.
inline skewadam::WarmupCosine schedule_of(const Settings& s) {
  const std::int64_t total = s.schedule_steps > 0 ? s.schedule_steps : s.steps;
  const std::int64_t warmup =
      s.warmup_steps > 0 ? s.warmup_steps
                         : std::max<std::int64_t>(1, std::llround(s.warmup * static_cast<double>(total)));
  return skewadam::WarmupCosine{.peak_lr = s.lr, .warmup_steps = warmup, .total_steps = total};
}

/// Parses the command line; throws std::invalid_argument naming the option.
/// Returns false when --help was given (the usage is printed).
inline bool parse(int argc, char** argv, Settings& s) {
  auto value = [&](int& i, const std::string& flag) -> std::string {
    if (i + 1 >= argc) throw std::invalid_argument(flag + ": needs a value");
    return argv[++i];
  };
  auto integer = [&](int& i, const std::string& flag, std::int64_t min) {
    const std::string v = value(i, flag);
    std::size_t used = 0;
    long long x = 0;
    try {
      x = std::stoll(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != v.size() || x < min)
      throw std::invalid_argument(flag + " " + v + ": expected an integer >= " + std::to_string(min));
    return static_cast<std::int64_t>(x);
  };
  auto real = [&](int& i, const std::string& flag) {
    const std::string v = value(i, flag);
    return positive_number(v, flag + " " + v);
  };
  bool in_backward_all = false;
  // The preset first, whatever its position: the other options override it.
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--preset") apply_preset(s, value(i, a));
  }
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      usage();
      return false;
    } else if (a == "--preset") ++i;
    else if (a == "--device") {
      s.device = value(i, a);
      if (s.device != "cpu" && s.device != "cuda")
        throw std::invalid_argument("--device " + s.device + ": expected cpu or cuda");
    } else if (a == "--plan-only") s.plan_only = true;
    else if (a == "--data") s.data = value(i, a);
    else if (a == "--out") s.out = value(i, a);
    else if (a == "--optimizers") s.optimizers = split_list(value(i, a));
    else if (a == "--in-backward") in_backward_all = true;
    else if (a == "--in-backward-clip") {
      s.in_backward_clip = value(i, a);
      if (s.in_backward_clip != "previous" && s.in_backward_clip != "none")
        throw std::invalid_argument("--in-backward-clip " + s.in_backward_clip + ": expected previous or none");
    } else if (a == "--max-grad-norm") {
      const std::string v = value(i, a);
      s.max_grad_norm = number_at_least(v, a + " " + v, 0.0, false);
    } else if (a == "--accumulate") s.accumulate = integer(i, a, 1);
    else if (a == "--checkpoint") {
      const std::string v = value(i, a);
      if (v != "on" && v != "off") throw std::invalid_argument("--checkpoint " + v + ": expected on or off");
      s.model.checkpoint = v == "on";
    }
    else if (a == "--separate-experts") s.model.separate_experts = true;
    else if (a == "--steps") s.steps = integer(i, a, 1);
    else if (a == "--batch") s.batch = integer(i, a, 1);
    else if (a == "--context") s.model.context = integer(i, a, 2);
    else if (a == "--lr") {
      const std::string v = value(i, a);
      s.lr = number_at_least(v, a + " " + v, 0.0, false);
    }
    else if (a == "--eps") s.eps = real(i, a);
    else if (a == "--warmup-steps") s.warmup_steps = integer(i, a, 1);
    else if (a == "--schedule-steps") s.schedule_steps = integer(i, a, 1);
    else if (a == "--warmup") {
      const std::string v = value(i, a);
      const double w = number_at_least(v, a + " " + v, 0.0, false);
      if (w > 1) throw std::invalid_argument(a + " " + v + ": expected a share of the steps, at most 1");
      s.warmup = w;
    }
    else if (a == "--eval-every") s.eval_every = integer(i, a, 1);
    else if (a == "--eval-windows") s.eval_windows = integer(i, a, 1);
    else if (a == "--final-windows") s.final_windows = integer(i, a, 1);
    else if (a == "--threads") s.threads = static_cast<int>(integer(i, a, 1));
    else if (a == "--seed") s.seed = static_cast<std::uint64_t>(integer(i, a, 0));
    else if (a == "--seeds") s.seeds = integer(i, a, 1);
    else if (a == "--tune") s.tune = true;
    else if (a == "--tune-factors") {
      s.tune_factors.clear();
      for (const std::string& f : split_list(value(i, a))) {
        const double x = positive_number(f, "--tune-factors: '" + f + "'");
        if (std::find(s.tune_factors.begin(), s.tune_factors.end(), x) == s.tune_factors.end())
          s.tune_factors.push_back(x);  // once each: a factor names its runs' files
      }
      if (std::find(s.tune_factors.begin(), s.tune_factors.end(), 1.0) == s.tune_factors.end())
        s.tune_factors.insert(s.tune_factors.begin(), 1.0);  // the default lr is always one of them
    }
    else if (a == "--tag") s.tag = value(i, a);
    else if (a == "--dtype") {
      const std::string t = value(i, a);
      if (t == "fp32") s.model.dtype = torch::kFloat;
      else if (t == "bf16") s.model.dtype = torch::kBFloat16;
      else throw std::invalid_argument("--dtype " + t + ": expected fp32 or bf16");
    } else if (a == "--d-model") s.model.d_model = integer(i, a, 1);
    else if (a == "--layers") s.model.layers = integer(i, a, 1);
    else if (a == "--experts") s.model.experts = integer(i, a, 2);
    else if (a == "--expert-ff") s.model.expert_ff = integer(i, a, 1);
    else if (a == "--dense-ff") s.model.dense_ff = integer(i, a, 1);
    else if (a == "--heads") s.model.heads = integer(i, a, 1);
    else if (a == "--kv-heads") s.model.kv_heads = integer(i, a, 1);
    else if (a == "--vocab") s.model.vocab = integer(i, a, 256);
    else if (a == "--worker") s.worker = value(i, a);
    else if (a == "--run-index") s.run_index = static_cast<int>(integer(i, a, 0));
    else if (a == "--runs") s.runs = static_cast<int>(integer(i, a, 1));
    else throw std::invalid_argument(a + ": unknown option (see --help)");
  }
  if (s.schedule_steps > 0 && s.schedule_steps < s.steps)
    throw std::invalid_argument("--schedule-steps " + std::to_string(s.schedule_steps) + ": fewer than --steps " +
                                std::to_string(s.steps));
  if (s.warmup_steps > std::max(s.schedule_steps, s.steps))
    throw std::invalid_argument("--warmup-steps " + std::to_string(s.warmup_steps) +
                                ": longer than the schedule (--schedule-steps, else --steps)");
  if (s.optimizers.empty()) throw std::invalid_argument("--optimizers: empty list");
  if (in_backward_all)
    for (auto& o : s.optimizers)
      if (!in_backward(o) && known_optimizer(o + std::string(in_backward_suffix))) o += in_backward_suffix;
  for (const auto& o : s.optimizers)
    if (!known_optimizer(o)) throw std::invalid_argument("--optimizers: unknown optimizer '" + o + "'");
  if (s.batch % s.accumulate != 0)
    throw std::invalid_argument("--accumulate " + std::to_string(s.accumulate) + ": does not divide --batch " +
                                std::to_string(s.batch));
  if (s.threads == 0) {  // the cores this process may run on
    cpu_set_t set;
    CPU_ZERO(&set);
    s.threads = sched_getaffinity(0, sizeof set, &set) == 0
                    ? CPU_COUNT(&set)
                    : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  s.model.validate();
  return true;
}

}  // namespace moe_lm
