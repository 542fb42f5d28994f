#pragma once
// skewadam::cuda::Optimizer<Tiers>: a standalone driver of the CUDA kernels,
// whose steps can be captured in a CUDA graph. The optimizer front-end over
// the CUDA backend (skewadam/cuda.cuh) has everything else (non-finite
// checks, clipping, fp32 gradients for 16-bit parameters, checkpoints); this
// driver remains until the front-end forms its step scalars on the device.
//
// Parameters, gradients and the optimizer state live in device memory; the
// rules (tiers) and their per-element math are the CPU backend's, selected at
// compile time.
//
//   skewadam::cuda::Optimizer<> opt(skewadam::Hyperparameters{.lr = 3e-4, .weight_decay = 0.05},
//                                   {.stream = stream});
//   opt.add("blocks.1.moe.experts.w1", skewadam::Tier::experts,
//           skewadam::TensorView<skewadam::bf16>(d_w1, {128, 4096, 4096}),
//           skewadam::TensorView<const skewadam::bf16>(d_gw1, {128, 4096, 4096}));
//   opt.step();  // asynchronous on `stream`
//
// step() enqueues a handful of kernel launches per group of tensors sharing a
// rule and dtype (kernels.cuh) on the optimizer's stream and never waits for
// the device. The step count and the per-step scalars are formed on the
// device; with set_lr_device() the learning rates are read from device memory
// too, so that a step can be captured in a CUDA graph and replayed (after
// one ordinary step() has uploaded the tensor table, and as long as no
// gradient pointer changes).
//
// Registration (add) allocates and synchronizes the device; set_grad() and
// step() do neither (a changed gradient pointer is uploaded by the next step,
// in stream order). Invalid input throws std::invalid_argument naming the
// argument, before anything changes; CUDA errors throw std::runtime_error.
//
// Gradients are in the parameter's dtype. Not (yet) on the GPU: non-finite
// gradient checks (every step is NonFinitePolicy::unchecked), global
// gradient-norm clipping, checkpoints (state() copies a tensor's state to
// the host).
//
// Scratch, allocated with the state: a factored [B, r, c] tensor keeps two
// column partials per row block of its statistics pass (blocks of at most
// backend::cuda::row_block_rows rows and about backend::cuda::row_block_elems
// elements), 8 * B * row_blocks * c bytes: numel / 2 bytes for rows of up to
// 4096 elements (1/8 of an fp32 parameter's size, 1/4 of a bf16 one), more
// for longer rows (numel bytes at 8192 columns); plus O(B * (r + c)) and a
// counter per matrix. An element-wise tensor keeps 8 bytes per chunk of
// backend::cuda::chunk_elems.

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "../../config.hpp"
#include "../../dtype.hpp"
#include "../../hyperparameters.hpp"
#include "../../param_state.hpp"
#include "../../random.hpp"
#include "../../state_layout.hpp"
#include "../../tensor_view.hpp"
#include "../../tier.hpp"
#include "../../tier_rules.hpp"
#include "../../tier_settings.hpp"
#include "device_buffer.cuh"
#include "kernels.cuh"
#include "runtime.cuh"
#include "work_lists.hpp"

