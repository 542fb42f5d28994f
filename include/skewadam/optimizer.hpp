#pragma once
// Optimizer<Tiers, Backend>: registers parameters by name under a tier and
// updates each with its tier's rule.
//
//   skewadam::SkewAdam opt(skewadam::Hyperparameters{.lr = 3e-4, .weight_decay = 0.05});
//   auto w = opt.add("blocks.1.moe.experts.w1", skewadam::Tier::experts,
//                    skewadam::TensorView<float>(w1, {8, 512, 128}),
//                    skewadam::TensorView<const float>(gw1, {8, 512, 128}));
//   opt.step();
//
// Hyperparameters are per tier. A parameter whose gradient is absent this
// step (clear_grad) is skipped: its state and step count do not change, as in
// the reference. Invalid input throws std::invalid_argument naming the
// argument, before anything is changed.

#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/work.hpp"
#include "config.hpp"
#include "dtype.hpp"
#include "hyperparameters.hpp"
#include "param_state.hpp"
#include "random.hpp"
#include "state_layout.hpp"
#include "step_scalars.hpp"
#include "tensor_view.hpp"
#include "tier.hpp"
#include "tier_rules.hpp"

namespace skewadam {

/// One value per tier.
template <class T>
struct PerTier {
  T backbone{};
  T experts{};
  T router{};
  T& operator[](Tier t) { return t == Tier::backbone ? backbone : (t == Tier::experts ? experts : router); }
  const T& operator[](Tier t) const {
    return t == Tier::backbone ? backbone : (t == Tier::experts ? experts : router);
  }
};

struct OptimizerOptions {
  std::uint64_t seed = 0x5eed5eedULL;  ///< stochastic-rounding seed
  int threads = 0;                      ///< 0: the hardware's thread count
};

template <class Tiers = SkewAdamTiers, class Backend = backend::DefaultBackend>
class Optimizer {
 public:
  using tiers = Tiers;
  using backend_type = Backend;
  using Schedule = std::function<double(std::int64_t)>;

  Optimizer() : Optimizer(Hyperparameters{}) {}
  explicit Optimizer(const Hyperparameters& all, OptimizerOptions options = {})
      : Optimizer(PerTier<Hyperparameters>{all, all, all}, options) {}
  explicit Optimizer(const PerTier<Hyperparameters>& per_tier, OptimizerOptions options = {}) : seed_(options.seed) {
    for (Tier t : all_tiers) validate(per_tier[t], std::string(tier_name(t)));
    hyper_ = per_tier;
    backend_.set_threads(options.threads);
  }

  // ------------------------------------------------------------ parameters
  /// Registers a parameter (once) under a tier; allocates its state.
  ParamId add(std::string_view name, Tier tier, ParamView param, GradView grad = {}) {
    if (name.empty()) throw std::invalid_argument("name: a parameter name must not be empty");
    if (index_.count(std::string(name)))
      throw std::invalid_argument("name: parameter '" + std::string(name) + "' is already registered");
    checked_tier(tier, "tier of '" + std::string(name) + "'");
    check_param(name, param);
    check_grad(name, param, grad);

    Entry e;
    e.name = std::string(name);
    e.tier = tier;
    e.param = param;
    e.grad = grad;
    e.id = tensor_id(name);
    const StateLayout layout = Tiers::layout(tier);
    const MatrixGeometry g = param.shape.matrices();
    const index_t n = param.numel();
    e.factored = factors(layout, param.shape);
    if (n == 0) {
      // empty tensors keep no state and are never stepped
    } else {
    if (layout.momentum) e.state.m.assign(static_cast<std::size_t>(n), 0.0f);
    if (e.factored) {
      e.state.v_row.assign(static_cast<std::size_t>(g.batch * g.rows), 0.0f);
      e.state.v_col.assign(static_cast<std::size_t>(g.batch * g.cols), 0.0f);
      e.row_blocks = backend::Cutting::row_blocks(g);
      const index_t pf = backend::Cutting::partial_floats(g);
      e.col_partial.assign(static_cast<std::size_t>(pf), 0.0f);
      e.d_partial.assign(static_cast<std::size_t>(pf), 0.0f);
    } else {
      e.state.v.assign(static_cast<std::size_t>(n), 0.0f);
      e.chunks = backend::Cutting::chunks_per_matrix(g);
      e.unit_sum.assign(static_cast<std::size_t>(g.batch * e.chunks), 0.0);
    }
    e.matrices.assign(static_cast<std::size_t>(g.batch), backend::MatrixScratch{});
    if (e.factored) backend_.reserve_columns(g.cols);
    }

    const ParamId id{static_cast<index_t>(entries_.size())};
    entries_.push_back(std::move(e));
    try {
      index_.emplace(std::string(name), id.index);
    } catch (...) {
      entries_.pop_back();
      throw;
    }
    return id;
  }

