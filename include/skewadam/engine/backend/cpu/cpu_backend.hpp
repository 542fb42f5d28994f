#pragma once
// CpuBackend<Arch>: the CPU backend (engine/backend/backend.hpp). State in host
// vectors, a piece's statistics and update as TensorTasks cut into Units
// (work.hpp), run on OpenMP threads by the kernels of kernels.hpp.
//
// A pass is one parallel region over every piece of the step: the statistics
// units (a piece is finished by the thread that completes its last unit, so
// no barrier separates the two), and the apply units after one barrier, when
// the engine hands both passes in one run() (no exchange between them: the
// local placement's whole step is one region). Units are taken dynamically, but
// every unit's result is independent of who computes it and partials are
// combined in a fixed order, so results are bit-identical for any thread
// count.
//
// The non-finite check (check()): tensors whose statistics pass writes only
// their small factored statistics R and C (factored rules without momentum:
// the experts, 95 % of an MoE's parameters) run their statistics pass at
// once, R and C copied first (B (r + c) floats, never numel): a non-finite
// gradient makes its row's R_i or column's C_j non-finite, so checking them
// afterwards detects it inside a pass that runs anyway, and reject() restores
// them. Every other tensor's gradient is scanned (gradient_check.hpp) in the
// same region. The results are bit-identical to an unchecked step.
//
// On a machine shared with other work, OpenMP threads that spin while they
// wait take CPU time from the thread they wait for: OMP_WAIT_POLICY=passive
// (libgomp: or a small GOMP_SPINCOUNT) made a 2-thread step 2-3x faster here
// under a busy co-tenant (bench/RESULTS.md).
//
// Arch is an xsimd architecture tag (xsimd::avx2, xsimd::avx512bw, ...),
// skewadam::ScalarArch, or skewadam::DispatchArch: the level chosen at run
// time among those compiled in, the widest the processor supports unless
// SKEWADAM_CPU_ARCH says otherwise (arch.hpp). DefaultBackend is the widest
// compiled level's, or DispatchArch's under SKEWADAM_RUNTIME_DISPATCH.

#include <algorithm>
#include <array>
#include <atomic>
#include <limits>
#include <numeric>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "../../../detail/config.hpp"
#include "../../../memory/host_memory.hpp"
#include "../../../math/step_scalars.hpp"
#include "../../../rules/rule_dispatch.hpp"
#include "../../../types/dtype.hpp"
#include "../backend.hpp"
#include "../gradient_check.hpp"
#include "arch.hpp"
#include "kernels.hpp"
#include "simd.hpp"
#include "summation.hpp"
#include "work.hpp"

// The compiled mode: the shipped rules' kernels come from skewadam::compiled.
#if defined(SKEWADAM_COMPILED)
#include "compiled.hpp"
#endif

namespace skewadam::backend {

namespace cpu {
/// A kernel that scans a gradient instead of stepping it: its task is cut
/// into element chunks; unit k writes to task.unit_sum[k] the offset of the
/// chunk's first offending element, or -1.
template <class G>
struct GradientScan {
  static void statistics(const TensorTask& t, const WorkUnit& u, Scratch) {
    const G* g = static_cast<const G*>(t.grad) + u.matrix * t.geom.matrix_size();
    t.unit_sum[u.block] =
        static_cast<double>(first_offending(g + u.begin, u.end - u.begin, t.scalars.grad_scale, t.grad_limit));
  }
  static void finalize(const TensorTask&, Scratch) {}
  static const KernelTable* table() noexcept {
    static constexpr KernelTable k{&statistics, &finalize, nullptr, nullptr};
    return &k;
  }
};
}  // namespace cpu

template <class Arch = DispatchArch>
class CpuBackend {
 public:
  using arch = Arch;
  using memory_type = HostMemory;

