#pragma once
// ShardedOptimizer<Tiers, Comm>: SkewAdam with its state sharded over the
// ranks of a communicator (data parallelism with ZeRO stage 1/2 sharding, and
// expert parallelism).
//
//   skewadam::mpi::MpiCommunicator comm;
//   skewadam::dist::ShardedOptimizer<skewadam::SkewAdamTiers, skewadam::mpi::MpiCommunicator> opt(comm, hyper);
//   opt.add("embed", Tier::backbone, full_param_view, full_grad_view);   // same list on every rank
//   ...
//   opt.step();            // collective: updates this rank's slices only
//   opt.gather_params();   // collective: every rank's parameters complete again
//
// Every rank registers the full parameter list (same names, tiers, shapes and
// order) with views of full-size buffers. A rank keeps state only for what it
// owns (shard_plan.hpp): row slices of every backbone and router tensor, whole
// experts of every expert bank (or row slices: ShardOptions::experts), and
// reads only its own slice of each gradient (after a reduce-scatter, only that
// slice needs to be valid) and writes only its own slice of each parameter.
//
// One step, per rank:
//   0. a small all-gather: every rank has gradients for the same tensors, and
//      none is non-finite (NonFinitePolicy, as Optimizer; the owned gradient
//      slices are scanned first, so a rejected step changes nothing);
//   1. the statistics pass over the owned slices (the CPU backend's kernels);
//   2. the statistics exchange: per matrix cut between ranks, each rank's c
//      column sums of g^2 and its sum of R_i; every rank adds them in rank
//      order and finishes C_j and vbar identically;
//   3. the clip exchange: each rank's sum of u^2 per matrix where the clip's
//      scope spans ranks;
//   4. the apply pass over the owned slices.
// Exchanges are all-gathers summed in rank order on every rank (never an
// all-reduce), so every rank holds the same C_j and clip divisors bit for bit,
// and the same rank count gives the same bits on every run. Matrices that one
// rank owns whole (every matrix at one rank, expert banks dealt out by expert)
// are computed exactly as the single-process Optimizer computes them, bit for
// bit; a matrix cut between ranks adds its partial sums in a different order
// than one process does, within the golden tolerances. Stochastic rounding
// uses each element's index in the whole tensor, as one process does.
//
// Each rank runs its pieces (one per matrix slice it owns) on
// OptimizerOptions::threads threads, a piece per thread at a time; pieces are
// independent, so the bits do not depend on the thread count. A single large
// piece runs on one thread.
//
// Checkpoints are the single-process format (dist/sharded_checkpoint.hpp), so
// a run saved with N ranks resumes with M ranks, or in one process.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "../backend/cpu/cpu_backend.hpp"
#include "../backend/work.hpp"
#include "../checks.hpp"
#include "../nonfinite.hpp"
#include "../optimizer.hpp"
#include "../tier_settings.hpp"
#include "communicator.hpp"
#include "shard_plan.hpp"

namespace skewadam::dist {

struct ShardOptions {
  ExpertSharding experts = ExpertSharding::experts;
};

namespace detail {

/// The CPU kernels of one (rule, parameter dtype, gradient dtype), cut at the
/// points where a sharded step exchanges partial sums.
struct ShardKernels {
  bool factored = false;
  bool clip = false;
  bool apply_pass = false;
  /// Factored: statistics of rows [r0, r1) of the task's matrix 0 into colsum, d.
  void (*rows)(const backend::TensorTask&, index_t r0, index_t r1, float* colsum, float* d,
               backend::Scratch scratch) = nullptr;
  /// Factored, a matrix owned whole: what the single-process backend does
  /// after the statistics pass (C_j, vbar, sum of u^2), from nb row blocks.
  void (*finalize_whole)(const backend::TensorTask&, float* colsum, float* d, index_t nb,
                         backend::Scratch scratch) = nullptr;
  /// Factored, a matrix cut between ranks: C_j from the summed column sums,
  /// vbar from the summed R_i, then this slice's sum of u^2 (returned).
  double (*finish_cut)(const backend::TensorTask&, index_t rows, const float* colsum, double sum_r, float* d,
                       backend::Scratch scratch) = nullptr;
  /// Element-wise: the statistics pass of one chunk.
  void (*elementwise)(const backend::TensorTask&, const backend::Unit&) = nullptr;
  /// The apply pass of one unit.
  void (*apply)(const backend::TensorTask&, const backend::Unit&, backend::Scratch scratch) = nullptr;
};

template <class Rule, class P, class G, class Arch>
struct ShardKernelsOf {
  using K = backend::cpu::Kernels<Rule, P, G, Arch>;
  using S = typename K::S;
  using C = typename K::C;

  static void rows(const backend::TensorTask& t, index_t r0, index_t r1, float* colsum, float* d,
                   backend::Scratch scratch) {
    if constexpr (S::factored) K::factored_rows(t, 0, r0, r1, colsum, d, scratch.d);
  }

  static void finalize_whole(const backend::TensorTask& t, float* colsum, float* d, index_t nb,
                             backend::Scratch scratch) {
    if constexpr (S::factored) K::finalize_matrix(t, 0, colsum, d, nb, scratch);
  }

  /// As K::finalize_matrix with one block, except that the column sums and
  /// the sum of R_i are totals over every rank's slice of a matrix of `rows`
  /// rows, and the returned sum of u^2 is this slice's share.
  static double finish_cut(const backend::TensorTask& t, index_t rows, const float* colsum, double sum_r, float* d,
                           backend::Scratch scratch) {
    if constexpr (S::factored) {
      const typename K::Ctx x(t);
      const StepScalars& s = x.s;
      const index_t c = x.cols;
      const float fr = static_cast<float>(rows);
      float* cs = t.v_col;
      for (index_t j = 0; j < c; ++j) cs[j] = S::update_statistic(cs[j], colsum[j] / fr, s);
      const float vbar = S::vbar(static_cast<float>(sum_r / static_cast<double>(rows)));
      t.matrices[0].vbar = vbar;
      if constexpr (C::active) {
        const float* rs = t.v_row;
        const index_t r = t.geom.rows;  // this slice's rows
        bool any = false;
        for (index_t i = 0; i < r && !any; ++i) any = rs[i] > 0.0f && S::row_floored(rs[i], vbar, s);
        double floored_sum = 0;
        if (any) {
          K::inverse_col_factors(t, x, 0, scratch.f);
          floored_sum = K::floored_rows(t, x, 0, 0, r, vbar, scratch.f, d, scratch.d);
        }
        double sum = 0;
        for (index_t j = 0; j < c; ++j) {
          const double col = static_cast<double>(S::col_factor(cs[j], s));
          sum += static_cast<double>(d[j]) / (col * col);
        }
        return static_cast<double>(vbar) * sum + floored_sum;
      }
    }
    return 0.0;
  }

