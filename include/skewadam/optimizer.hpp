#pragma once
// Optimizer<Tiers, Backend, Placement>: the one optimizer front-end. It
// registers parameters by name under a tier and updates each with its tier's
// rule, on any backend and placement.
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
// default (OptimizerOptions::nonfinite, see nonfinite.hpp); last_step() says
// what the last step did.
//
// The step can also be taken inside backward, one parameter at a time, as
// each gradient is complete, so that each gradient can be freed at once:
// step(ParamId) for each, then finish_step(). It gives step()'s bits.
//
// Step counts live with the backend (on the GPU for the CUDA backend), and
// step() never waits for a device (unless the policy is raise, which must
// throw from step()): a skipped step is skipped by the backend itself, and
// last_step(), steps(), step_count() and export_state() read its answer when
// called. On a backend with graphs (CUDA), capture_step() records a step
// that replay() runs again, each replay a counted step.
//
// Only registering a parameter depends on the rules (it picks the
// parameter's kernels): every other member is OptimizerBase<Backend,
// Placement>'s, which reads the tiers' layouts, rule names and clipping from
// a TierTable (tier_table.hpp) and is compiled once for every alias.
//
// Where the state lives and how a step runs is the engine's business
// (engine.hpp): Engine<Backend, Placement>, the step skeleton over a
// backend (engine/backend/backend.hpp: the CPU backend, or with skewadam/cuda.cuh
// the CUDA backend) and a placement: Local (engine/placement/local.hpp) holds
// everything in this process, dist::Sharded<Comm> (engine/placement/sharded.hpp,
// dist/sharded_optimizer.hpp) shards the state over the ranks of a
// communicator. Members that only make sense for one placement exist only
// for it (state() for Local; rank(), pieces(), gather_params()... for
// Sharded).

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "detail/config.hpp"
#include "engine/backend/cpu/cpu_backend.hpp"
#include "engine/engine.hpp"
#include "engine/grad_norm_clip.hpp"
#include "engine/nonfinite.hpp"
#include "engine/optimizer_options.hpp"
#include "engine/placement/local.hpp"
#include "engine/step_inside_backward.hpp"
#include "math/hyperparameters.hpp"
#include "math/random.hpp"
#include "math/step_scalars.hpp"
#include "rules/rule_dispatch.hpp"
#include "state/optimizer_state.hpp"
#include "state/param_state.hpp"
#include "state/state_layout.hpp"
#include "tiers/tier_rules.hpp"
#include "tiers/tier_settings.hpp"
#include "tiers/tier_table.hpp"
#include "tiers/variants.hpp"
#include "types/checks.hpp"
#include "types/dtype.hpp"
#include "types/tensor_view.hpp"
#include "types/tier.hpp"

namespace skewadam {

namespace detail {
/// A backend's graph_type, or an empty stand-in for backends without graphs.
struct NoGraph {};
template <class B>
struct graph_of {
  using type = NoGraph;
};
template <class B>
  requires requires { typename B::graph_type; }
struct graph_of<B> {
  using type = typename B::graph_type;
};
}  // namespace detail

/// Everything of an optimizer but which rule each tier follows, which it
/// reads from a TierTable (tier_table.hpp): the front-end of every TierRules
/// alias of one backend and placement, compiled once for all of them.
/// Optimizer<Tiers, Backend, Placement> (below) is the class to use; its
/// functions that serve any alias (checkpoints, adapters) take this base.
template <class Backend, class Placement>
class OptimizerBase : public TierSettings {
 public:
  using backend_type = Backend;
  using placement_type = Placement;
  using engine_type = Engine<Backend, Placement>;
  using communicator_type = typename Placement::communicator_type;
  using Schedule = TierSettings::Schedule;
  static constexpr bool sharded = Placement::sharded;
  /// Whether steps can be captured and replayed (a backend with graphs, the
  /// local placement).
  static constexpr bool graphs = !sharded && requires { typename Backend::graph_type; };
  /// A step captured by capture_step() (graphs; else an empty type).
  using StepGraph = typename detail::graph_of<Backend>::type;

 protected:
  /// A tensor's kernels (Engine::add): for a gradient of its parameter's
  /// dtype, and for an fp32 one; picked by the derived class from its tier,
  /// whether it is rank-1, and its parameter's dtype.
  using kernel_pair = std::array<typename Backend::kernels_type, 2>;
  using KernelPicker = kernel_pair (*)(Tier tier, bool rank1, Dtype param);

  OptimizerBase(const TierTable& table, const PerTier<Hyperparameters>& per_tier, const OptimizerOptions& options)
    requires(!sharded)
      : TierSettings(per_tier), table_(&table), engine_(options), seed_(options.seed),
        nonfinite_(detail::checked_policy(options.nonfinite)),
        max_grad_norm_(detail::checked_max_grad_norm(options.max_grad_norm)),
        clip_norm_(detail::checked_clip_norm(options.clip_norm, "options.clip_norm")) {}
  OptimizerBase(const TierTable& table, communicator_type& comm, const PerTier<Hyperparameters>& per_tier,
                const OptimizerOptions& options, typename Placement::options_type shard) requires sharded
      : TierSettings(per_tier), table_(&table), engine_(comm, options, shard), seed_(options.seed),
        nonfinite_(detail::checked_policy(options.nonfinite)),
        max_grad_norm_(detail::checked_max_grad_norm(options.max_grad_norm)),
        clip_norm_(detail::checked_clip_norm(options.clip_norm, "options.clip_norm")) {}