  /// Checks the architecture choice (SKEWADAM_CPU_ARCH) up front: an invalid
  /// one throws here, before any parameter is registered. The backend of the
  /// widest compiled level (NativeBackend) refuses a choice of another level:
  /// it holds no other kernels.
  CpuBackend() {
    if constexpr (std::is_same_v<Arch, DispatchArch>) {
      (void)cpu::selected_arch();
    } else if constexpr (std::is_same_v<Arch, cpu::widest_tag_t>) {
      const char* env = std::getenv("SKEWADAM_CPU_ARCH");
      if (env == nullptr || *env == '\0') return;
      const CpuArch a = cpu::parse_arch(env, "SKEWADAM_CPU_ARCH");
      if (a != cpu::widest_compiled())
        throw std::invalid_argument(std::string("SKEWADAM_CPU_ARCH=") + env + ": this program's CPU backend holds the " +
                                    cpu::level_name(cpu::widest_compiled()) +
                                    " kernels alone (define SKEWADAM_RUNTIME_DISPATCH to choose the level at run time)");
    }
  }
  explicit CpuBackend(const OptimizerOptions& options) : CpuBackend() { set_threads(options.threads); }

  /// The name of the architecture the kernels run ("avx512bw", "scalar"...).
  static const char* arch_name() { return Arch::name(); }

  /// The kernels of a rule for parameters of element type P and gradients of
  /// G (cpu::kernel_table: compiled once by skewadam::compiled where linked).
  template <class Rule, class P, class G>
  static const KernelTable* kernels() {
    if constexpr (std::is_same_v<Arch, DispatchArch>)
      return cpu::visit_arch(cpu::selected_arch(), []<class A>() { return cpu::kernel_table<Rule, P, G, A>(); });
    else
      return cpu::kernel_table<Rule, P, G, Arch>();
  }

  /// Threads used per step; 0 selects the hardware's count.
  void set_threads(int n) {
    if (n < 0) throw std::invalid_argument("threads = " + std::to_string(n) + ": must be >= 0 (0: hardware)");
    threads_ = n == 0 ? hardware_threads() : n;
    scratch_.resize(threads_, max_cols_);
  }
  int threads() const noexcept { return threads_; }
  /// The host's memory (the engine keeps the state there).
  HostMemory memory() const noexcept { return {}; }
  static int hardware_threads() noexcept {
#if defined(_OPENMP)
    return std::max(1, omp_get_max_threads());
#else
    return 1;
#endif
  }

  // ------------------------------------------------------ registration
  /// A tensor's kernels: for a gradient of the parameter's dtype, and for an
  /// fp32 one (the engine picks them by rule and dtypes, kernels<Rule, P, G>()).
  using kernels_type = const KernelTable*;

