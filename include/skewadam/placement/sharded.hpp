#pragma once
// The sharded placement: the optimizer state spread over the ranks of a
// communicator (data parallelism with ZeRO stage 1/2 sharding, and expert
// parallelism). dist/sharded_optimizer.hpp names the optimizer it makes.
//
// A rank keeps state only for what it owns (shard_plan.hpp): row slices of
// every backbone and router tensor, whole experts of every expert bank (or
// row slices: ShardOptions::experts), and reads only its own slice of each
// gradient (after a reduce-scatter, only that slice needs to be valid) and
// writes only its own slice of each parameter.
//
// One step, per rank:
//   0. a small all-gather: every rank has gradients for the same tensors, and
//      none is non-finite (NonFinitePolicy; the owned gradient slices are
//      scanned first, so a rejected step changes nothing);
//   1. the statistics pass over the owned slices (the CPU backend's kernels,
//      backend/cpu/shard_kernels.hpp);
//   2. the statistics exchange: per matrix cut between ranks, each rank's c
//      column sums of g^2 and its sum of R_i; every rank adds them in rank
//      order and finishes C_j and vbar identically;
//   3. the clip exchange: each rank's sum of u^2 per matrix where the clip's
//      scope spans ranks;
//   4. the apply pass over the owned slices.
// Steps 0 and 3 are dist/step_exchange.hpp's, shared with the CUDA backend's
// sharded engine (placement/sharded_cuda.hpp).
// Exchanges are all-gathers summed in rank order on every rank (never an
// all-reduce), so every rank holds the same C_j and clip divisors bit for bit,
// and the same rank count gives the same bits on every run. Matrices that one
// rank owns whole (every matrix at one rank, expert banks dealt out by expert)
// are computed exactly as the local placement computes them, bit for bit; a
// matrix cut between ranks adds its partial sums in a different order than
// one process does, within the golden tolerances. Stochastic rounding uses
// each element's index in the whole tensor, as one process does.
//
// Export, import and gather_params move arrays between the ranks' shares and
// complete tensors through dist/shard_transfer.hpp.
//
// Each rank runs its pieces (one per matrix slice it owns) on the optimizer's
// threads, a piece per thread at a time; pieces are independent, so the bits
// do not depend on the thread count. A single large piece runs on one thread.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "../backend/cpu/cpu_backend.hpp"
#include "../backend/cpu/shard_kernels.hpp"
#include "../backend/cpu/summation.hpp"
#include "../backend/gradient_check.hpp"
#include "../backend/work.hpp"
#include "../config.hpp"
#include "../dist/communicator.hpp"
#include "../dist/shard_plan.hpp"
#include "../dist/shard_transfer.hpp"
#include "../dist/step_exchange.hpp"
#include "../dtype.hpp"
#include "../engine.hpp"
#include "../nonfinite.hpp"
#include "../optimizer_options.hpp"
#include "../param_state.hpp"
#include "../rule_dispatch.hpp"
#include "../state_layout.hpp"

namespace skewadam::dist {

struct ShardOptions {
  ExpertSharding experts = ExpertSharding::experts;
};

namespace detail {
/// std::invalid_argument unless `shard` is valid and comm's rank lies in its group.
template <Communicator Comm>
void check_sharding(const Comm& comm, const ShardOptions& shard) {
  if (shard.experts != ExpertSharding::experts && shard.experts != ExpertSharding::rows)
    throw std::invalid_argument("shard.experts: unknown value " + std::to_string(static_cast<int>(shard.experts)));
  if (comm.size() < 1 || comm.rank() < 0 || comm.rank() >= comm.size())
    throw std::invalid_argument("comm: rank " + std::to_string(comm.rank()) + " of " + std::to_string(comm.size()) +
                                " is not a valid position in a group");
}
}  // namespace detail

template <class Tiers, class Backend, Communicator Comm>
class ShardedEngine {
  static_assert(sizeof(Backend) == 0,
                "skewadam::dist::Sharded: no engine for this backend (backend::CpuBackend<Arch> has one here; "
                "backend::CudaBackend<R> in placement/sharded_cuda.hpp)");
};

/// The state sharded over the ranks of a Comm.
template <Communicator Comm>
struct Sharded {
  static constexpr bool sharded = true;
  using communicator_type = Comm;
  using options_type = ShardOptions;
  template <class Tiers, class Backend>
  using engine = ShardedEngine<Tiers, Backend, Comm>;
};

template <class Tiers, class Arch, Communicator Comm>
class ShardedEngine<Tiers, backend::CpuBackend<Arch>, Comm> {
 public:
  using staged_type = std::vector<ParamState>;