 public:
  /// What tier t's rule keeps and is called (tier_table.hpp).
  const TierFacts& tier_facts(Tier t) const { return (*table_)[t]; }

  // ------------------------------------------------------------ parameters
  /// Sets the gradient used by the next step(s). A default GradView clears it.
  void set_grad(ParamId id, GradView grad) {
    Entry& e = entry(id);
    detail::check_grad(e.name, e.param, grad);
    engine_.check_memory(e.name, e.param, grad);
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
  /// Updates this parameter has received (t of its last step).
  std::int64_t step_count(ParamId id) const {
    const Entry& e = entry(id);
    refresh_counts();
    return e.step;
  }

  /// A parameter's state, viewed in place (local placement; on a device
  /// backend the arrays are in device memory).
  ParamStateView state(ParamId id) const requires(!sharded) {
    ParamStateView v = engine_.view(index_of(id));
    refresh_counts();
    v.step = entry(id).step;
    return v;
  }

  /// The id keying this parameter's stochastic-rounding bits (FNV-1a of its
  /// name when registered; import_state() restores a saved one).
  std::uint32_t rounding_stream(ParamId id) const { return entry(id).id; }

  /// A copy of the complete optimizer state (see optimizer_state.hpp).
  /// Sharded: collective, every rank receives all of it.
  OptimizerState export_state() const {
    check_no_open_step("export_state");
    refresh_counts();
    OptimizerState s;
    for (Tier t : all_tiers) s.hyperparameters[static_cast<std::size_t>(tier_index(t))] = hyper_[t];
    s.seed = seed_;
    s.steps = steps_;
    s.previous_grad_norm = carried_.norm();
    s.params.reserve(entries_.size());
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      OptimizerState::Param p{engine_.export_arrays(i), entries_[i].id};
      p.state.step = entries_[i].step;
      s.params.push_back(std::move(p));
    }
    return s;
  }

  /// Replaces the complete optimizer state with `next`, which must describe
  /// the registered parameters in ParamId order with state arrays of exactly
  /// the sizes this optimizer's rules keep (complete tensors, also when
  /// sharded: every rank imports the same state and keeps its share).
  /// Everything is checked first: on error std::invalid_argument names the
  /// problem and nothing has changed; then the state is swapped in without
  /// any step that can fail. Gradients, lr schedules, threads and the
  /// non-finite policy are not part of it.
  void import_state(OptimizerState next) {
    if (next.params.size() != entries_.size())
      throw std::invalid_argument("state: holds " + std::to_string(next.params.size()) +
                                  " parameters, the optimizer has " + std::to_string(entries_.size()));
    check_header(next.hyperparameters, next.steps);
    CarriedNorm::check(next.previous_grad_norm, "state.previous_grad_norm");
    StateImport im = begin_import();
    for (std::size_t i = 0; i < entries_.size(); ++i)
      import_param(im, ParamId{static_cast<index_t>(i)}, std::move(next.params[i].state),
                   next.params[i].rounding_stream, next.steps);
    finish_import(std::move(im), next.hyperparameters, next.seed, next.steps, next.previous_grad_norm);
  }