  /// Tensor n's pieces, whose arrays are at `state` (one per piece).
  void add(const TensorRegistration& reg, std::span<const PieceSpec> specs, std::array<kernels_type, 2> kernels,
           std::span<const PieceState> state) {
    Tensor e;
    e.kernels = kernels;
    e.tier = reg.tier;
    e.factored = !specs.empty() && specs.front().factored;
    if (!specs.empty()) e.limit = gradient_limit({1, specs.front().full_rows, specs.front().geom.cols}, e.factored);
    const bool stored = reg.layout.momentum && reg.layout.storage != MomentumStorage::f32;
    // a tensor is restorable when its statistics pass writes only R and C
    e.restorable = e.factored && !reg.layout.momentum;
    for (const PieceSpec& spec : specs)
      if (spec.factored) {
        e.rows += spec.geom.batch * spec.geom.rows;
        e.cols += spec.geom.batch * spec.geom.cols;
      }
    if (e.restorable) e.backup_floats = e.rows + e.cols;
    for (std::size_t q = 0; q < specs.size(); ++q) {
      const PieceSpec& spec = specs[q];
      PieceWork p;
      p.spec = spec;
      TensorTask& t = p.task;
      t.geom = spec.geom;
      t.factored = spec.factored;
      t.element_base = spec.first;
      t.cut = spec.cut;
      t.full_rows = spec.full_rows;
      t.grad_limit = e.limit;
      const auto B = static_cast<std::size_t>(spec.geom.batch);
      if (spec.factored) {
        t.row_blocks = Cutting::row_blocks(spec.geom);
        if (stored) t.row_align = momentum_block / std::gcd(spec.geom.cols, momentum_block);
        p.partial_floats = Cutting::partial_floats(spec.geom, spec.cut);
      } else {
        t.chunks_per_matrix = Cutting::chunks_per_matrix(spec.geom);
        p.unit_sum.assign(B * static_cast<std::size_t>(t.chunks_per_matrix), 0.0);
      }
      p.matrices.assign(B, MatrixScratch{});
      p.scan.assign(B * static_cast<std::size_t>(Cutting::chunks_per_matrix(spec.geom)), -1.0);
      p.clip_at = spec.clip_at;
      p.cut_at = spec.cut_at;
      e.pieces.push_back(std::move(p));
    }
    point(e, state);
    const index_t cols_needed = specs.empty() || !e.factored ? 0 : specs.front().geom.cols;
    if (cols_needed > max_cols_) {
      scratch_.resize(threads_, cols_needed);
      max_cols_ = cols_needed;
    }
    clip_sums_.resize(clip_sums_.size() + static_cast<std::size_t>(e.matrices()), 0.0);
    divisors_.resize(clip_sums_.size(), 1.0f);
    cut_sums_.resize(cut_sums_.size() + static_cast<std::size_t>(e.cut_values()), 0.0);
    tensors_.push_back(std::move(e));
  }
  void pop_back() noexcept {
    const Tensor& e = tensors_.back();
    clip_sums_.resize(clip_sums_.size() - static_cast<std::size_t>(e.matrices()));
    divisors_.resize(clip_sums_.size());
    cut_sums_.resize(cut_sums_.size() - static_cast<std::size_t>(e.cut_values()));
    tensors_.pop_back();
  }
  /// Tensor i's arrays are now at `state` (an import moved them).
  void point(std::size_t i, std::span<const PieceState> state) noexcept { point(tensors_[i], state); }

  index_t scratch_bytes() const noexcept {
    std::size_t b = scratch_.bytes() + 8 * (clip_sums_.size() + cut_sums_.size()) + 4 * divisors_.size() +
                    4 * workspace_.size();
    for (const Tensor& e : tensors_)
      for (const PieceWork& p : e.pieces)
        b += 8 * (p.unit_sum.size() + p.scan.size()) + sizeof(MatrixScratch) * p.matrices.size();
    return static_cast<index_t>(b);
  }

  // ----------------------------------------------------------------- step
  void prepare(std::span<const StepItem> items, const StepSettings& settings) {
    settings_ = settings;
    counts_ = settings.counts;
    stepped_.clear();
    tasks_.clear();
    place_workspace(items);
    for (const StepItem& it : items) {
      Tensor& e = tensors_[static_cast<std::size_t>(it.index)];
      stepped_.push_back(Stepped{static_cast<std::size_t>(it.index), &it});
      const KernelTable* k = e.kernels[it.grad.dtype == Dtype::f32 ? 1 : 0];
      for (PieceWork& p : e.pieces) {
        p.task.param = static_cast<char*>(it.param.data) + p.spec.first * dtype_size(it.param.dtype);
        p.task.grad = static_cast<const char*>(it.grad.data) + p.spec.first * dtype_size(it.grad.dtype);
        p.task.kernel = k;
        p.task.scope = settings.hyper[tier_index(e.tier)].clip_scope;
        tasks_.push_back(Active{&p, &e, it.grad.dtype, false});
      }
    }
  }

