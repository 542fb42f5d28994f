#pragma once
// The local placement's engine over the CUDA backend: every tensor's state,
// its scratch and the step's tables live in the runtime's (device) memory;
// a step is a handful of kernel launches per group of tensors sharing a rule
// and dtypes, enqueued on the optimizer's stream.
//
//   upload     only what changed since the last step, from pageable memory
//              in stream order: the tensor table (a gradient pointer, a
//              rounding stream) and the StepControl (hyperparameters, the
//              global-norm scale, the seed); usually nothing
//   clip       (max_grad_norm set) squares_kernel and total_kernel: the
//              step's sum of g^2, from which begin_step_kernel forms the scale
//   begin      begin_step_kernel (step_control.cuh): every stepped tensor's
//              scalars and rounding key from its count on the device
//   check      (unless NonFinitePolicy::unchecked) scan_kernel and
//              decide_kernel (check_kernels.cuh): an offending gradient sets
//              every tensor's skip flag and the step's outcome on the device
//   groups     statistics, columns or finalize, apply (kernels.cuh), one
//              launch each per group covering all of its tensors
//   end        end_step_kernel: the counts of an applied step advance
//
// Registration allocates and synchronizes; a step never waits for the device
// (the front-end reads counts and the outcome when it is asked for them).
// Everything after the uploads can be captured in a CUDA graph (capture());
// a replay is one more step, counted on the device like any other.
//
// Work lists are cut by shape only, when a tensor is registered; a tensor
// changes group only when its gradient's dtype changes (fp32 or the
// parameter's own), which rebuilds the lists once (and waits for the device,
// as the old lists may still be read).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../backend/cuda/check_kernels.cuh"
#include "../backend/cuda/cuda_backend.hpp"
#include "../backend/cuda/device_memory.hpp"
#include "../backend/cuda/kernels.cuh"
#include "../backend/cuda/passes.hpp"
#include "../backend/cuda/step_control.cuh"
#include "../backend/cuda/work_lists.hpp"
#include "../backend/gradient_check.hpp"
#include "../config.hpp"
#include "../dtype.hpp"
#include "../engine.hpp"
#include "../nonfinite.hpp"
#include "../optimizer_options.hpp"
#include "../param_state.hpp"
#include "../rule_dispatch.hpp"
#include "../state_layout.hpp"
#include "local.hpp"

namespace skewadam {

template <class Tiers, class R>
class LocalEngine<Tiers, backend::CudaBackend<R>> {
  using Stream = typename R::stream_type;
  template <class T>
  using Array = backend::cuda::DeviceArray<R, T>;
  using Mem = backend::cuda::DeviceMemory<R>;
  using WorkItem = backend::cuda::WorkItem;
  using DeviceTask = backend::cuda::DeviceTask;
  using TaskStep = backend::cuda::TaskStep;
  using GroupArrays = backend::cuda::GroupArrays;
  using StepControl = backend::cuda::StepControl;

  /// A tensor's state arrays in device memory.
  struct DeviceState {
    Array<float> m, v, v_row, v_col;
  };

 public:
  using backend_type = backend::CudaBackend<R>;
  using runtime = R;
  static constexpr bool counts_on_device = true;

  /// An import's arrays and counts, in device memory until commit().
  struct staged_type {
    std::vector<std::optional<DeviceState>> states;
    Array<std::int64_t> counts;
  };

  /// A step captured for replay, with what it was captured against.
  class graph_type {
    friend class LocalEngine;
    typename R::graph_type graph_{};
    std::uint64_t generation_ = 0;
    std::vector<const void*> grads_;
    NonFinitePolicy policy_ = NonFinitePolicy::skip_step;
    bool clips_ = false;

   public:
    NonFinitePolicy policy() const noexcept { return policy_; }
    /// Whether it clips the global gradient norm itself (StepSettings::max_norm).
    bool clips_each_step() const noexcept { return clips_; }
  };