  ShardedEngine(Comm& comm, const OptimizerOptions& options, ShardOptions shard) : comm_(&comm), shard_(shard) {
    detail::check_sharding(comm, shard);
    set_threads(options.threads);
  }

  /// Host memory: every address is the backend's.
  static constexpr bool host_memory = true;
  void check_memory(std::string_view, const ParamView&, const GradView&) const noexcept {}


  Comm& comm() const noexcept { return *comm_; }
  int rank() const noexcept { return comm_->rank(); }
  int ranks() const noexcept { return comm_->size(); }

  void set_threads(int n) {
    if (n < 0) throw std::invalid_argument("threads = " + std::to_string(n) + ": must be >= 0 (0: hardware)");
    threads_ = n == 0 ? backend::CpuBackend<Arch>::hardware_threads() : n;
    resize_scratch();
  }
  int threads() const noexcept { return threads_; }

  // ------------------------------------------------------------ registration
  void add(const TensorRegistration& spec) {
    Entry e;
    e.rank1 = spec.param.shape.rank() < 2;
    e.split = split_for(spec.tier, spec.param.shape, spec.layout, ranks(), shard_.experts, whole_experts_);
    e.pieces = e.split.pieces(rank());
    allocate(e, spec.layout);
    entries_.push_back(std::move(e));
    if (entries_.back().split.split == Split::whole) ++whole_experts_;
  }
  void pop_back() noexcept {
    if (entries_.back().split.split == Split::whole) --whole_experts_;
    entries_.pop_back();
  }

  const TensorSplit& split(std::size_t i) const { return entries_[i].split; }
  std::span<const Piece> pieces(std::size_t i) const { return entries_[i].pieces; }
  ParamStateView view(std::size_t i) const {
    const ParamState& s = entries_[i].state;
    return {s.m, s.v, s.v_row, s.v_col, 0};
  }
  index_t state_bytes(std::size_t i) const noexcept { return entries_[i].state.bytes(); }
  std::vector<index_t> per_rank(index_t mine) const {
    std::vector<index_t> all(static_cast<std::size_t>(ranks()));
    all_gather_values<Comm, index_t>(*comm_, std::span<const index_t>(&mine, 1), std::span<index_t>(all));
    return all;
  }
  index_t last_exchange_bytes() const noexcept { return last_exchange_bytes_; }

  // ---------------------------------------------------------------- state
  /// Tensor i's complete state, gathered from its owners (collective).
  ParamState export_arrays(std::size_t i) const {
    const Entry& e = entries_[i];
    ParamState s;
    s.m = gather_array(e, ShardArray::m);
    s.v = gather_array(e, ShardArray::v);
    s.v_row = gather_array(e, ShardArray::v_row);
    s.v_col = gather_array(e, ShardArray::v_col);
    return s;
  }
  void check_arrays(std::size_t i, const ParamState& got, const std::string& who) const {
    const FullSizes want = full_sizes(entries_[i].split, entries_[i].momentum);
    skewadam::detail::check_array_sizes({want.m, want.v, want.v_row, want.v_col}, got, who);
  }
  staged_type stage_begin() const { return staged_type(entries_.size()); }
  /// Keeps this rank's share of tensor i's complete arrays.
  void stage(staged_type& staged, std::size_t i, ParamState&& full) const {
    const Entry& e = entries_[i];
    ParamState& l = staged[i];
    l.m = share_of(e.split, rank(), ShardArray::m, full.m);
    l.v = share_of(e.split, rank(), ShardArray::v, full.v);
    l.v_row = share_of(e.split, rank(), ShardArray::v_row, full.v_row);
    l.v_col = share_of(e.split, rank(), ShardArray::v_col, full.v_col);
  }
  void commit(std::vector<ParamState>&& staged) noexcept {
    for (std::size_t i = 0; i < entries_.size(); ++i) std::swap(entries_[i].state, staged[i]);
  }

  /// Completes every rank's copy of a parameter from its owners (collective).
  void gather_param(std::size_t i, const ParamView& param) {
    const Entry& e = entries_[i];
    if (e.split.geom.numel() == 0 || ranks() == 1) return;
    const std::size_t elem = static_cast<std::size_t>(dtype_size(param.dtype));
    auto* data = static_cast<std::byte*>(param.data);
    gather_shards(*comm_, e.split, ShardArray::param, data, elem, data);
  }

