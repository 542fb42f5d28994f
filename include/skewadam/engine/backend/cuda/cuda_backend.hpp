#pragma once
// CudaBackend<R>: the CUDA backend (engine/backend/backend.hpp) over a runtime R
// (device_memory.hpp): every piece's state, its scratch and the step's tables
// live in the runtime's (device) memory, and a pass is a handful of kernel
// launches (kernels.cuh, check_kernels.cuh, step_control.cuh) per group of
// pieces sharing a rule and dtypes (passes.hpp), enqueued on one stream:
//
//   prepare    uploads only what changed since the last step, from pageable
//              memory in stream order: the piece table (gradient pointers,
//              rounding streams), the stepped tensors, the StepControl
//              (hyperparameters, global-norm scale or norm, seed); usually
//              nothing
//   begin      (settings.max_norm) squares_kernel and total_kernel: the sum
//              of g^2, from which begin_step_kernel forms the scale; then
//              begin_step_kernel: every stepped piece's scalars and rounding
//              key from its tensor's count on the device
//   check      scan_kernel and decide_kernel: an offending gradient sets every
//              piece's skip flag and the step's outcome on the device, so the
//              later passes leave the step alone; the host learns it when it
//              asks (resolve, outcome)
//   statistics, finish, apply   the groups' launches (passes.hpp)
//   count      end_step_kernel: the counts of an applied step advance
//
// Registration allocates and waits for the device; a step waits for nothing
// unless the placement reads a host value (a sharded step's exchanges), so
// under the local placement a step can be captured in a graph (capture());
// a replay is one more step, counted on the device like any other.
//
// Work lists are cut when a tensor is registered (passes.hpp); a tensor
// changes group only when its gradient's dtype changes (fp32 or the
// parameter's own), which rebuilds the lists once (and waits for the device,
// as the old lists may still be read). The groups' statistics passes write
// their row blocks' column partials to one workspace, back to back, which
// only grows.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../../../detail/config.hpp"
#include "../../../state/param_state.hpp"
#include "../../../types/dtype.hpp"
#include "../../engine_types.hpp"
#include "../../nonfinite.hpp"
#include "../../optimizer_options.hpp"
#include "../backend.hpp"
#include "../gradient_check.hpp"
#include "check_kernels.cuh"
#include "device_memory.hpp"
#include "kernels.cuh"
#include "passes.hpp"
#include "step_control.cuh"

namespace skewadam::backend {

template <class R>
class CudaBackend {
  static_assert(cuda::Runtime<R>, "CudaBackend<R>: R lacks a member of the runtime interface (device_memory.hpp)");
  using Stream = typename R::stream_type;
  template <class T>
  using Array = cuda::DeviceArray<R, T>;
  using Mem = cuda::DeviceMemory<R>;
  using DeviceTask = cuda::DeviceTask;
  using GroupPasses = cuda::GroupPasses<R>;

 public:
  using runtime = R;
  using memory_type = cuda::StreamMemory<R>;
  using kernels_type = const GroupPasses*;
  template <class Rule, class P, class G>
  static kernels_type kernels() {
    return cuda::passes_of<R, Rule, P, G>();
  }

  /// A step captured for replay, with what it was captured against.
  class graph_type {
    friend class CudaBackend;
    typename R::graph_type graph_{};
    std::uint64_t generation_ = 0;
    std::vector<const void*> grads_;
    std::vector<kernels_type> kernels_;
    const std::int64_t* counts_ = nullptr;
    NonFinitePolicy policy_ = NonFinitePolicy::skip_step;
    bool clips_ = false;

   public:
    NonFinitePolicy policy() const noexcept { return policy_; }
    /// Whether it clips the global gradient norm itself (StepSettings::max_norm).
    bool clips_each_step() const noexcept { return clips_; }
  };

  explicit CudaBackend(const OptimizerOptions& options)
      : stream_(static_cast<Stream>(options.stream)),
        device_(device_of(options.device)),
        mem_{skewadam::detail::checked_allocator(options.device_allocator)} {
    const cuda::DeviceScope<R> on(device_);
    control_d_ = array<cuda::StepControl>(1);
    outcome_ = array<cuda::CheckOutcome>(1);
    open_outcome_ = array<cuda::OpenOutcome>(1);
    norm_sq_ = array<double>(1);
    tables_ = build_tables();
    R::zero(outcome_.data(), outcome_.bytes(), stream_);
    R::zero(norm_sq_.data(), norm_sq_.bytes(), stream_);
    R::synchronize(stream_);
  }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;
  /// Waits for its steps, then frees its memory with its device current.
  ~CudaBackend() {
    try {
      const cuda::DeviceScope<R> on(device_);
      if (!tensors_.empty()) R::synchronize(stream_);
      tensors_.clear();
      tables_ = Tables{};
      undo_ = Tables{};
      control_d_.reset();
      outcome_.reset();
      open_outcome_.reset();
      norm_sq_.reset();
      workspace_.reset();
    } catch (...) {  // a destructor reports nothing; the memory is freed regardless
    }
  }

