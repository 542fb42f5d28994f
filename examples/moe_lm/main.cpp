// moe_lm: trains a small Mixture-of-Experts language model from C++ with four
// optimizers - SkewAdam, torch::optim::AdamW, the Adafactor-like rule (no
// momentum anywhere) and the uniform ablation (momentum + factored everywhere)
// - from the same initialisation on identical batches, and compares them the
// way the paper does: optimizer state, peak memory, throughput, validation
// perplexity and load balance.
//
// Each optimizer trains in its own process (this program, started again with
// --worker NAME), so that peak resident memory and throughput are its own.
// Results: a table on stdout, results.csv, curves.csv and val_ppl.png (when
// gnuplot is installed) in --out.

#include <skewadam/schedule.hpp>
#include <skewadam/tier_assignment.hpp>
#include <skewadam/torch/optimizer.hpp>

#include <sched.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "corpus.hpp"
#include "device.hpp"
#include "memory_report.hpp"
#include "model.hpp"
#include "settings.hpp"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

using moe_lm::display_names;
using moe_lm::Settings;

std::string duration(double seconds) {
  const auto s = static_cast<long long>(std::max(0.0, seconds) + 0.5);
  std::ostringstream o;
  o << s / 60 << ":" << std::setw(2) << std::setfill('0') << s % 60;
  return o.str();
}

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

/// The 1-minute load average (other work competing for the cores).
std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string first;
  return in >> first ? first : std::string("unknown");
}

// ---------------------------------------------------------------- one run

std::int64_t torch_state_bytes(const torch::optim::Optimizer& opt) {
  std::int64_t bytes = 0;
  for (const auto& item : opt.state()) {
    if (const auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(item.second.get())) {
      for (const torch::Tensor* t : {&s->exp_avg(), &s->exp_avg_sq(), &s->max_exp_avg_sq()})
        if (t->defined()) bytes += t->numel() * static_cast<std::int64_t>(t->element_size());
    } else if (const auto* p = dynamic_cast<const skewadam::libtorch::ParamState*>(item.second.get())) {
      bytes += p->bytes();
    }
  }
  return bytes;
}

struct TrainedOptimizer {
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::function<std::int64_t(skewadam::Tier)> tier_bytes;  // empty for torch's AdamW
};

template <class Variant>
TrainedOptimizer make_skewadam(moe_lm::MoELM& model, const Settings& s) {
  skewadam::libtorch::Options o;
  const skewadam::Hyperparameters decayed{.lr = s.lr, .eps = s.eps, .weight_decay = s.weight_decay};
  o.hyperparameters = {decayed, decayed, skewadam::Hyperparameters{.lr = s.lr, .eps = s.eps}};
  o.threads = s.threads;
  o.seed = s.seed;
  auto opt = std::make_unique<Variant>(model->named_parameters(), std::move(o));
  auto* raw = opt.get();
  return {std::move(opt), [raw](skewadam::Tier t) { return static_cast<std::int64_t>(raw->state_bytes(t)); }};
}

/// AdamW's state of one parameter: fp32 zeros, step 0.
template <class AdamW>
void seed_fp32_moments_of(AdamW& opt, const torch::Tensor& p) {
  auto& state = opt.state();
  using Key = typename std::decay_t<decltype(state)>::key_type;  // a string before LibTorch 2.2, then the address
  auto s = std::make_unique<torch::optim::AdamWParamState>();
  s->step(0);
  s->exp_avg(torch::zeros(p.sizes(), p.options().dtype(torch::kFloat)));
  s->exp_avg_sq(torch::zeros(p.sizes(), p.options().dtype(torch::kFloat)));
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;  // the format of torch's own keys
    key << static_cast<const void*>(p.unsafeGetTensorImpl());
    state[key.str()] = std::move(s);
  } else {
    state[static_cast<Key>(p.unsafeGetTensorImpl())] = std::move(s);
  }
}