  /// Each stepped tensor's scalars and key from its count; with max_norm the
  /// global-norm scale from this process's sum of g^2.
  void begin() {
    norm_sq_ = std::numeric_limits<double>::quiet_NaN();
    if (settings_.max_norm > 0) {
      norm_sq_ = 0;
      for (const Stepped& s : stepped_) norm_sq_ += tensor_squares(tensors_[s.index], s.item->grad);
    }
    const double scale = step_grad_scale(settings_.grad_scale, settings_.max_norm, norm_sq_);
    for (const Stepped& s : stepped_) {
      Tensor& e = tensors_[s.index];
      const std::int64_t t = counts_[s.index] + 1;
      const StepScalars sc = make_step_scalars(settings_.hyper[tier_index(e.tier)], t, scale);
      for (PieceWork& p : e.pieces) {
        p.task.scalars = sc;
        p.task.key = RoundingKey{settings_.seed, s.item->stream, static_cast<std::uint64_t>(t)};
      }
    }
    verdict_ = Verdict{};
  }

  Verdict check(NonFinitePolicy policy) {
    if (policy == NonFinitePolicy::unchecked) return verdict_;
    begin_pass();
    for (Active& a : tasks_) {
      if (a.tensor->restorable) {
        if (&a.tensor->pieces.front() == a.piece) save_statistics(*a.tensor);
        add_to_pass(a.piece->task, a.piece);
        a.done = true;
      } else {
        add_to_pass(scan_task(*a.piece, a.grad), a.piece);
      }
    }
    run_region(true, false);
    for (const Stepped& s : stepped_) {
      Tensor& e = tensors_[s.index];
      if (e.pieces.empty()) continue;
      if (e.restorable && all_finite(e.v_row, static_cast<std::size_t>(e.rows)) &&
          all_finite(e.v_col, static_cast<std::size_t>(e.cols)))
        continue;
      if (e.restorable) {  // something offends: find it
        begin_pass();
        for (PieceWork& p : e.pieces) add_to_pass(scan_task(p, s.item->grad.dtype), &p);
        run_region(true, false);
      }
      std::optional<Offender> o = first_offender(s);
      if (!o && e.restorable) o = Offender{static_cast<index_t>(s.index), -1, 0.0f};  // (no element offends alone)
      if (o) {
        verdict_.offender = o;
        break;
      }
    }
    return verdict_;
  }
  /// Restores what check() wrote: the statistics of restorable tensors.
  void reject() noexcept {
    for (const Stepped& s : stepped_) {
      Tensor& e = tensors_[s.index];
      if (!e.restorable) continue;
      std::copy_n(e.backup, e.rows, e.v_row);
      std::copy_n(e.backup + e.rows, e.cols, e.v_col);
    }
  }

  /// The passes of a step (backend.hpp). Statistics and apply given together
  /// run in one parallel region, the apply after a barrier: a piece that is
  /// not cut is finished by the thread that completes its statistics, so its
  /// finish pass is part of the region (a cut piece's waits for the totals,
  /// and so never comes with its statistics).
  void run(Passes passes) {
    if (passes.has(Pass::statistics) && passes.has(Pass::apply)) {
      begin_pass();
      bool stats = false;
      for (Active& a : tasks_) {
        add_to_pass(a.piece->task, a.piece, !a.done);
        stats = stats || !a.done;
        a.done = true;
      }
      run_region(stats, true);
    } else {
      if (passes.has(Pass::statistics)) {
        begin_pass();
        for (Active& a : tasks_)
          if (!a.done) {
            add_to_pass(a.piece->task, a.piece);
            a.done = true;
          }
        run_region(true, false);
      }
      if (passes.has(Pass::finish)) finish_cut_pieces();
      if (passes.has(Pass::apply)) {
        begin_pass();
        for (Active& a : tasks_) add_to_pass(a.piece->task, a.piece, false);
        run_region(false, true);
      }
    }
    if (passes.has(Pass::count)) {
      for (const Stepped& s : stepped_) ++counts_[s.index];
      if (settings_.counts_step) ++counts_[tensors_.size()];
    }
  }
  std::span<double> cut_sums() noexcept { return cut_sums_; }
  void set_cut_sums() noexcept {}  // the placement wrote them in place
  std::span<const double> clip_sums() {
    for (const Active& a : tasks_)
      for (std::size_t b = 0; b < a.piece->matrices.size(); ++b)
        clip_sums_[static_cast<std::size_t>(a.piece->clip_at) + b] = a.piece->matrices[b].sum_u2;
    return clip_sums_;
  }
  std::span<float> divisors() noexcept { return divisors_; }
  void set_divisors() noexcept {
    for (const Active& a : tasks_)
      for (std::size_t b = 0; b < a.piece->matrices.size(); ++b)
        a.piece->matrices[b].divisor = divisors_[static_cast<std::size_t>(a.piece->clip_at) + b];
  }
  std::optional<Offender> outcome() const { return verdict_.offender; }
  double clip_sum_squares() const noexcept { return norm_sq_; }