  // -------------------------------------------------------------- device
  /// The device its memory and launches are on (OptimizerOptions::device).
  int device() const noexcept { return device_; }
  /// That device current while the result lives (the engine holds one over
  /// each call that allocates, launches or copies).
  cuda::DeviceScope<R> on_device() const { return cuda::DeviceScope<R>(device_); }

  // -------------------------------------------------------------- stream
  /// From now on steps are ordered on s; waits for the steps enqueued so far.
  /// (A graph captured before keeps running on the stream it is replayed on.)
  void set_stream(Stream s) {
    const cuda::DeviceScope<R> on(device_);
    R::synchronize(stream_);
    stream_ = s;
  }
  Stream stream() const noexcept { return stream_; }
  /// Waits until every enqueued step has finished.
  void synchronize() const {
    const cuda::DeviceScope<R> on(device_);
    R::synchronize(stream_);
  }
  /// From now on each tier's lr is read from lr[tier_index] in device memory
  /// as each step runs (so that a captured step follows it); null: from the
  /// hyperparameters again.
  void set_lr_device(const double* lr) {
    if (lr != nullptr) Mem::check_on(lr, device_, "lr (device)");
    lr_device_ = lr;
  }
  void set_threads(int) noexcept {}
  int threads() const noexcept { return 1; }

  // -------------------------------------------------------------- memory
  /// Its device's memory, copies in its stream's order (the engine keeps the
  /// state there).
  memory_type memory() const { return memory_type{mem_, stream_, device_}; }

  // -------------------------------------------------------- registration
  /// Tensor n's pieces, whose arrays are at `state` (one per piece).
  void add(const TensorRegistration& reg, std::span<const PieceSpec> specs, std::array<kernels_type, 2> kernels,
           std::span<const PieceState> state) {
    Tensor e;
    e.kernels = kernels;
    e.ops = kernels[0];
    e.whole = reg.param.shape.matrices();
    const auto index = static_cast<std::int32_t>(tensors_.size());
    std::vector<cuda::ScratchSizes> sizes;
    cuda::ScratchSizes total;
    for (std::size_t q = 0; q < specs.size(); ++q) {
      const PieceSpec& spec = specs[q];
      DeviceTask d;
      d.geom = spec.geom;
      d.param = static_cast<char*>(reg.param.data) + spec.first * dtype_size(reg.param.dtype);
      d.element_base = spec.first;
      d.tier = tier_index(reg.tier);
      d.tensor = index;
      d.host_divisors = spec.host_divisors ? 1 : 0;
      if (spec.factored) {
        d.row_blocks = cuda::row_blocks_of(d.geom);
        if (spec.cut) d.full_rows = spec.full_rows;
      } else {
        d.chunks = cuda::chunks_of(d.geom);
      }
      // each piece's scratch 64-byte aligned (the quad walks load its column
      // partials as 16-byte quads)
      cuda::ScratchSizes sz = cuda::scratch_sizes(d, spec.factored);
      sz.floats = (sz.floats + 15) / 16 * 16;
      sz.doubles = (sz.doubles + 7) / 8 * 8;
      sizes.push_back(sz);
      total.floats += sz.floats;
      total.doubles += sz.doubles;
      total.counters += sz.counters;
      e.limit = gradient_limit(MatrixGeometry{1, spec.full_rows, spec.geom.cols}, spec.factored);
      e.pieces.push_back(PieceWork{spec, d});
    }
    e.scratch_f = array<float>(total.floats);
    e.scratch_d = array<double>(total.doubles);
    if (total.counters > 0) mem_.zeroed(e.done, total.counters, stream_);
    std::size_t f = 0, x = 0, k = 0;
    for (std::size_t q = 0; q < e.pieces.size(); ++q) {
      PieceWork& p = e.pieces[q];
      cuda::place_scratch(p.task, p.spec.factored, e.scratch_f.data() + f, e.scratch_d.data() + x, e.done.data() + k);
      point_piece(p.task, state[q]);
      f += sizes[q].floats;
      x += sizes[q].doubles;
      k += sizes[q].counters;
    }
    tensors_.push_back(std::move(e));
    try {
      Tables next = build_tables();
      R::synchronize(stream_);  // the zeroing and the tables' uploads
      undo_ = std::move(tables_);
      tables_ = std::move(next);
      ++generation_;
    } catch (...) {
      tensors_.pop_back();
      throw;
    }
  }
  void pop_back() noexcept {
    tensors_.pop_back();
    tables_ = std::move(undo_);
    point_workspace(tables_.groups);
    ++generation_;
  }