  explicit LocalEngine(const OptimizerOptions& options)
      : stream_(static_cast<Stream>(options.stream)), control_d_(1), outcome_(1), clip_norm_sq_(1) {
    tables_ = build_tables({0});
    R::zero(outcome_.data(), outcome_.bytes(), stream_);
    R::zero(clip_norm_sq_.data(), clip_norm_sq_.bytes(), stream_);
    R::synchronize(stream_);
  }
  LocalEngine(const LocalEngine&) = delete;
  LocalEngine& operator=(const LocalEngine&) = delete;
  ~LocalEngine() {
    if (!tensors_.empty()) {
      try {
        R::synchronize(stream_);
      } catch (...) {  // a destructor reports nothing; the memory is freed regardless
      }
    }
  }

  // -------------------------------------------------------------- stream
  /// From now on steps are ordered on s; waits for the steps enqueued so far.
  /// (A graph captured before keeps running on the stream it is replayed on.)
  void set_stream(Stream s) {
    R::synchronize(stream_);
    stream_ = s;
  }
  /// From now on each tier's lr is read from lr[tier_index] in device memory
  /// as each step runs (so that a captured step follows it); null: from the
  /// hyperparameters again.
  void set_lr_device(const double* lr) {
    if (lr != nullptr) R::check_device_memory(lr, "lr (device)");
    lr_device_ = lr;
  }
  const double* lr_device() const noexcept { return lr_device_; }
  Stream stream() const noexcept { return stream_; }
  /// Waits until every enqueued step has finished.
  void synchronize() const { R::synchronize(stream_); }

  void set_threads(int) noexcept {}
  int threads() const noexcept { return 1; }

  static constexpr bool host_memory = false;
  /// Bytes from device memory to the host, and back (in stream order; both
  /// wait for the stream).
  void read_memory(void* host, const void* device, std::size_t n) const { Mem::read(host, device, n, stream_); }
  void write_memory(void* device, const void* host, std::size_t n) { Mem::write(device, host, n, stream_); }
  ParamState host_arrays(std::size_t i) const { return export_arrays(i); }

  void check_memory(std::string_view name, const ParamView& p, const GradView& g) const { Mem::check(name, p, g); }

