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
//
// The complete state can be exported and imported as plain data
// (export_state, import_state) and saved to a file (checkpoint.hpp).
//
// A step whose gradients hold NaN or infinities is skipped as a whole by
// default (OptimizerOptions::nonfinite, see nonfinite.hpp).

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/summation.hpp"
#include "backend/work.hpp"
#include "checks.hpp"
#include "config.hpp"
#include "dtype.hpp"
#include "hyperparameters.hpp"
#include "nonfinite.hpp"
#include "optimizer_state.hpp"
#include "param_state.hpp"
#include "random.hpp"
#include "state_layout.hpp"
#include "step_scalars.hpp"
#include "tensor_view.hpp"
#include "tier.hpp"
#include "tier_rules.hpp"
#include "tier_settings.hpp"

namespace skewadam {

struct OptimizerOptions {
  std::uint64_t seed = 0x5eed5eedULL;  ///< stochastic-rounding seed
  int threads = 0;                      ///< 0: the hardware's thread count
  NonFinitePolicy nonfinite = NonFinitePolicy::skip_step;  ///< see nonfinite.hpp
};

template <class Tiers = SkewAdamTiers, class Backend = backend::DefaultBackend>
class Optimizer : public TierSettings {
 public:
  using tiers = Tiers;
  using backend_type = Backend;
  using Schedule = TierSettings::Schedule;

  Optimizer() : Optimizer(Hyperparameters{}) {}
  explicit Optimizer(const Hyperparameters& all, OptimizerOptions options = {})
      : Optimizer(PerTier<Hyperparameters>{all, all, all}, options) {}
  explicit Optimizer(const PerTier<Hyperparameters>& per_tier, OptimizerOptions options = {})
      : TierSettings(per_tier), seed_(options.seed) {
    backend_.set_threads(options.threads);
    set_nonfinite_policy(options.nonfinite);
  }

  // ------------------------------------------------------------ parameters
  /// Registers a parameter (once) under a tier; allocates its state.
  ParamId add(std::string_view name, Tier tier, ParamView param, GradView grad = {}) {
    if (name.empty()) throw std::invalid_argument("name: a parameter name must not be empty");
    if (index_.count(std::string(name)))
      throw std::invalid_argument("name: parameter '" + std::string(name) + "' is already registered");
    checked_tier(tier, "tier of '" + std::string(name) + "'");
    detail::check_param(name, param);
    detail::check_grad(name, param, grad);
    check_disjoint(name, param, grad);

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
    // non-finite checks: see nonfinite.hpp
    e.restorable_statistics = e.factored && e.state.m.empty();
    if (e.restorable_statistics) e.statistics_backup.assign(e.state.v_row.size() + e.state.v_col.size(), 0.0f);
    e.scan.assign(static_cast<std::size_t>(g.batch * backend::Cutting::chunks_per_matrix(g)), -1.0);
    }