  /// The kernels of `tasks` alone, without a step around them (kernel tests):
  /// their statistics, each task finished as a step finishes it, and their
  /// update, in one parallel region.
  void run(std::span<const TensorTask> tasks) {
    begin_pass();
    for (const TensorTask& t : tasks) {
      add_to_pass(t, nullptr);
      if (t.factored && t.geom.cols > max_cols_) scratch_.resize(threads_, max_cols_ = t.geom.cols);
    }
    run_region(true, true);
  }

  /// Sum of g^2 over this process's pieces of the listed gradients, in item
  /// order, in double (summation.hpp).
  double grad_sum_squares(std::span<const StepItem> items) const {
    double sum = 0;
    for (const StepItem& it : items) sum += tensor_squares(tensors_[static_cast<std::size_t>(it.index)], it.grad);
    return sum;
  }

 private:
  /// A piece (PieceSpec) with what this backend keeps to step it.
  struct PieceWork {
    PieceSpec spec;
    TensorTask task;  ///< its state and scratch pointers; the step's fields are set by prepare() and begin()
    std::vector<MatrixScratch> matrices;
    index_t partial_floats = 0;  ///< of the step's workspace, for its row blocks' column sums and again for D_j
    std::vector<double> unit_sum;
    std::vector<double> scan;  ///< per chunk: first offending offset, or -1
    index_t clip_at = 0;  ///< its first matrix in clip_sums_ and divisors_
    index_t cut_at = -1;  ///< its c + 1 values in cut_sums_ (cut)
  };
  struct Tensor {
    std::array<kernels_type, 2> kernels{};
    Tier tier = Tier::backbone;
    bool factored = false;
    bool restorable = false;
    float limit = 0;
    index_t rows = 0, cols = 0;  ///< factored: its pieces' R_i and C_j (their arrays' sizes)
    float* v_row = nullptr;      ///< its pieces' R_i, then
    float* v_col = nullptr;      ///< their C_j, each concatenated in piece order (the engine's StateStore)
    index_t backup_floats = 0;  ///< restorable: v_row and v_col, saved before the step
    float* backup = nullptr;    ///< where in the step's workspace
    std::vector<PieceWork> pieces;
    index_t matrices() const noexcept {
      index_t n = 0;
      for (const PieceWork& p : pieces) n += p.spec.geom.batch;
      return n;
    }
    index_t cut_values() const noexcept {
      index_t n = 0;
      for (const PieceWork& p : pieces)
        if (p.spec.cut) n += p.spec.geom.cols + 1;
      return n;
    }
  };
  struct Stepped {
    std::size_t index;
    const StepItem* item;
  };
  struct Active {
    PieceWork* piece;
    Tensor* tensor;
    Dtype grad;
    bool done;  ///< its statistics ran in check()
  };