  /// Tensor i's arrays are now at `state` (an import moved them).
  void point(std::size_t i, std::span<const PieceState> state) noexcept {
    Tensor& e = tensors_[i];
    for (std::size_t q = 0; q < e.pieces.size(); ++q) {
      PieceWork& p = e.pieces[q];
      point_piece(p.task, state[q]);
      point_piece(tables_.tasks[static_cast<std::size_t>(p.at)], state[q]);
    }
    tables_.tasks_dirty = true;
    ++generation_;  // a graph reads the arrays it was captured with
  }

  /// Device memory besides the state: each piece's scratch, the step's
  /// tables (those of the last registration's undo included) and the
  /// statistics workspace the groups share.
  index_t scratch_bytes() const noexcept {
    std::size_t b =
        control_d_.bytes() + outcome_.bytes() + open_outcome_.bytes() + norm_sq_.bytes() + workspace_.bytes();
    for (const Tensor& e : tensors_) b += e.scratch_f.bytes() + e.scratch_d.bytes() + e.done.bytes();
    for (const Tables* t : {&tables_, &undo_}) {
      b += t->d_tasks.bytes() + t->d_steps.bytes() + t->d_stepped.bytes() +
           t->check_items.bytes() + t->grad_tasks.bytes() + t->first.bytes() + t->value.bytes() +
           t->partial.bytes() + t->total.bytes() + t->sums.bytes() + t->divisors.bytes() + t->cut.bytes();
      for (const Group& g : t->groups) b += g.items.bytes() + g.ids.bytes();
    }
    return static_cast<index_t>(b);
  }

  // ----------------------------------------------------------------- step
  /// Uploads what a step of `items` needs that changed since the last one.
  void prepare(std::span<const StepItem> items, const StepSettings& settings) {
    regroup(items);
    Tables& t = tables_;
    grads_.assign(tensors_.size(), nullptr);
    grad_sizes_.assign(tensors_.size(), 0);
    std::vector<int> stepped(tensors_.size(), 0);
    for (const StepItem& it : items) {
      const auto i = static_cast<std::size_t>(it.index);
      stepped[i] = 1;
      grads_[i] = it.grad.data;
      grad_sizes_[i] = dtype_size(it.grad.dtype);
      for (const PieceWork& p : tensors_[i].pieces) {
        DeviceTask& d = t.tasks[static_cast<std::size_t>(p.at)];
        if (d.id != it.stream) {
          d.id = it.stream;
          t.tasks_dirty = true;
        }
      }
    }
    for (std::size_t i = 0; i < tensors_.size(); ++i)
      for (const PieceWork& p : tensors_[i].pieces) {
        DeviceTask& d = t.tasks[static_cast<std::size_t>(p.at)];
        const void* g = nullptr;
        if (grads_[i] != nullptr) g = static_cast<const char*>(grads_[i]) + p.spec.first * grad_sizes_[i];
        if (d.grad != g) {
          d.grad = g;
          t.tasks_dirty = true;
        }
      }
    if (t.tasks_dirty && !t.tasks.empty())
      R::to_device(t.d_tasks.data(), t.tasks.data(), t.tasks.size() * sizeof(DeviceTask), stream_);
    t.tasks_dirty = false;
    if (stepped != t.stepped && !stepped.empty()) {
      t.stepped = std::move(stepped);
      R::to_device(t.d_stepped.data(), t.stepped.data(), t.stepped.size() * sizeof(int), stream_);
    }
    sync_grad_table(items);
    focus_ = items.size() == 1 ? static_cast<int>(items.front().index) : items.empty() ? no_tensor : -1;
    counts_step_ = settings.counts_step;
    counts_ = settings.counts;
    cuda::StepControl c;
    for (int k = 0; k < tier_count; ++k) c.hyper[k] = settings.hyper[static_cast<std::size_t>(k)];
    c.grad_scale = settings.grad_scale;
    c.seed = settings.seed;
    c.lr = lr_device_;
    c.max_norm = settings.max_norm;
    c.norm_sq = norm_sq_.data();
    if (!control_uploaded_ || !cuda::same_control(c, control_)) {
      R::to_device(control_d_.data(), &c, sizeof c, stream_);
      control_ = c;
      control_uploaded_ = true;
    }
  }