  static void elementwise(const backend::TensorTask& t, const backend::Unit& u) {
    if constexpr (!S::factored) K::elementwise_statistics(t, u);
  }

  static void apply(const backend::TensorTask& t, const backend::Unit& u, backend::Scratch scratch) {
    if constexpr (S::factored || C::active) K::apply(t, u, scratch);
  }

  static const ShardKernels* table() {
    static constexpr ShardKernels k{S::factored, C::active, S::factored || C::active, &rows, &finalize_whole,
                                    &finish_cut,  &elementwise, &apply};
    return &k;
  }
};

}  // namespace detail

template <class Tiers = SkewAdamTiers, Communicator Comm = SelfCommunicator,
          class Arch = typename backend::DefaultBackend::arch>
class ShardedOptimizer : public TierSettings {
 public:
  using tiers = Tiers;
  using communicator_type = Comm;
  using Schedule = TierSettings::Schedule;
  /// The single-process optimizer with the same rules (checkpoints go through it).
  using single_process_type = Optimizer<Tiers, backend::CpuBackend<Arch>>;

  ShardedOptimizer(Comm& comm, const Hyperparameters& all, OptimizerOptions options = {}, ShardOptions shard = {})
      : ShardedOptimizer(comm, PerTier<Hyperparameters>{all, all, all}, options, shard) {}
  ShardedOptimizer(Comm& comm, const PerTier<Hyperparameters>& per_tier, OptimizerOptions options = {},
                   ShardOptions shard = {})
      : TierSettings(per_tier), comm_(&comm), seed_(options.seed), shard_(shard) {
    if (shard.experts != ExpertSharding::experts && shard.experts != ExpertSharding::rows)
      throw std::invalid_argument("shard.experts: unknown value " + std::to_string(static_cast<int>(shard.experts)));
    if (comm.size() < 1 || comm.rank() < 0 || comm.rank() >= comm.size())
      throw std::invalid_argument("comm: rank " + std::to_string(comm.rank()) + " of " + std::to_string(comm.size()) +
                                  " is not a valid position in a group");
    set_nonfinite_policy(options.nonfinite);
    set_threads(options.threads);
  }

  Comm& comm() const noexcept { return *comm_; }
  int rank() const noexcept { return comm_->rank(); }
  int ranks() const noexcept { return comm_->size(); }