namespace skewadam::backend::cuda {

/// Hyperparameters of the three tiers, passed by value to prepare_kernel.
struct TierHyper {
  Hyperparameters h[3];
};

/// Forms every tensor's step scalars and rounding key on the device and
/// advances its step count, for tensors with a gradient. `lr_device`, when
/// not null, holds the three tiers' lr (so that a captured step reads it).
/// This driver never skips a step (TaskStep::skip stays 0). (A template only
/// so that the header can be included by several translation units.)
template <int = 0>
__global__ void prepare_kernel(const DeviceTask* tasks, TaskStep* steps, std::int64_t* counts, int n,
                               TierHyper hyper, const double* lr_device, std::uint64_t seed, double grad_scale) {
  const int k = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (k >= n) return;
  const DeviceTask& t = tasks[k];
  if (t.grad == nullptr) return;
  const std::int64_t step = counts[k] + 1;
  counts[k] = step;
  Hyperparameters h = hyper.h[t.tier];
  if (lr_device != nullptr) h.lr = lr_device[t.tier];
  steps[k].s = make_step_scalars(h, step, grad_scale);
  steps[k].key = RoundingKey{seed, t.id, static_cast<std::uint64_t>(step)};
  steps[k].scope = h.clip_scope;
  steps[k].skip = 0;
}

/// Launches of one (rule, parameter dtype, gradient dtype).
struct GroupOps {
  bool factored = false;
  void (*launch)(const GroupArrays&, const DeviceTask*, const TaskStep*, cudaStream_t) = nullptr;
};

template <class Rule, class P, class G>
void launch_group(const GroupArrays& g, const DeviceTask* tasks, const TaskStep* steps, cudaStream_t stream) {
  using X = Math<Rule, P, G>;
  const dim3 block(block_threads);
  if (g.n_units == 0) return;
  statistics_kernel<Rule, P, G><<<g.n_units, block, 0, stream>>>(tasks, steps, g.units);
  if constexpr (X::S::factored) {
    // also forms the clip divisors (the last block of each tensor)
    columns_kernel<Rule, P, G><<<g.n_columns, block, 0, stream>>>(tasks, steps, g.columns);
  } else if constexpr (X::C::active) {
    finalize_kernel<Rule, P, G><<<(g.n_tasks + 127) / 128, 128, 0, stream>>>(tasks, steps, g.tasks, g.n_tasks);
  }
  if constexpr (X::S::factored || X::C::active)
    apply_kernel<Rule, P, G><<<g.n_applies, apply_threads, 0, stream>>>(tasks, steps, g.applies);
  check(cudaGetLastError(), "skewadam CUDA step: kernel launch");
}

template <class Rule, class P, class G>
const GroupOps* group_ops() {
  static const GroupOps ops{Rule::second_moment::factored, &launch_group<Rule, P, G>};
  return &ops;
}

}  // namespace skewadam::backend::cuda

namespace skewadam::cuda {

using backend::cuda::device_count;

struct Options {
  std::uint64_t seed = 0x5eed5eedULL;  ///< stochastic-rounding seed (as the CPU optimizer's default)
  cudaStream_t stream = nullptr;        ///< the stream step() runs on (null: the default stream)
};

template <class Tiers = SkewAdamTiers>
class Optimizer : public TierSettings {
 public:
  using tiers = Tiers;
  using Schedule = TierSettings::Schedule;

  Optimizer() : Optimizer(Hyperparameters{}) {}
  explicit Optimizer(const Hyperparameters& all, Options options = {})
      : Optimizer(PerTier<Hyperparameters>{all, all, all}, options) {}
  /// Hyperparameters of the backbone, experts and router tiers.
  explicit Optimizer(const std::array<Hyperparameters, 3>& per_tier, Options options = {})
      : Optimizer(PerTier<Hyperparameters>{per_tier[0], per_tier[1], per_tier[2]}, options) {}
  explicit Optimizer(const PerTier<Hyperparameters>& per_tier, Options options = {})
      : TierSettings(per_tier), seed_(options.seed), stream_(options.stream) {}
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;
  ~Optimizer() {
    if (!entries_.empty()) (void)cudaStreamSynchronize(stream_);
  }

  // ------------------------------------------------------------ parameters
  /// Registers a parameter (device memory) under a tier; allocates its state
  /// on the device. Synchronizes the stream.
  ParamId add(std::string_view name, Tier tier, ParamView param, GradView grad = {}) {
    if (name.empty()) throw std::invalid_argument("name: a parameter name must not be empty");
    if (index_.count(std::string(name)))
      throw std::invalid_argument("name: parameter '" + std::string(name) + "' is already registered");
    if (tier != Tier::backbone && tier != Tier::experts && tier != Tier::router)
      throw std::invalid_argument("tier of '" + std::string(name) + "': unknown tier");
    check_param(name, param);
    check_grad(name, param, grad);

    backend::cuda::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    auto e = std::make_unique<Entry>();
    e->name = std::string(name);
    e->tier = tier;
    e->param = param;
    e->grad = grad;
    const StateLayout layout = Tiers::layout(tier);
    const MatrixGeometry g = param.shape.matrices();
    e->factored = layout.factored && param.shape.rank() >= 2;
    e->numel = param.numel();
    e->ops = pick_ops(tier, param.dtype, param.shape.rank() < 2);

    backend::cuda::DeviceTask& d = e->task;
    d.param = param.data;
    d.grad = grad.present() && e->numel > 0 ? grad.data : nullptr;
    d.geom = g;
    d.tier = idx(tier);
    d.id = tensor_id(name);
    if (e->numel > 0) {
      const auto n = static_cast<std::size_t>(e->numel);
      const auto B = static_cast<std::size_t>(g.batch);
      const auto r = static_cast<std::size_t>(g.rows);
      const auto c = static_cast<std::size_t>(g.cols);
      if (layout.momentum) d.m = alloc(*e, e->m, n, true);
      if (e->factored) {
        d.row_blocks = backend::cuda::row_blocks_of(g);
        d.v_row = alloc(*e, e->v_row, B * r, true);
        d.v_col = alloc(*e, e->v_col, B * c, true);
      } else {
        d.chunks = backend::cuda::chunks_of(g);
        d.v = alloc(*e, e->v, n, true);
      }
      const backend::cuda::ScratchSizes sz = backend::cuda::scratch_sizes(d, e->factored);
      float* f = alloc(*e, e->scratch_f, sz.floats, false);
      double* x = alloc(*e, e->scratch_d, sz.doubles, false);
      unsigned* counters = sz.counters > 0 ? alloc(*e, e->done, sz.counters, true) : nullptr;
      backend::cuda::place_scratch(d, e->factored, f, x, counters);
    }

    const ParamId id{static_cast<index_t>(entries_.size())};
    index_.emplace(std::string(name), id.index);
    entries_.push_back(std::move(e));
    rebuild();
    // cudaMemset and pageable cudaMemcpy may still be in flight on the
    // legacy stream, which a non-blocking stream does not wait for
    backend::cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    return id;
  }