  void begin() {
    const Tables& t = tables_;
    if (control_.max_norm > 0) sum_squares(norm_sq_.data());  // for begin_step_kernel's scale
    R::template launch<&cuda::begin_step_kernel<>>(
        grid(std::max<std::size_t>(1, (t.tasks.size() + 127) / 128)), 128u, stream_,
        static_cast<const DeviceTask*>(t.d_tasks.data()), static_cast<const cuda::StepControl*>(control_d_.data()),
        static_cast<const std::int64_t*>(counts_), t.d_steps.data(), static_cast<int>(t.tasks.size()),
        outcome_.data());
  }
  Verdict check(NonFinitePolicy policy) {
    if (policy == NonFinitePolicy::unchecked) return Verdict{};
    const Tables& t = tables_;
    // a step of one tensor checks its chunks alone (their slots are theirs)
    std::size_t lo = 0, n = t.check_items.size();
    if (focus_ == no_tensor) n = 0;
    if (focus_ >= 0) {
      lo = static_cast<std::size_t>(t.parts[static_cast<std::size_t>(focus_)].check_lo);
      n = static_cast<std::size_t>(t.parts[static_cast<std::size_t>(focus_)].check_n);
    }
    const WorkUnit* items = static_cast<const WorkUnit*>(t.check_items.data()) + lo;
    R::template launch<&cuda::scan_kernel<>>(grid(n), cuda::block_threads, stream_,
                                             static_cast<const cuda::GradTask*>(t.grad_tasks.data()),
                                             static_cast<const cuda::TaskStep*>(t.d_steps.data()), items,
                                             t.first.data(), t.value.data());
    R::template launch<&cuda::decide_kernel<>>(1u, cuda::block_threads, stream_,
                                               static_cast<const index_t*>(t.first.data()) + lo,
                                               static_cast<const float*>(t.value.data()) + lo,
                                               static_cast<index_t>(n), items, t.d_steps.data(),
                                               static_cast<int>(t.tasks.size()), outcome_.data());
    return Verdict{false, std::nullopt};
  }
  void reject() noexcept {}  // the device wrote nothing: the later passes were never enqueued

  /// The passes of a step (backend.hpp), each group's launches in turn.
  void run(Passes passes) {
    auto each_group = [&](typename GroupPasses::Pass GroupPasses::*pass) {
      for_groups([&](const Group& g, const cuda::GroupArrays& a) { (g.ops->*pass)(a, tasks_d(), steps_d(), stream_); });
    };
    if (passes.has(Pass::statistics)) each_group(&GroupPasses::statistics);
    if (passes.has(Pass::finish)) each_group(&GroupPasses::finish);
    if (passes.has(Pass::apply)) each_group(&GroupPasses::apply);
    if (passes.has(Pass::count))
      R::template launch<&cuda::end_step_kernel<>>(1u, cuda::block_threads, stream_,
                                                   static_cast<const int*>(tables_.d_stepped.data()),
                                                   counts_, static_cast<int>(tensors_.size()),
                                                   static_cast<const cuda::CheckOutcome*>(outcome_.data()),
                                                   counts_step_ ? 1 : 0);
  }
  /// The cut pieces' sums, on the host (waits); set_cut_sums() hands them back.
  std::span<double> cut_sums() {
    cut_host_.resize(tables_.cut.size());
    if (!cut_host_.empty()) R::to_host(cut_host_.data(), tables_.cut.data(), tables_.cut.bytes(), stream_);
    return cut_host_;
  }
  void set_cut_sums() {
    if (!cut_host_.empty()) R::to_device(tables_.cut.data(), cut_host_.data(), tables_.cut.bytes(), stream_);
  }
  std::span<const double> clip_sums() {
    sums_host_.resize(tables_.sums.size());
    if (!sums_host_.empty()) R::to_host(sums_host_.data(), tables_.sums.data(), tables_.sums.bytes(), stream_);
    return sums_host_;
  }
  std::span<float> divisors() {
    divisors_host_.assign(tables_.divisors.size(), 1.0f);
    return divisors_host_;
  }
  void set_divisors() {
    if (!divisors_host_.empty())
      R::to_device(tables_.divisors.data(), divisors_host_.data(), tables_.divisors.bytes(), stream_);
  }
  /// The step inside backward: its tensors' verdicts folded on the device
  /// (fold_verdict after each one's step), read once by read_verdicts().
  void begin_verdicts() {
    R::zero(open_outcome_.data(), open_outcome_.bytes(), stream_);
  }
  void fold_verdict() {
    R::template launch<&cuda::fold_verdict_kernel<>>(1u, 1u, stream_,
                                                     static_cast<const cuda::CheckOutcome*>(outcome_.data()),
                                                     static_cast<const DeviceTask*>(tables_.d_tasks.data()),
                                                     open_outcome_.data());
  }
  OpenVerdicts read_verdicts() const {
    cuda::OpenOutcome out;
    R::to_host(&out, open_outcome_.data(), sizeof out, stream_);
    OpenVerdicts v;
    v.skipped = out.skipped;
    if (out.skipped > 0) v.first = Offender{out.tensor, out.element, out.value};
    return v;
  }