  // ----------------------------------------------------------------- step
  /// Sum of g^2 over the listed gradients (collective): each rank sums its
  /// own slices in double, the ranks' sums are added in rank order.
  double grad_sum_squares(std::span<const StepItem> items) const {
    double sum = 0;
    for (const StepItem& it : items) {
      const Entry& e = entries_[static_cast<std::size_t>(it.index)];
      for (const Piece& p : e.pieces)
        sum += backend::cpu::grad_sum_squares(it.grad, e.split.first_element(p), e.split.elements(p));
    }
    return sum_over_ranks(*comm_, sum);
  }

  std::optional<Offender> step(std::span<const StepItem> items, NonFinitePolicy policy) {
    last_exchange_bytes_ = 0;
    mark_stepped(entries_, items, stepped_);
    if (std::optional<Offender> bad = preflight(policy)) return bad;

    // 1. statistics, and everything of matrices owned whole
    build_tasks();
    for_each_work([this](Work& w, backend::Scratch scratch) { statistics(w, scratch); });

    // 2. the statistics exchange: column sums and sum of R_i of cut matrices
    pack_statistics();
    exchange(stats_out_, stats_in_);
    finish_cut_matrices();

    // 3. the clip exchange and the divisors
    clip_divisors();

    // 4. apply
    for_each_work([this](Work& w, backend::Scratch scratch) { apply(w, scratch); });
    return std::nullopt;
  }

 private:
  struct Entry {
    TensorSplit split;
    std::vector<Piece> pieces;
    bool momentum = false;
    bool rank1 = false;
    ParamState state;  ///< this rank's share, pieces concatenated; its step stays 0
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
    // during a step
    const StepItem* item = nullptr;  ///< null: not stepped
    const backend::cpu::ShardKernels* kernels = nullptr;
  };

  /// One piece of one stepped tensor.
  struct Work {
    std::size_t entry = 0;
    std::size_t piece = 0;
    backend::TensorTask task;
    const backend::cpu::ShardKernels* kernels = nullptr;
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

  // ---------------------------------------------------------- the step
  /// Step 0: the ranks agree on the stepped tensors; the owned gradient
  /// slices are scanned for non-finite values (unless unchecked).
  std::optional<Offender> preflight(NonFinitePolicy policy) {
    std::optional<Offender> mine;
    if (policy != NonFinitePolicy::unchecked) {
      for (std::size_t i : stepped_) {
        const Entry& e = entries_[i];
        for (const Piece& p : e.pieces) {
          const index_t at = first_offending(e, p);
          if (at < 0) continue;
          const index_t element = e.split.first_element(p) + at;
          mine = Offender{static_cast<index_t>(i), element,
                          backend::grad_element(e.item->grad, element) * e.item->scalars.grad_scale};
          break;
        }
        if (mine) break;
      }
    }
    return agree_on_step(*comm_, std::span<const std::size_t>(stepped_), mine, last_exchange_bytes_);
  }

  index_t first_offending(const Entry& e, const Piece& p) const {
    const index_t first = e.split.first_element(p);
    const index_t n = e.split.elements(p);
    const GradView& g = e.item->grad;
    const float scale = e.item->scalars.grad_scale;
    const float limit = backend::gradient_limit(e.split.geom, e.split.factored);
    switch (g.dtype) {
      case Dtype::bf16: return backend::first_offending(g.template as<bf16>() + first, n, scale, limit);
      case Dtype::f16: return backend::first_offending(g.template as<f16>() + first, n, scale, limit);
      case Dtype::f32: break;
    }
    return backend::first_offending(g.template as<float>() + first, n, scale, limit);
  }

