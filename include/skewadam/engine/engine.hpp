#pragma once
// Engine<Backend, Placement>: the step skeleton, written once for every
// backend and placement, under the optimizer front-end (optimizer.hpp). It
// knows no rule: each tensor comes with its kernels, its state layout and
// its update clipping (TensorRegistration), so one engine serves every tier
// alias.
//
// The placement decides what of each tensor this process steps (its pieces,
// engine/backend/backend.hpp) and the exchanges between the passes; the
// engine owns the state, in the backend's memory (StateStore, over the
// backend's memory policy), and the backend runs the passes over the pieces.
// One step:
//
//   scan        backend.check: the non-finite policy's scan (the backend's
//               one strategy; it may leave the decision on its device)
//   agree       placement.agree: the processes agree on the stepped tensors
//               and the first offender; a rejected step changes nothing
//   statistics  Pass::statistics
//   exchange    the cut matrices' column sums and sums of R_i, summed over
//               the processes (placement.add_over_ranks), where a matrix is cut
//   finish      Pass::finish: C_j, vbar, the sums of u^2
//   exchange    where the placement forms the clip divisors: the sums of u^2
//               over the processes, then every clipped tensor's divisors
//   apply       Pass::apply
//   count       Pass::count: every stepped tensor's count, and the step's
//
// The passes between two exchanges go to the backend together
// (backend.run(passes)), which may fuse them: with no exchange at all (the
// local placement) one call runs the whole step.
//
// Step counts live in the backend's memory (on the device for the CUDA
// backend), and each tensor's scalars and rounding key are formed there from
// its own count, so the front-end has one step() path whatever the backend:
// it asks counts() and outcome() when it needs them. Under the local placement no
// pass needs the host once a step is enqueued, which is what lets a device
// backend capture it (capture(), replay()).

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../detail/config.hpp"
#include "../math/step_scalars.hpp"
#include "../rules/clip_divisors.hpp"
#include "../state/param_state.hpp"
#include "../types/dtype.hpp"
#include "backend/backend.hpp"
#include "engine_types.hpp"
#include "nonfinite.hpp"
#include "optimizer_options.hpp"
#include "pieces.hpp"
#include "state_store.hpp"

namespace skewadam {

namespace detail {
/// std::invalid_argument naming who and the array unless `got` has exactly
/// the sizes `have` (m, v, v_row, v_col).
inline void check_array_sizes(const std::array<std::size_t, 4>& have, const ParamState& got, const std::string& who) {
  const std::array<std::size_t, 4> sizes{got.m.size(), got.v.size(), got.v_row.size(), got.v_col.size()};
  constexpr const char* names[4] = {"m", "v", "v_row", "v_col"};
  for (std::size_t k = 0; k < 4; ++k)
    if (have[k] != sizes[k])
      throw std::invalid_argument(who + ": " + names[k] + " has " + std::to_string(sizes[k]) + " values, expected " +
                                  std::to_string(have[k]));
}
}  // namespace detail

template <class Backend, class Placement>
class Engine {
  static_assert(backend::Backend<Backend>,
                "skewadam::Engine: the backend does not provide the members of backend::Backend (engine/backend/backend.hpp)");

 public:
  using backend_type = Backend;
  using placement_type = Placement;
  using memory_type = typename Backend::memory_type;
  using staged_type = typename StateStore<memory_type>::Staged;

  explicit Engine(const OptimizerOptions& options) requires(!Placement::sharded)
      : backend_(options), store_(memory()) {}
  Engine(typename Placement::communicator_type& comm, const OptimizerOptions& options,
         typename Placement::options_type shard) requires(Placement::sharded)
      : placement_(comm, shard), backend_(options), store_(memory()) {}
  Engine(Engine&&) = default;
  Engine& operator=(Engine&&) = default;
  /// Frees the state once the backend's work on it is done, with its device
  /// current.
  ~Engine() {
    try {
      const memory_type m = memory();
      [[maybe_unused]] const auto on = m.scope();
      m.wait();
      store_.clear();
    } catch (...) {  // a destructor reports nothing; the memory is freed regardless
      store_.clear();
    }
  }