  /// An import under way (import_state, checkpoint loading): parameters are
  /// handed over one at a time, each checked and reduced to what this process
  /// keeps as it comes, so that no more than one complete tensor is held
  /// beside the staged state. Nothing changes until finish_import().
  class StateImport {
    friend class OptimizerBase;
    typename engine_type::staged_type staged;
    std::vector<std::int64_t> steps;
    std::vector<std::uint32_t> streams;
    std::vector<char> given;
  };
  StateImport begin_import() const {
    check_no_open_step("import_state");
    StateImport im;
    im.staged = engine_.stage_begin();
    im.steps.assign(entries_.size(), 0);
    im.streams.assign(entries_.size(), 0);
    im.given.assign(entries_.size(), 0);
    return im;
  }
  /// Takes one parameter's complete state (its step count must be within
  /// 0..steps, the optimizer step count of the state being imported).
  void import_param(StateImport& im, ParamId id, ParamState&& state, std::uint32_t rounding_stream,
                    std::int64_t steps) const {
    const std::size_t i = index_of(id);
    const std::string who = "state of '" + entries_[i].name + "'";
    engine_.check_arrays(i, state, who);
    if (state.step < 0 || state.step > steps)
      throw std::invalid_argument(who + ": step = " + std::to_string(state.step) + " is outside 0.." +
                                  std::to_string(steps) + " (the optimizer's step count)");
    im.steps[i] = state.step;
    im.streams[i] = rounding_stream;
    engine_.stage(im.staged, i, std::move(state));
    im.given[i] = 1;
  }
  /// Checks that every parameter was given and commits, with the tiers'
  /// hyperparameters (by tier_index), seed, step count and previous step's
  /// global gradient norm (E8; NaN: none) of the state.
  void finish_import(StateImport&& im, const std::array<Hyperparameters, tier_count>& hyper, std::uint64_t seed,
                     std::int64_t steps, double previous_grad_norm) {
    check_no_open_step("import_state");
    check_header(hyper, steps);
    CarriedNorm::check(previous_grad_norm, "state.previous_grad_norm");
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      if (!im.given[i]) throw std::invalid_argument("state of '" + entries_[i].name + "': missing");
      if (im.steps[i] > steps)
        throw std::invalid_argument("state of '" + entries_[i].name + "': step = " + std::to_string(im.steps[i]) +
                                    " is outside 0.." + std::to_string(steps) + " (the optimizer's step count)");
    }
    engine_.stage_counts(im.staged, im.steps, steps);
    // commit: swaps and scalar copies only
    engine_.commit(std::move(im.staged));
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      entries_[i].step = im.steps[i];
      entries_[i].id = im.streams[i];
    }
    for (Tier t : all_tiers) hyper_[t] = hyper[static_cast<std::size_t>(tier_index(t))];
    seed_ = seed;
    steps_ = steps;
    carried_.restore(previous_grad_norm);
    counts_known_ = true;
  }

  // ------------------------------------------------------ hyperparameters
  // hyperparameters(), set_hyperparameters(), set_lr(), set_lr_schedule():
  // TierSettings (tier_settings.hpp).

  // --------------------------------------------------------------- threads
  /// Threads per step (per rank, sharded); 0 selects the hardware's count.
  void set_threads(int n) {
    if (n < 0) throw std::invalid_argument("threads = " + std::to_string(n) + ": must be >= 0 (0: hardware)");
    engine_.set_threads(n);
  }
  int threads() const noexcept { return engine_.threads(); }

  // ---------------------------------------------------- non-finite gradients
  void set_nonfinite_policy(NonFinitePolicy p) { nonfinite_ = detail::checked_policy(p); }
  NonFinitePolicy nonfinite_policy() const noexcept { return nonfinite_; }

  // ------------------------------------------------ global gradient norm (E6)
  /// L2 norm over all present gradients, in double, in a fixed order
  /// (sharded: collective; each rank sums its own slices, the ranks' sums
  /// are added in rank order).
  double grad_norm() const {
    std::vector<StepItem> items;
    for (std::size_t i = 0; i < entries_.size(); ++i)
      if (entries_[i].grad.present() && entries_[i].param.numel() > 0) items.push_back(item(i));
    return std::sqrt(engine_.grad_sum_squares(items));
  }

  /// Clips the global gradient norm to max_norm for the next step, as
  /// torch.nn.utils.clip_grad_norm_ does (scale = min(max_norm / (norm + 1e-6), 1)),
  /// without writing the gradients: the scale is applied as they are read.
  /// Returns the norm before clipping (it waits for a device).
  double clip_grad_norm(double max_norm) {
    detail::check_max_norm(max_norm);
    const double norm = grad_norm();
    grad_scale_ = grad_clip_scale(norm, max_norm);
    return norm;
  }
  double pending_grad_scale() const noexcept { return grad_scale_; }

  /// From now on every step first clips the global gradient norm to max_norm
  /// (0: off again).
  ///
  /// ClipNorm::current (E6): by this step's norm, exactly as
  /// clip_grad_norm(max_norm) before it would. The norm and the scale are
  /// formed by the backend, so a step on a device does not wait for them. It
  /// needs every gradient of the step: the step inside backward refuses it.
  ///
  /// ClipNorm::previous (E8, grad_norm_clip.hpp): by the norm of the
  /// previous step's gradients, taken as each tensor is stepped, so that the
  /// step inside backward can clip; it gives the same bits there as in the
  /// whole step(). With no norm yet (the first step under it, or the first
  /// after a step without it) a step measures the norm and changes nothing
  /// else: last_step().measured. On a device backend each stepped tensor's
  /// sum of g^2 is read back (a wait per tensor). Not for a captured step
  /// (its scale would be the capture's).
  void set_max_grad_norm(double max_norm, ClipNorm norm = ClipNorm::current) {
    check_no_open_step("set_max_grad_norm");
    const double checked = detail::checked_max_grad_norm(max_norm);
    clip_norm_ = detail::checked_clip_norm(norm);
    max_grad_norm_ = checked;
  }
  double max_grad_norm() const noexcept { return max_grad_norm_; }
  ClipNorm clip_norm() const noexcept { return clip_norm_; }
  /// Whether steps clip by the previous step's global norm (E8).
  bool clips_by_previous_norm() const noexcept { return max_grad_norm_ > 0 && clip_norm_ == ClipNorm::previous; }
  /// The global gradient norm the next step clips by under
  /// ClipNorm::previous: the last step's, when it was taken so; NaN if none.
  double previous_grad_norm() const noexcept { return carried_.norm(); }
  /// The global gradient norm (before clipping) of the last step that
  /// clipped by max_grad_norm; NaN if none has. Under ClipNorm::previous,
  /// previous_grad_norm(). Waits for a device.
  double last_grad_norm() const {
    if (clips_by_previous_norm()) return carried_.norm();
    if (!last_norm_known_) {
      last_norm_ = std::sqrt(engine_.clip_sum_squares());
      last_norm_known_ = true;
    }
    return last_norm_;
  }

  // ------------------------------------------------------------------ step
  /// Updates every parameter that has a gradient. Under
  /// NonFinitePolicy::skip_step a step with an offending gradient is skipped
  /// and last_step() names it; under raise, step() throws instead (and so
  /// waits for a device's answer). It does not wait for a device otherwise:
  /// last_step() has the report. Sharded: collective; every rank must have
  /// gradients for the same parameters (else std::invalid_argument on every
  /// rank, nothing changes).
  void step() {
    check_no_open_step("step()");
    const PerTier<Hyperparameters> h = hyperparameters_at(has_schedule() ? steps() + 1 : 0);
    gather_items();
    const StepSettings st = settings(h);
    if (clips_by_previous_norm()) {
      const bool measuring = measures_norm();
      carried_.begin(entries_.size());
      for (const StepItem& it : items_) {
        const double sum = engine_.grad_sum_squares(std::span(&it, 1));
        if (!measuring || std::isfinite(sum)) carried_.record(static_cast<std::size_t>(it.index), sum);
      }
      if (measuring) {  // no norm yet: this step measures it, and changes nothing else
        carried_.end(by_name());
        last_ = StepReport{};
        last_.applied = false;
        last_.measured = true;
        last_.stepped = static_cast<index_t>(items_.size());
        last_known_ = true;
        return;
      }
    }
    engine_.step(items_, nonfinite_, st);
    stepped();
    if (clips_by_previous_norm()) {
      if (last_step().applied) carried_.end(by_name());
      else carried_.discard();  // a rejected step changes nothing
    } else {
      carried_.clear();
    }
    if (nonfinite_ == NonFinitePolicy::raise) {
      const StepReport& r = last_step();
      if (!r.applied) throw NonFiniteGradientError(*r.nonfinite);
    }
  }

  /// What the last step did (applied, or skipped and why); before any step,
  /// an applied report. Waits for a device.
  const StepReport& last_step() const {
    if (!last_known_) {
      const std::optional<Offender> bad = engine_.outcome();
      last_ = StepReport{};
      last_.stepped = last_stepped_;
      if (bad) {
        last_.applied = false;
        last_.nonfinite = describe(*bad);
      }
      last_known_ = true;
    }
    return last_;
  }

  /// Number of step() calls applied so far (and of steps finished with
  /// finish_step()).
  std::int64_t steps() const {
    refresh_counts();
    return steps_;
  }

  // ------------------------------------------------ the step inside backward
  /// Steps one parameter now, with its present gradient, exactly as the
  /// whole step() would, so that the caller can free that gradient at once:
  /// a backward hook calls it as soon as a gradient is complete, and
  /// finish_step() ends the optimizer step once backward is done. The first
  /// step(ParamId) opens the optimizer step number steps() + 1, whose lr
  /// schedule value every parameter of it is stepped with; each parameter
  /// is stepped at most once in it. A parameter's update reads only its own
  /// gradient, state and count, so every rule gives the whole step's bits.
  ///
  /// What needs every gradient of the step is refused (std::invalid_argument,
  /// nothing changes; check_step_inside_backward() says it up front):
  /// max_grad_norm and a pending clip_grad_norm() scale, the global gradient
  /// norm. The rules' own update clipping is per tensor
  /// and is unchanged. Non-finite gradients are handled tensor by tensor
  /// (nonfinite.hpp): under skip_step the offending tensor alone is skipped,
  /// and finish_step() reports it; under raise this call throws and the
  /// tensor is unchanged. While a step is open, step(), capture_step(),
  /// export_state(), import_state() and checkpoints are refused
  /// (std::logic_error). Sharded: collective; every rank steps the same
  /// parameters in the same order, and a cut matrix's exchanges happen within
  /// its own call. On a device backend the call does not wait for the device
  /// under skip_step or unchecked: the tensors' verdicts stay on the device
  /// until finish_step() reads them, once.
  void step(ParamId id) {
    const std::size_t i = index_of(id);
    const Entry& e = entries_[i];
    check_step_inside_backward();
    if (!e.grad.present())
      throw std::invalid_argument("grad of '" + e.name + "': absent (set_grad() before step(ParamId))");
    if (inside_.stepped(i))
      throw std::invalid_argument("param '" + e.name +
                                  "': already stepped in this optimizer step (a parameter is stepped once per "
                                  "step inside backward; finish_step() ends it)");
    if (!inside_.open()) (void)last_step();  // the previous step's report, before this step replaces the engine's
    // the open step's number (steps() does not count it until finish_step())
    std::optional<std::int64_t> number = inside_.number();
    if (has_schedule() && !number) number = steps() + 1;
    StepSettings st = settings(hyperparameters_at(has_schedule() ? *number : 0));
    st.counts_step = false;
    const bool previous = clips_by_previous_norm();
    // (whether the step measures cannot change while it is open: the clip
    // settings and the norm are refused or fixed until finish_step())
    const bool measuring = measures_norm();
    if (!inside_.open()) {
      if (!measuring) engine_.begin_open_step(nonfinite_);
      if (previous) carried_.begin(entries_.size());
    }
    if (measuring) {  // no norm yet: this step measures it, and changes nothing else
      if (e.param.numel() > 0) {
        const StepItem one = item(i);
        const double sum = engine_.grad_sum_squares(std::span(&one, 1));
        if (std::isfinite(sum)) carried_.record(i, sum);
      }
      inside_.stepped_one(i, entries_.size(), number, st);
      return;
    }
    double sum_squares = 0.0;
    if (e.param.numel() > 0) {
      const StepItem one = item(i);
      if (previous) sum_squares = engine_.grad_sum_squares(std::span(&one, 1));
      engine_.step(std::span<const StepItem>(&one, 1), nonfinite_, st);
      counts_known_ = false;
    }
    inside_.stepped_one(i, entries_.size(), number, st);  // opened once something has been stepped
    if (nonfinite_ == NonFinitePolicy::raise && e.param.numel() > 0) {
      if (const std::optional<Offender> bad = engine_.outcome()) {
        inside_.unstep(i);  // unchanged: it may be stepped again
        throw NonFiniteGradientError(describe(*bad));
      }
    }
    // a tensor skipped for a non-finite gradient leaves no sum (E8)
    if (previous && (nonfinite_ != NonFinitePolicy::skip_step || e.param.numel() == 0 || !engine_.outcome()))
      carried_.record(i, sum_squares);
  }

  /// Throws what step(ParamId) would refuse whatever the parameter: the
  /// settings that need every gradient of the step (max_grad_norm, a pending
  /// clip_grad_norm() scale). A framework calls it when the step inside
  /// backward is turned on, before any backward.
  void check_step_inside_backward() const {
    if (max_grad_norm_ > 0 && clip_norm_ == ClipNorm::current)
      throw std::invalid_argument(
          "max_grad_norm: global gradient-norm clipping by this step's norm needs every gradient of the step, "
          "which the step inside backward does not wait for; clip by the previous step's norm "
          "(ClipNorm::previous), set it to 0, or step after backward");
    if (grad_scale_ != 1.0)
      throw std::invalid_argument(
          "clip_grad_norm: its scale needs every gradient of the step, which the step inside backward does not "
          "wait for; clip with the step after backward");
  }

  /// Ends the optimizer step that step(ParamId) opened: counts it (steps()
  /// advances by one, the lr schedule moves on) and returns its report, which
  /// last_step() gives from now on: applied unless a tensor was skipped for a
  /// non-finite gradient, with the first such tensor and their number; the
  /// tensors it stepped and the parameters it did not. `how`: whether
  /// backward ran to its end, or raised part way (StepEnd::interrupted: the
  /// tensors stepped before stay stepped, and the report says it was cut
  /// short). On a device backend it reads the tensors' verdicts (waits).
  /// Sharded: collective. std::logic_error when no step is open.
  StepReport finish_step(StepEnd how = StepEnd::completed) {
    if (!inside_.open()) throw std::logic_error("finish_step: no step is open (step(ParamId) opens one)");
    const bool measured = measures_norm();  // it only measured the norm (E8): nothing to count
    OpenVerdicts v;
    if (!measured) {
      v = engine_.open_verdicts();
      StepSettings st = inside_.settings();
      st.counts_step = true;
      engine_.step(std::span<const StepItem>(), NonFinitePolicy::unchecked, st);
      counts_known_ = false;
    }
    if (clips_by_previous_norm()) carried_.end(by_name());
    else carried_.clear();
    last_ = StepReport{};
    last_.measured = measured;
    if (measured) last_.applied = false;
    if (v.first) {
      last_.applied = false;
      last_.nonfinite = describe(*v.first);
      last_.skipped = v.skipped;
    }
    last_.interrupted = how == StepEnd::interrupted;
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      if (inside_.stepped(i)) ++last_.stepped;
      else last_.not_stepped.push_back(entries_[i].name);
    }
    last_known_ = true;
    inside_.close();
    return last_;
  }
  /// Whether step(ParamId) has opened an optimizer step that finish_step()
  /// has not ended yet.
  bool step_open() const noexcept { return inside_.open(); }
  /// Whether parameter id has been stepped in the open optimizer step.
  bool stepped_in_open_step(ParamId id) const {
    const std::size_t i = index_of(id);
    return inside_.stepped(i);
  }
  /// std::logic_error naming `what` while an optimizer step is open.
  void check_no_open_step(std::string_view what) const {
    if (inside_.open())
      throw std::logic_error(std::string(what) +
                             ": a step inside backward is open (step(ParamId)); finish_step() ends it first");
  }

  // ------------------------------------------------------ CUDA graphs
  /// Records one step of the parameters that have a gradient now, for
  /// replay(): a CUDA graph on the optimizer's stream (OptimizerOptions::
  /// stream; the default stream cannot be captured). The capture itself
  /// steps nothing. A replay reads the gradients' memory the capture saw,
  /// the hyperparameters set at the time of the replay (set_lr between
  /// replays works; a host lr schedule does not, as it needs the step count:
  /// read the lr from device memory instead, set_lr_device) and the counts on
  /// the device; it is refused once the optimizer's tables change (a
  /// parameter added, a gradient's dtype changed, a state imported). Not
  /// under NonFinitePolicy::raise, which needs the host inside every step.
  StepGraph capture_step() requires graphs {
    check_no_open_step("capture_step");
    check_no_previous_norm("capture_step");
    if (nonfinite_ == NonFinitePolicy::raise)
      throw std::invalid_argument(
          "nonfinite policy: raise needs the host inside every step; a captured step can skip_step or be unchecked");
    check_no_schedule();
    const PerTier<Hyperparameters> h = hyperparameters_at(0);
    gather_items();
    return engine_.capture(items_, nonfinite_, settings(h));
  }
  /// Runs a step captured by capture_step() on the optimizer's stream: one
  /// more step, with the same report, counts and clipping as step().
  void replay(const StepGraph& g) requires graphs {
    check_no_open_step("replay");
    check_no_previous_norm("replay");
    if (g.policy() != nonfinite_)
      throw std::invalid_argument("graph: captured under nonfinite policy " +
                                  std::string(nonfinite_policy_name(g.policy())) + ", the optimizer's is now " +
                                  std::string(nonfinite_policy_name(nonfinite_)) + " (capture again)");
    if (g.clips_each_step() != (max_grad_norm_ > 0))
      throw std::invalid_argument(std::string("graph: captured ") + (g.clips_each_step() ? "with" : "without") +
                                  " max_grad_norm, which is now " + (max_grad_norm_ > 0 ? "set" : "off") +
                                  " (capture again)");
    check_no_schedule();
    const PerTier<Hyperparameters> h = hyperparameters_at(0);
    gather_items();
    if (const std::optional<ReplayProblem> p = engine_.replay_problem(g, items_)) {
      if (p->index < 0)
        throw std::invalid_argument(
            "graph: captured before the optimizer changed (a parameter added, a gradient's dtype changed or a state "
            "imported); capture again");
      throw std::invalid_argument("grad of '" + entries_[static_cast<std::size_t>(p->index)].name +
                                  "': not the gradient the graph was captured with (a replay reads the same memory, "
                                  "with the same dtype; capture again)");
    }
    engine_.replay(g, items_, settings(h));
    stepped();
  }
  /// From now on each tier's lr is read from lr[tier_index] in device memory
  /// as each step (or replay) runs; null: from the hyperparameters again.
  void set_lr_device(const double* lr) requires graphs { engine_.backend().set_lr_device(lr); }
  /// Waits until every step enqueued so far has finished (a device backend).
  void synchronize() const requires requires(const Backend& b) { b.synchronize(); } { engine_.backend().synchronize(); }

  // ----------------------------------------------------------------- state
  /// Optimizer state bytes (docs/spec.md §2), total and per tier; sharded:
  /// held by this rank.
  index_t state_bytes() const noexcept {
    index_t b = 0;
    for (std::size_t i = 0; i < entries_.size(); ++i) b += engine_.state_bytes(i);
    return b;
  }
  index_t state_bytes(Tier t) const noexcept {
    index_t b = 0;
    for (std::size_t i = 0; i < entries_.size(); ++i)
      if (entries_[i].tier == t) b += engine_.state_bytes(i);
    return b;
  }
  std::uint64_t seed() const noexcept { return seed_; }
  /// Memory the backend holds besides the state (its scratch and tables).
  index_t scratch_bytes() const noexcept { return engine_.scratch_bytes(); }
  /// Device memory the optimizer holds, on a backend whose memory is a
  /// device's (the CUDA backend): its state, its scratch and its step tables,
  /// so that device_bytes() - state_bytes() is what it costs beyond its
  /// state; sharded: this rank's.
  index_t device_bytes() const noexcept
    requires requires(const engine_type& e) { e.device_bytes(); }
  {
    return engine_.device_bytes();
  }

  /// The engine: the placement's and backend's own members.
  engine_type& engine() noexcept { return engine_; }
  const engine_type& engine() const noexcept { return engine_; }

  // ------------------------------------------------ sharded placement only
  communicator_type& comm() const noexcept requires sharded { return engine_.placement().comm(); }
  int rank() const noexcept requires sharded { return engine_.placement().rank(); }
  int ranks() const noexcept requires sharded { return engine_.placement().ranks(); }
  /// How the parameter is split over the ranks.
  decltype(auto) split(ParamId id) const requires sharded { return engine_.split(index_of(id)); }
  /// What this rank owns of it.
  decltype(auto) pieces(ParamId id) const requires sharded { return engine_.pieces(index_of(id)); }
  /// This rank's share of its state: the pieces' rows or elements in piece
  /// order; v_col holds c values per piece (factored).
  ParamStateView local_state(ParamId id) const requires sharded {
    ParamStateView v = engine_.view(index_of(id));
    refresh_counts();
    v.step = entry(id).step;
    return v;
  }
  /// Completes every rank's parameter buffers from their owners (collective).
  void gather_params() requires sharded {
    for (std::size_t i = 0; i < entries_.size(); ++i) engine_.gather_param(i, entries_[i].param);
  }
  void gather_param(ParamId id) requires sharded { engine_.gather_param(index_of(id), entry(id).param); }
  /// Every rank's state_bytes(), in rank order (collective).
  std::vector<index_t> state_bytes_per_rank() requires sharded {
    const index_t mine = state_bytes();
    std::vector<index_t> all(static_cast<std::size_t>(ranks()));
    dist::all_gather_values<communicator_type, index_t>(comm(), std::span<const index_t>(&mine, 1), all);
    return all;
  }
  /// Bytes this rank put into the exchanges of its last step (it receives
  /// ranks() times as much): 32 bytes of agreement and non-finite check, then
  /// exchange_bytes() (shard_plan.hpp) of each stepped tensor. Parameters and
  /// gradients are not included.
  index_t last_step_exchange_bytes() const noexcept requires sharded { return engine_.last_exchange_bytes(); }

 protected:
  /// add(): registers the parameter with the kernels `pick` gives it, once
  /// every argument is checked.
  ParamId add_param(std::string_view name, Tier tier, const ParamView& param, const GradView& grad,
                    KernelPicker pick) {
    if (name.empty()) throw std::invalid_argument("name: a parameter name must not be empty");
    if (index_.count(std::string(name)))
      throw std::invalid_argument("name: parameter '" + std::string(name) + "' is already registered");
    checked_tier(tier, "tier of '" + std::string(name) + "'");
    detail::check_param(name, param);
    detail::check_grad(name, param, grad);
    engine_.check_memory(name, param, grad);
    check_disjoint(name, param, grad);

    const ParamId id{static_cast<index_t>(entries_.size())};
    Entry e;
    e.name = std::string(name);
    e.tier = tier;
    e.param = param;
    e.grad = grad;
    e.id = tensor_id(name);
    const TierFacts& facts = tier_facts(tier);
    engine_.add(TensorRegistration{id.index, tier, facts.layout, param, facts.clip},
                pick(tier, param.shape.rank() < 2, param.dtype));
    try {
      entries_.push_back(std::move(e));
      index_.emplace(entries_.back().name, id.index);
      const auto [lo, hi] = byte_range(param.data, param.numel(), param.dtype);
      if (lo != hi) memory_.emplace(lo, std::pair{hi, id.index});
    } catch (...) {
      index_.erase(std::string(name));
      if (entries_.size() > static_cast<std::size_t>(id.index)) entries_.pop_back();
      engine_.pop_back();
      throw;
    }
    return id;
  }

 private:
  struct Entry {
    std::string name;
    Tier tier = Tier::backbone;
    ParamView param;
    GradView grad;
    std::uint32_t id = 0;    ///< rounding stream
    mutable std::int64_t step = 0;   ///< updates received (once refresh_counts())
  };

  /// Reads the counts from the engine once they may have changed.
  void refresh_counts() const {
    if (counts_known_) return;
    std::vector<std::int64_t> c(entries_.size());
    steps_ = engine_.counts(c);
    for (std::size_t i = 0; i < entries_.size(); ++i) entries_[i].step = c[i];
    counts_known_ = true;
  }
  /// After a step or replay was enqueued.
  void stepped() noexcept {
    last_stepped_ = static_cast<index_t>(items_.size());
    counts_known_ = false;
    last_known_ = false;
    grad_scale_ = 1.0;
    if (max_grad_norm_ > 0) last_norm_known_ = false;
  }
  /// items_: every parameter with a gradient.
  void gather_items() {
    items_.clear();
    for (std::size_t i = 0; i < entries_.size(); ++i)
      if (entries_[i].grad.present() && entries_[i].param.numel() > 0) items_.push_back(item(i));
  }
  StepSettings settings(const PerTier<Hyperparameters>& h) const {
    StepSettings st;
    for (Tier t : all_tiers) st.hyper[static_cast<std::size_t>(tier_index(t))] = h[t];
    st.grad_scale = grad_scale_;
    st.seed = seed_;
    st.max_norm = max_grad_norm_;
    if (clips_by_previous_norm()) {  // E8: a scale known before the step, as clip_grad_norm()'s
      st.grad_scale = carried_.scale(max_grad_norm_);
      st.max_norm = 0;
    }
    return st;
  }
  /// Whether the next step, clipping by the previous step's norm, has none
  /// and so measures it (E8).
  bool measures_norm() const noexcept { return clips_by_previous_norm() && std::isnan(carried_.norm()); }
  /// Every parameter's index, in the order of their names (E8's sum).
  std::span<const std::size_t> by_name() {
    if (by_name_.size() != entries_.size()) {
      by_name_.resize(entries_.size());
      for (std::size_t i = 0; i < by_name_.size(); ++i) by_name_[i] = i;
      std::sort(by_name_.begin(), by_name_.end(),
                [&](std::size_t a, std::size_t b) { return entries_[a].name < entries_[b].name; });
    }
    return by_name_;
  }
  void check_no_previous_norm(std::string_view what) const {
    if (clips_by_previous_norm())
      throw std::invalid_argument(std::string(what) +
                                  ": max_grad_norm clips by the previous step's norm (ClipNorm::previous), which a "
                                  "captured step would not follow; clip by the current norm to capture");
  }
  void check_no_schedule() const {
    if (has_schedule())
      throw std::invalid_argument(
          "lr schedule: a captured step cannot call a host function (it needs the step count); set_lr() between "
          "replays, or read the lr from device memory (set_lr_device)");
  }

  StepItem item(std::size_t i) const {
    const Entry& e = entries_[i];
    return StepItem{static_cast<index_t>(i), e.tier, e.param, e.grad, e.id};
  }

  void check_header(const std::array<Hyperparameters, tier_count>& hyper, std::int64_t steps) const {
    if (steps < 0) throw std::invalid_argument("state.steps = " + std::to_string(steps) + ": must be >= 0");
    for (Tier t : all_tiers)
      validate(hyper[static_cast<std::size_t>(tier_index(t))], "state.hyperparameters." + std::string(tier_name(t)));
  }

  NonFiniteGradient describe(const Offender& o) const {
    const Entry& e = entries_[static_cast<std::size_t>(o.index)];
    NonFiniteGradient r;
    r.param = ParamId{o.index};
    r.name = e.name;
    r.shape = e.param.shape;
    r.element = o.element;
    r.value = o.value;
    return r;
  }

  std::size_t index_of(ParamId id) const {
    (void)entry(id);  // checks it
    return static_cast<std::size_t>(id.index);
  }

  Entry& entry(ParamId id) {
    if (id.index < 0 || id.index >= size())
      throw std::invalid_argument("param id " + std::to_string(id.index) + ": no such parameter");
    return entries_[static_cast<std::size_t>(id.index)];
  }
  const Entry& entry(ParamId id) const { return const_cast<OptimizerBase*>(this)->entry(id); }

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

  const TierTable* table_;
  engine_type engine_;
  std::vector<Entry> entries_;
  std::unordered_map<std::string, index_t> index_;
  /// Registered parameters' memory: first byte -> (end, entry index).
  std::map<std::uintptr_t, std::pair<std::uintptr_t, index_t>> memory_;
  std::uint64_t seed_ = 0;
  mutable std::int64_t steps_ = 0;  ///< once refresh_counts()
  mutable bool counts_known_ = true;
  mutable StepReport last_;
  mutable bool last_known_ = true;
  index_t last_stepped_ = 0;  ///< tensors the last whole step took
  double grad_scale_ = 1.0;
  NonFinitePolicy nonfinite_ = NonFinitePolicy::skip_step;
  double max_grad_norm_ = 0;
  ClipNorm clip_norm_ = ClipNorm::current;
  CarriedNorm carried_;  ///< the norm of the last step under ClipNorm::previous (E8)
  std::vector<std::size_t> by_name_;  ///< by_name()'s, once the parameters are all registered
  mutable double last_norm_ = std::numeric_limits<double>::quiet_NaN();
  mutable bool last_norm_known_ = true;
  /// Reused by every step; grows with the number of tensors, never with their size.
  std::vector<StepItem> items_;
  // the step inside backward (step(ParamId), finish_step())
  StepInsideBackward inside_;
};