  ParamId add(std::string_view name, std::string_view tier, ParamView param, GradView grad = {}) {
    return add(name, parse_tier(tier, "tier of '" + std::string(name) + "'"), param, grad);
  }

  /// Sets the gradient used by the next step(s). A default GradView clears it.
  void set_grad(ParamId id, GradView grad) {
    Entry& e = entry(id);
    check_grad(e.name, e.param, grad);
    e.grad = grad;
  }
  void clear_grad(ParamId id) { entry(id).grad = GradView{}; }
  void clear_grads() noexcept {
    for (Entry& e : entries_) e.grad = GradView{};
  }

  std::optional<ParamId> find(std::string_view name) const {
    auto it = index_.find(std::string(name));
    if (it == index_.end()) return std::nullopt;
    return ParamId{it->second};
  }
  index_t size() const noexcept { return static_cast<index_t>(entries_.size()); }
  const std::string& name(ParamId id) const { return entry(id).name; }
  Tier tier(ParamId id) const { return entry(id).tier; }
  const ParamView& param(ParamId id) const { return entry(id).param; }
  const GradView& grad(ParamId id) const { return entry(id).grad; }

  ParamStateView state(ParamId id) const {
    const Entry& e = entry(id);
    return {e.state.m, e.state.v, e.state.v_row, e.state.v_col, e.state.step};
  }

  // ------------------------------------------------------ hyperparameters
  const Hyperparameters& hyperparameters(Tier t) const { return hyper_[checked_tier(t)]; }
  void set_hyperparameters(Tier t, const Hyperparameters& h) {
    checked_tier(t);
    validate(h, std::string(tier_name(t)));
    hyper_[t] = h;
  }
  /// Sets the learning rate of every tier.
  void set_lr(double lr) {
    for (Tier t : all_tiers) check_lr(lr, std::string(tier_name(t)) + ".lr");
    for (Tier t : all_tiers) hyper_[t].lr = lr;
  }
  void set_lr(Tier t, double lr) {
    checked_tier(t);
    check_lr(lr, std::string(tier_name(t)) + ".lr");
    hyper_[t].lr = lr;
  }
  /// lr of step t (t counts step() calls from 1) comes from `schedule`,
  /// overriding the tier's lr. An empty function removes the schedule.
  void set_lr_schedule(Schedule schedule) {
    for (Tier t : all_tiers) schedules_[t] = schedule;
  }
  void set_lr_schedule(Tier t, Schedule schedule) { schedules_[checked_tier(t)] = std::move(schedule); }

  // --------------------------------------------------------------- threads
  void set_threads(int n) { backend_.set_threads(n); }
  int threads() const noexcept { return backend_.threads(); }

  // ------------------------------------------------ global gradient norm (E6)
  /// L2 norm over all present gradients, in double, in a fixed order.
  double grad_norm() const {
    double sum = 0;
    for (const Entry& e : entries_)
      if (e.grad.present()) sum += grad_sum_squares(e.grad);
    return std::sqrt(sum);
  }

  /// Clips the global gradient norm to max_norm for the next step, as
  /// torch.nn.utils.clip_grad_norm_ does (scale = min(max_norm / (norm + 1e-6), 1)),
  /// without writing the gradients: the scale is applied as they are read.
  /// Returns the norm before clipping.
  double clip_grad_norm(double max_norm) {
    if (!(max_norm > 0.0) || std::isnan(max_norm))
      throw std::invalid_argument("max_norm = " + std::to_string(max_norm) + ": must be > 0");
    const double norm = grad_norm();
    const double scale = max_norm / (norm + 1e-6);
    grad_scale_ = std::isfinite(norm) && scale < 1.0 ? scale : 1.0;
    return norm;
  }
  double pending_grad_scale() const noexcept { return grad_scale_; }