  /// The backend's memory, where the state is (its memory policy).
  memory_type memory() const { return backend_.memory(); }

  Backend& backend() noexcept { return backend_; }
  const Backend& backend() const noexcept { return backend_; }
  Placement& placement() noexcept { return placement_; }
  const Placement& placement() const noexcept { return placement_; }

  // ---------------------------------------------------------- registration
  void check_memory(std::string_view name, const ParamView& p, const GradView& g) const {
    memory().check(name, p, g);
  }
  using kernels_type = typename Backend::kernels_type;

  /// Allocates a tensor's state (its pieces') in the backend's memory, and
  /// hands the backend its pieces with its kernels: for a gradient of the
  /// parameter's dtype, and for an fp32 one (Backend::kernels<Rule, P,
  /// G>()); strong guarantee.
  void add(const TensorRegistration& spec, const std::array<kernels_type, 2>& kernels) {
    Tensor t;
    t.tier = spec.tier;
    t.momentum = spec.layout.momentum;
    t.clip = spec.clip;
    t.split = placement_.split(spec.tier, spec.param.shape, spec.layout);
    t.pieces = t.split.pieces(placement_.rank());
    t.cut = t.split.factored && t.split.cuts_matrices();  // on every rank alike: the exchanges are collective
    t.clip_at = clip_count_;
    t.cut_at = cut_count_;
    try {
      tensors_.reserve(tensors_.size() + 1);
      const memory_type m = memory();
      [[maybe_unused]] const auto on = m.scope();
      const std::vector<backend::PieceSpec> specs = piece_specs(t);
      store_.add(m, spec.layout, specs);
      try {
        backend_.add(spec, specs, kernels, store_.pieces(store_.size() - 1));
      } catch (...) {
        store_.pop_back();
        throw;
      }
    } catch (...) {
      placement_.unsplit(t.split);
      throw;
    }
    clip_count_ += static_cast<index_t>(t.pieces.size());
    if (t.cut) cut_count_ += static_cast<index_t>(t.pieces.size()) * (t.split.geom.cols + 1);
    tensors_.push_back(std::move(t));
  }
  void pop_back() noexcept {
    const Tensor& t = tensors_.back();
    clip_count_ = t.clip_at;
    cut_count_ = t.cut_at;
    placement_.unsplit(t.split);
    backend_.pop_back();
    store_.pop_back();
    tensors_.pop_back();
  }

  const TensorSplit& split(std::size_t i) const { return tensors_[i].split; }
  std::span<const Piece> pieces(std::size_t i) const { return tensors_[i].pieces; }