  // ------------------------------------------------------------ parameters
  /// Registers a parameter (the same list on every rank; not collective) and
  /// allocates the state of this rank's share of it.
  ParamId add(std::string_view name, Tier tier, ParamView param, GradView grad = {}) {
    if (name.empty()) throw std::invalid_argument("name: a parameter name must not be empty");
    if (index_.count(std::string(name)))
      throw std::invalid_argument("name: parameter '" + std::string(name) + "' is already registered");
    checked_tier(tier, "tier of '" + std::string(name) + "'");
    skewadam::detail::check_param(name, param);
    skewadam::detail::check_grad(name, param, grad);

    Entry e;
    e.name = std::string(name);
    e.tier = tier;
    e.param = param;
    e.grad = grad;
    e.id = tensor_id(name);
    const StateLayout layout = Tiers::layout(tier);
    e.split = split_for(tier, param.shape, layout, ranks(), shard_.experts, whole_experts_);
    e.pieces = e.split.pieces(rank());
    allocate(e, layout);

    const ParamId id{static_cast<index_t>(entries_.size())};
    if (e.split.split == Split::whole) ++whole_experts_;
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

  void set_grad(ParamId id, GradView grad) {
    Entry& e = entry(id);
    skewadam::detail::check_grad(e.name, e.param, grad);
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
  std::uint32_t rounding_stream(ParamId id) const { return entry(id).id; }
  /// How the parameter is split over the ranks.
  const TensorSplit& split(ParamId id) const { return entry(id).split; }
  /// What this rank owns of it.
  std::span<const Piece> pieces(ParamId id) const { return entry(id).pieces; }
  /// This rank's share of its state: the pieces' rows or elements in piece
  /// order; v_col holds c values per piece (factored).
  ParamStateView local_state(ParamId id) const {
    const Entry& e = entry(id);
    return {e.state.m, e.state.v, e.state.v_row, e.state.v_col, e.state.step};
  }

  // ------------------------------------------------------ hyperparameters
  // hyperparameters(), set_hyperparameters(), set_lr(), set_lr_schedule():
  // TierSettings (tier_settings.hpp).

  /// Threads per rank; 0 selects the hardware's count.
  void set_threads(int n) {
    if (n < 0) throw std::invalid_argument("threads = " + std::to_string(n) + ": must be >= 0 (0: hardware)");
    threads_ = n == 0 ? backend::CpuBackend<Arch>::hardware_threads() : n;
    resize_scratch();
  }
  int threads() const noexcept { return threads_; }

  void set_nonfinite_policy(NonFinitePolicy p) {
    if (p != NonFinitePolicy::skip_step && p != NonFinitePolicy::raise && p != NonFinitePolicy::unchecked)
      throw std::invalid_argument("nonfinite policy: unknown value " + std::to_string(static_cast<int>(p)));
    nonfinite_ = p;
  }
  NonFinitePolicy nonfinite_policy() const noexcept { return nonfinite_; }

  // ------------------------------------------------ global gradient norm (E6)
  /// L2 norm over all present gradients (collective): each rank sums its own
  /// slices in double, the ranks' sums are added in rank order.
  double grad_norm() {
    double sum = 0;
    for (const Entry& e : entries_) {
      if (!e.grad.present()) continue;
      for (const Piece& p : e.pieces) sum += grad_sum_squares(e, p);
    }
    std::span<double> one(&sum, 1);
    ordered_sum(*comm_, one, doubles_);
    return std::sqrt(sum);
  }
  /// As Optimizer::clip_grad_norm (collective).
  double clip_grad_norm(double max_norm) {
    skewadam::detail::check_max_norm(max_norm);
    const double norm = grad_norm();
    grad_scale_ = skewadam::detail::grad_clip_scale(norm, max_norm);
    return norm;
  }
  double pending_grad_scale() const noexcept { return grad_scale_; }

  // ------------------------------------------------------------------ step
  /// Updates this rank's slices of every parameter with a gradient
  /// (collective: every rank must have gradients for the same parameters,
  /// else std::invalid_argument on every rank and nothing changes).
  StepReport step() {
    const std::int64_t t_global = steps_ + 1;
    PerTier<Hyperparameters> h = hyperparameters_at(t_global);
    step_hyper_ = h;
    last_exchange_bytes_ = 0;
    stepped_.clear();
    for (std::size_t i = 0; i < entries_.size(); ++i)
      if (entries_[i].grad.present() && entries_[i].param.numel() > 0) stepped_.push_back(i);

    StepReport report;
    if (std::optional<NonFiniteGradient> bad = preflight()) {
      grad_scale_ = 1.0;
      if (nonfinite_ == NonFinitePolicy::raise) throw NonFiniteGradientError(std::move(*bad));
      report.applied = false;
      report.nonfinite = std::move(bad);
      return report;
    }

    // 1. statistics, and everything of matrices owned whole
    build_tasks(h);
    for_each_work([this](Work& w, backend::Scratch scratch) { statistics(w, scratch); });

    // 2. the statistics exchange: column sums and sum of R_i of cut matrices
    pack_statistics();
    exchange(stats_out_, stats_in_);
    finish_cut_matrices();

    // 3. the clip exchange and the divisors
    clip_divisors();

    // 4. apply
    for_each_work([this](Work& w, backend::Scratch scratch) { apply(w, scratch); });

    for (std::size_t i : stepped_) ++entries_[i].state.step;
    ++steps_;
    grad_scale_ = 1.0;
    return report;
  }

  std::int64_t steps() const noexcept { return steps_; }
  std::uint64_t seed() const noexcept { return seed_; }

  /// Bytes this rank put into the exchanges of its last step (it receives
  /// ranks() times as much): 32 bytes of agreement and non-finite check, then
  /// exchange_bytes() (shard_plan.hpp) of each stepped tensor. Parameters and
  /// gradients are not included.
  index_t last_step_exchange_bytes() const noexcept { return last_exchange_bytes_; }

  // ----------------------------------------------------------------- state
  /// Optimizer state bytes held by this rank (SPEC section 2 formulas applied
  /// to its slices; a cut matrix's column statistics are held by every rank
  /// that owns some of its rows).
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
  /// Every rank's state_bytes(), in rank order (collective).
  std::vector<index_t> state_bytes_per_rank() {
    const index_t mine = state_bytes();
    std::vector<index_t> all(static_cast<std::size_t>(ranks()));
    all_gather_values<Comm, index_t>(*comm_, std::span<const index_t>(&mine, 1), std::span<index_t>(all));
    return all;
  }

  // ------------------------------------------------------------- gathering
  /// Completes every rank's parameter buffers from their owners (collective).
  void gather_params() {
    for (Entry& e : entries_) gather_param(e);
  }
  void gather_param(ParamId id) { gather_param(entry(id)); }

  /// The complete state of every parameter, as the single-process Optimizer
  /// would export it (collective; every rank receives it).
  OptimizerState export_state() {
    OptimizerState s;
    for (Tier t : all_tiers) s.hyperparameters[static_cast<std::size_t>(tier_index(t))] = hyper_[t];
    s.seed = seed_;
    s.steps = steps_;
    s.params.reserve(entries_.size());
    for (Entry& e : entries_) {
      OptimizerState::Param p;
      p.rounding_stream = e.id;
      p.state.step = e.state.step;
      p.state.m = gather_array(e, Array::m);
      p.state.v = gather_array(e, Array::v);
      p.state.v_row = gather_array(e, Array::v_row);
      p.state.v_col = gather_array(e, Array::v_col);
      s.params.push_back(std::move(p));
    }
    return s;
  }

  /// Takes this rank's share of a complete state (as export_state() or the
  /// single-process Optimizer::export_state() returns it). Not collective, but
  /// every rank must import the same state. Everything is checked first; on
  /// error std::invalid_argument names the problem and nothing has changed.
  void import_state(const OptimizerState& next) {
    if (next.params.size() != entries_.size())
      throw std::invalid_argument("state: holds " + std::to_string(next.params.size()) +
                                  " parameters, the optimizer has " + std::to_string(entries_.size()));
    if (next.steps < 0) throw std::invalid_argument("state.steps = " + std::to_string(next.steps) + ": must be >= 0");
    for (Tier t : all_tiers)
      validate(next.hyperparameters[static_cast<std::size_t>(tier_index(t))],
               "state.hyperparameters." + std::string(tier_name(t)));
    std::vector<ParamState> local(entries_.size());
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      const Entry& e = entries_[i];
      const ParamState& got = next.params[i].state;
      const std::string who = "state of '" + e.name + "'";
      const FullSizes want = full_sizes(e);
      auto same_size = [&](std::size_t have, std::size_t n, const char* array) {
        if (have != n)
          throw std::invalid_argument(who + ": " + array + " has " + std::to_string(have) + " values, expected " +
                                      std::to_string(n));
      };
      same_size(got.m.size(), want.m, "m");
      same_size(got.v.size(), want.v, "v");
      same_size(got.v_row.size(), want.v_row, "v_row");
      same_size(got.v_col.size(), want.v_col, "v_col");
      if (got.step < 0 || got.step > next.steps)
        throw std::invalid_argument(who + ": step = " + std::to_string(got.step) + " is outside 0.." +
                                    std::to_string(next.steps) + " (the optimizer's step count)");
      ParamState& l = local[i];
      l.step = got.step;
      l.m = slice_of(e, Array::m, got.m);
      l.v = slice_of(e, Array::v, got.v);
      l.v_row = slice_of(e, Array::v_row, got.v_row);
      l.v_col = slice_of(e, Array::v_col, got.v_col);
    }
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      std::swap(entries_[i].state, local[i]);
      entries_[i].id = next.params[i].rounding_stream;
    }
    for (Tier t : all_tiers) hyper_[t] = next.hyperparameters[static_cast<std::size_t>(tier_index(t))];
    seed_ = next.seed;
    steps_ = next.steps;
  }