  // ---------------------------------------------------------- allocation
  void add(const TensorRegistration& spec) {
    const ParamView& param = spec.param;
    Tensor e;
    e.tier = spec.tier;
    e.pdtype = param.dtype;
    e.rank1 = param.shape.rank() < 2;
    e.geom = param.shape.matrices();
    e.numel = param.numel();
    e.factored = factors(spec.layout, param.shape);
    e.limit = backend::gradient_limit(e.geom, e.factored);
    e.ops = pick(e.tier, e.pdtype, e.pdtype, e.rank1);

    DeviceTask& d = e.task;
    d.param = param.data;
    d.geom = e.geom;
    if (e.numel > 0) {
      const auto n = static_cast<std::size_t>(e.numel);
      const auto B = static_cast<std::size_t>(e.geom.batch);
      const auto r = static_cast<std::size_t>(e.geom.rows);
      const auto c = static_cast<std::size_t>(e.geom.cols);
      if (spec.layout.momentum) d.m = Mem::zeroed(e.state.m, n, stream_);
      if (e.factored) {
        d.row_blocks = backend::cuda::row_blocks_of(e.geom);
        d.v_row = Mem::zeroed(e.state.v_row, B * r, stream_);
        d.v_col = Mem::zeroed(e.state.v_col, B * c, stream_);
      } else {
        d.chunks = backend::cuda::chunks_of(e.geom);
        d.v = Mem::zeroed(e.state.v, n, stream_);
      }
      const backend::cuda::ScratchSizes sz = backend::cuda::scratch_sizes(d, e.factored);
      e.scratch_f = Array<float>(sz.floats);
      e.scratch_d = Array<double>(sz.doubles);
      if (sz.counters > 0) (void)Mem::zeroed(e.done, sz.counters, stream_);
      backend::cuda::place_scratch(d, e.factored, e.scratch_f.data(), e.scratch_d.data(), e.done.data());
    }
    d.tier = tier_index(e.tier);
    std::vector<std::int64_t> counts(tensors_.size() + 1);
    R::to_host(counts.data(), tables_.counts.data(), tables_.counts.bytes(), stream_);
    counts.insert(counts.end() - 1, 0);  // the new tensor's, before the optimizer's
    tensors_.push_back(std::move(e));
    try {
      Tables next = build_tables(counts);
      fit_workspace(next.groups);
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
    for (Group& g : tables_.groups) g.arrays.workspace = workspace_.data();
    ++generation_;
  }

  // ---------------------------------------------------------------- state
  /// Tensor i's state arrays, viewed in device memory.
  ParamStateView view(std::size_t i) const {
    const DeviceState& s = tensors_[i].state;
    return {Mem::view(s.m), Mem::view(s.v), Mem::view(s.v_row), Mem::view(s.v_col), 0};
  }
  ParamState export_arrays(std::size_t i) const {
    const DeviceState& d = tensors_[i].state;
    ParamState s;
    Mem::download(d.m, s.m, stream_);
    Mem::download(d.v, s.v, stream_);
    Mem::download(d.v_row, s.v_row, stream_);
    Mem::download(d.v_col, s.v_col, stream_);
    return s;
  }
  void check_arrays(std::size_t i, const ParamState& got, const std::string& who) const {
    const DeviceState& have = tensors_[i].state;
    detail::check_array_sizes({have.m.size(), have.v.size(), have.v_row.size(), have.v_col.size()}, got, who);
  }
  staged_type stage_begin() const {
    staged_type s;
    s.states.resize(tensors_.size());
    return s;
  }
  void stage(staged_type& staged, std::size_t i, ParamState&& full) const {
    DeviceState d;
    Mem::upload(d.m, full.m, stream_);
    Mem::upload(d.v, full.v, stream_);
    Mem::upload(d.v_row, full.v_row, stream_);
    Mem::upload(d.v_col, full.v_col, stream_);
    staged.states[i] = std::move(d);
  }
  void stage_counts(staged_type& staged, std::span<const std::int64_t> counts, std::int64_t steps) const {
    std::vector<std::int64_t> all(counts.begin(), counts.end());
    all.push_back(steps);
    Mem::upload(staged.counts, all, stream_);
  }
  /// Swaps the staged arrays in (the old ones are freed with `staged`).
  void commit(staged_type&& staged) noexcept {
    if (!staged.counts.empty()) {
      std::swap(tables_.counts, staged.counts);
      ++generation_;  // a graph reads the counts it was captured with
    }
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      if (!staged.states[i]) continue;
      Tensor& e = tensors_[i];
      std::swap(e.state, *staged.states[i]);
      for (DeviceTask* d : {&e.task, &tables_.tasks[i]}) {
        d->m = e.state.m.data();
        d->v = e.state.v.data();
        d->v_row = e.state.v_row.data();
        d->v_col = e.state.v_col.data();
      }
    }
    tables_.tasks_dirty = true;
  }
  index_t state_bytes(std::size_t i) const noexcept {
    const DeviceState& s = tensors_[i].state;
    return static_cast<index_t>(s.m.bytes() + s.v.bytes() + s.v_row.bytes() + s.v_col.bytes());
  }
  /// Every byte of device memory the engine holds: the state, each tensor's
  /// scratch, the step's tables (those of the last registration's undo
  /// included) and the statistics workspace the groups share.
  index_t device_bytes() const noexcept {
    std::size_t b = workspace_.bytes() + control_d_.bytes() + outcome_.bytes() + clip_norm_sq_.bytes();
    for (const Tensor& e : tensors_)
      b += e.state.m.bytes() + e.state.v.bytes() + e.state.v_row.bytes() + e.state.v_col.bytes() +
           e.scratch_f.bytes() + e.scratch_d.bytes() + e.done.bytes();
    for (const Tables* t : {&tables_, &undo_}) {
      b += t->d_tasks.bytes() + t->d_steps.bytes() + t->counts.bytes() + t->check_items.bytes() +
           t->grad_tasks.bytes() + t->first.bytes() + t->value.bytes() + t->partial.bytes() + t->total.bytes();
      for (const Group& g : t->groups) b += g.items.bytes() + g.tasks.bytes();
    }
    return static_cast<index_t>(b);
  }