  /// The last step's first offender, when it was rejected; waits for the device.
  std::optional<Offender> outcome() const {
    cuda::CheckOutcome out;
    R::to_host(&out, outcome_.data(), sizeof out, stream_);
    if (!out.bad) return std::nullopt;
    const auto k = static_cast<std::size_t>(out.task);
    const DeviceTask& d = tables_.tasks[k];
    return Offender{d.tensor, d.element_base + out.element, out.value};
  }

  double grad_sum_squares(std::span<const StepItem> items) const {
    const Tables& t = tables_;
    if (t.check_items.empty()) return 0.0;
    sync_grad_table(items);
    sum_squares(t.total.data());
    double sum = 0;
    R::to_host(&sum, t.total.data(), sizeof sum, stream_);
    return sum;
  }
  /// The sum of g^2 the last clipping step formed; waits for the device.
  double clip_sum_squares() const {
    double x = 0;
    R::to_host(&x, norm_sq_.data(), sizeof x, stream_);
    return x;
  }

  // ------------------------------------------------------------ graphs
  /// The launches of enqueue(), recorded for replay on this backend's stream
  /// (not the default stream, which cannot be captured); prepare() ran first.
  template <class Enqueue>
  graph_type capture(NonFinitePolicy policy, bool clips, Enqueue&& enqueue) {
    if (stream_ == Stream{})
      throw std::invalid_argument(
          "stream: a step on the default stream cannot be captured (build the optimizer with OptimizerOptions::stream)");
    graph_type g;
    g.generation_ = generation_;
    g.counts_ = counts_;
    g.grads_ = grads_;
    for (const Tensor& e : tensors_) g.kernels_.push_back(e.ops);
    g.policy_ = policy;
    g.clips_ = clips;
    R::begin_capture(stream_);
    try {
      enqueue();
      g.graph_ = R::end_capture(stream_);
    } catch (...) {
      R::abort_capture(stream_);
      throw;
    }
    return g;
  }
  std::optional<ReplayProblem> replay_problem(const graph_type& g, std::span<const StepItem> items) const {
    if (g.generation_ != generation_) return ReplayProblem{};
    std::vector<const void*> grads(tensors_.size(), nullptr);
    for (const StepItem& it : items) {
      const auto i = static_cast<std::size_t>(it.index);
      const Tensor& e = tensors_[i];
      if (e.pieces.empty()) continue;
      grads[i] = it.grad.data;
      if (e.kernels[it.grad.dtype == Dtype::f32 ? 1 : 0] != g.kernels_[i]) return ReplayProblem{it.index};
    }
    for (std::size_t i = 0; i < grads.size(); ++i)
      if (grads[i] != (i < g.grads_.size() ? g.grads_[i] : nullptr)) return ReplayProblem{static_cast<index_t>(i)};
    return std::nullopt;
  }
  /// Runs a captured step (replay_problem() must have found nothing; prepare() ran first).
  void launch(const graph_type& g) {
    if (g.counts_ != counts_)
      throw std::invalid_argument("graph: the step counts moved since it was captured (a state imported): capture it again");
    R::launch_graph(g.graph_, stream_);
  }