  ParamId add(std::string_view name, std::string_view tier, ParamView param, GradView grad = {}) {
    return add(name, parse_tier(tier, "tier of '" + std::string(name) + "'"), param, grad);
  }

  /// Sets the gradient (device memory) used by the next step(s). A default
  /// GradView clears it. Takes effect with the next step(), in stream order.
  void set_grad(ParamId id, GradView grad) {
    Entry& e = entry(id);
    check_grad(e.name, e.param, grad);
    e.grad = grad;
    const void* p = grad.present() && e.numel > 0 ? grad.data : nullptr;
    auto& slot = host_tasks_[static_cast<std::size_t>(id.index)];
    if (slot.grad != p) {
      slot.grad = p;
      e.task.grad = p;
      tasks_dirty_ = true;
    }
  }
  void clear_grad(ParamId id) { set_grad(id, GradView{}); }
  void clear_grads() {
    for (index_t i = 0; i < size(); ++i) clear_grad(ParamId{i});
  }

  std::optional<ParamId> find(std::string_view name) const {
    auto it = index_.find(std::string(name));
    if (it == index_.end()) return std::nullopt;
    return ParamId{it->second};
  }
  index_t size() const noexcept { return static_cast<index_t>(entries_.size()); }
  const std::string& name(ParamId id) const { return entry(id).name; }
  Tier tier(ParamId id) const { return entry(id).tier; }

  // ------------------------------------------------------ hyperparameters
  // hyperparameters(), set_hyperparameters(), set_lr(), set_lr_schedule():
  // TierSettings (tier_settings.hpp).
  /// From now on the lr of tier k (backbone, experts, router) is read from
  /// lr[k] in device memory when each step runs; null goes back to the host
  /// values. The pointer must stay valid while steps are enqueued.
  void set_lr_device(const double* lr) {
    if (lr != nullptr) check_device_pointer(lr, "lr (device)");
    lr_device_ = lr;
  }