  // ---------------------------------------------------------------- state
  /// This process's share of tensor i's state, viewed where it lives.
  ParamStateView view(std::size_t i) const { return store_.view(i); }
  /// A host copy of tensor i's complete state (sharded: collective).
  ParamState export_arrays(std::size_t i) const {
    const memory_type m = memory();
    [[maybe_unused]] const auto on = m.scope();
    ParamState s = store_.share(m, i);
    placement_.complete(tensors_[i].split, tensors_[i].momentum, s);
    return s;
  }
  /// f(ParamStateView of tensor i's complete state), without a copy where the
  /// state is complete in host memory (sharded: collective).
  template <class F>
  decltype(auto) with_complete_arrays(std::size_t i, F&& f) const {
    if constexpr (memory_type::host && !Placement::sharded) {
      return f(store_.view(i));
    } else {
      const ParamState s = export_arrays(i);
      return f(ParamStateView{s.m, s.v, s.v_row, s.v_col, 0});
    }
  }
  /// f(host bytes of tensor i's complete parameter p), without a copy where
  /// the parameter is complete in host memory (sharded: collective).
  template <class F>
  decltype(auto) with_complete_param(std::size_t i, const ParamView& p, F&& f) const {
    const std::size_t elem = static_cast<std::size_t>(dtype_size(p.dtype));
    const std::size_t n = static_cast<std::size_t>(p.numel()) * elem;
    if constexpr (memory_type::host && !Placement::sharded) {
      return f(static_cast<const std::byte*>(p.data));
    } else {
      std::vector<std::byte> host(n);
      {
        const memory_type m = memory();
        [[maybe_unused]] const auto on = m.scope();
        m.read(host.data(), p.data, n);
      }
      if constexpr (Placement::sharded) placement_.gather_param(tensors_[i].split, host.data(), elem);
      return f(static_cast<const std::byte*>(host.data()));
    }
  }
  void check_arrays(std::size_t i, const ParamState& got, const std::string& who) const {
    const FullSizes w = full_sizes(tensors_[i].split, tensors_[i].momentum);
    detail::check_array_sizes({w.m, w.v, w.v_row, w.v_col}, got, who);
  }
  staged_type stage_begin() const { return store_.stage_begin(); }
  /// Takes this process's share of tensor i's complete arrays.
  void stage(staged_type& staged, std::size_t i, ParamState&& full) const {
    placement_.share_of(tensors_[i].split, tensors_[i].momentum, full);
    const memory_type m = memory();
    [[maybe_unused]] const auto on = m.scope();
    store_.stage(m, staged, i, std::move(full));
  }
  void stage_counts(staged_type& staged, std::span<const std::int64_t> counts, std::int64_t steps) const {
    const memory_type m = memory();
    [[maybe_unused]] const auto on = m.scope();
    store_.stage_counts(m, staged, counts, steps);
  }
  /// Swaps the staged arrays and counts in, and points the backend at them.
  void commit(staged_type&& staged) noexcept {
    store_.commit(staged);
    for (std::size_t i = 0; i < tensors_.size(); ++i)
      if (staged.arrays[i]) backend_.point(i, staged.pieces[i]);
  }
  /// Every tensor's count into out, and the applied steps.
  std::int64_t counts(std::span<std::int64_t> out) const {
    const memory_type m = memory();
    [[maybe_unused]] const auto on = m.scope();
    return store_.counts(m, out);
  }
  index_t state_bytes(std::size_t i) const noexcept { return store_.bytes(i); }
  /// Memory held besides the state arrays: the backend's (scratch, tables)
  /// and the step counts.
  index_t scratch_bytes() const noexcept { return backend_.scratch_bytes() + store_.counts_bytes(); }
  /// Every byte of device memory the backend holds (the state and the
  /// rest), on a backend whose memory is a device's.
  index_t device_bytes() const noexcept requires(!memory_type::host) {
    index_t b = scratch_bytes();
    for (std::size_t i = 0; i < tensors_.size(); ++i) b += store_.bytes(i);
    return b;
  }

  /// Completes every process's copy of tensor i's parameter from its owners.
  void gather_param(std::size_t i, const ParamView& p) requires(Placement::sharded) {
    const std::size_t elem = static_cast<std::size_t>(dtype_size(p.dtype));
    if constexpr (memory_type::host) {
      placement_.gather_param(tensors_[i].split, static_cast<std::byte*>(p.data), elem);
    } else {  // through a host copy
      std::vector<std::byte> host(static_cast<std::size_t>(p.numel()) * elem);
      const memory_type m = memory();
      [[maybe_unused]] const auto on = m.scope();
      m.read(host.data(), p.data, host.size());
      placement_.gather_param(tensors_[i].split, host.data(), elem);
      m.write(p.data, host.data(), host.size());
    }
  }
  /// Bytes this process put into the exchanges of its last step.
  index_t last_exchange_bytes() const noexcept { return exchanged_; }

  // ----------------------------------------------------------------- step
  /// Sum of g^2 over the listed gradients, in double, in an order fixed by
  /// the shapes (sharded: collective, the processes' sums in rank order).
  double grad_sum_squares(std::span<const StepItem> items) const {
    [[maybe_unused]] const auto on = on_device();
    return placement_.sum_over_ranks(backend_.grad_sum_squares(items));
  }