 private:
  /// A piece (PieceSpec) with what this backend keeps to step it.
  struct PieceWork {
    PieceSpec spec;
    DeviceTask task;       ///< its state and scratch (the tables add the step's pointers)
    index_t at = 0;        ///< its index in the tables
  };
  struct Tensor {
    std::array<kernels_type, 2> kernels{};
    kernels_type ops = nullptr;  ///< of the gradient dtype it was last stepped with
    MatrixGeometry whole{};      ///< its matrices, whatever this process holds of them
    float limit = 0;
    std::vector<PieceWork> pieces;
    Array<float> scratch_f;
    Array<double> scratch_d;
    Array<unsigned> done;
  };
  struct Group {
    kernels_type ops = nullptr;
    Array<WorkUnit> items;
    Array<std::int32_t> ids;
    cuda::GroupArrays arrays;
    std::size_t workspace = 0;     ///< doubles of statistics workspace its passes need
    std::size_t workspace_at = 0;  ///< where they start in the backend's
  };
  /// Where one tensor's work lies in the tables: its group and its part of
  /// the group's lists, and its check items (what a step of that tensor
  /// alone launches).
  struct TensorPart {
    int group = -1;
    cuda::ListStarts lo{}, hi{};
    index_t check_lo = 0, check_n = 0;
  };
  /// Everything a step reads besides the tensors' own arrays, the StepControl
  /// and the outcome.
  struct Tables {
    std::vector<DeviceTask> tasks;  ///< one per piece: what d_tasks holds, or will once uploaded
    Array<DeviceTask> d_tasks;
    bool tasks_dirty = false;
    Array<cuda::TaskStep> d_steps;  ///< formed on the device by begin_step_kernel
    std::vector<int> stepped;       ///< per tensor: in the step (what d_stepped holds)
    Array<int> d_stepped;
    std::vector<Group> groups;
    Array<WorkUnit> check_items;    ///< one per chunk of every piece; item.block is its slot
    mutable std::vector<cuda::GradTask> host_grad_tasks;  ///< what grad_tasks holds
    Array<cuda::GradTask> grad_tasks;
    Array<index_t> first;
    Array<float> value;
    Array<double> partial;
    Array<double> total;
    Array<double> sums;             ///< per matrix of every piece: its sum of u^2
    Array<float> divisors;          ///< per matrix of every piece: its clip divisor
    Array<double> cut;              ///< per cut piece: c column sums, then the sum of R_i
    std::vector<TensorPart> parts;  ///< per tensor
  };

  template <class T>
  Array<T> array(std::size_t n) const {
    return mem_.template array<T>(n);
  }
  static int device_of(int d) {
    if (d < -1)
      throw std::invalid_argument("device: " + std::to_string(d) + " (a device's index, or -1 for the current one)");
    return d >= 0 ? d : R::current_device();
  }

  static unsigned grid(std::size_t blocks) { return static_cast<unsigned>(blocks); }
  const DeviceTask* tasks_d() const { return tables_.d_tasks.data(); }
  /// f(group, its lists) for every group; for a step of one tensor, its
  /// group alone with its part of the lists (launches sized to it); for a
  /// step of none, nothing.
  template <class F>
  void for_groups(F&& f) const {
    if (focus_ == no_tensor) return;
    if (focus_ >= 0) {
      const TensorPart& q = tables_.parts[static_cast<std::size_t>(focus_)];
      if (q.group < 0) return;
      const Group& g = tables_.groups[static_cast<std::size_t>(q.group)];
      f(g, cuda::part_of(g.arrays, q.lo, q.hi));
      return;
    }
    for (const Group& g : tables_.groups) f(g, g.arrays);
  }
  const cuda::TaskStep* steps_d() const { return tables_.d_steps.data(); }

  /// Enqueues the sum of g^2 over the gradient table's pieces, into *out.
  void sum_squares(double* out) const {
    const Tables& t = tables_;
    R::template launch<&cuda::squares_kernel<>>(grid(t.check_items.size()), cuda::block_threads, stream_,
                                                static_cast<const cuda::GradTask*>(t.grad_tasks.data()),
                                                static_cast<const WorkUnit*>(t.check_items.data()), t.partial.data());
    R::template launch<&cuda::total_kernel<>>(1u, cuda::block_threads, stream_,
                                              static_cast<const double*>(t.partial.data()),
                                              static_cast<index_t>(t.partial.size()), out);
  }

  /// The pieces' gradients of `items` (the others null), uploaded when changed.
  void sync_grad_table(std::span<const StepItem> items) const {
    std::vector<cuda::GradTask>& h = grad_room_;
    h.assign(tables_.tasks.size(), cuda::GradTask{});
    for (const StepItem& it : items) {
      const Tensor& e = tensors_[static_cast<std::size_t>(it.index)];
      for (const PieceWork& p : e.pieces)
        h[static_cast<std::size_t>(p.at)] = cuda::GradTask{
            static_cast<const char*>(it.grad.data) + p.spec.first * dtype_size(it.grad.dtype), it.grad.dtype,
            e.limit, p.spec.geom.matrix_size()};
    }
    auto same = [](const cuda::GradTask& a, const cuda::GradTask& b) {
      return a.grad == b.grad && a.dtype == b.dtype && a.limit == b.limit && a.matrix_size == b.matrix_size;
    };
    if (std::equal(h.begin(), h.end(), tables_.host_grad_tasks.begin(), tables_.host_grad_tasks.end(), same)) return;
    if (!h.empty()) R::to_device(tables_.grad_tasks.data(), h.data(), h.size() * sizeof(h[0]), stream_);
    std::swap(tables_.host_grad_tasks, h);
  }