  // ---------------------------------------------------------------- step
  double grad_sum_squares(std::span<const StepItem> items) const {
    if (tables_.check_items.empty()) return 0.0;
    sync_grad_table(items);
    const Tables& t = tables_;
    R::template launch<&backend::cuda::squares_kernel<>>(grid(t.check_items.size()), backend::cuda::block_threads,
                                                          stream_, t.grad_tasks.data(), t.check_items.data(),
                                                          t.partial.data());
    R::template launch<&backend::cuda::total_kernel<>>(1u, backend::cuda::block_threads, stream_, t.partial.data(),
                                                        static_cast<index_t>(t.partial.size()), t.total.data());
    double sum = 0;
    R::to_host(&sum, t.total.data(), sizeof sum, stream_);
    return sum;
  }

  /// Enqueues one step; never waits for the device.
  void step(std::span<const StepItem> items, NonFinitePolicy policy, const StepSettings& settings) {
    prepare(items, settings);
    enqueue(policy);
  }

  /// Every tensor's count into out (size(): the tensors') and the applied-step
  /// count; waits for the device.
  std::int64_t counts(std::span<std::int64_t> out) const {
    std::vector<std::int64_t> all(tensors_.size() + 1);
    R::to_host(all.data(), tables_.counts.data(), all.size() * sizeof(std::int64_t), stream_);
    std::copy(all.begin(), all.end() - 1, out.begin());
    return all.back();
  }
  /// The sum of g^2 the last clipping step formed; waits for the device.
  double clip_sum_squares() const {
    double x = 0;
    R::to_host(&x, clip_norm_sq_.data(), sizeof x, stream_);
    return x;
  }
  /// The last step's first offender, when it was rejected; waits for the device.
  std::optional<Offender> outcome() const {
    backend::cuda::CheckOutcome out;
    R::to_host(&out, outcome_.data(), sizeof out, stream_);
    if (!out.bad) return std::nullopt;
    return Offender{out.task, out.element, out.value};
  }

  // ------------------------------------------------------------ graphs
  /// One step recorded for replay on this engine's stream (not the default
  /// stream, which cannot be captured). What changed since the last step is
  /// uploaded first, outside the graph.
  graph_type capture(std::span<const StepItem> items, NonFinitePolicy policy, const StepSettings& settings) {
    if (stream_ == Stream{})
      throw std::invalid_argument(
          "stream: a step on the default stream cannot be captured (build the optimizer with OptimizerOptions::stream)");
    prepare(items, settings);
    graph_type g;
    g.generation_ = generation_;
    g.grads_ = grads_;
    g.policy_ = policy;
    g.clips_ = settings.max_norm > 0;
    R::begin_capture(stream_);
    try {
      enqueue(policy);
      g.graph_ = R::end_capture(stream_);
    } catch (...) {
      R::abort_capture(stream_);
      throw;
    }
    return g;
  }
  std::optional<ReplayProblem> replay_problem(const graph_type& g, std::span<const StepItem> items) const {
    if (g.generation_ != generation_) return ReplayProblem{};
    std::vector<const void*>& grads = replay_room_;
    grads.assign(tensors_.size(), nullptr);
    for (const StepItem& it : items) {
      const auto i = static_cast<std::size_t>(it.index);
      const Tensor& e = tensors_[i];
      if (e.numel == 0) continue;
      grads[i] = it.grad.data;
      if (pick(e.tier, e.pdtype, it.grad.dtype, e.rank1) != e.ops) return ReplayProblem{it.index};
    }
    for (std::size_t i = 0; i < grads.size(); ++i)
      if (grads[i] != g.grads_[i]) return ReplayProblem{static_cast<index_t>(i)};
    return std::nullopt;
  }
  /// Runs a captured step (replay_problem() must have found nothing).
  void replay(const graph_type& g, std::span<const StepItem> items, const StepSettings& settings) {
    prepare(items, settings);  // uploads what changed (a rounding stream, the hyperparameters)
    R::launch_graph(g.graph_, stream_);
  }

 private:
  /// The passes of one (rule, parameter dtype, gradient dtype).
  using GroupOps = backend::cuda::GroupPasses<R>;

  struct Group {
    const GroupOps* ops = nullptr;
    Array<WorkItem> items;
    Array<std::int32_t> tasks;
    GroupArrays arrays;
    std::size_t workspace = 0;  ///< doubles of statistics workspace its passes need
  };