/// torch's AdamW keeps its moments in each parameter's dtype; for bf16 or
/// fp16 parameters they start here as fp32 zeros instead (the paper's
/// baseline: bf16 parameters, fp32 state), and AdamW's in-place updates keep
/// them fp32.
template <class AdamW>
void seed_fp32_moments(AdamW& opt) {
  for (const auto& group : opt.param_groups())
    for (const auto& p : group.params())
      if (p.scalar_type() != torch::kFloat) seed_fp32_moments_of(opt, p);
}

/// Whether torch's AdamW steps `dtype` parameters on `device` with fp32
/// moments: its update of the parameter mixes dtypes in place, which some
/// kernels refuse (LibTorch 1.13 on the CPU, for bf16). Tried on two elements.
bool adamw_steps_with_fp32_moments(torch::Device device, torch::ScalarType dtype) {
  try {
    auto p = torch::ones({2}, torch::TensorOptions().dtype(dtype).device(device));
    p.mutable_grad() = torch::ones_like(p);
    torch::optim::AdamW probe(std::vector<torch::Tensor>{p}, torch::optim::AdamWOptions(1e-3));
    seed_fp32_moments(probe);
    probe.step();
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

TrainedOptimizer make_optimizer(const std::string& name, moe_lm::MoELM& model, const Settings& s) {
  if (name == "skewadam") return make_skewadam<skewadam::libtorch::SkewAdam>(model, s);
  if (name == "adafactor") return make_skewadam<skewadam::libtorch::AdafactorLike>(model, s);
  if (name == "uniform") return make_skewadam<skewadam::libtorch::UniformAblation>(model, s);
  if (name == "expert-momentum") return make_skewadam<skewadam::libtorch::ExpertMomentumAblation>(model, s);
  if (name == "factored-router") return make_skewadam<skewadam::libtorch::FactoredRouterAblation>(model, s);
  // torch's AdamW, with the same groups: weight decay except on the router.
  const skewadam::TierAssigner rules;
  std::vector<torch::Tensor> decayed, router;
  for (const auto& p : model->named_parameters())
    (rules.assign(p.key()) == skewadam::Tier::router ? router : decayed).push_back(p.value());
  auto options = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(s.lr).betas({0.9, 0.999}).eps(1e-8).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decayed, options(s.weight_decay));
  groups.emplace_back(router, options(0.0));
  auto adamw = std::make_unique<torch::optim::AdamW>(std::move(groups), torch::optim::AdamWOptions(s.lr));
  if (s.model.dtype != torch::kFloat) {
    if (adamw_steps_with_fp32_moments(model->tok_emb->weight.device(), s.model.dtype))
      seed_fp32_moments(*adamw);
    else
      std::cout << "AdamW: this LibTorch cannot update " << c10::toString(s.model.dtype)
                << " parameters from fp32 moments on this device; its moments are kept in the parameters' dtype\n";
  }
  return {std::move(adamw), {}};
}

struct Evaluation {
  double loss = 0;
  double balance = 0;
};

Evaluation evaluate(moe_lm::MoELM& model, const std::vector<moe_lm::Batch>& batches) {
  torch::NoGradGuard no_grad;
  double loss = 0, balance = 0;
  std::int64_t tokens = 0;
  for (const auto& b : batches) {
    const auto out = model->forward(b.inputs);
    const auto n = b.targets.numel();
    loss += moe_lm::lm_loss(out.logits, b.targets).item<double>() * static_cast<double>(n);
    balance += out.balance_loss.item<double>() * static_cast<double>(n);
    tokens += n;
  }
  return {loss / static_cast<double>(tokens), balance / static_cast<double>(tokens)};
}

int run_worker(const Settings& s) {
  at::set_num_threads(s.threads);
  const std::string label = display_names.at(s.worker);
  const moe_lm::Corpus corpus = moe_lm::load_corpus(s.data, s.model.context);
  const torch::Device device = moe_lm::resolve_device(s.device);
  moe_lm::ModelConfig config = s.model;
  config.device = device;
  torch::manual_seed(s.seed);
  moe_lm::MoELM model(config);
  model->train();
  TrainedOptimizer t = make_optimizer(s.worker, model, s);
  torch::optim::Optimizer& opt = *t.optimizer;  // from here on, only torch's interface

  const skewadam::WarmupCosine schedule{.peak_lr = s.lr,
                                        .warmup_steps = std::max<std::int64_t>(1, std::llround(s.warmup * static_cast<double>(s.steps))),
                                        .total_steps = s.steps};
  moe_lm::BatchSampler sampler(corpus.train, s.batch, s.model.context, s.seed);
  const auto eval_set = moe_lm::validation_batches(corpus.val, s.batch, s.model.context, s.eval_windows);
  const auto final_set = moe_lm::validation_batches(corpus.val, s.batch, s.model.context, s.final_windows);
  std::vector<torch::Tensor> params;
  for (const auto& p : model->named_parameters()) params.push_back(p.value());

  fs::create_directories(s.out);
  std::ofstream curve(fs::path(s.out) / ("curve_" + s.worker + ".csv"));
  curve << "optimizer,step,train_loss,val_loss,val_ppl,balance_loss,lr\n";

  std::ostringstream memory;  // the summary's memory lines
  const bool tty = isatty(STDOUT_FILENO) != 0;
  const std::int64_t tokens_per_step = s.batch * s.model.context;
  double train_seconds = 0, step_seconds = 0, loss_sum = 0, balance_sum = 0, last_train_loss = 0;
  std::int64_t loss_count = 0;
  auto last_print = Clock::now() - std::chrono::seconds(10);
  const auto print_every = std::max<std::int64_t>(1, s.steps / 10);

  for (std::int64_t step = 1; step <= s.steps; ++step) {
    const auto batch = sampler.next();
    const auto t0 = Clock::now();
    const double lr = schedule(step);
    for (auto& g : opt.param_groups()) g.options().set_lr(lr);
    opt.zero_grad();
    const auto out = model->forward(batch.inputs);
    const auto ce = moe_lm::lm_loss(out.logits, batch.targets);
    const auto loss = ce + s.balance_coef * out.balance_loss;
    loss.backward();
    torch::nn::utils::clip_grad_norm_(params, s.max_grad_norm);
    moe_lm::synchronize(device);
    const auto t1 = Clock::now();
    opt.step();
    moe_lm::synchronize(device);
    const auto t2 = Clock::now();
    if (step == s.steps) {  // the memory of a step: weights, gradients and state all live
      if (device.is_cuda()) {
        const auto smi = moe_lm::nvidia_smi_memory();
        memory << "smi_mib=" << smi.mib << "\nsmi_what=" << smi.what << "\n";
      }
      std::int64_t weights = 0, grads = 0;
      for (const auto& p : params) {
        weights += p.numel() * static_cast<std::int64_t>(p.element_size());
        if (p.grad().defined()) grads += p.grad().numel() * static_cast<std::int64_t>(p.grad().element_size());
      }
      memory << "weights_bytes=" << weights << "\ngrads_bytes=" << grads << "\n";
    }
    step_seconds += std::chrono::duration<double>(t2 - t1).count();
    train_seconds += std::chrono::duration<double>(t2 - t0).count();
    loss_sum += ce.item<double>();
    balance_sum += out.balance_loss.item<double>();
    ++loss_count;

    const bool eval_now = step % s.eval_every == 0 || step == s.steps;
    if (eval_now) {
      model->eval();
      const Evaluation e = evaluate(model, eval_set);
      model->train();
      last_train_loss = loss_sum / static_cast<double>(loss_count);
      curve << s.worker << "," << step << "," << last_train_loss << "," << e.loss << "," << std::exp(e.loss) << ","
            << balance_sum / static_cast<double>(loss_count) << "," << lr << std::endl;
      loss_sum = balance_sum = 0;
      loss_count = 0;
    }
    const auto now = Clock::now();
    const bool print_line = tty ? (now - last_print > std::chrono::milliseconds(500) || step == s.steps)
                                : (step % print_every == 0 || step == s.steps);
    if (print_line) {
      last_print = now;
      const double tps = static_cast<double>(step * tokens_per_step) / train_seconds;
      const double per_step = train_seconds / static_cast<double>(step);
      const double left = per_step * static_cast<double>(s.steps - step);
      const double all_left = left + per_step * static_cast<double>(s.steps) * (s.runs - s.run_index - 1);
      std::ostringstream line;
      line << "[" << s.run_index + 1 << "/" << s.runs << " " << label << "] step " << step << "/" << s.steps
           << "  loss " << std::fixed << std::setprecision(3) << ce.item<double>() << "  balance "
           << std::setprecision(3) << out.balance_loss.item<double>() << "  " << std::setprecision(0) << tps
           << " tok/s  ETA " << duration(left) << " (all runs " << duration(all_left) << ")";
      if (tty) std::cout << "\r" << line.str() << "   " << std::flush;
      else std::cout << line.str() << "\n" << std::flush;
    }
  }
  if (tty) std::cout << "\n";

  model->eval();
  const Evaluation final_eval = evaluate(model, final_set);
  std::ofstream summary(fs::path(s.out) / ("summary_" + s.worker + ".txt"));
  summary << std::setprecision(10);
  summary << "state_bytes=" << torch_state_bytes(opt) << "\n";
  summary << memory.str();
  const moe_lm::AllocatorBytes allocator = moe_lm::allocator_bytes(device);
  summary << "allocator_peak_bytes=" << allocator.peak_allocated << "\n";
  summary << "allocator_peak_reserved_bytes=" << allocator.peak_reserved << "\n";
  // The library's state lives in memory it allocates itself (not torch's);
  // AdamW's state tensors are in the allocator's counts.
  summary << "library_device_bytes=" << (t.tier_bytes && device.is_cuda() ? torch_state_bytes(opt) : 0) << "\n";
  if (t.tier_bytes)
    for (skewadam::Tier tier : skewadam::all_tiers)
      summary << "state_" << skewadam::tier_name(tier) << "=" << t.tier_bytes(tier) << "\n";
  summary << "tokens_per_s=" << static_cast<double>(s.steps * tokens_per_step) / train_seconds << "\n";
  summary << "train_seconds=" << train_seconds << "\n";
  summary << "optimizer_ms_per_step=" << 1000.0 * step_seconds / static_cast<double>(s.steps) << "\n";
  summary << "train_loss=" << last_train_loss << "\n";
  summary << "val_loss=" << final_eval.loss << "\n";
  summary << "val_ppl=" << std::exp(final_eval.loss) << "\n";
  summary << "balance_loss=" << final_eval.balance << "\n";
  const skewadam::TierAssigner rules;
  std::map<skewadam::Tier, std::int64_t> counts;
  std::int64_t total = 0;
  for (const auto& p : model->named_parameters()) {
    counts[rules.assign(p.key())] += p.value().numel();
    total += p.value().numel();
  }
  summary << "params=" << total << "\n";
  for (const auto& [tier, n] : counts) summary << "params_" << skewadam::tier_name(tier) << "=" << n << "\n";
  std::cout << "[" << s.run_index + 1 << "/" << s.runs << " " << label << "] done: validation perplexity "
            << std::fixed << std::setprecision(3) << std::exp(final_eval.loss) << ", "
            << std::setprecision(0) << static_cast<double>(s.steps * tokens_per_step) / train_seconds
            << " tok/s\n" << std::flush;
  return 0;
}

// ----------------------------------------------------------------- driver

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

double number(const std::map<std::string, std::string>& v, const std::string& key) {
  auto it = v.find(key);
  return it == v.end() ? std::nan("") : std::stod(it->second);
}

std::string megabytes(double bytes) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(bytes < 1e7 ? 3 : 1) << bytes / 1e6;
  return o.str();
}