  /// Moves tensors whose gradient dtype changed to the group of the new one.
  void regroup(std::span<const StepItem> items) {
    bool changed = false;
    std::vector<kernels_type> ops;
    for (const Tensor& e : tensors_) ops.push_back(e.ops);
    for (const StepItem& it : items) {
      const Tensor& e = tensors_[static_cast<std::size_t>(it.index)];
      kernels_type& o = ops[static_cast<std::size_t>(it.index)];
      const kernels_type want = e.kernels[it.grad.dtype == Dtype::f32 ? 1 : 0];
      changed = changed || o != want;
      o = want;
    }
    if (!changed) return;
    R::synchronize(stream_);  // the old lists may still be read
    tables_.groups = build_groups(ops, tables_.parts);
    for (std::size_t i = 0; i < tensors_.size(); ++i) tensors_[i].ops = ops[i];
    ++generation_;
  }

  /// Every group's work lists over the pieces, for tensors with passes `ops`,
  /// and their part of the workspace (fit_workspace).
  std::vector<Group> build_groups(const std::vector<kernels_type>& ops, std::vector<TensorPart>& parts) {
    parts.resize(tensors_.size());
    for (TensorPart& q : parts) q.group = -1;
    std::vector<kernels_type> order;
    for (std::size_t i = 0; i < tensors_.size(); ++i)
      if (!tensors_[i].pieces.empty() && std::find(order.begin(), order.end(), ops[i]) == order.end())
        order.push_back(ops[i]);
    std::vector<Group> groups;
    for (kernels_type o : order) {
      cuda::GroupLists lists;
      lists.factored = o->factored;
      lists.stored = o->stored;
      // every tensor of the group, held here or not: a matrix is cut as one
      // process holding every tensor cuts it
      for (std::size_t i = 0; i < tensors_.size(); ++i)
        if (ops[i] == o) lists.count(tensors_[i].whole);
      std::vector<std::pair<std::size_t, std::size_t>> pieces;  // (tensor, its first piece in the group)
      std::size_t added = 0;
      for (std::size_t i = 0; i < tensors_.size(); ++i) {
        if (ops[i] != o) continue;
        pieces.emplace_back(i, added);
        for (const PieceWork& p : tensors_[i].pieces) {
          lists.add(static_cast<std::int32_t>(p.at), p.task, p.spec.cut);
          ++added;
        }
      }
      const std::vector<cuda::ListStarts>& starts = lists.starts();
      for (const auto& [i, first] : pieces) {
        TensorPart& q = parts[i];
        q.group = static_cast<int>(groups.size());
        q.lo = starts[first];
        q.hi = starts[first + tensors_[i].pieces.size()];
      }
      Group g;
      g.ops = o;
      mem_.upload(g.items, lists.concatenated(), stream_);
      mem_.upload(g.ids, lists.tasks, stream_);
      g.arrays = lists.arrays(g.items.data(), g.ids.data());
      g.workspace = lists.workspace_doubles();
      groups.push_back(std::move(g));
    }
    fit_workspace(groups);
    return groups;
  }

  /// Grows the statistics workspace to what `groups` need, back to back
  /// (every group's statistics pass runs before any group's finish), and
  /// points every group at its part.
  void fit_workspace(std::vector<Group>& groups) {
    std::size_t need = 0;
    for (Group& g : groups) {
      g.workspace_at = need;
      need += g.workspace;
    }
    if (need > workspace_.size()) {
      R::synchronize(stream_);  // the old one may still be read
      workspace_ = array<double>(need);
      point_workspace(tables_.groups);
      point_workspace(undo_.groups);
    }
    point_workspace(groups);
  }
  void point_workspace(std::vector<Group>& groups) noexcept {
    for (Group& g : groups) g.arrays.workspace = g.workspace == 0 ? nullptr : workspace_.data() + g.workspace_at;
  }