 private:
  enum class Array { m, v, v_row, v_col, param };

  struct FullSizes {
    std::size_t m = 0, v = 0, v_row = 0, v_col = 0;
  };

  struct Entry {
    std::string name;
    Tier tier = Tier::backbone;
    ParamView param;
    GradView grad;
    std::uint32_t id = 0;
    TensorSplit split;
    std::vector<Piece> pieces;
    bool momentum = false;
    ParamState state;  ///< this rank's share, pieces concatenated
    // per piece: offsets into the local state and scratch
    std::vector<index_t> elem_off;   ///< into m (and v)
    std::vector<index_t> row_off;    ///< into v_row
    std::vector<index_t> chunk_off;  ///< into unit_sum (element-wise)
    std::vector<index_t> blocks;     ///< row blocks of the statistics pass (factored)
    std::vector<index_t> block_off;  ///< into colsum and dsum, c floats per block
    std::vector<backend::MatrixScratch> matrices;  ///< one per piece
    std::vector<float> colsum;
    std::vector<float> dsum;
    std::vector<double> unit_sum;
    std::vector<double> piece_u2;  ///< this piece's sum of u^2 (cut matrices)
    std::vector<double> piece_r;   ///< this piece's sum of R_i (cut matrices)
  };

  /// One piece of one stepped tensor.
  struct Work {
    std::size_t entry = 0;
    std::size_t piece = 0;
    backend::TensorTask task;
    const detail::ShardKernels* kernels = nullptr;
  };

  // ---------------------------------------------------------- allocation
  void allocate(Entry& e, StateLayout layout) {
    const MatrixGeometry& g = e.split.geom;
    e.momentum = layout.momentum;
    index_t elems = 0, rows = 0, chunks = 0, blocks = 0;
    for (const Piece& p : e.pieces) {
      e.elem_off.push_back(elems);
      e.row_off.push_back(rows);
      e.chunk_off.push_back(chunks);
      e.block_off.push_back(blocks * g.cols);
      const index_t n = e.split.elements(p);
      elems += n;
      if (e.split.factored) {
        rows += p.size();
        // a matrix owned whole is cut into the single-process backend's row
        // blocks, so that its statistics are combined exactly as there
        const index_t nb = e.split.cuts_matrices() ? 1 : backend::Cutting::row_blocks(g);
        e.blocks.push_back(nb);
        blocks += nb;
      } else {
        e.blocks.push_back(0);
        chunks += std::max<index_t>(1, (n + backend::Cutting::chunk_elems - 1) / backend::Cutting::chunk_elems);
      }
    }
    if (e.momentum) e.state.m.assign(static_cast<std::size_t>(elems), 0.0f);
    if (e.split.factored) {
      e.state.v_row.assign(static_cast<std::size_t>(rows), 0.0f);
      e.state.v_col.assign(e.pieces.size() * static_cast<std::size_t>(g.cols), 0.0f);
      e.colsum.assign(static_cast<std::size_t>(blocks * g.cols), 0.0f);
      e.dsum.assign(static_cast<std::size_t>(blocks * g.cols), 0.0f);
      if (g.cols > max_cols_) {
        max_cols_ = g.cols;
        resize_scratch();
      }
    } else {
      e.state.v.assign(static_cast<std::size_t>(elems), 0.0f);
      e.unit_sum.assign(static_cast<std::size_t>(chunks), 0.0);
    }
    e.matrices.assign(e.pieces.size(), backend::MatrixScratch{});
    e.piece_u2.assign(e.pieces.size(), 0.0);
    e.piece_r.assign(e.pieces.size(), 0.0);
  }

  FullSizes full_sizes(const Entry& e) const {
    FullSizes s;
    const MatrixGeometry& g = e.split.geom;
    const auto n = static_cast<std::size_t>(g.numel());
    if (n == 0) return s;
    if (e.momentum) s.m = n;
    if (e.split.factored) {
      s.v_row = static_cast<std::size_t>(g.batch * g.rows);
      s.v_col = static_cast<std::size_t>(g.batch * g.cols);
    } else {
      s.v = n;
    }
    return s;
  }