  /// Points e's pieces at their arrays, and their scratch.
  static void point(Tensor& e, std::span<const PieceState> state) noexcept {
    e.v_row = state.empty() ? nullptr : state.front().v_row;
    e.v_col = state.empty() ? nullptr : state.front().v_col;
    for (std::size_t q = 0; q < e.pieces.size(); ++q) {
      PieceWork& p = e.pieces[q];
      TensorTask& t = p.task;
      point_piece(t, state[q]);
      t.matrices = p.matrices.data();
      t.col_partial = t.d_partial = nullptr;  // the step's workspace (place_workspace)
      t.unit_sum = p.unit_sum.empty() ? nullptr : p.unit_sum.data();
    }
  }

  void save_statistics(Tensor& e) {
    std::copy_n(e.v_row, e.rows, e.backup);
    std::copy_n(e.v_col, e.cols, e.backup + e.rows);
  }

  /// Points the stepped pieces' column partials and the restorable tensors'
  /// backups into the step's workspace, which grows to the largest step's
  /// need: a step of one tensor (inside backward) needs that tensor's alone,
  /// so what the backend keeps besides the state stays small.
  void place_workspace(std::span<const StepItem> items) {
    std::size_t need = 0;
    for (const StepItem& it : items) {
      const Tensor& e = tensors_[static_cast<std::size_t>(it.index)];
      need += static_cast<std::size_t>(e.backup_floats);
      for (const PieceWork& p : e.pieces) need += 2 * static_cast<std::size_t>(p.partial_floats);
    }
    if (need > workspace_.size()) std::vector<float>(need).swap(workspace_);  // exactly this size
    float* at = workspace_.data();
    for (const StepItem& it : items) {
      Tensor& e = tensors_[static_cast<std::size_t>(it.index)];
      e.backup = e.backup_floats > 0 ? at : nullptr;
      at += e.backup_floats;
      for (PieceWork& p : e.pieces) {
        p.task.col_partial = p.partial_floats > 0 ? at : nullptr;
        p.task.d_partial = p.partial_floats > 0 ? at + p.partial_floats : nullptr;
        at += 2 * p.partial_floats;
      }
    }
  }

  /// A task that scans piece p's gradient, chunk by chunk, into p.scan.
  static TensorTask scan_task(const PieceWork& p, Dtype grad) {
    TensorTask t = p.task;
    switch (grad) {
      case Dtype::f32: t.kernel = cpu::GradientScan<float>::table(); break;
      case Dtype::bf16: t.kernel = cpu::GradientScan<bf16>::table(); break;
      case Dtype::f16: t.kernel = cpu::GradientScan<f16>::table(); break;
    }
    t.factored = false;
    t.cut = false;
    t.chunks_per_matrix = Cutting::chunks_per_matrix(t.geom);
    t.unit_sum = const_cast<double*>(p.scan.data());
    t.m = t.v = t.v_row = t.v_col = nullptr;
    return t;
  }

  /// The first offending element of a stepped tensor's pieces, from their scans.
  std::optional<Offender> first_offender(const Stepped& s) const {
    const Tensor& e = tensors_[s.index];
    for (const PieceWork& p : e.pieces) {
      const index_t per_matrix = Cutting::chunks_per_matrix(p.spec.geom);
      for (std::size_t u = 0; u < p.scan.size(); ++u) {
        if (p.scan[u] < 0) continue;
        const auto k = static_cast<index_t>(u);
        const index_t element = p.spec.first + (k / per_matrix) * p.spec.geom.matrix_size() +
                                (k % per_matrix) * Cutting::chunk_elems + static_cast<index_t>(p.scan[u]);
        return Offender{static_cast<index_t>(s.index), element,
                        grad_element(s.item->grad, element) * p.task.scalars.grad_scale};
      }
    }
    return std::nullopt;
  }