  /// One step of the listed tensors (see the top of this file).
  void step(std::span<const StepItem> items, NonFinitePolicy policy, StepSettings settings) {
    [[maybe_unused]] const auto on = on_device();
    begin_step(items);
    if (settings.max_norm > 0 && placement_.ranks() > 1) {
      norm_sq_ = grad_sum_squares(items);  // the backend clips alone only what is all in this process
      settings.grad_scale = step_grad_scale(settings.grad_scale, settings.max_norm, *norm_sq_);
      settings.max_norm = 0;
    }
    settings.counts = store_.counts();
    settings_ = settings;
    backend_.prepare(items, settings);
    enqueue(policy);
    if (open_ && !items.empty()) keep_verdict();
  }

  /// An optimizer step taken inside backward begins: from now on each
  /// step()'s verdict under skip_step is kept (on the device, for a backend
  /// that can fold it there: no wait) until open_verdicts() reads them.
  void begin_open_step(NonFinitePolicy policy) {
    open_ = policy == NonFinitePolicy::skip_step;
    open_host_ = OpenVerdicts{};
    open_on_device_ = false;
    if constexpr (folds_verdicts) {
      if (open_ && !Placement::sharded) {
        [[maybe_unused]] const auto on = on_device();
        backend_.begin_verdicts();
        open_on_device_ = true;
      }
    }
  }
  /// The verdicts kept since begin_open_step() (one wait for a device), and
  /// the end of keeping them.
  OpenVerdicts open_verdicts() {
    OpenVerdicts v = open_host_;
    if constexpr (folds_verdicts) {
      if (open_on_device_) {
        [[maybe_unused]] const auto on = on_device();
        v = backend_.read_verdicts();
      }
    }
    open_ = false;
    open_on_device_ = false;
    open_host_ = OpenVerdicts{};
    return v;
  }

  /// The last step's first offender, when it was rejected (may wait for a device).
  std::optional<Offender> outcome() const {
    if (verdict_.known) return verdict_.offender;
    [[maybe_unused]] const auto on = on_device();
    return backend_.outcome();
  }
  /// The sum of g^2 the last step clipped by (StepSettings::max_norm).
  double clip_sum_squares() const {
    if (norm_sq_) return *norm_sq_;
    [[maybe_unused]] const auto on = on_device();
    return backend_.clip_sum_squares();
  }

  // ------------------------------------------------------------- graphs
  /// One step recorded for replay (a backend with graphs, local placement).
  auto capture(std::span<const StepItem> items, NonFinitePolicy policy, const StepSettings& settings)
    requires(!Placement::sharded && requires { typename Backend::graph_type; })
  {
    [[maybe_unused]] const auto on = on_device();
    begin_step(items);
    settings_ = settings;
    settings_.counts = store_.counts();
    backend_.prepare(items, settings_);
    return backend_.capture(policy, settings.max_norm > 0, [&] { enqueue(policy); });
  }
  template <class Graph>
  std::optional<ReplayProblem> replay_problem(const Graph& g, std::span<const StepItem> items) const {
    return backend_.replay_problem(g, items);
  }
  template <class Graph>
  void replay(const Graph& g, std::span<const StepItem> items, const StepSettings& settings) {
    [[maybe_unused]] const auto on = on_device();
    begin_step(items);
    settings_ = settings;
    settings_.counts = store_.counts();
    backend_.prepare(items, settings_);
    backend_.launch(g);
  }

  void set_threads(int n) { backend_.set_threads(n); }
  int threads() const noexcept { return backend_.threads(); }

 private:
  /// The backend's device current while the result lives.
  auto on_device() const { return memory().scope(); }

  struct Tensor {
    Tier tier = Tier::backbone;
    bool momentum = false;
    UpdateClip clip{};  ///< its rule's update clipping
    bool cut = false;   ///< factored and cut between processes
    TensorSplit split;
    std::vector<Piece> pieces;  ///< this process's, one per matrix
    index_t clip_at = 0;              ///< its first matrix in clip_sums() and divisors()
    index_t cut_at = 0;               ///< its first value in cut_sums()
  };