    const ParamId id{static_cast<index_t>(entries_.size())};
    entries_.push_back(std::move(e));
    try {
      index_.emplace(std::string(name), id.index);
      const auto [lo, hi] = byte_range(param.data, param.numel(), param.dtype);
      if (lo != hi) memory_.emplace(lo, std::pair{hi, id.index});
    } catch (...) {
      index_.erase(std::string(name));
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
    detail::check_grad(e.name, e.param, grad);
    check_grad_disjoint(e.name, grad);
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

  /// The id keying this parameter's stochastic-rounding bits (FNV-1a of its
  /// name when registered; import_state() restores a saved one).
  std::uint32_t rounding_stream(ParamId id) const { return entry(id).id; }

  /// A copy of the complete optimizer state (see optimizer_state.hpp).
  OptimizerState export_state() const {
    OptimizerState s;
    for (Tier t : all_tiers) s.hyperparameters[static_cast<std::size_t>(tier_index(t))] = hyper_[t];
    s.seed = seed_;
    s.steps = steps_;
    s.params.reserve(entries_.size());
    for (const Entry& e : entries_) s.params.push_back(OptimizerState::Param{e.state, e.id});
    return s;
  }

  /// Replaces the complete optimizer state with `next`, which must describe
  /// the registered parameters in ParamId order with state arrays of exactly
  /// the sizes this optimizer's rules keep. Everything is checked first: on
  /// error std::invalid_argument names the problem and nothing has changed;
  /// then the state is swapped in without any step that can fail. Gradients,
  /// lr schedules, threads and the non-finite policy are not part of it.
  void import_state(OptimizerState next) {
    if (next.params.size() != entries_.size())
      throw std::invalid_argument("state: holds " + std::to_string(next.params.size()) +
                                  " parameters, the optimizer has " + std::to_string(entries_.size()));
    if (next.steps < 0) throw std::invalid_argument("state.steps = " + std::to_string(next.steps) + ": must be >= 0");
    for (Tier t : all_tiers)
      validate(next.hyperparameters[static_cast<std::size_t>(tier_index(t))],
               "state.hyperparameters." + std::string(tier_name(t)));
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      const ParamState& have = entries_[i].state;
      const ParamState& got = next.params[i].state;
      const std::string who = "state of '" + entries_[i].name + "'";
      auto same_size = [&](const std::vector<float>& a, const std::vector<float>& b, const char* array) {
        if (a.size() != b.size())
          throw std::invalid_argument(who + ": " + array + " has " + std::to_string(b.size()) + " values, expected " +
                                      std::to_string(a.size()));
      };
      same_size(have.m, got.m, "m");
      same_size(have.v, got.v, "v");
      same_size(have.v_row, got.v_row, "v_row");
      same_size(have.v_col, got.v_col, "v_col");
      if (got.step < 0 || got.step > next.steps)
        throw std::invalid_argument(who + ": step = " + std::to_string(got.step) + " is outside 0.." +
                                    std::to_string(next.steps) + " (the optimizer's step count)");
    }
    // commit: swaps and scalar copies only
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      std::swap(entries_[i].state, next.params[i].state);
      entries_[i].id = next.params[i].rounding_stream;
    }
    for (Tier t : all_tiers) hyper_[t] = next.hyperparameters[static_cast<std::size_t>(tier_index(t))];
    seed_ = next.seed;
    steps_ = next.steps;
  }

  // ------------------------------------------------------ hyperparameters
  // hyperparameters(), set_hyperparameters(), set_lr(), set_lr_schedule():
  // TierSettings (tier_settings.hpp).

  // --------------------------------------------------------------- threads
  void set_threads(int n) { backend_.set_threads(n); }
  int threads() const noexcept { return backend_.threads(); }