  /// Sum of g^2 over tensor e's pieces of gradient g, in piece order.
  static double tensor_squares(const Tensor& e, const GradView& g) {
    double sum = 0;
    for (const PieceWork& p : e.pieces) sum += cpu::grad_sum_squares(g, p.spec.first, p.spec.geom.numel());
    return sum;
  }

  /// The cut pieces' C_j, vbar and sums of u^2, from the totals over
  /// processes in cut_sums_.
  void finish_cut_pieces() {
    cut_.clear();
    for (const Active& a : tasks_)
      if (a.piece->spec.cut) cut_.push_back(a.piece);
    parallel(static_cast<std::int64_t>(cut_.size()), [&](std::int64_t k, Scratch s) {
      const PieceWork& p = *cut_[static_cast<std::size_t>(k)];
      p.task.kernel->finish_cut(p.task, cut_sums_.data() + p.cut_at, s);
    });
  }

  void begin_pass() noexcept {
    pass_.clear();
    pass_piece_.clear();
    pass_stats_.clear();
  }
  /// Task t of piece p joins the next region; `stats`: its statistics units
  /// run there (else only its apply units, if the region applies).
  void add_to_pass(const TensorTask& t, PieceWork* p, bool stats = true) {
    pass_.push_back(t);
    pass_piece_.push_back(p);
    pass_stats_.push_back(stats ? 1 : 0);
  }

  /// The cut piece of task k's c column sums (its row blocks' partials added
  /// in double) and sum of R_i, into cut_sums_.
  void form_cut_sums(std::size_t k) {
    const TensorTask& t = pass_[k];
    const PieceWork& p = *pass_piece_[k];
    const index_t c = t.geom.cols;
    double* out = cut_sums_.data() + p.cut_at;
    for (index_t j = 0; j < c; ++j) {
      double sum = 0;
      for (index_t b = 0; b < t.row_blocks; ++b) sum += static_cast<double>(t.col_partial[b * c + j]);
      out[j] = sum;
    }
    out[c] = cpu::wide_sum(t.geom.rows, [&](index_t i) { return static_cast<double>(t.v_row[i]); });
  }