/// The optimizer: OptimizerBase (every member above) with the rules Tiers
/// gives each tier. Registering a parameter picks its kernels, which is
/// what depends on Tiers; the rest is the base's, shared by every alias.
template <class Tiers = SkewAdamTiers, class Backend = backend::DefaultBackend, class Placement = Local>
class Optimizer : public OptimizerBase<Backend, Placement> {
  using Base = OptimizerBase<Backend, Placement>;
  using typename Base::kernel_pair;

 public:
  using tiers = Tiers;
  using typename Base::communicator_type;
  static constexpr bool sharded = Base::sharded;

  // ------------------------------------------------------------ construction
  Optimizer() requires(!sharded) : Optimizer(Hyperparameters{}) {}
  explicit Optimizer(const Hyperparameters& all, OptimizerOptions options = {}) requires(!sharded)
      : Optimizer(PerTier<Hyperparameters>{all, all, all}, options) {}
  explicit Optimizer(const PerTier<Hyperparameters>& per_tier, OptimizerOptions options = {}) requires(!sharded)
      : Base(TierTable::of<Tiers>(), per_tier, options) {}

  /// A sharded optimizer over the ranks of `comm` (which must outlive it).
  Optimizer(communicator_type& comm, const Hyperparameters& all, OptimizerOptions options = {},
            typename Placement::options_type shard = {}) requires sharded
      : Optimizer(comm, PerTier<Hyperparameters>{all, all, all}, options, shard) {}
  Optimizer(communicator_type& comm, const PerTier<Hyperparameters>& per_tier, OptimizerOptions options = {},
            typename Placement::options_type shard = {}) requires sharded
      : Base(TierTable::of<Tiers>(), comm, per_tier, options, shard) {}