  /// The backend's pieces of tensor t: each cut matrix's slice alone, or
  /// every matrix this process owns whole as one piece; with their slots
  /// (the only place slots are assigned: one per matrix in clip_sums() and
  /// divisors(), c + 1 per cut matrix in cut_sums(), tensor by tensor).
  std::vector<backend::PieceSpec> piece_specs(const Tensor& t) const {
    std::vector<backend::PieceSpec> out;
    if (t.pieces.empty()) return out;
    const MatrixGeometry& g = t.split.geom;
    const bool f = t.split.factored;
    auto spec = [&](MatrixGeometry geom, index_t first, bool cut, index_t clip_at, index_t cut_at) {
      return backend::PieceSpec{geom, first, f, cut, g.rows, Placement::host_divisors, clip_at, cut ? cut_at : -1};
    };
    if (t.split.cuts_matrices()) {
      for (std::size_t q = 0; q < t.pieces.size(); ++q) {
        const Piece& p = t.pieces[q];
        const auto k = static_cast<index_t>(q);
        out.push_back(spec(f ? MatrixGeometry{1, p.size(), g.cols} : MatrixGeometry{1, 1, p.size()},
                           t.split.first_element(p), f, t.clip_at + k, t.cut_at + k * (g.cols + 1)));
      }
    } else {
      out.push_back(spec(MatrixGeometry{static_cast<index_t>(t.pieces.size()), g.rows, g.cols},
                         t.split.first_element(t.pieces.front()), false, t.clip_at, -1));
    }
    return out;
  }

  /// A backend that keeps the verdicts of an open step on its device.
  static constexpr bool folds_verdicts = requires(Backend& b) {
    b.begin_verdicts();
    b.fold_verdict();
    { b.read_verdicts() } -> std::same_as<OpenVerdicts>;
  };

  /// The verdict of the step just enqueued, into the open step's.
  void keep_verdict() {
    if constexpr (folds_verdicts) {
      if (open_on_device_) {
        backend_.fold_verdict();
        return;
      }
    }
    if (const std::optional<Offender> bad = outcome()) {
      if (!open_host_.first) open_host_.first = bad;
      ++open_host_.skipped;
    }
  }

  void begin_step(std::span<const StepItem> items) {
    exchanged_ = 0;
    norm_sq_.reset();
    verdict_ = backend::Verdict{false, std::nullopt};
    stepped_.clear();
    any_cut_ = false;
    for (const StepItem& it : items) {
      stepped_.push_back(static_cast<std::size_t>(it.index));
      any_cut_ = any_cut_ || tensors_[static_cast<std::size_t>(it.index)].cut;
    }
  }

  /// The passes of a step, once its items are prepared.
  void enqueue(NonFinitePolicy policy) {
    backend_.begin();
    verdict_ = placement_.agree(backend_, backend_.check(policy), stepped_, exchanged_);
    if (verdict_.known && verdict_.offender) {
      backend_.reject();
      return;
    }
    using backend::Pass;
    backend::Passes next = Pass::statistics;
    if (any_cut_) {
      backend_.run(next);
      exchange_statistics();
      next = {};
    }
    next = next | Pass::finish;
    if constexpr (Placement::host_divisors) {
      backend_.run(next);
      exchange_clip();
      next = {};
    }
    backend_.run(next | Pass::apply | Pass::count);
  }

  /// The cut matrices' c column sums and sum of R_i, summed over processes:
  /// one slot of c + 1 per matrix of every stepped cut tensor, zero where
  /// this process owns no rows of it.
  void exchange_statistics() {
    const std::span<double> sums = backend_.cut_sums();
    std::size_t size = 0;
    for (std::size_t i : stepped_)
      if (tensors_[i].cut) size += static_cast<std::size_t>(tensors_[i].split.geom.batch * (tensors_[i].split.geom.cols + 1));
    wire_.assign(size, 0.0);
    // f(this process's c + 1 values of piece q, the matrix's slot on the wire)
    auto each_piece = [&](auto&& f) {
      std::size_t base = 0;
      for (std::size_t i : stepped_) {
        const Tensor& t = tensors_[i];
        if (!t.cut) continue;
        const auto w = static_cast<std::size_t>(t.split.geom.cols + 1);
        for (std::size_t q = 0; q < t.pieces.size(); ++q)
          f(sums.data() + static_cast<std::size_t>(t.cut_at) + q * w,
            wire_.data() + base + static_cast<std::size_t>(t.pieces[q].matrix) * w, w);
        base += static_cast<std::size_t>(t.split.geom.batch) * w;
      }
    };
    each_piece([](const double* mine, double* slot, std::size_t w) { std::copy_n(mine, w, slot); });
    placement_.add_over_ranks(wire_, exchanged_);
    each_piece([](double* mine, const double* slot, std::size_t w) { std::copy_n(slot, w, mine); });
    backend_.set_cut_sums();
  }