  /// One parallel region over pass_: the statistics units of the tasks
  /// pass_stats_ marks, each task finished by the thread that completes its
  /// last unit, then, after a barrier, every task's apply units.
  void run_region(bool stats, bool apply) {
    units_.clear();
    for (std::size_t k = 0; k < pass_.size(); ++k) append_units(pass_[k], static_cast<std::int32_t>(k), units_);
    if (pending_left_.size() < pass_.size()) pending_left_.resize(pass_.size());
    std::fill(pending_left_.begin(), pending_left_.begin() + static_cast<std::ptrdiff_t>(pass_.size()), index_t{0});
    index_t elements = 0;
    bool any_apply = false;
    for (const WorkUnit& u : units_) {
      const TensorTask& t = pass_[static_cast<std::size_t>(u.task)];
      ++pending_left_[static_cast<std::size_t>(u.task)];
      elements += (u.end - u.begin) * (t.factored ? t.geom.cols : 1);
      any_apply = any_apply || t.kernel->apply != nullptr;
    }
    apply = apply && any_apply;
    if (units_.empty() || (!stats && !apply)) return;
    const auto n = static_cast<std::int64_t>(units_.size());
    auto statistics = [&](std::int64_t k, Scratch scratch) {
      const WorkUnit& u = units_[static_cast<std::size_t>(k)];
      const auto task = static_cast<std::size_t>(u.task);
      if (!pass_stats_[task]) return;
      const TensorTask& t = pass_[task];
      t.kernel->statistics(t, u, scratch);
      std::atomic_ref<index_t> left(pending_left_[task]);
      if (left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
      if (t.cut) form_cut_sums(task);
      else t.kernel->finalize(t, scratch);
    };
    auto update = [&](std::int64_t k, Scratch scratch) {
      const WorkUnit& u = units_[static_cast<std::size_t>(k)];
      const TensorTask& t = pass_[static_cast<std::size_t>(u.task)];
      if (t.kernel->apply) t.kernel->apply(t, u, scratch);
    };
    // A thread per Cutting::chunk_elems elements at most: a small step is
    // not worth waking threads for (the result does not depend on the count).
    const index_t by_work = std::max<index_t>(1, elements / Cutting::chunk_elems);
    const int nthreads = static_cast<int>(std::min<index_t>({index_t{threads_}, index_t{n}, by_work}));
#if defined(_OPENMP)
#pragma omp parallel num_threads(nthreads)
    {
      const Scratch scratch = scratch_.at(omp_get_thread_num());
      if (stats) {
#pragma omp for schedule(dynamic, 1) nowait
        for (std::int64_t k = 0; k < n; ++k) statistics(k, scratch);
      }
      if (apply) {
        if (stats) {
#pragma omp barrier
        }
#pragma omp for schedule(dynamic, 1) nowait
        for (std::int64_t k = 0; k < n; ++k) update(k, scratch);
      }
    }
#else
    (void)nthreads;
    if (stats)
      for (std::int64_t k = 0; k < n; ++k) statistics(k, scratch_.at(0));
    if (apply)
      for (std::int64_t k = 0; k < n; ++k) update(k, scratch_.at(0));
#endif
  }

  /// f(k, scratch) for k in [0, n), on up to threads_ threads.
  template <class F>
  void parallel(std::int64_t n, F&& f) {
    if (n == 0) return;
#if defined(_OPENMP)
    const int nthreads = static_cast<int>(std::min<std::int64_t>(threads_, n));
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (std::int64_t k = 0; k < n; ++k) f(k, scratch_.at(omp_get_thread_num()));
#else
    for (std::int64_t k = 0; k < n; ++k) f(k, scratch_.at(0));
#endif
  }

  int threads_ = hardware_threads();
  index_t max_cols_ = 0;
  ScratchSpace scratch_ = [] {
    ScratchSpace s;
    s.resize(hardware_threads(), 0);
    return s;
  }();
  std::vector<Tensor> tensors_;
  std::int64_t* counts_ = nullptr;  ///< the engine's (StepSettings::counts): n + 1 values
  std::vector<double> clip_sums_;  ///< per matrix of every piece
  std::vector<float> divisors_;
  std::vector<double> cut_sums_;   ///< per cut piece: c column sums, the sum of R_i
  std::vector<float> workspace_;   ///< the step's column partials and backups (place_workspace)
  // the step (reused; they grow with the number of tensors, never with their size)
  StepSettings settings_{};
  std::vector<Stepped> stepped_;
  std::vector<Active> tasks_;
  std::vector<TensorTask> pass_;  ///< a region's tasks, with their pieces and whether their statistics run
  std::vector<PieceWork*> pass_piece_;
  std::vector<char> pass_stats_;
  std::vector<PieceWork*> cut_;
  std::vector<WorkUnit> units_;
  std::vector<index_t> pending_left_;  ///< accessed through std::atomic_ref during a region
  Verdict verdict_{};
  double norm_sq_ = std::numeric_limits<double>::quiet_NaN();
};

/// The widest level the compiler targets, fixed at compile time: one set of
/// kernels per rule and dtypes.
using NativeBackend = CpuBackend<cpu::widest_tag_t>;
/// Every compiled level, the one that runs chosen at run time (arch.hpp).
using DispatchBackend = CpuBackend<DispatchArch>;
/// The backend an optimizer uses unless told otherwise: NativeBackend, or
/// DispatchBackend where SKEWADAM_RUNTIME_DISPATCH is defined (arch.hpp).
#if defined(SKEWADAM_RUNTIME_DISPATCH)
using DefaultBackend = DispatchBackend;
#else
using DefaultBackend = NativeBackend;
#endif

}  // namespace skewadam::backend