  // ------------------------------------------------------------ parameters
  /// Registers a parameter (once) under a tier; allocates its state. Sharded:
  /// every rank registers the same list (names, tiers, shapes, order) with
  /// views of full-size buffers, and keeps the state of its share.
  ///
  /// Typed views (TensorView<P>, and a gradient of P or float) compile the
  /// kernels of P alone; ParamView and GradView, whose dtype is known at run
  /// time, compile every dtype's. (A gradient of another type is refused at
  /// run time, as with GradView.)
  template <class P, class G = const P>
  ParamId add(std::string_view name, Tier tier, TensorView<P> param, TensorView<G> grad = {}) {
    static_assert(!std::is_const_v<P>, "skewadam: a parameter's view must be mutable (TensorView<T>, not <const T>)");
    return this->add_param(name, tier, ParamView(param), GradView(grad), &kernels_of<P>);
  }
  template <class P, class G = const P>
  ParamId add(std::string_view name, std::string_view tier, TensorView<P> param, TensorView<G> grad = {}) {
    return add(name, parse_tier(tier, "tier of '" + std::string(name) + "'"), param, grad);
  }
  ParamId add(std::string_view name, Tier tier, ParamView param, GradView grad = {}) {
    return this->add_param(name, tier, param, grad, &kernels_of_dtype);
  }
  ParamId add(std::string_view name, std::string_view tier, ParamView param, GradView grad = {}) {
    return add(name, parse_tier(tier, "tier of '" + std::string(name) + "'"), param, grad);
  }

 private:
  /// The kernels of tier t's rule (its rank-1 rule for a vector) for
  /// parameters of element type P: only what is named here is compiled, so a
  /// caller that knows P pays for P's kernels alone.
  template <class P>
  static kernel_pair kernels_of(Tier tier, bool rank1, Dtype) {
    return visit_rule<Tiers>(tier, rank1, []<class Rule>() {
      return kernel_pair{Backend::template kernels<Rule, P, P>(), Backend::template kernels<Rule, P, float>()};
    });
  }
  /// The same for a dtype known at run time: every dtype's kernels.
  static kernel_pair kernels_of_dtype(Tier tier, bool rank1, Dtype param) {
    return visit_dtype(param, [&]<class P>() { return kernels_of<P>(tier, rank1, param); });
  }
};

// ----------------------------------------------------------------- variants
// SkewAdam, SkewAdamBf16Momentum, SkewAdam8bit, the ablations, AdafactorLike
// and AdamW: Optimizer<Tiers> of each variant of the list (variants.hpp).
SKEWADAM_VARIANT_ALIASES()

}  // namespace skewadam