  // ------------------------------------------------------------------ step
  void step() {
    const std::int64_t t_global = steps_ + 1;
    PerTier<Hyperparameters> h = hyper_;
    for (Tier t : all_tiers) {
      if (!schedules_[t]) continue;
      const double lr = schedules_[t](t_global);
      check_lr(lr, "lr schedule of tier " + std::string(tier_name(t)) + " at step " + std::to_string(t_global));
      h[t].lr = lr;
    }

    tasks_.clear();
    units_.clear();
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      Entry& e = entries_[i];
      if (!e.grad.present() || e.param.numel() == 0) continue;
      backend::TensorTask task;
      task.param = e.param.data;
      task.grad = e.grad.data;
      task.geom = e.param.shape.matrices();
      task.factored = e.factored;
      task.scope = h[e.tier].clip_scope;
      const std::int64_t t = e.state.step + 1;
      task.scalars = make_step_scalars(h[e.tier], t, grad_scale_);
      task.key = RoundingKey{seed_, e.id, static_cast<std::uint64_t>(t)};
      task.m = e.state.m.empty() ? nullptr : e.state.m.data();
      task.v = e.state.v.empty() ? nullptr : e.state.v.data();
      task.v_row = e.state.v_row.empty() ? nullptr : e.state.v_row.data();
      task.v_col = e.state.v_col.empty() ? nullptr : e.state.v_col.data();
      task.matrices = e.matrices.data();
      task.col_partial = e.col_partial.empty() ? nullptr : e.col_partial.data();
      task.d_partial = e.d_partial.empty() ? nullptr : e.d_partial.data();
      task.unit_sum = e.unit_sum.empty() ? nullptr : e.unit_sum.data();
      task.row_blocks = e.row_blocks;
      task.chunks_per_matrix = e.chunks;
      task.kernel = pick_kernel(e.tier, e.param.dtype, e.grad.dtype, e.param.shape.rank() < 2);
      const auto index = static_cast<std::int32_t>(tasks_.size());
      tasks_.push_back(task);
      backend::append_units(task, index, units_);
      stepped_.push_back(i);
    }
    backend_.run(tasks_, units_);
    for (std::size_t i : stepped_) ++entries_[i].state.step;
    stepped_.clear();
    ++steps_;
    grad_scale_ = 1.0;
  }

  /// Number of step() calls so far.
  std::int64_t steps() const noexcept { return steps_; }

  // ----------------------------------------------------------------- state
  /// Optimizer state bytes (SPEC section 2), total and per tier.
  index_t state_bytes() const noexcept {
    index_t b = 0;
    for (const Entry& e : entries_) b += e.state.bytes();
    return b;
  }
  index_t state_bytes(Tier t) const noexcept {
    index_t b = 0;
    for (const Entry& e : entries_)
      if (e.tier == t) b += e.state.bytes();
    return b;
  }
  std::uint64_t seed() const noexcept { return seed_; }

 private:
  struct Entry {
    std::string name;
    Tier tier = Tier::backbone;
    ParamView param;
    GradView grad;
    std::uint32_t id = 0;
    bool factored = false;
    ParamState state;
    // scratch: O(B + row_blocks * c + chunks), never the tensor's size
    std::vector<backend::MatrixScratch> matrices;
    std::vector<float> col_partial;
    std::vector<float> d_partial;
    std::vector<double> unit_sum;
    index_t row_blocks = 1;
    index_t chunks = 1;
  };

  Entry& entry(ParamId id) {
    if (id.index < 0 || id.index >= size())
      throw std::invalid_argument("param id " + std::to_string(id.index) + ": no such parameter");
    return entries_[static_cast<std::size_t>(id.index)];
  }
  const Entry& entry(ParamId id) const { return const_cast<Optimizer*>(this)->entry(id); }

  static void check_lr(double lr, const std::string& what) {
    if (!(lr >= 0.0) || !std::isfinite(lr))
      throw std::invalid_argument(what + " = " + std::to_string(lr) + ": must be finite and >= 0");
  }