  // ---------------------------------------------------------------- stream
  void set_stream(cudaStream_t s) {
    backend::cuda::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    stream_ = s;
  }
  cudaStream_t stream() const noexcept { return stream_; }
  /// Waits until every enqueued step has finished.
  void synchronize() const { backend::cuda::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

  // ------------------------------------------------------------------ step
  /// Enqueues one step of every parameter that has a gradient on the stream.
  /// Does not wait for the device.
  void step() {
    const std::int64_t t_global = steps_ + 1;
    const PerTier<Hyperparameters> h = hyperparameters_at(t_global);
    backend::cuda::TierHyper th;
    for (Tier t : all_tiers) th.h[idx(t)] = h[t];
    if (!entries_.empty()) {
      if (tasks_dirty_) {
        // from pageable memory: staged before the call returns
        backend::cuda::check(cudaMemcpyAsync(d_tasks_.data(), host_tasks_.data(),
                                             host_tasks_.size() * sizeof(backend::cuda::DeviceTask),
                                             cudaMemcpyHostToDevice, stream_),
                             "cudaMemcpyAsync (tensor table)");
        tasks_dirty_ = false;
      }
      const int n = static_cast<int>(entries_.size());
      backend::cuda::prepare_kernel<><<<(n + 127) / 128, 128, 0, stream_>>>(
          d_tasks_.data(), d_steps_.data(), d_counts_.data(), n, th, lr_device_, seed_, 1.0);
      backend::cuda::check(cudaGetLastError(), "skewadam CUDA step: prepare launch");
      for (const Group& g : groups_) g.ops->launch(g.arrays, d_tasks_.data(), d_steps_.data(), stream_);
    }
    for (auto& e : entries_)
      if (e->task.grad != nullptr) ++e->step;
    ++steps_;
  }

  std::int64_t steps() const noexcept { return steps_; }
  std::uint64_t seed() const noexcept { return seed_; }

  // ----------------------------------------------------------------- state
  /// A host copy of a parameter's state. Synchronizes the stream.
  ParamState state(ParamId id) const {
    const Entry& e = entry(id);
    synchronize();
    ParamState s;
    download(e.m, s.m);
    download(e.v, s.v);
    download(e.v_row, s.v_row);
    download(e.v_col, s.v_col);
    s.step = e.step;
    return s;
  }
  /// Optimizer state bytes (SPEC section 2; scratch not counted).
  index_t state_bytes() const noexcept {
    index_t b = 0;
    for (const auto& e : entries_) b += e->state_bytes();
    return b;
  }
  index_t state_bytes(Tier t) const noexcept {
    index_t b = 0;
    for (const auto& e : entries_)
      if (e->tier == t) b += e->state_bytes();
    return b;
  }

 private:
  struct Entry {
    std::string name;
    Tier tier = Tier::backbone;
    ParamView param;
    GradView grad;
    bool factored = false;
    index_t numel = 0;
    std::int64_t step = 0;
    const backend::cuda::GroupOps* ops = nullptr;
    backend::cuda::DeviceTask task{};
    backend::cuda::DeviceBuffer<float> m, v, v_row, v_col, scratch_f;
    backend::cuda::DeviceBuffer<double> scratch_d;
    backend::cuda::DeviceBuffer<unsigned> done;
    index_t state_bytes() const noexcept {
      return 4 * static_cast<index_t>(m.size() + v.size() + v_row.size() + v_col.size());
    }
  };

  struct Group {
    const backend::cuda::GroupOps* ops = nullptr;
    backend::cuda::DeviceBuffer<backend::cuda::WorkItem> items;
    backend::cuda::DeviceBuffer<std::int32_t> tasks;
    backend::cuda::GroupArrays arrays;
  };

  static int idx(Tier t) noexcept { return t == Tier::backbone ? 0 : (t == Tier::experts ? 1 : 2); }

  template <class T>
  static T* alloc(Entry&, backend::cuda::DeviceBuffer<T>& buf, std::size_t n, bool zero) {
    buf = backend::cuda::DeviceBuffer<T>(n);
    if (zero) buf.zero();
    return buf.data();
  }

  template <class T>
  static void download(const backend::cuda::DeviceBuffer<T>& d, std::vector<T>& out) {
    out.resize(d.size());
    if (!d.empty())
      backend::cuda::check(cudaMemcpy(out.data(), d.data(), d.size() * sizeof(T), cudaMemcpyDeviceToHost),
                           "cudaMemcpy (state to host)");
  }

  template <class T>
  static void upload(backend::cuda::DeviceBuffer<T>& d, const std::vector<T>& v) {
    d = backend::cuda::DeviceBuffer<T>(v.size());
    if (!v.empty())
      backend::cuda::check(cudaMemcpy(d.data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
                           "cudaMemcpy (work lists)");
  }

  /// Rebuilds the tensor table, the step counts and every group's work lists
  /// (registration only; the stream is idle).
  void rebuild() {
    const std::size_t n = entries_.size();
    // step counts survive: copy the old ones
    std::vector<std::int64_t> counts(n, 0);
    if (!d_counts_.empty())
      backend::cuda::check(cudaMemcpy(counts.data(), d_counts_.data(), d_counts_.size() * sizeof(std::int64_t),
                                      cudaMemcpyDeviceToHost),
                           "cudaMemcpy (step counts)");
    host_tasks_.resize(n);
    for (std::size_t k = 0; k < n; ++k) host_tasks_[k] = entries_[k]->task;
    upload(d_tasks_, host_tasks_);
    upload(d_counts_, counts);
    d_steps_ = backend::cuda::DeviceBuffer<backend::cuda::TaskStep>(n);
    tasks_dirty_ = false;

    groups_.clear();
    std::vector<const backend::cuda::GroupOps*> order;
    for (const auto& e : entries_)
      if (e->numel > 0 && std::find(order.begin(), order.end(), e->ops) == order.end()) order.push_back(e->ops);
    for (const backend::cuda::GroupOps* ops : order) {
      backend::cuda::GroupLists lists;
      lists.factored = ops->factored;
      for (std::size_t k = 0; k < n; ++k) {
        const Entry& e = *entries_[k];
        if (e.ops == ops && e.numel > 0)
          lists.add(static_cast<std::int32_t>(k), e.task.geom, e.task.row_blocks, e.task.chunks);
      }
      Group grp;
      grp.ops = ops;
      upload(grp.items, lists.concatenated());
      upload(grp.tasks, lists.tasks);
      grp.arrays = backend::cuda::GroupArrays::of(lists, grp.items.data(), grp.tasks.data());
      groups_.push_back(std::move(grp));
    }
  }

  Entry& entry(ParamId id) {
    if (id.index < 0 || id.index >= size())
      throw std::invalid_argument("param id " + std::to_string(id.index) + ": no such parameter");
    return *entries_[static_cast<std::size_t>(id.index)];
  }
  const Entry& entry(ParamId id) const { return const_cast<Optimizer*>(this)->entry(id); }

  static void check_device_pointer(const void* p, const std::string& who) {
    backend::cuda::DeviceRuntime::check_device_memory(p, who);
  }

  static void check_param(std::string_view name, const ParamView& p) {
    const std::string who = "param of '" + std::string(name) + "'";
    if (p.shape.rank() < 1) throw std::invalid_argument(who + ": shape has rank 0 (a view must have rank >= 1)");
    if (p.dtype != Dtype::f32 && p.dtype != Dtype::bf16 && p.dtype != Dtype::f16)
      throw std::invalid_argument(who + ": unknown dtype");
    if (p.numel() == 0) return;
    if (p.data == nullptr) throw std::invalid_argument(who + ": null data pointer");
    check_device_pointer(p.data, who);
  }

  static void check_grad(std::string_view name, const ParamView& p, const GradView& g) {
    if (!g.present()) return;
    const std::string who = "grad of '" + std::string(name) + "'";
    if (!(g.shape == p.shape))
      throw std::invalid_argument(who + ": shape " + g.shape.str() + " does not match the parameter's " +
                                  p.shape.str());
    if (g.dtype != p.dtype)
      throw std::invalid_argument(who + ": dtype " + std::string(dtype_name(g.dtype)) +
                                  " must be the parameter's dtype " + std::string(dtype_name(p.dtype)) +
                                  " (the CUDA optimizer)");
    if (g.numel() == 0) return;
    if (g.data == nullptr) throw std::invalid_argument(who + ": null data pointer");
    check_device_pointer(g.data, who);
  }

  template <class Rule>
  static const backend::cuda::GroupOps* pick_rule(Dtype p, bool rank1) {
    if constexpr (!std::is_same_v<Rule, typename Rule::rank1_rule>) {
      if (rank1) return pick_rule<typename Rule::rank1_rule>(p, false);
    }
    switch (p) {
      case Dtype::f32: return backend::cuda::group_ops<Rule, float, float>();
      case Dtype::bf16: return backend::cuda::group_ops<Rule, bf16, bf16>();
      case Dtype::f16: return backend::cuda::group_ops<Rule, f16, f16>();
    }
    return nullptr;
  }

  static const backend::cuda::GroupOps* pick_ops(Tier t, Dtype p, bool rank1) {
    switch (t) {
      case Tier::backbone: return pick_rule<typename Tiers::backbone>(p, rank1);
      case Tier::experts: return pick_rule<typename Tiers::experts>(p, rank1);
      case Tier::router: return pick_rule<typename Tiers::router>(p, rank1);
    }
    return nullptr;
  }

  std::vector<std::unique_ptr<Entry>> entries_;
  std::unordered_map<std::string, index_t> index_;
  std::uint64_t seed_ = 0;
  cudaStream_t stream_ = nullptr;
  const double* lr_device_ = nullptr;
  std::int64_t steps_ = 0;
  std::vector<Group> groups_;
  std::vector<backend::cuda::DeviceTask> host_tasks_;
  bool tasks_dirty_ = false;
  backend::cuda::DeviceBuffer<backend::cuda::DeviceTask> d_tasks_;
  backend::cuda::DeviceBuffer<backend::cuda::TaskStep> d_steps_;
  backend::cuda::DeviceBuffer<std::int64_t> d_counts_;
};

// ----------------------------------------------------------------- variants
using SkewAdam = Optimizer<SkewAdamTiers>;
using AdamW = Optimizer<AdamWTiers>;

}  // namespace skewadam::cuda