/// Runs this program again as one optimizer's worker; returns its peak RSS in KiB.
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

void plot(const Settings& s, const std::vector<std::string>& names) {
  const fs::path dir = fs::absolute(s.out);
  std::ofstream gp(dir / "val_ppl.gp");
  gp << "set terminal pngcairo size 960,600 font 'sans,11'\n"
     << "set output '" << (dir / "val_ppl.png").string() << "'\n"
     << "set datafile separator ','\n"
     << "set title 'MoE LM: validation perplexity (" << s.steps << " steps, same init and batches)'\n"
     << "set xlabel 'step'\nset ylabel 'validation perplexity (per byte)'\nset grid\n"
     << "set key top right\n"
     << "plot ";
  for (std::size_t i = 0; i < names.size(); ++i) {
    gp << (i ? ", " : "") << "'" << (dir / ("curve_" + names[i] + ".csv")).string()
       << "' using 2:5 every ::1 with linespoints lw 2 pt 7 ps 0.5 title '" << display_names.at(names[i]) << "'";
  }
  gp << "\n";
  gp.close();
  const std::string command = "gnuplot '" + (dir / "val_ppl.gp").string() + "' 2>/dev/null";
  if (std::system(command.c_str()) == 0) std::cout << "plot:    " << (dir / "val_ppl.png").string() << "\n";
  else std::cout << "plot:    gnuplot not found; install gnuplot-nox, then run: gnuplot " << (dir / "val_ppl.gp").string() << "\n";
}