  // ---------------------------------------------------------- the step
  /// Step 0: the ranks agree on the stepped tensors; the owned gradient
  /// slices are scanned for non-finite values (unless unchecked).
  std::optional<NonFiniteGradient> preflight() {
    struct Check {
      std::uint64_t stepped = 0;  ///< FNV-1a of the stepped tensors' indices
      std::int64_t param = -1;    ///< first offending tensor, or -1
      std::int64_t element = -1;
      float value = 0;
      float pad = 0;
    };
    Check mine;
    std::uint64_t h = 14695981039346656037ull;
    for (std::size_t i : stepped_) {
      h ^= static_cast<std::uint64_t>(i) + 1;
      h *= 1099511628211ull;
    }
    mine.stepped = h;
    if (nonfinite_ != NonFinitePolicy::unchecked) {
      for (std::size_t i : stepped_) {
        const Entry& e = entries_[i];
        for (const Piece& p : e.pieces) {
          const index_t at = first_offending(e, p);
          if (at < 0) continue;
          mine.param = static_cast<std::int64_t>(i);
          mine.element = e.split.first_element(p) + at;
          mine.value = grad_value(e.grad, mine.element) * static_cast<float>(grad_scale_);
          break;
        }
        if (mine.param >= 0) break;
      }
    }
    std::vector<Check> all(static_cast<std::size_t>(ranks()));
    comm_->all_gather(std::as_bytes(std::span<const Check>(&mine, 1)), std::as_writable_bytes(std::span<Check>(all)));
    last_exchange_bytes_ += static_cast<index_t>(sizeof(Check));
    for (std::size_t k = 0; k < all.size(); ++k)
      if (all[k].stepped != all[0].stepped)
        throw std::invalid_argument("step: rank " + std::to_string(k) +
                                    " has gradients for a different set of parameters than rank 0 (every rank "
                                    "must set the same gradients before a step)");
    const Check* first = nullptr;
    for (const Check& c : all) {
      if (c.param < 0) continue;
      if (!first || c.param < first->param || (c.param == first->param && c.element < first->element)) first = &c;
    }
    if (!first) return std::nullopt;
    const Entry& e = entries_[static_cast<std::size_t>(first->param)];
    NonFiniteGradient r;
    r.param = ParamId{first->param};
    r.name = e.name;
    r.shape = e.param.shape;
    r.element = first->element;
    r.value = first->value;
    return r;
  }

  void build_tasks(const PerTier<Hyperparameters>& h) {
    work_.clear();
    for (std::size_t i : stepped_) {
      Entry& e = entries_[i];
      const MatrixGeometry& g = e.split.geom;
      const std::int64_t t = e.state.step + 1;
      const detail::ShardKernels* k = pick(e.tier, e.param.dtype, e.grad.dtype, e.param.shape.rank() < 2);
      for (std::size_t q = 0; q < e.pieces.size(); ++q) {
        const Piece& p = e.pieces[q];
        Work w;
        w.entry = i;
        w.piece = q;
        w.kernels = k;
        backend::TensorTask& task = w.task;
        const index_t first = e.split.first_element(p);
        task.param = static_cast<char*>(e.param.data) + first * dtype_size(e.param.dtype);
        task.grad = static_cast<const char*>(e.grad.data) + first * dtype_size(e.grad.dtype);
        task.geom = e.split.factored ? MatrixGeometry{1, p.size(), g.cols} : MatrixGeometry{1, 1, p.size()};
        task.factored = e.split.factored;
        task.scope = h[e.tier].clip_scope;
        task.scalars = make_step_scalars(h[e.tier], t, grad_scale_);
        task.key = RoundingKey{seed_, e.id, static_cast<std::uint64_t>(t)};
        task.element_base = first;
        const auto eo = static_cast<std::size_t>(e.elem_off[q]);
        task.m = e.state.m.empty() ? nullptr : e.state.m.data() + eo;
        task.v = e.state.v.empty() ? nullptr : e.state.v.data() + eo;
        task.v_row = e.state.v_row.empty() ? nullptr : e.state.v_row.data() + e.row_off[q];
        task.v_col = e.state.v_col.empty() ? nullptr : e.state.v_col.data() + static_cast<index_t>(q) * g.cols;
        task.matrices = &e.matrices[q];
        task.col_partial = e.colsum.empty() ? nullptr : e.colsum.data() + e.block_off[q];
        task.d_partial = e.dsum.empty() ? nullptr : e.dsum.data() + e.block_off[q];
        task.unit_sum = e.unit_sum.empty() ? nullptr : e.unit_sum.data() + e.chunk_off[q];
        task.row_blocks = e.split.factored ? e.blocks[q] : 1;
        task.chunks_per_matrix = e.split.factored ? 1 : chunks_of(p.size());
        work_.push_back(w);
      }
    }
  }

  static index_t chunks_of(index_t n) {
    return std::max<index_t>(1, (n + backend::Cutting::chunk_elems - 1) / backend::Cutting::chunk_elems);
  }

  static backend::Unit chunk_unit(index_t n, index_t k) {
    const index_t begin = k * backend::Cutting::chunk_elems;
    return backend::Unit{0, 0, begin, std::min(n, begin + backend::Cutting::chunk_elems), k};
  }

  /// A backend::Scratch per thread for matrices of up to max_cols_ columns.
  void resize_scratch() { scratch_.resize(threads_, max_cols_); }

  /// Runs f(work, scratch) for every piece of the step, on up to threads_
  /// threads (no more than one per Cutting::chunk_elems elements).
  template <class F>
  void for_each_work(F&& f) {
    const auto n = static_cast<std::int64_t>(work_.size());
    if (n == 0) return;
    index_t elements = 0;
    for (const Work& w : work_) elements += w.task.geom.numel();
    const index_t by_work = std::max<index_t>(1, elements / backend::Cutting::chunk_elems);
    const int nthreads = static_cast<int>(std::min<index_t>({index_t{threads_}, index_t{n}, by_work}));
#if defined(_OPENMP)
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (std::int64_t k = 0; k < n; ++k)
      f(work_[static_cast<std::size_t>(k)], scratch_.at(omp_get_thread_num()));
#else
    (void)nthreads;
    for (std::int64_t k = 0; k < n; ++k) f(work_[static_cast<std::size_t>(k)], scratch_.at(0));
#endif
  }

  void statistics(Work& w, backend::Scratch scratch) {
    Entry& e = entries_[w.entry];
    const backend::TensorTask& t = w.task;
    const index_t c = t.geom.cols;
    if (t.factored) {
      const index_t nb = t.row_blocks;
      const index_t r = t.geom.rows;
      for (index_t k = 0; k < nb; ++k)
        w.kernels->rows(t, r * k / nb, r * (k + 1) / nb, t.col_partial + k * c, t.d_partial + k * c, scratch);
      if (e.split.cuts_matrices()) {
        e.piece_r[w.piece] = backend::cpu::wide_sum(r, [&](index_t i) { return static_cast<double>(t.v_row[i]); });
      } else {
        w.kernels->finalize_whole(t, t.col_partial, t.d_partial, nb, scratch);
      }
    } else {
      const index_t nc = t.chunks_per_matrix;
      for (index_t k = 0; k < nc; ++k) w.kernels->elementwise(t, chunk_unit(t.geom.cols, k));
      if (w.kernels->clip) {
        double s = 0;
        for (index_t k = 0; k < nc; ++k) s += t.unit_sum[k];
        t.matrices[0].sum_u2 = s;
      }
    }
  }