  struct Tensor {
    Tier tier = Tier::backbone;
    Dtype pdtype = Dtype::f32;
    bool rank1 = false;
    bool factored = false;
    MatrixGeometry geom{};
    index_t numel = 0;
    float limit = 0;
    const GroupOps* ops = nullptr;  ///< of the gradient dtype it was last stepped with
    DeviceTask task{};              ///< its pointers (the gradient's is the step's: Tables::tasks)
    DeviceState state;
    Array<float> scratch_f;
    Array<double> scratch_d;
    Array<unsigned> done;
  };

  /// Everything a step reads besides the tensors' own arrays and the
  /// engine's StepControl and outcome.
  struct Tables {
    std::vector<DeviceTask> tasks;  ///< what d_tasks holds, or will once uploaded (tasks_dirty)
    Array<DeviceTask> d_tasks;
    bool tasks_dirty = false;
    Array<TaskStep> d_steps;        ///< formed on the device by begin_step_kernel
    Array<std::int64_t> counts;     ///< [n + 1]: each tensor's count, then the applied steps
    std::vector<Group> groups;
    Array<WorkItem> check_items;    ///< one per chunk of every tensor; item.block is its slot
    mutable std::vector<backend::cuda::GradTask> host_grad_tasks;  ///< what grad_tasks holds
    Array<backend::cuda::GradTask> grad_tasks;
    Array<index_t> first;
    Array<float> value;
    Array<double> partial;
    Array<double> total;
  };

  static const GroupOps* pick(Tier t, Dtype p, Dtype g, bool rank1) {
    return backend::cuda::passes_for<R, Tiers>(t, p, g, rank1);
  }

  static unsigned grid(std::size_t blocks) { return static_cast<unsigned>(blocks); }


  /// Uploads what a step of `items` needs that changed since the last one.
  void prepare(std::span<const StepItem> items, const StepSettings& settings) {
    regroup(items);
    Tables& t = tables_;
    grads_.assign(tensors_.size(), nullptr);
    for (const StepItem& it : items) {
      const auto i = static_cast<std::size_t>(it.index);
      if (tensors_[i].numel > 0) grads_[i] = it.grad.data;
      DeviceTask& d = t.tasks[i];
      if (d.id != it.key.tensor) {
        d.id = it.key.tensor;
        t.tasks_dirty = true;
      }
    }
    for (std::size_t i = 0; i < tensors_.size(); ++i)
      if (t.tasks[i].grad != grads_[i]) {
        t.tasks[i].grad = grads_[i];
        t.tasks_dirty = true;
      }
    if (t.tasks_dirty) {
      R::to_device(t.d_tasks.data(), t.tasks.data(), t.tasks.size() * sizeof(DeviceTask), stream_);
      t.tasks_dirty = false;
    }
    sync_grad_table(items);
    StepControl c;
    for (int k = 0; k < tier_count; ++k) c.hyper[k] = settings.hyper[static_cast<std::size_t>(k)];
    c.grad_scale = settings.grad_scale;
    c.seed = settings.seed;
    c.lr = lr_device_;
    c.max_norm = settings.max_norm;
    c.norm_sq = clip_norm_sq_.data();
    if (!control_uploaded_ || !backend::cuda::same_control(c, control_)) {
      R::to_device(control_d_.data(), &c, sizeof c, stream_);
      control_ = c;
      control_uploaded_ = true;
    }
  }

