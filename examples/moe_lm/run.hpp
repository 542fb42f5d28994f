#pragma once
// moe_lm's training run: one optimizer, from one initialisation and batch
// order, in a process of its own (the driver starts this program again with
// --worker), so that its peak resident memory and throughput are its own.
// It writes its validation curve and a summary of key=value lines.

#include <skewadam/math/schedule.hpp>
#include <skewadam/tiers/tier_assignment.hpp>
#include <skewadam/torch/optimizer.hpp>

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "corpus.hpp"
#include "device.hpp"
#include "model.hpp"
#include "settings.hpp"

namespace moe_lm {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

/// Seconds as M:SS.
inline std::string duration(double seconds) {
  const auto s = static_cast<long long>(std::max(0.0, seconds) + 0.5);
  std::ostringstream o;
  o << s / 60 << ":" << std::setw(2) << std::setfill('0') << s % 60;
  return o.str();
}

inline std::int64_t torch_state_bytes(const torch::optim::Optimizer& opt) {
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
  std::shared_ptr<void> keep;  // what a run without an optimizer keeps alive (its hooks)
};

/// A run without an optimizer: each parameter's gradient is dropped as soon
/// as it has been accumulated, inside backward, by a post hook on its
/// gradient accumulator (what the library's step inside backward does after
/// stepping it). Removes its hooks when destroyed.
class GradientDropper {
 public:
  explicit GradientDropper(const std::vector<torch::Tensor>& params) {
    for (const auto& p : params) {
      std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(p);
      const std::uintptr_t key = acc->add_post_hook(std::make_unique<Drop>(p));
      hooks_.push_back({std::move(acc), key});
    }
  }
  ~GradientDropper() {
    for (auto& [node, key] : hooks_) node->del_post_hook(key);
  }
  GradientDropper(const GradientDropper&) = delete;
  GradientDropper& operator=(const GradientDropper&) = delete;

 private:
  struct Drop final : torch::autograd::FunctionPostHook {
    explicit Drop(const torch::Tensor& p) : param(p) {}
    torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                              const torch::autograd::variable_list&) override {
      param.mutable_grad() = torch::Tensor();
      return outputs;
    }
    torch::Tensor param;  // no cycle: the dropper removes its hooks when destroyed
  };
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, std::uintptr_t>> hooks_;
};

/// A step-less optimizer over the parameters, so that the run's loop is the
/// same: its step() does nothing.
class NoOptimizer final : public torch::optim::Optimizer {
 public:
  explicit NoOptimizer(std::vector<torch::Tensor> params)
      : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                                std::make_unique<torch::optim::SGDOptions>(0.0)) {}
  torch::Tensor step(LossClosure = nullptr) override { return {}; }
};

template <class Variant>
TrainedOptimizer make_skewadam(MoELM& model, const Settings& s, bool step_in_backward) {
  skewadam::libtorch::Options o;
  const skewadam::Hyperparameters decayed{.lr = s.lr, .eps = s.eps, .weight_decay = s.weight_decay};
  o.hyperparameters = {decayed, decayed, skewadam::Hyperparameters{.lr = s.lr, .eps = s.eps}};
  o.threads = s.threads;
  o.seed = s.seed;
  if (step_in_backward && s.in_backward_clip == "previous" && s.max_grad_norm > 0) {
    o.max_grad_norm = s.max_grad_norm;  // the previous step's global norm: what a step inside backward can clip by
    o.clip_norm = skewadam::ClipNorm::previous;
  }
  auto opt = std::make_unique<Variant>(model->named_parameters(), std::move(o));
  if (step_in_backward) opt->step_in_backward();
  auto* raw = opt.get();
  return {std::move(opt), [raw](skewadam::Tier t) { return static_cast<std::int64_t>(raw->state_bytes(t)); }, {}};
}