  /// Bytes of a stepped tensor's part of the statistics exchange.
  void pack_statistics() {
    stats_out_.clear();
    for (std::size_t i : stepped_) {
      const Entry& e = entries_[i];
      if (!e.split.factored || !e.split.cuts_matrices()) continue;
      const MatrixGeometry& g = e.split.geom;
      // this rank's piece of matrix b, if any (pieces are in matrix order)
      std::size_t q = 0;
      for (index_t b = 0; b < g.batch; ++b) {
        const std::size_t at = stats_out_.size();
        stats_out_.resize(at + static_cast<std::size_t>(4 * g.cols + 8), std::byte{0});
        if (q < e.pieces.size() && e.pieces[q].matrix == b) {
          std::memcpy(stats_out_.data() + at, e.colsum.data() + e.block_off[q], static_cast<std::size_t>(4 * g.cols));
          std::memcpy(stats_out_.data() + at + 4 * g.cols, &e.piece_r[q], 8);
          ++q;
        }
      }
    }
  }

  void exchange(const std::vector<std::byte>& out, std::vector<std::byte>& in) {
    in.resize(out.size() * static_cast<std::size_t>(ranks()));
    if (out.empty()) return;
    comm_->all_gather(std::span<const std::byte>(out), std::span<std::byte>(in));
    last_exchange_bytes_ += static_cast<index_t>(out.size());
  }

  void finish_cut_matrices() {
    const std::size_t stride = stats_out_.size();
    std::size_t at = 0;
    std::vector<float>& total = floats_;
    for (std::size_t i : stepped_) {
      Entry& e = entries_[i];
      if (!e.split.factored || !e.split.cuts_matrices()) continue;
      const MatrixGeometry& g = e.split.geom;
      const auto c = static_cast<std::size_t>(g.cols);
      total.resize(c);
      std::size_t q = 0;
      for (index_t b = 0; b < g.batch; ++b, at += 4 * c + 8) {
        if (!(q < e.pieces.size() && e.pieces[q].matrix == b)) continue;
        std::memcpy(total.data(), stats_in_.data() + at, 4 * c);
        double sum_r = 0;
        std::memcpy(&sum_r, stats_in_.data() + at + 4 * c, 8);
        std::vector<float>& part = floats2_;
        part.resize(c);
        for (int k = 1; k < ranks(); ++k) {
          const std::byte* src = stats_in_.data() + static_cast<std::size_t>(k) * stride + at;
          std::memcpy(part.data(), src, 4 * c);
          for (std::size_t j = 0; j < c; ++j) total[j] += part[j];
          double r = 0;
          std::memcpy(&r, src + 4 * c, 8);
          sum_r += r;
        }
        Work* w = find_work(i, q);
        e.piece_u2[q] = w->kernels->finish_cut(w->task, g.rows, total.data(), sum_r, w->task.d_partial,
                                               scratch_.at(0));
        ++q;
      }
    }
  }

  Work* find_work(std::size_t entry, std::size_t piece) {
    for (Work& w : work_)
      if (w.entry == entry && w.piece == piece) return &w;
    return nullptr;
  }

  /// Step 3: every clipped tensor's divisors, from sums over ranks where its
  /// scope spans ranks.
  void clip_divisors() {
    clip_out_.clear();
    for (std::size_t i : stepped_) {
      const Entry& e = entries_[i];
      const Hyperparameters& hp = hyper_[e.tier];
      const bool clip = kernels_of(e)->clip;
      const ExchangeBytes x = exchange_bytes(e.split, clip, hp.clip_scope == ClipScope::matrix);
      if (x.clip == 0) continue;
      const std::size_t at = clip_out_.size();
      clip_out_.resize(at + static_cast<std::size_t>(e.split.geom.batch), 0.0);
      for (std::size_t q = 0; q < e.pieces.size(); ++q)
        clip_out_[at + static_cast<std::size_t>(e.pieces[q].matrix)] = piece_sum_u2(e, q);
    }
    clip_in_.resize(clip_out_.size() * static_cast<std::size_t>(ranks()));
    if (!clip_out_.empty()) {
      comm_->all_gather(std::as_bytes(std::span<const double>(clip_out_)),
                        std::as_writable_bytes(std::span<double>(clip_in_)));
      last_exchange_bytes_ += static_cast<index_t>(8 * clip_out_.size());
    }

    std::size_t at = 0;
    for (std::size_t i : stepped_) {
      Entry& e = entries_[i];
      const detail::ShardKernels* k = kernels_of(e);
      if (!k->clip) continue;
      const Hyperparameters& hp = hyper_[e.tier];
      const bool per_matrix = hp.clip_scope == ClipScope::matrix;
      const MatrixGeometry& g = e.split.geom;
      const ExchangeBytes x = exchange_bytes(e.split, true, per_matrix);
      const StepScalars s = first_scalars(i);
      std::vector<double>& sums = doubles_;
      sums.assign(static_cast<std::size_t>(g.batch), 0.0);
      if (x.clip > 0) {
        const std::size_t stride = clip_out_.size();
        for (index_t b = 0; b < g.batch; ++b) {
          double v = clip_in_[at + static_cast<std::size_t>(b)];
          for (int r = 1; r < ranks(); ++r) v += clip_in_[static_cast<std::size_t>(r) * stride + at + static_cast<std::size_t>(b)];
          sums[static_cast<std::size_t>(b)] = v;
        }
        at += static_cast<std::size_t>(g.batch);
      } else {
        for (std::size_t q = 0; q < e.pieces.size(); ++q)
          sums[static_cast<std::size_t>(e.pieces[q].matrix)] = piece_sum_u2(e, q);
      }
      if (per_matrix) {
        for (std::size_t q = 0; q < e.pieces.size(); ++q)
          e.matrices[q].divisor = clip_divisor(e, sums[static_cast<std::size_t>(e.pieces[q].matrix)],
                                               g.matrix_size(), s);
      } else {
        double total = 0;
        for (double v : sums) total += v;
        const float div = clip_divisor(e, total, g.numel(), s);
        for (auto& m : e.matrices) m.divisor = div;
      }
    }
  }