  /// The launches of one step (nothing here copies or waits: it can be captured).
  void enqueue(NonFinitePolicy policy) {
    namespace cu = backend::cuda;
    const Tables& t = tables_;
    const int n = static_cast<int>(tensors_.size());
    if (control_.max_norm > 0) {  // the step's sum of g^2, for begin_step_kernel's scale
      if (!t.check_items.empty())
        R::template launch<&cu::squares_kernel<>>(grid(t.check_items.size()), cu::block_threads, stream_,
                                                  static_cast<const cu::GradTask*>(t.grad_tasks.data()),
                                                  static_cast<const WorkItem*>(t.check_items.data()),
                                                  t.partial.data());
      R::template launch<&cu::total_kernel<>>(1u, cu::block_threads, stream_,
                                              static_cast<const double*>(t.partial.data()),
                                              static_cast<index_t>(t.check_items.size()), clip_norm_sq_.data());
    }
    R::template launch<&cu::begin_step_kernel<>>(grid(std::max<std::size_t>(1, (tensors_.size() + 127) / 128)), 128u,
                                                 stream_, static_cast<const DeviceTask*>(t.d_tasks.data()),
                                                 static_cast<const StepControl*>(control_d_.data()),
                                                 static_cast<const std::int64_t*>(t.counts.data()), t.d_steps.data(), n,
                                                 outcome_.data());
    if (policy != NonFinitePolicy::unchecked && !t.check_items.empty()) {
      R::template launch<&cu::scan_kernel<>>(grid(t.check_items.size()), cu::block_threads, stream_,
                                             static_cast<const cu::GradTask*>(t.grad_tasks.data()),
                                             static_cast<const TaskStep*>(t.d_steps.data()),
                                             static_cast<const WorkItem*>(t.check_items.data()), t.first.data(),
                                             t.value.data());
      R::template launch<&cu::decide_kernel<>>(1u, cu::block_threads, stream_,
                                               static_cast<const index_t*>(t.first.data()),
                                               static_cast<const float*>(t.value.data()),
                                               static_cast<index_t>(t.first.size()),
                                               static_cast<const WorkItem*>(t.check_items.data()), t.d_steps.data(), n,
                                               outcome_.data());
    }
    for (const Group& g : t.groups) g.ops->run_all(g.arrays, t.d_tasks.data(), t.d_steps.data(), stream_);
    R::template launch<&cu::end_step_kernel<>>(1u, cu::block_threads, stream_,
                                               static_cast<const DeviceTask*>(t.d_tasks.data()), t.counts.data(), n,
                                               static_cast<const cu::CheckOutcome*>(outcome_.data()));
  }

  /// The gradient table of `items` (the others null), uploaded when it changed.
  void sync_grad_table(std::span<const StepItem> items) const {
    std::vector<backend::cuda::GradTask>& h = grad_room_;
    h.assign(tensors_.size(), backend::cuda::GradTask{});
    for (const StepItem& it : items) {
      const Tensor& e = tensors_[static_cast<std::size_t>(it.index)];
      if (e.numel == 0) continue;
      h[static_cast<std::size_t>(it.index)] =
          backend::cuda::GradTask{it.grad.data, it.grad.dtype, e.limit, e.geom.matrix_size()};
    }
    auto same = [](const backend::cuda::GradTask& a, const backend::cuda::GradTask& b) {
      return a.grad == b.grad && a.dtype == b.dtype && a.limit == b.limit && a.matrix_size == b.matrix_size;
    };
    if (std::equal(h.begin(), h.end(), tables_.host_grad_tasks.begin(), tables_.host_grad_tasks.end(), same)) return;
    R::to_device(tables_.grad_tasks.data(), h.data(), h.size() * sizeof(h[0]), stream_);
    std::swap(tables_.host_grad_tasks, h);
  }

  /// Moves tensors whose gradient dtype changed to the group of the new one.
  void regroup(std::span<const StepItem> items) {
    std::vector<const GroupOps*> ops;
    for (const StepItem& it : items) {
      const Tensor& e = tensors_[static_cast<std::size_t>(it.index)];
      const GroupOps* o = pick(e.tier, e.pdtype, it.grad.dtype, e.rank1);
      if (o == e.ops) continue;
      if (ops.empty()) {
        ops.reserve(tensors_.size());
        for (const Tensor& x : tensors_) ops.push_back(x.ops);
      }
      ops[static_cast<std::size_t>(it.index)] = o;
    }
    if (ops.empty()) return;
    R::synchronize(stream_);  // the old lists may still be read
    std::vector<Group> groups = build_groups(ops);
    fit_workspace(groups);
    tables_.groups = std::move(groups);
    ++generation_;
    for (std::size_t i = 0; i < tensors_.size(); ++i) tensors_[i].ops = ops[i];
  }