  void build_tasks() {
    work_.clear();
    for (std::size_t i : stepped_) {
      Entry& e = entries_[i];
      const StepItem& it = *e.item;
      const MatrixGeometry& g = e.split.geom;
      e.kernels = pick(it.tier, it.param.dtype, it.grad.dtype, e.rank1);
      const backend::cpu::ShardKernels* k = e.kernels;
      for (std::size_t q = 0; q < e.pieces.size(); ++q) {
        const Piece& p = e.pieces[q];
        Work w;
        w.entry = i;
        w.piece = q;
        w.kernels = k;
        backend::TensorTask& task = w.task;
        const index_t first = e.split.first_element(p);
        task.param = static_cast<char*>(it.param.data) + first * dtype_size(it.param.dtype);
        task.grad = static_cast<const char*>(it.grad.data) + first * dtype_size(it.grad.dtype);
        task.geom = e.split.factored ? MatrixGeometry{1, p.size(), g.cols} : MatrixGeometry{1, 1, p.size()};
        task.factored = e.split.factored;
        task.scope = it.scope;
        task.scalars = it.scalars;
        task.key = it.key;
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
  /// scope spans ranks (dist/step_exchange.hpp).
  void clip_divisors() {
    struct Tensors {
      ShardedEngine& x;
      bool clips(std::size_t i) const { return x.entries_[i].kernels->clip; }
      const TensorSplit& split(std::size_t i) const { return x.entries_[i].split; }
      bool per_matrix(std::size_t i) const { return x.entries_[i].item->scope == ClipScope::matrix; }
      std::size_t pieces(std::size_t i) const { return x.entries_[i].pieces.size(); }
      index_t matrix(std::size_t i, std::size_t q) const { return x.entries_[i].pieces[q].matrix; }
      double sum_u2(std::size_t i, std::size_t q) const {
        const Entry& e = x.entries_[i];
        return e.split.factored && e.split.cuts_matrices() ? e.piece_u2[q] : e.matrices[q].sum_u2;
      }
      float divisor(std::size_t i, double sum, index_t count) const {
        const Entry& e = x.entries_[i];
        return visit_rule<Tiers>(e.item->tier, e.rank1,
                                 [&]<class Rule>() { return Rule::clip::divisor(sum, count, e.item->scalars); });
      }
      void set_divisor(std::size_t i, std::size_t q, float d) const { x.entries_[i].matrices[q].divisor = d; }
    };
    Tensors t{*this};
    last_exchange_bytes_ += dist::clip_divisors(*comm_, std::span<const std::size_t>(stepped_), t, clip_);
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
  static const backend::cpu::ShardKernels* kernels() {
    if constexpr (std::is_same_v<Arch, DispatchArch>)
      return backend::cpu::visit_arch(backend::cpu::selected_arch(), []<class A>() {
        return backend::cpu::ShardKernelsOf<Rule, P, G, A>::table();
      });
    else
      return backend::cpu::ShardKernelsOf<Rule, P, G, Arch>::table();
  }
  static const backend::cpu::ShardKernels* pick(Tier t, Dtype p, Dtype g, bool rank1) {
    return visit_rule<Tiers>(t, rank1, [&]<class Rule>() {
      return visit_dtypes(p, g, []<class P, class G>() { return kernels<Rule, P, G>(); });
    });
  }

  // ---------------------------------------------------------- transfers
  /// A complete state array of e, gathered from its owners (collective).
  std::vector<float> gather_array(const Entry& e, ShardArray a) const {
    std::vector<float> full;
    if (!shard_keeps(e.split, e.momentum, a) || e.split.geom.numel() == 0) return full;
    const FullSizes s = full_sizes(e.split, e.momentum);
    const std::vector<float>* local = nullptr;
    switch (a) {
      case ShardArray::m: full.resize(s.m); local = &e.state.m; break;
      case ShardArray::v: full.resize(s.v); local = &e.state.v; break;
      case ShardArray::v_row: full.resize(s.v_row); local = &e.state.v_row; break;
      case ShardArray::v_col: full.resize(s.v_col); local = &e.state.v_col; break;
      case ShardArray::param: return full;
    }
    gather_shards(*comm_, e.split, a, reinterpret_cast<const std::byte*>(local->data()), sizeof(float),
           reinterpret_cast<std::byte*>(full.data()));
    return full;
  }

  Comm* comm_;
  ShardOptions shard_;
  std::vector<Entry> entries_;
  index_t whole_experts_ = 0;
  index_t max_cols_ = 0;
  index_t last_exchange_bytes_ = 0;
  int threads_ = 1;
  // reused every step
  std::vector<std::size_t> stepped_;
  std::vector<Work> work_;
  backend::ScratchSpace scratch_;
  std::vector<std::byte> stats_out_, stats_in_;
  ClipScratch clip_;
  std::vector<float> floats_, floats2_;
};

}  // namespace skewadam::dist