  double piece_sum_u2(const Entry& e, std::size_t q) const {
    return e.split.factored && e.split.cuts_matrices() ? e.piece_u2[q] : e.matrices[q].sum_u2;
  }

  StepScalars first_scalars(std::size_t entry) const {
    for (const Work& w : work_)
      if (w.entry == entry) return w.task.scalars;
    const Entry& e = entries_[entry];
    return make_step_scalars(step_hyper_[e.tier], e.state.step + 1, grad_scale_);
  }

  float clip_divisor(const Entry& e, double sum, index_t count, const StepScalars& s) const {
    switch (e.tier) {
      case Tier::backbone: return clip_of<typename Tiers::backbone>(e, sum, count, s);
      case Tier::experts: return clip_of<typename Tiers::experts>(e, sum, count, s);
      case Tier::router: return clip_of<typename Tiers::router>(e, sum, count, s);
    }
    return 1.0f;
  }
  template <class Rule>
  static float clip_of(const Entry& e, double sum, index_t count, const StepScalars& s) {
    if constexpr (!std::is_same_v<Rule, typename Rule::rank1_rule>) {
      if (e.param.shape.rank() < 2) return Rule::rank1_rule::clip::divisor(sum, count, s);
    }
    return Rule::clip::divisor(sum, count, s);
  }

  void apply(Work& w, backend::Scratch scratch) {
    if (!w.kernels->apply_pass) return;
    const backend::TensorTask& t = w.task;
    if (t.factored) {
      w.kernels->apply(t, backend::Unit{0, 0, 0, t.geom.rows, 0}, scratch);
    } else {
      const index_t nc = t.chunks_per_matrix;
      for (index_t k = 0; k < nc; ++k) w.kernels->apply(t, chunk_unit(t.geom.cols, k), scratch);
    }
  }

  // ---------------------------------------------------------- kernels
  template <class Rule, class P, class G>
  static const detail::ShardKernels* kernels() {
    if constexpr (std::is_same_v<Arch, DispatchArch>)
      return backend::cpu::visit_arch(backend::cpu::selected_arch(),
                                      []<class A>() { return detail::ShardKernelsOf<Rule, P, G, A>::table(); });
    else
      return detail::ShardKernelsOf<Rule, P, G, Arch>::table();
  }
  template <class Rule>
  static const detail::ShardKernels* pick_rule(Dtype p, Dtype g, bool rank1) {
    if constexpr (!std::is_same_v<Rule, typename Rule::rank1_rule>) {
      if (rank1) return pick_rule<typename Rule::rank1_rule>(p, g, false);
    }
    switch (p) {
      case Dtype::f32: return kernels<Rule, float, float>();
      case Dtype::bf16: return g == Dtype::f32 ? kernels<Rule, bf16, float>() : kernels<Rule, bf16, bf16>();
      case Dtype::f16: return g == Dtype::f32 ? kernels<Rule, f16, float>() : kernels<Rule, f16, f16>();
    }
    return nullptr;
  }
  static const detail::ShardKernels* pick(Tier t, Dtype p, Dtype g, bool rank1) {
    switch (t) {
      case Tier::backbone: return pick_rule<typename Tiers::backbone>(p, g, rank1);
      case Tier::experts: return pick_rule<typename Tiers::experts>(p, g, rank1);
      case Tier::router: return pick_rule<typename Tiers::router>(p, g, rank1);
    }
    return nullptr;
  }
  const detail::ShardKernels* kernels_of(const Entry& e) const {
    return pick(e.tier, e.param.dtype, e.grad.present() ? e.grad.dtype : e.param.dtype, e.param.shape.rank() < 2);
  }

  // ---------------------------------------------------------- gathers
  /// (offset, count) of every segment rank `rank` holds of an array, in the
  /// order of its local storage. For v_col only the first owner of each
  /// matrix is listed when `gathering` (the others hold copies).
  std::vector<std::pair<index_t, index_t>> segments(const Entry& e, int rank, Array a, bool gathering) const {
    std::vector<std::pair<index_t, index_t>> out;
    const MatrixGeometry& g = e.split.geom;
    const std::vector<Piece> pieces = rank == this->rank() ? e.pieces : e.split.pieces(rank);
    for (const Piece& p : pieces) {
      switch (a) {
        case Array::m:
        case Array::v:
        case Array::param: out.emplace_back(e.split.first_element(p), e.split.elements(p)); break;
        case Array::v_row: out.emplace_back(p.matrix * g.rows + p.begin, p.size()); break;
        case Array::v_col:
          if (!gathering || e.split.first_owner(p.matrix) == rank) out.emplace_back(p.matrix * g.cols, g.cols);
          break;
      }
    }
    return out;
  }

  bool keeps(const Entry& e, Array a) const {
    switch (a) {
      case Array::m: return e.momentum;
      case Array::v: return !e.split.factored;
      case Array::v_row:
      case Array::v_col: return e.split.factored;
      case Array::param: return true;
    }
    return false;
  }