  static void check_param(std::string_view name, const ParamView& p) {
    const std::string who = "param of '" + std::string(name) + "'";
    if (p.shape.rank() < 1) throw std::invalid_argument(who + ": shape has rank 0 (a view must have rank >= 1)");
    if (p.dtype != Dtype::f32 && p.dtype != Dtype::bf16 && p.dtype != Dtype::f16)
      throw std::invalid_argument(who + ": unknown dtype");
    if (p.data == nullptr && p.numel() > 0) throw std::invalid_argument(who + ": null data pointer");
  }

  static void check_grad(std::string_view name, const ParamView& p, const GradView& g) {
    if (!g.present()) return;
    const std::string who = "grad of '" + std::string(name) + "'";
    if (!(g.shape == p.shape))
      throw std::invalid_argument(who + ": shape " + g.shape.str() + " does not match the parameter's " +
                                  p.shape.str());
    if (g.dtype != Dtype::f32 && g.dtype != p.dtype)
      throw std::invalid_argument(who + ": dtype " + std::string(dtype_name(g.dtype)) +
                                  " must be f32 or the parameter's dtype " + std::string(dtype_name(p.dtype)));
    if (g.data == nullptr && g.numel() > 0) throw std::invalid_argument(who + ": null data pointer");
  }

  static double grad_sum_squares(const GradView& g) {
    const index_t n = g.numel();
    double s = 0;
    switch (g.dtype) {
      case Dtype::f32:
        for (index_t i = 0; i < n; ++i) s += static_cast<double>(g.as<float>()[i]) * g.as<float>()[i];
        break;
      case Dtype::bf16:
        for (index_t i = 0; i < n; ++i) {
          const double x = to_float(g.as<bf16>()[i]);
          s += x * x;
        }
        break;
      case Dtype::f16:
        for (index_t i = 0; i < n; ++i) {
          const double x = to_float(g.as<f16>()[i]);
          s += x * x;
        }
        break;
    }
    return s;
  }

  template <class Rule>
  static const backend::KernelTable* pick_rule(Dtype p, Dtype g, bool rank1) {
    if constexpr (!std::is_same_v<Rule, typename Rule::rank1_rule>) {
      if (rank1) return pick_rule<typename Rule::rank1_rule>(p, g, false);
    }
    switch (p) {
      case Dtype::f32: return Backend::template kernels<Rule, float, float>();
      case Dtype::bf16:
        return g == Dtype::f32 ? Backend::template kernels<Rule, bf16, float>()
                               : Backend::template kernels<Rule, bf16, bf16>();
      case Dtype::f16:
        return g == Dtype::f32 ? Backend::template kernels<Rule, f16, float>()
                               : Backend::template kernels<Rule, f16, f16>();
    }
    return nullptr;
  }

  static const backend::KernelTable* pick_kernel(Tier t, Dtype p, Dtype g, bool rank1) {
    switch (t) {
      case Tier::backbone: return pick_rule<typename Tiers::backbone>(p, g, rank1);
      case Tier::experts: return pick_rule<typename Tiers::experts>(p, g, rank1);
      case Tier::router: return pick_rule<typename Tiers::router>(p, g, rank1);
    }
    return nullptr;
  }

  std::vector<Entry> entries_;
  std::unordered_map<std::string, index_t> index_;
  PerTier<Hyperparameters> hyper_;
  PerTier<Schedule> schedules_;
  Backend backend_;
  std::uint64_t seed_ = 0;
  std::int64_t steps_ = 0;
  double grad_scale_ = 1.0;
  // reused every step; grow with the number of tensors, never with their size
  std::vector<backend::TensorTask> tasks_;
  std::vector<backend::Unit> units_;
  std::vector<std::size_t> stepped_;
};

// ----------------------------------------------------------------- variants
using SkewAdam = Optimizer<SkewAdamTiers>;
using ExpertMomentumAblation = Optimizer<ExpertMomentumTiers>;
using FactoredRouterAblation = Optimizer<FactoredRouterTiers>;
using UniformAblation = Optimizer<UniformTiers>;
using AdafactorLike = Optimizer<AdafactorTiers>;
using AdamW = Optimizer<AdamWTiers>;

}  // namespace skewadam