  /// The tables of every registered tensor (uploads in stream order).
  Tables build_tables() {
    Tables t;
    std::size_t matrices = 0, cut = 0;
    for (Tensor& e : tensors_)
      for (PieceWork& p : e.pieces) {
        p.at = static_cast<index_t>(t.tasks.size());
        t.tasks.push_back(p.task);
        matrices += static_cast<std::size_t>(p.spec.geom.batch);
        if (p.spec.cut) cut += static_cast<std::size_t>(p.spec.geom.cols + 1);
      }
    t.sums = array<double>(matrices);
    t.divisors = array<float>(matrices);
    t.cut = array<double>(cut);
    for (Tensor& e : tensors_)
      for (PieceWork& p : e.pieces) {
        DeviceTask& d = t.tasks[static_cast<std::size_t>(p.at)];
        d.matrix_sum = t.sums.data() + p.spec.clip_at;
        d.divisor = t.divisors.data() + p.spec.clip_at;
        if (p.spec.cut) d.shard_sums = t.cut.data() + p.spec.cut_at;
        d.grad = nullptr;
      }
    mem_.upload(t.d_tasks, t.tasks, stream_);
    mem_.upload(t.d_steps, std::vector<cuda::TaskStep>(t.tasks.size()), stream_);
    t.stepped.assign(tensors_.size(), 0);
    mem_.upload(t.d_stepped, t.stepped, stream_);
    std::vector<kernels_type> ops;
    for (const Tensor& e : tensors_) ops.push_back(e.ops);
    t.groups = build_groups(ops, t.parts);

    std::vector<WorkUnit> checks;
    for (std::size_t k = 0; k < t.tasks.size(); ++k) {
      const MatrixGeometry& g = t.tasks[k].geom;
      for (index_t b = 0; b < g.batch; ++b)
        for (index_t o = 0; o < g.matrix_size(); o += cuda::chunk_elems) {
          const auto slot = static_cast<index_t>(checks.size());
          checks.push_back(
              WorkUnit{static_cast<std::int32_t>(k), b, o, std::min(g.matrix_size(), o + cuda::chunk_elems), slot});
        }
    }
    if (checks.size() > 0x7fffffffu) throw std::invalid_argument("parameters: too many work items for one launch");
    for (std::size_t k = 0; k < checks.size();) {  // each tensor's checks, consecutive as its pieces are
      const auto i = static_cast<std::size_t>(t.tasks[static_cast<std::size_t>(checks[k].task)].tensor);
      std::size_t end = k;
      while (end < checks.size() &&
             static_cast<std::size_t>(t.tasks[static_cast<std::size_t>(checks[end].task)].tensor) == i)
        ++end;
      t.parts[i].check_lo = static_cast<index_t>(k);
      t.parts[i].check_n = static_cast<index_t>(end - k);
      k = end;
    }
    mem_.upload(t.check_items, checks, stream_);
    t.host_grad_tasks.assign(t.tasks.size(), cuda::GradTask{});
    mem_.upload(t.grad_tasks, t.host_grad_tasks, stream_);
    t.first = array<index_t>(checks.size());
    t.value = array<float>(checks.size());
    t.partial = array<double>(checks.size());
    t.total = array<double>(1);
    grads_.assign(tensors_.size(), nullptr);
    return t;
  }

  Stream stream_{};
  int device_ = 0;
  Mem mem_;  ///< arrays from the caller's allocator, or the runtime's
  std::vector<Tensor> tensors_;
  Tables tables_;
  Tables undo_;  ///< the tables before the last add (pop_back)
  std::vector<const void*> grads_;  ///< per tensor: the step's gradient, or null
  std::vector<index_t> grad_sizes_;  ///< and its element size
  mutable std::vector<cuda::GradTask> grad_room_;  ///< sync_grad_table's, reused
  Array<cuda::StepControl> control_d_;
  cuda::StepControl control_{};  ///< what control_d_ holds once control_uploaded_
  bool control_uploaded_ = false;
  bool counts_step_ = true;  ///< the step being enqueued advances the optimizer count (StepSettings::counts_step)
  std::int64_t* counts_ = nullptr;  ///< the engine's (StepSettings::counts): n + 1 values on the device
  /// The one tensor the step being enqueued steps, or -1 (several), or
  /// no_tensor (none: a step that only counts, as finish_step()'s).
  int focus_ = -1;
  static constexpr int no_tensor = -2;
  Array<cuda::CheckOutcome> outcome_;
  Array<cuda::OpenOutcome> open_outcome_;  ///< the step inside backward's verdicts (begin_verdicts)
  Array<double> norm_sq_;  ///< the last clipping step's sum of g^2
  Array<double> workspace_;  ///< the statistics passes' column partials (fit_workspace)
  const double* lr_device_ = nullptr;
  std::uint64_t generation_ = 0;  ///< changes whenever a captured graph would go stale
  std::vector<double> cut_host_, sums_host_;
  std::vector<float> divisors_host_;
};

}  // namespace skewadam::backend