  /// Gathers one array (full size) from every rank's pieces; bytes of
  /// `elem` each. `local` is this rank's storage, pieces concatenated.
  void gather_bytes(const Entry& e, Array a, const std::byte* local, std::size_t elem, std::byte* full) {
    const int n = ranks();
    std::vector<std::size_t> counts(static_cast<std::size_t>(n));
    std::vector<std::vector<std::pair<index_t, index_t>>> segs(static_cast<std::size_t>(n));
    for (int k = 0; k < n; ++k) {
      segs[static_cast<std::size_t>(k)] = segments(e, k, a, true);
      std::size_t c = 0;
      for (auto [off, len] : segs[static_cast<std::size_t>(k)]) c += static_cast<std::size_t>(len) * elem;
      counts[static_cast<std::size_t>(k)] = c;
    }
    // this rank's contribution in segment order
    std::vector<std::byte> mine(counts[static_cast<std::size_t>(rank())]);
    {
      std::size_t at = 0;
      if (a == Array::v_col) {
        // local v_col holds c per piece; take the listed ones
        const MatrixGeometry& g = e.split.geom;
        for (std::size_t q = 0; q < e.pieces.size(); ++q) {
          if (e.split.first_owner(e.pieces[q].matrix) != rank()) continue;
          const std::size_t bytes = static_cast<std::size_t>(g.cols) * elem;
          std::memcpy(mine.data() + at, local + q * bytes, bytes);
          at += bytes;
        }
      } else if (a == Array::param) {
        for (auto [off, len] : segs[static_cast<std::size_t>(rank())]) {
          const std::size_t bytes = static_cast<std::size_t>(len) * elem;
          std::memcpy(mine.data() + at, local + static_cast<std::size_t>(off) * elem, bytes);
          at += bytes;
        }
      } else if (!mine.empty()) {
        std::memcpy(mine.data(), local, mine.size());
      }
    }
    std::size_t total = 0;
    for (std::size_t c : counts) total += c;
    std::vector<std::byte> all(total);
    comm_->all_gather_v(std::span<const std::byte>(mine), std::span<std::byte>(all),
                        std::span<const std::size_t>(counts));
    std::size_t at = 0;
    for (int k = 0; k < n; ++k)
      for (auto [off, len] : segs[static_cast<std::size_t>(k)]) {
        const std::size_t bytes = static_cast<std::size_t>(len) * elem;
        std::memcpy(full + static_cast<std::size_t>(off) * elem, all.data() + at, bytes);
        at += bytes;
      }
  }

  std::vector<float> gather_array(Entry& e, Array a) {
    std::vector<float> full;
    if (!keeps(e, a) || e.split.geom.numel() == 0) return full;
    const FullSizes s = full_sizes(e);
    const std::vector<float>* local = nullptr;
    switch (a) {
      case Array::m: full.resize(s.m); local = &e.state.m; break;
      case Array::v: full.resize(s.v); local = &e.state.v; break;
      case Array::v_row: full.resize(s.v_row); local = &e.state.v_row; break;
      case Array::v_col: full.resize(s.v_col); local = &e.state.v_col; break;
      case Array::param: return full;
    }
    gather_bytes(e, a, reinterpret_cast<const std::byte*>(local->data()), sizeof(float),
                 reinterpret_cast<std::byte*>(full.data()));
    return full;
  }

  void gather_param(Entry& e) {
    if (e.split.geom.numel() == 0 || ranks() == 1) return;
    const std::size_t elem = static_cast<std::size_t>(dtype_size(e.param.dtype));
    auto* data = static_cast<std::byte*>(e.param.data);
    // gather_bytes copies into `data` after the exchange; the source slices
    // are this rank's own and are not overwritten by other ranks' segments
    gather_bytes(e, Array::param, data, elem, data);
  }

  /// This rank's share of a full array.
  std::vector<float> slice_of(const Entry& e, Array a, const std::vector<float>& full) const {
    std::vector<float> out;
    if (full.empty()) return out;
    for (auto [off, len] : segments(e, rank(), a, false))
      out.insert(out.end(), full.begin() + off, full.begin() + off + len);
    return out;
  }

  // ---------------------------------------------------------- gradients
  index_t first_offending(const Entry& e, const Piece& p) const {
    const index_t first = e.split.first_element(p);
    const index_t n = e.split.elements(p);
    const float scale = static_cast<float>(grad_scale_);
    const float limit = skewadam::detail::gradient_limit(e.split.geom, e.split.factored);
    switch (e.grad.dtype) {
      case Dtype::f32: return skewadam::detail::first_offending(e.grad.template as<float>() + first, n, scale, limit);
      case Dtype::bf16: return skewadam::detail::first_offending(e.grad.template as<bf16>() + first, n, scale, limit);
      case Dtype::f16: return skewadam::detail::first_offending(e.grad.template as<f16>() + first, n, scale, limit);
    }
    return -1;
  }

  static float grad_value(const GradView& g, index_t i) {
    switch (g.dtype) {
      case Dtype::f32: return g.as<float>()[i];
      case Dtype::bf16: return to_float(g.as<bf16>()[i]);
      case Dtype::f16: return to_float(g.as<f16>()[i]);
    }
    return 0.0f;
  }

  static double grad_sum_squares(const Entry& e, const Piece& p) {
    const index_t first = e.split.first_element(p);
    const index_t n = e.split.elements(p);
    return backend::cpu::wide_sum(n, [&](index_t i) {
      const double x = grad_value(e.grad, first + i);
      return x * x;
    });
  }

  // ---------------------------------------------------------- checks
  Entry& entry(ParamId id) {
    if (id.index < 0 || id.index >= size())
      throw std::invalid_argument("param id " + std::to_string(id.index) + ": no such parameter");
    return entries_[static_cast<std::size_t>(id.index)];
  }
  const Entry& entry(ParamId id) const { return const_cast<ShardedOptimizer*>(this)->entry(id); }

  Comm* comm_;
  std::uint64_t seed_ = 0;
  ShardOptions shard_;
  std::vector<Entry> entries_;
  std::unordered_map<std::string, index_t> index_;
  PerTier<Hyperparameters> step_hyper_;  ///< this step's, schedules applied
  std::int64_t steps_ = 0;
  double grad_scale_ = 1.0;
  NonFinitePolicy nonfinite_ = NonFinitePolicy::skip_step;
  index_t whole_experts_ = 0;
  index_t max_cols_ = 0;
  index_t last_exchange_bytes_ = 0;
  int threads_ = 1;
  // reused every step
  std::vector<std::size_t> stepped_;
  std::vector<Work> work_;
  backend::ScratchSpace scratch_;
  std::vector<std::byte> stats_out_, stats_in_;
  std::vector<double> clip_out_, clip_in_;
  std::vector<float> floats_, floats2_;
  std::vector<double> doubles_;
};

}  // namespace skewadam::dist