/// AdamW's state of one parameter: fp32 zeros, step 0.
template <class AdamW>
void seed_fp32_moments_of(AdamW& opt, const torch::Tensor& p) {
  auto s = std::make_unique<torch::optim::AdamWParamState>();
  s->step(0);
  s->exp_avg(torch::zeros(p.sizes(), p.options().dtype(torch::kFloat)));
  s->exp_avg_sq(torch::zeros(p.sizes(), p.options().dtype(torch::kFloat)));
  opt.state()[skewadam::libtorch::state_key(p)] = std::move(s);
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
inline bool adamw_steps_with_fp32_moments(torch::Device device, torch::ScalarType dtype) {
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

inline TrainedOptimizer make_optimizer(const std::string& optimizer, MoELM& model, const Settings& s) {
  const std::string name = rule_of(optimizer);
  const bool ib = in_backward(optimizer);
  if (name == "no-optimizer") {
    std::vector<torch::Tensor> params;
    for (const auto& p : model->parameters()) params.push_back(p);
    TrainedOptimizer t{std::make_unique<NoOptimizer>(params), [](skewadam::Tier) { return std::int64_t{0}; }, {}};
    t.keep = std::make_shared<GradientDropper>(params);
    return t;
  }
  if (name == "skewadam") return make_skewadam<skewadam::libtorch::SkewAdam>(model, s, ib);
  if (name == "skewadam-bf16") return make_skewadam<skewadam::libtorch::SkewAdamBf16Momentum>(model, s, ib);
  if (name == "skewadam-8bit") return make_skewadam<skewadam::libtorch::SkewAdam8bit>(model, s, ib);
  if (name == "skewadam-linear8bit")
    return make_skewadam<skewadam::libtorch::Optimizer<skewadam::SkewAdamLinear8bitTiers>>(model, s, ib);
  if (name == "adafactor") return make_skewadam<skewadam::libtorch::AdafactorLike>(model, s, ib);
  if (name == "uniform") return make_skewadam<skewadam::libtorch::UniformAblation>(model, s, ib);
  if (name == "expert-momentum") return make_skewadam<skewadam::libtorch::ExpertMomentumAblation>(model, s, ib);
  if (name == "factored-router") return make_skewadam<skewadam::libtorch::FactoredRouterAblation>(model, s, ib);
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
  return {std::move(adamw), {}, {}};
}

struct Evaluation {
  double loss = 0;
  double balance = 0;
  /// How far the busiest expert's share of the routed tokens is above the
  /// uniform share 1/E (0.01: 1 % above it), the largest over MoE layers.
  double max_load = 0;
};

inline Evaluation evaluate(MoELM& model, const std::vector<Batch>& batches) {
  torch::NoGradGuard no_grad;
  double loss = 0, balance = 0;
  std::int64_t tokens = 0;
  std::vector<std::vector<std::int64_t>> counts;  // per MoE layer, per expert
  for (const auto& b : batches) {
    const LMLoss out = model->loss(b.inputs, b.targets);
    const auto n = b.targets.numel();
    loss += out.loss.item<double>() * static_cast<double>(n);
    balance += out.balance_loss.item<double>() * static_cast<double>(n);
    tokens += n;
    counts.resize(out.expert_counts.size());
    for (std::size_t l = 0; l < out.expert_counts.size(); ++l) {
      counts[l].resize(out.expert_counts[l].size());
      for (std::size_t e = 0; e < out.expert_counts[l].size(); ++e) counts[l][e] += out.expert_counts[l][e];
    }
  }
  double max_load = 0;
  for (const auto& layer : counts) {
    std::int64_t total = 0, busiest = 0;
    for (const std::int64_t c : layer) {
      total += c;
      busiest = std::max(busiest, c);
    }
    if (total > 0)
      max_load = std::max(max_load, static_cast<double>(busiest) * static_cast<double>(layer.size()) /
                                        static_cast<double>(total) - 1.0);
  }
  return {loss / static_cast<double>(tokens), balance / static_cast<double>(tokens), max_load};
}

/// One run: the optimizer s.worker at peak lr s.lr, initialised and fed
/// batches from s.seed. Writes curve_TAG.csv and summary_TAG.txt (TAG:
/// s.tag) in s.out.
inline int run_worker(const Settings& s) {
  // glibc serves blocks above its mmap threshold from mmap and unmaps them
  // when freed, but raises the threshold to each such block freed (up to 32
  // MiB), after which blocks below it stay in its heap once freed. On the
  // paper's model that kept 2.8 GiB more at the peak (measured without an
  // optimizer: 17.75 against 14.91 GiB). A fixed threshold of 1 MiB returns
  // every block from 1 MiB up when it is freed.
  if (s.return_freed_memory) mallopt(M_MMAP_THRESHOLD, 1 << 20);
  at::set_num_threads(s.threads);
  std::ostringstream labelled;
  labelled << display_name(s.worker) << ", lr " << s.lr << ", seed " << s.seed;
  const std::string label = labelled.str();
  const Corpus corpus = load_corpus(s.data, s.model.context);
  const torch::Device device = resolve_device(s.device);
  ModelConfig config = s.model;
  config.device = device;
  torch::manual_seed(s.seed);
  MoELM model(config);
  model->train();
  TrainedOptimizer t = make_optimizer(s.worker, model, s);
  torch::optim::Optimizer& opt = *t.optimizer;  // from here on, only torch's interface

  const skewadam::WarmupCosine schedule = schedule_of(s);
  BatchSampler sampler(corpus.train, s.batch, s.model.context, s.seed);
  const auto eval_set = validation_batches(corpus.val, s.batch, s.model.context, s.eval_windows);
  const auto final_set = validation_batches(corpus.val, s.batch, s.model.context, s.final_windows);
  std::vector<torch::Tensor> params;
  for (const auto& p : model->named_parameters()) params.push_back(p.value());
  // The largest gradient formed in backward: with the step inside backward,
  // the most gradient memory the optimizer holds at once.
  const bool steps_in_backward = in_backward(s.worker);
  std::int64_t largest_grad = 0;
  for (auto& p : params)
    p.register_hook([&largest_grad](const torch::Tensor& g) {
      if (g.defined())
        largest_grad = std::max<std::int64_t>(largest_grad, g.numel() * static_cast<std::int64_t>(g.element_size()));
    });

  fs::create_directories(s.out);
  std::ofstream curve(fs::path(s.out) / ("curve_" + s.tag + ".csv"));
  curve << "run,optimizer,lr,seed,step,train_loss,val_loss,val_ppl,balance_loss,max_load,step_lr\n";

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
    // The step's sequences in micro-batches, their gradients summed (the
    // whole step), or in one backward (the step inside backward).
    const std::int64_t parts = steps_in_backward ? 1 : s.accumulate, micro = s.batch / parts;
    double ce = 0, balance = 0;
    for (std::int64_t k = 0; k < parts; ++k) {
      const LMLoss out =
          model->loss(batch.inputs.narrow(0, k * micro, micro), batch.targets.narrow(0, k * micro, micro));
      const auto loss = (out.loss + s.balance_coef * out.balance_loss) / static_cast<double>(parts);
      loss.backward();  // with the step inside backward, each parameter is stepped here
      ce += out.loss.item<double>() / static_cast<double>(parts);
      balance += out.balance_loss.item<double>() / static_cast<double>(parts);
    }
    if (!steps_in_backward && s.max_grad_norm > 0) torch::nn::utils::clip_grad_norm_(params, s.max_grad_norm);
    synchronize(device);
    const auto t1 = Clock::now();
    opt.step();
    synchronize(device);
    const auto t2 = Clock::now();
    if (step == s.steps) {  // the memory of a step: weights, gradients and state all live
      if (device.is_cuda()) {
        const auto smi = nvidia_smi_memory();
        memory << "smi_mib=" << smi.mib << "\nsmi_what=" << smi.what << "\n";
      }
      std::int64_t weights = 0, grads = 0;
      for (const auto& p : params) {
        weights += p.numel() * static_cast<std::int64_t>(p.element_size());
        if (p.grad().defined()) grads += p.grad().numel() * static_cast<std::int64_t>(p.grad().element_size());
      }
      // in backward, every gradient is freed by now: the largest is what was held
      if (steps_in_backward) grads = largest_grad;
      memory << "weights_bytes=" << weights << "\ngrads_bytes=" << grads << "\n";
    }
    step_seconds += std::chrono::duration<double>(t2 - t1).count();
    train_seconds += std::chrono::duration<double>(t2 - t0).count();
    loss_sum += ce;
    balance_sum += balance;
    ++loss_count;

    const bool eval_now = step % s.eval_every == 0 || step == s.steps;
    if (eval_now) {
      model->eval();
      const Evaluation e = evaluate(model, eval_set);
      model->train();
      last_train_loss = loss_sum / static_cast<double>(loss_count);
      curve << s.tag << "," << s.worker << "," << s.lr << "," << s.seed << "," << step << "," << last_train_loss << ","
            << e.loss << "," << std::exp(e.loss) << "," << balance_sum / static_cast<double>(loss_count) << ","
            << e.max_load << "," << lr << std::endl;
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
           << "  loss " << std::fixed << std::setprecision(3) << ce << "  balance "
           << std::setprecision(3) << balance << "  " << std::setprecision(0) << tps
           << " tok/s  ETA " << duration(left) << " (all runs " << duration(all_left) << ")";
      if (tty) std::cout << "\r" << line.str() << "   " << std::flush;
      else std::cout << line.str() << "\n" << std::flush;
    }
  }
  if (tty) std::cout << "\n";

  model->eval();
  const Evaluation final_eval = evaluate(model, final_set);
  std::ofstream summary(fs::path(s.out) / ("summary_" + s.tag + ".txt"));
  summary << std::setprecision(10);
  summary << "optimizer=" << s.worker << "\nlr=" << s.lr << "\nseed=" << s.seed << "\n";
  summary << "state_bytes=" << torch_state_bytes(opt) << "\n";
  summary << memory.str();
  const AllocatorBytes allocator = allocator_bytes(device);
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
  summary << "seconds_per_step=" << train_seconds / static_cast<double>(s.steps) << "\n";
  summary << "optimizer_ms_per_step=" << 1000.0 * step_seconds / static_cast<double>(s.steps) << "\n";
  summary << "train_loss=" << last_train_loss << "\n";
  summary << "val_loss=" << final_eval.loss << "\n";
  summary << "val_ppl=" << std::exp(final_eval.loss) << "\n";
  summary << "balance_loss=" << final_eval.balance << "\n";
  summary << "max_load=" << final_eval.max_load << "\n";
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

}  // namespace moe_lm