int run_driver(const Settings& s, const std::vector<std::string>& passthrough) {
  // Workers wait for OpenMP work by sleeping rather than spinning, unless told
  // otherwise: spinning threads of torch, OpenBLAS and the optimizer (one
  // OpenMP runtime) cost little on an idle machine but, measured on a shared
  // 2-core machine, made a step 13x slower than with sleeping threads.
  setenv("OMP_WAIT_POLICY", "passive", 0);
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
  std::cout << "device:  " << s.device << "\n"
            << "corpus:  " << corpus.source << ": " << corpus.train.size() << " bytes train, " << corpus.val.size()
            << " bytes held out\n"
            << "run:     " << s.steps << " steps x " << s.batch << " x " << s.model.context << " tokens, lr " << s.lr
            << " (warm-up " << s.warmup * 100 << " %, cosine to 0), weight decay " << s.weight_decay
            << " (router 0), grad-norm clip " << s.max_grad_norm << ", eps " << s.eps
            << " (the library's rules; AdamW 1e-8)\n"
            << "threads: " << s.threads << " (torch and optimizer), OMP_WAIT_POLICY="
            << std::getenv("OMP_WAIT_POLICY")
            << "; BLAS: " << loaded_blas() << "\n\n"
            << std::flush;

  const std::string self = fs::canonical("/proc/self/exe").string();
  fs::create_directories(s.out);
  std::vector<std::map<std::string, std::string>> results;
  std::vector<long> rss;
  const std::string load_before = load_average();
  const auto started = Clock::now();
  for (std::size_t i = 0; i < s.optimizers.size(); ++i) {
    std::vector<std::string> args = passthrough;
    args.insert(args.end(), {"--worker", s.optimizers[i], "--run-index", std::to_string(i), "--runs",
                             std::to_string(s.optimizers.size()), "--threads", std::to_string(s.threads)});
    rss.push_back(spawn_worker(self, args));
    results.push_back(read_summary(fs::path(s.out) / ("summary_" + s.optimizers[i] + ".txt")));
  }
  const double wall = std::chrono::duration<double>(Clock::now() - started).count();

  // ------------------------------------------------------------ the table
  double adamw_bytes = std::nan("");
  for (std::size_t i = 0; i < s.optimizers.size(); ++i)
    if (s.optimizers[i] == "adamw") adamw_bytes = number(results[i], "state_bytes");
  std::ostringstream table;
  table << std::left << std::setw(18) << "optimizer" << std::right << std::setw(12) << "state (MB)" << std::setw(10)
        << "vs AdamW" << std::setw(12) << "backbone" << std::setw(10) << "experts" << std::setw(10) << "router"
        << std::setw(11) << "peak RSS" << std::setw(10) << "tokens/s" << std::setw(9) << "step ms" << std::setw(9)
        << "val ppl" << std::setw(9) << "balance" << "\n";
  table << std::string(120, '-') << "\n";
  std::ofstream csv(fs::path(s.out) / "results.csv");
  csv << "optimizer,state_bytes,state_backbone_bytes,state_experts_bytes,state_router_bytes,peak_rss_kib,"
         "tokens_per_s,optimizer_ms_per_step,val_loss,val_ppl,balance_loss,train_seconds\n";
  for (std::size_t i = 0; i < s.optimizers.size(); ++i) {
    const auto& r = results[i];
    const double bytes = number(r, "state_bytes");
    auto tier = [&](const char* key) {
      const double b = number(r, key);
      return std::isnan(b) ? std::string("-") : megabytes(b);
    };
    std::ostringstream ratio;
    if (!std::isnan(adamw_bytes) && adamw_bytes > 0) ratio << std::fixed << std::setprecision(1) << 100.0 * bytes / adamw_bytes << " %";
    else ratio << "-";
    table << std::left << std::setw(18) << display_names.at(s.optimizers[i]) << std::right << std::setw(12)
          << megabytes(bytes) << std::setw(10) << ratio.str() << std::setw(12) << tier("state_backbone")
          << std::setw(10) << tier("state_experts") << std::setw(10) << tier("state_router") << std::setw(7)
          << std::fixed << std::setprecision(0) << static_cast<double>(rss[i]) / 1024.0 << " MiB" << std::setw(10)
          << number(r, "tokens_per_s") << std::setw(9) << std::setprecision(1) << number(r, "optimizer_ms_per_step")
          << std::setw(9) << std::setprecision(3) << number(r, "val_ppl")
          << std::setw(9) << std::setprecision(3) << number(r, "balance_loss") << "\n";
    csv << s.optimizers[i] << "," << r.at("state_bytes") << "," << (r.count("state_backbone") ? r.at("state_backbone") : "")
        << "," << (r.count("state_experts") ? r.at("state_experts") : "") << ","
        << (r.count("state_router") ? r.at("state_router") : "") << "," << rss[i] << "," << r.at("tokens_per_s") << "," << r.at("optimizer_ms_per_step") << ","
        << r.at("val_loss") << "," << r.at("val_ppl") << "," << r.at("balance_loss") << "," << r.at("train_seconds")
        << "\n";
  }
  csv.close();
  {
    std::ofstream curves(fs::path(s.out) / "curves.csv");
    curves << "optimizer,step,train_loss,val_loss,val_ppl,balance_loss,lr\n";
    for (const auto& name : s.optimizers) {
      std::ifstream in(fs::path(s.out) / ("curve_" + name + ".csv"));
      std::string line;
      std::getline(in, line);  // header
      while (std::getline(in, line)) curves << line << "\n";
    }
  }
  std::cout << "\n" << table.str() << "\n"
            << "state: optimizer state bytes (MB = 10^6 B; AdamW's from its state tensors, the others from the library);\n"
            << "peak RSS: whole process (LibTorch included); tokens/s: training, evaluation excluded; step ms: "
               "optimizer.step() alone;\n"
            << "val ppl: per byte, on " << s.final_windows << " held-out windows of " << s.model.context
            << "; balance: load-balancing loss (1 = uniform routing).\n"
            << "total wall time " << duration(wall) << "; load average " << load_before << " before, "
            << load_average() << " after\n"
            << "results: " << fs::absolute(fs::path(s.out) / "results.csv").string() << ", "
            << fs::absolute(fs::path(s.out) / "curves.csv").string() << "\n";
  plot(s, s.optimizers);
  if (s.device == "cuda") {
    std::vector<moe_lm::RunMemory> memory;
    for (std::size_t i = 0; i < s.optimizers.size(); ++i) {
      const auto& r = results[i];
      moe_lm::RunMemory m;
      m.name = s.optimizers[i];
      m.weights = number(r, "weights_bytes");
      m.grads = number(r, "grads_bytes");
      m.state = number(r, "state_bytes");
      m.allocator_peak = number(r, "allocator_peak_bytes");
      m.library_device = number(r, "library_device_bytes");
      m.smi_mib = number(r, "smi_mib");
      m.smi_what = r.count("smi_what") ? r.at("smi_what") : "n/a";
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
    if (!s.worker.empty()) return run_worker(s);
    std::vector<std::string> passthrough(argv + 1, argv + argc);
    return run_driver(s, passthrough);
  } catch (const std::exception& e) {
    std::cerr << "moe_lm: " << e.what() << "\n";
    return 2;
  }
}