  // ---------------------------------------------------- non-finite gradients
  void set_nonfinite_policy(NonFinitePolicy p) {
    if (p != NonFinitePolicy::skip_step && p != NonFinitePolicy::raise && p != NonFinitePolicy::unchecked)
      throw std::invalid_argument("nonfinite policy: unknown value " + std::to_string(static_cast<int>(p)));
    nonfinite_ = p;
  }
  NonFinitePolicy nonfinite_policy() const noexcept { return nonfinite_; }

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
    detail::check_max_norm(max_norm);
    const double norm = grad_norm();
    grad_scale_ = detail::grad_clip_scale(norm, max_norm);
    return norm;
  }
  double pending_grad_scale() const noexcept { return grad_scale_; }

  // ------------------------------------------------------------------ step
  /// Updates every parameter that has a gradient. Returns whether the step
  /// was applied; under NonFinitePolicy::skip_step a step with an offending
  /// gradient is skipped and the report names it (raise: throws instead).
  StepReport step() {
    const std::int64_t t_global = steps_ + 1;
    PerTier<Hyperparameters> h = hyperparameters_at(t_global);

    tasks_.clear();
    units_.clear();
    stepped_.clear();
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
      e.kernels = pick_kernel(e.tier, e.param.dtype, e.grad.dtype, e.param.shape.rank() < 2);
      task.kernel = e.kernels->full;
      tasks_.push_back(task);
      stepped_.push_back(i);
    }

    StepReport report;
    if (nonfinite_ == NonFinitePolicy::unchecked) {
      for (std::size_t k = 0; k < tasks_.size(); ++k)
        backend::append_units(tasks_[k], static_cast<std::int32_t>(k), units_);
      backend_.run(tasks_, units_);
    } else if (std::optional<NonFiniteGradient> bad = checked_statistics()) {
      stepped_.clear();
      grad_scale_ = 1.0;
      if (nonfinite_ == NonFinitePolicy::raise) throw NonFiniteGradientError(std::move(*bad));
      report.applied = false;
      report.nonfinite = std::move(bad);
      return report;
    } else {
      finish_checked_step();
    }
    for (std::size_t i : stepped_) ++entries_[i].state.step;
    stepped_.clear();
    ++steps_;
    grad_scale_ = 1.0;
    return report;
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
    // non-finite checks (nonfinite.hpp): the statistics pass writes only
    // v_row and v_col (factored, no momentum), which are copied before it
    bool restorable_statistics = false;
    std::vector<float> statistics_backup;  ///< v_row then v_col
    std::vector<double> scan;              ///< per chunk: first offending offset, or -1
    const detail::PhaseKernels* kernels = nullptr;
  };

  /// Phase 1 of a checked step (see nonfinite.hpp): the statistics of the
  /// tensors whose state it can restore, a gradient scan of the others. On an
  /// offending gradient restores that state and returns the first offender in
  /// registration order; otherwise leaves phase 2 to finish_checked_step().
  std::optional<NonFiniteGradient> checked_statistics() {
    phase_tasks_.clear();
    units_.clear();
    for (std::size_t k = 0; k < tasks_.size(); ++k) {
      Entry& e = entries_[stepped_[k]];
      backend::TensorTask t = tasks_[k];
      if (e.restorable_statistics) {
        std::copy(e.state.v_row.begin(), e.state.v_row.end(), e.statistics_backup.begin());
        std::copy(e.state.v_col.begin(), e.state.v_col.end(),
                  e.statistics_backup.begin() + static_cast<std::ptrdiff_t>(e.state.v_row.size()));
        t.kernel = &e.kernels->statistics_only;
      } else {
        t = scan_task(e, tasks_[k]);
      }
      phase_tasks_.push_back(t);
      backend::append_units(t, static_cast<std::int32_t>(k), units_);
    }
    backend_.run(phase_tasks_, units_);

    std::optional<std::size_t> first;
    for (std::size_t k = 0; k < tasks_.size() && !first; ++k) {
      const Entry& e = entries_[stepped_[k]];
      const bool ok = e.restorable_statistics
                          ? detail::all_finite(e.state.v_row.data(), e.state.v_row.size()) &&
                                detail::all_finite(e.state.v_col.data(), e.state.v_col.size())
                          : std::all_of(e.scan.begin(), e.scan.end(), [](double x) { return x < 0; });
      if (!ok) first = k;
    }
    if (!first) return std::nullopt;

    for (std::size_t k = 0; k < tasks_.size(); ++k) {
      Entry& e = entries_[stepped_[k]];
      if (!e.restorable_statistics) continue;
      const auto split = e.statistics_backup.begin() + static_cast<std::ptrdiff_t>(e.state.v_row.size());
      std::copy(e.statistics_backup.begin(), split, e.state.v_row.begin());
      std::copy(split, e.statistics_backup.end(), e.state.v_col.begin());
    }
    return describe_offender(*first);
  }

  /// Phase 2 of a checked step: apply the first group, everything of the rest.
  void finish_checked_step() {
    phase_tasks_.clear();
    units_.clear();
    for (std::size_t k = 0; k < tasks_.size(); ++k) {
      const Entry& e = entries_[stepped_[k]];
      backend::TensorTask t = tasks_[k];
      if (e.restorable_statistics) t.kernel = &e.kernels->apply_only;
      phase_tasks_.push_back(t);
      backend::append_units(t, static_cast<std::int32_t>(k), units_);
    }
    backend_.run(phase_tasks_, units_);
  }

  /// A task that scans the gradient of `task`, chunk by chunk, into e.scan.
  static backend::TensorTask scan_task(Entry& e, const backend::TensorTask& task) {
    backend::TensorTask t = task;
    t.kernel = detail::gradient_scan_kernels(e.grad.dtype, task.factored);
    t.factored = false;
    t.chunks_per_matrix = backend::Cutting::chunks_per_matrix(task.geom);
    t.unit_sum = e.scan.data();
    t.m = t.v = t.v_row = t.v_col = nullptr;
    return t;
  }

  /// The report for task k, scanning its gradient if phase 1 did not.
  NonFiniteGradient describe_offender(std::size_t k) {
    Entry& e = entries_[stepped_[k]];
    if (e.restorable_statistics) {
      phase_tasks_.assign(1, scan_task(e, tasks_[k]));
      units_.clear();
      backend::append_units(phase_tasks_[0], 0, units_);
      backend_.run(phase_tasks_, units_);
    }
    NonFiniteGradient r;
    r.param = ParamId{static_cast<index_t>(stepped_[k])};
    r.name = e.name;
    r.shape = e.param.shape;
    const index_t chunk = backend::Cutting::chunk_elems;
    const index_t per_matrix = backend::Cutting::chunks_per_matrix(tasks_[k].geom);
    for (std::size_t u = 0; u < e.scan.size(); ++u) {
      if (e.scan[u] < 0) continue;
      const auto ui = static_cast<index_t>(u);
      r.element = (ui / per_matrix) * tasks_[k].geom.matrix_size() + (ui % per_matrix) * chunk +
                  static_cast<index_t>(e.scan[u]);
      r.value = grad_value(e.grad, r.element) * static_cast<float>(grad_scale_);
      break;
    }
    return r;
  }

  static float grad_value(const GradView& g, index_t i) {
    switch (g.dtype) {
      case Dtype::f32: return g.as<float>()[i];
      case Dtype::bf16: return to_float(g.as<bf16>()[i]);
      case Dtype::f16: return to_float(g.as<f16>()[i]);
    }
    return 0.0f;
  }

  Entry& entry(ParamId id) {
    if (id.index < 0 || id.index >= size())
      throw std::invalid_argument("param id " + std::to_string(id.index) + ": no such parameter");
    return entries_[static_cast<std::size_t>(id.index)];
  }
  const Entry& entry(ParamId id) const { return const_cast<Optimizer*>(this)->entry(id); }

  /// Bytes [lo, hi) of a contiguous view.
  static std::pair<std::uintptr_t, std::uintptr_t> byte_range(const void* data, index_t numel, Dtype dtype) {
    const auto lo = reinterpret_cast<std::uintptr_t>(data);
    return {lo, lo + static_cast<std::uintptr_t>(numel * dtype_size(dtype))};
  }
  /// The registered parameter whose memory overlaps [lo, hi), if any. The
  /// registered ranges are disjoint, so only the last one starting below hi
  /// can overlap.
  std::optional<index_t> overlapping(std::uintptr_t lo, std::uintptr_t hi) const {
    if (lo == hi) return std::nullopt;
    auto it = memory_.lower_bound(hi);
    if (it == memory_.begin()) return std::nullopt;
    --it;
    if (it->second.first > lo) return it->second.second;
    return std::nullopt;
  }
  /// Parameters must not share memory (each would be updated once per name),
  /// and no gradient may live in a parameter's memory (a step would read what
  /// it has just written).
  void check_disjoint(std::string_view name, const ParamView& p, const GradView& g) const {
    const auto [lo, hi] = byte_range(p.data, p.numel(), p.dtype);
    if (auto other = overlapping(lo, hi))
      throw std::invalid_argument("param of '" + std::string(name) + "': its memory overlaps parameter '" +
                                  entries_[static_cast<std::size_t>(*other)].name +
                                  "' (register a shared tensor once, under one name)");
    const auto [glo, ghi] = byte_range(g.data, g.numel(), g.dtype);
    if (glo != ghi && glo < hi && lo < ghi)
      throw std::invalid_argument("grad of '" + std::string(name) + "': its memory overlaps the parameter itself");
    check_grad_disjoint(name, g);
  }
  void check_grad_disjoint(std::string_view name, const GradView& g) const {
    const auto [lo, hi] = byte_range(g.data, g.numel(), g.dtype);
    if (auto other = overlapping(lo, hi))
      throw std::invalid_argument("grad of '" + std::string(name) + "': its memory overlaps parameter '" +
                                  entries_[static_cast<std::size_t>(*other)].name + "'");
  }

  /// Sum of squares of a gradient, in double and blocked (backend/cpu/summation.hpp).
  static double grad_sum_squares(const GradView& g) {
    const auto squares = [&]<class T>(const T* x) {
      return backend::cpu::wide_sum(g.numel(), [x](index_t i) {
        const double v = static_cast<double>(to_float(x[i]));
        return v * v;
      });
    };
    switch (g.dtype) {
      case Dtype::f32: return squares(g.as<float>());
      case Dtype::bf16: return squares(g.as<bf16>());
      case Dtype::f16: return squares(g.as<f16>());
    }
    return 0.0;
  }

  /// The backend's kernel table for (Rule, P, G) and its two phases.
  template <class Rule, class P, class G>
  static const detail::PhaseKernels* phase_kernels() {
    static const detail::PhaseKernels k = detail::split_phases(Backend::template kernels<Rule, P, G>());
    return &k;
  }

  template <class Rule>
  static const detail::PhaseKernels* pick_rule(Dtype p, Dtype g, bool rank1) {
    if constexpr (!std::is_same_v<Rule, typename Rule::rank1_rule>) {
      if (rank1) return pick_rule<typename Rule::rank1_rule>(p, g, false);
    }
    switch (p) {
      case Dtype::f32: return phase_kernels<Rule, float, float>();
      case Dtype::bf16:
        return g == Dtype::f32 ? phase_kernels<Rule, bf16, float>() : phase_kernels<Rule, bf16, bf16>();
      case Dtype::f16:
        return g == Dtype::f32 ? phase_kernels<Rule, f16, float>() : phase_kernels<Rule, f16, f16>();
    }
    return nullptr;
  }

  static const detail::PhaseKernels* pick_kernel(Tier t, Dtype p, Dtype g, bool rank1) {
    switch (t) {
      case Tier::backbone: return pick_rule<typename Tiers::backbone>(p, g, rank1);
      case Tier::experts: return pick_rule<typename Tiers::experts>(p, g, rank1);
      case Tier::router: return pick_rule<typename Tiers::router>(p, g, rank1);
    }
    return nullptr;
  }

  std::vector<Entry> entries_;
  std::unordered_map<std::string, index_t> index_;
  /// Registered parameters' memory: first byte -> (end, entry index).
  std::map<std::uintptr_t, std::pair<std::uintptr_t, index_t>> memory_;
  Backend backend_;
  std::uint64_t seed_ = 0;
  std::int64_t steps_ = 0;
  double grad_scale_ = 1.0;
  NonFinitePolicy nonfinite_ = NonFinitePolicy::skip_step;
  // reused every step; grow with the number of tensors, never with their size
  std::vector<backend::TensorTask> tasks_;
  std::vector<backend::TensorTask> phase_tasks_;
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