  /// Every group's work lists, uploaded, for tensors with kernels `ops`.
  std::vector<Group> build_groups(const std::vector<const GroupOps*>& ops) const {
    std::vector<const GroupOps*> order;
    for (std::size_t k = 0; k < tensors_.size(); ++k)
      if (tensors_[k].numel > 0 && std::find(order.begin(), order.end(), ops[k]) == order.end())
        order.push_back(ops[k]);
    std::vector<Group> groups;
    for (const GroupOps* o : order) {
      backend::cuda::GroupLists lists;
      lists.factored = o->factored;
      for (std::size_t k = 0; k < tensors_.size(); ++k) {
        const Tensor& e = tensors_[k];
        if (ops[k] == o && e.numel > 0)
          lists.add(static_cast<std::int32_t>(k), e.geom, e.task.row_blocks, e.task.chunks);
      }
      Group grp;
      grp.ops = o;
      Mem::upload(grp.items, lists.concatenated(), stream_);
      Mem::upload(grp.tasks, lists.tasks, stream_);
      grp.arrays = GroupArrays::of(lists, grp.items.data(), grp.tasks.data());
      grp.workspace = lists.workspace_doubles();
      groups.push_back(std::move(grp));
    }
    return groups;
  }

  /// Grows the statistics workspace to what `groups` need (they run one after
  /// another on the stream, so they share it) and points every group at it.
  void fit_workspace(std::vector<Group>& groups) {
    std::size_t need = 0;
    for (const Group& g : groups) need = std::max(need, g.workspace);
    if (need > workspace_.size()) {
      R::synchronize(stream_);  // the old one may still be read
      workspace_ = Array<double>(need);
    }
    for (std::vector<Group>* gs : {&groups, &tables_.groups, &undo_.groups})
      for (Group& g : *gs) g.arrays.workspace = workspace_.data();
  }

  /// The tables of every registered tensor with these counts (n + 1:
  /// registration; uploads in stream order).
  Tables build_tables(const std::vector<std::int64_t>& counts) const {
    namespace cu = backend::cuda;
    Tables t;
    const std::size_t n = tensors_.size();
    t.tasks.resize(n);
    for (std::size_t k = 0; k < n; ++k) {
      t.tasks[k] = tensors_[k].task;
      t.tasks[k].grad = nullptr;
    }
    Mem::upload(t.d_tasks, t.tasks, stream_);
    Mem::upload(t.d_steps, std::vector<TaskStep>(n), stream_);
    Mem::upload(t.counts, counts, stream_);
    std::vector<const GroupOps*> ops;
    for (const Tensor& e : tensors_) ops.push_back(e.ops);
    t.groups = build_groups(ops);

    std::vector<WorkItem> checks;
    for (std::size_t k = 0; k < n; ++k) {
      const Tensor& e = tensors_[k];
      if (e.numel == 0) continue;
      const index_t size = e.geom.matrix_size();
      for (index_t b = 0; b < e.geom.batch; ++b)
        for (index_t o = 0; o < size; o += cu::chunk_elems) {
          const auto slot = static_cast<index_t>(checks.size());
          checks.push_back(WorkItem{static_cast<std::int32_t>(k), b, o, std::min(size, o + cu::chunk_elems), slot});
        }
    }
    backend::cuda::check_launch_size(checks.size());
    Mem::upload(t.check_items, checks, stream_);
    t.host_grad_tasks.assign(n, cu::GradTask{});
    Mem::upload(t.grad_tasks, t.host_grad_tasks, stream_);
    t.first = Array<index_t>(checks.size());
    t.value = Array<float>(checks.size());
    t.partial = Array<double>(checks.size());
    t.total = Array<double>(1);
    return t;
  }

  Stream stream_{};
  std::vector<Tensor> tensors_;
  Tables tables_;
  Tables undo_;  ///< the tables before the last add (pop_back)
  std::vector<const void*> grads_;  ///< reused by every step
  mutable std::vector<backend::cuda::GradTask> grad_room_;  ///< sync_grad_table's, reused
  mutable std::vector<const void*> replay_room_;            ///< replay_problem's, reused
  Array<StepControl> control_d_;
  StepControl control_{};           ///< what control_d_ holds once control_uploaded_
  bool control_uploaded_ = false;
  Array<backend::cuda::CheckOutcome> outcome_;
  Array<double> clip_norm_sq_;      ///< the last clipping step's sum of g^2
  Array<double> workspace_;         ///< the statistics passes' column partials (fit_workspace)
  const double* lr_device_ = nullptr;
  std::uint64_t generation_ = 0;    ///< changes whenever a captured graph would go stale
};

}  // namespace skewadam