  /// Every stepped clipped tensor's divisors, from its matrices' sums of u^2,
  /// summed over processes where its clip scope spans them.
  void exchange_clip() {
    const std::span<const double> sums = backend_.clip_sums();
    const std::span<float> divisors = backend_.divisors();
    auto per_matrix = [&](const Tensor& t) { return settings_.hyper[tier_index(t.tier)].clip_scope == ClipScope::matrix; };
    auto exchanged = [&](const Tensor& t) { return placement_.clip_exchanged(t.split, per_matrix(t)); };
    wire_.clear();
    for (std::size_t i : stepped_) {
      const Tensor& t = tensors_[i];
      if (!t.clip.active || !exchanged(t)) continue;
      const std::size_t base = wire_.size();
      wire_.resize(base + static_cast<std::size_t>(t.split.geom.batch), 0.0);
      for (std::size_t q = 0; q < t.pieces.size(); ++q)
        wire_[base + static_cast<std::size_t>(t.pieces[q].matrix)] = sums[static_cast<std::size_t>(t.clip_at) + q];
    }
    placement_.add_over_ranks(wire_, exchanged_);
    std::size_t at = 0;
    for (std::size_t i : stepped_) {
      const Tensor& t = tensors_[i];
      if (!t.clip.active) continue;
      const MatrixGeometry& g = t.split.geom;
      matrix_sums_.assign(static_cast<std::size_t>(g.batch), 0.0);
      if (exchanged(t)) {
        std::copy_n(wire_.begin() + static_cast<std::ptrdiff_t>(at), g.batch, matrix_sums_.begin());
        at += static_cast<std::size_t>(g.batch);
      } else {
        for (std::size_t q = 0; q < t.pieces.size(); ++q)
          matrix_sums_[static_cast<std::size_t>(t.pieces[q].matrix)] = sums[static_cast<std::size_t>(t.clip_at) + q];
      }
      const StepScalars s = make_step_scalars(settings_.hyper[tier_index(t.tier)], 1);
      matrix_divisors_.assign(static_cast<std::size_t>(g.batch), 1.0f);
      clip_divisors(
          per_matrix(t) ? ClipScope::matrix : ClipScope::tensor, g,
          [&](double sum, index_t count) { return t.clip.divisor(sum, count, s); },
          [&](index_t b) { return matrix_sums_[static_cast<std::size_t>(b)]; },
          [&](index_t b, float d) { matrix_divisors_[static_cast<std::size_t>(b)] = d; });
      for (std::size_t q = 0; q < t.pieces.size(); ++q)
        divisors[static_cast<std::size_t>(t.clip_at) + q] =
            matrix_divisors_[static_cast<std::size_t>(t.pieces[q].matrix)];
    }
    backend_.set_divisors();
  }

  Placement placement_;
  Backend backend_;
  StateStore<memory_type> store_;  ///< after backend_: freed before it (~Engine)
  std::vector<Tensor> tensors_;
  index_t clip_count_ = 0;  ///< matrices of every tensor's pieces
  index_t cut_count_ = 0;   ///< values of every cut piece's column sums and sum of R_i
  // the last step
  std::vector<std::size_t> stepped_;
  bool any_cut_ = false;
  StepSettings settings_{};
  backend::Verdict verdict_{};
  std::optional<double> norm_sq_;
  index_t exchanged_ = 0;
  std::vector<double> wire_, matrix_sums_;
  std::vector<float> matrix_divisors_;
  // an optimizer step taken inside backward (begin_open_step)
  bool open_ = false;            ///< keeping its verdicts
  bool open_on_device_ = false;  ///< on the backend's device
  OpenVerdicts open_host_;
};

}  // namespace skewadam
