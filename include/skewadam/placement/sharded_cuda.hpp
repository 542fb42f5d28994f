#pragma once
// The sharded placement's engine over the CUDA backend: each rank keeps, in
// its device memory, the state of what it owns (dist/shard_plan.hpp: row
// slices of backbone and router tensors, whole experts of a bank), and runs
// the CUDA backend's passes (backend/cuda/passes.hpp) over its pieces, with
// the placement's exchanges between them:
//
//   0. agree      the owned gradient slices are scanned on the device
//                 (scan_kernel, decide_kernel, unless unchecked); the ranks
//                 agree on the stepped tensors and the first offender
//                 (dist/step_exchange.hpp). A rejected step changes nothing.
//   1. statistics every group's statistics pass over the pieces; for a
//                 matrix cut between ranks, shard_sums_kernel forms this
//                 rank's column sums of g^2 and sum of R_i (in double)
//   2. exchange   those sums, all-gathered and added in rank order on every
//                 rank, written back as totals; every group's finish pass
//                 forms C_j and vbar from them (a matrix owned whole: exactly
//                 as the local CUDA engine does) and each piece's sum of u^2
//   3. clip       the pieces' sums of u^2 to the host, exchanged where a clip
//                 scope spans ranks; the divisors back to the device
//   4. apply      every group's apply pass
//
// A piece is one matrix's rows (or elements) that the rank owns, a task of
// its own; stochastic rounding uses each element's index in the whole tensor
// (DeviceTask::element_base), so a matrix owned whole gives the local CUDA
// engine's bits, and any rank count gives the same bits on every run. The
// communicators' buffers are host memory (dist/communicator.hpp), so each
// exchange copies its few values (c + 1 doubles per cut matrix, one double
// per clipped matrix) through the host and waits for the stream; step
// counts stay on the host, as in the CPU's sharded engine. gather_param()
// copies a parameter through the host.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../backend/cuda/check_kernels.cuh"
#include "../backend/cuda/cuda_backend.hpp"
#include "../backend/cuda/device_memory.hpp"
#include "../backend/cuda/kernels.cuh"
#include "../backend/cuda/passes.hpp"
#include "../backend/cuda/work_lists.hpp"
#include "../backend/gradient_check.hpp"
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
#include "sharded.hpp"

namespace skewadam::dist {

template <class Tiers, class R, Communicator Comm>
class ShardedEngine<Tiers, backend::CudaBackend<R>, Comm> {
  using Stream = typename R::stream_type;
  template <class T>
  using Array = backend::cuda::DeviceArray<R, T>;
  using Mem = backend::cuda::DeviceMemory<R>;
  using WorkItem = backend::cuda::WorkItem;
  using DeviceTask = backend::cuda::DeviceTask;
  using TaskStep = backend::cuda::TaskStep;
  using GradTask = backend::cuda::GradTask;
  using Passes = backend::cuda::GroupPasses<R>;

  /// This rank's share of a tensor's state, in device memory: its pieces'
  /// rows or elements concatenated; v_col holds c values per piece.
  struct Shares {
    Array<float> m, v, v_row, v_col;
  };

 public:
  using backend_type = backend::CudaBackend<R>;
  using runtime = R;
  using staged_type = std::vector<std::optional<Shares>>;

  ShardedEngine(Comm& comm, const OptimizerOptions& options, ShardOptions shard)
      : comm_(&comm), shard_(shard), stream_(static_cast<Stream>(options.stream)), outcome_(1), total_(1) {
    detail::check_sharding(comm, shard);
    tables_ = build_tables();
  }
  ShardedEngine(const ShardedEngine&) = delete;
  ShardedEngine& operator=(const ShardedEngine&) = delete;
  ~ShardedEngine() {
    try {
      R::synchronize(stream_);
    } catch (...) {  // a destructor reports nothing; the memory is freed regardless
    }
  }

  Comm& comm() const noexcept { return *comm_; }
  int rank() const noexcept { return comm_->rank(); }
  int ranks() const noexcept { return comm_->size(); }
  Stream stream() const noexcept { return stream_; }
  /// From now on steps are ordered on s; waits for the work enqueued so far.
  void set_stream(Stream s) {
    R::synchronize(stream_);
    stream_ = s;
  }

  void set_threads(int) noexcept {}
  int threads() const noexcept { return 1; }

  static constexpr bool host_memory = false;
  void read_memory(void* host, const void* device, std::size_t n) const { Mem::read(host, device, n, stream_); }
  void write_memory(void* device, const void* host, std::size_t n) { Mem::write(device, host, n, stream_); }
  /// Tensor i's complete state on the host (collective).
  ParamState host_arrays(std::size_t i) const { return export_arrays(i); }

  void check_memory(std::string_view name, const ParamView& p, const GradView& g) const { Mem::check(name, p, g); }

  // ------------------------------------------------------------ registration
  void add(const TensorRegistration& spec) {
    Entry e;
    e.tier = spec.tier;
    e.pdtype = spec.param.dtype;
    e.param = spec.param.data;
    e.rank1 = spec.param.shape.rank() < 2;
    e.momentum = spec.layout.momentum;
    e.split = split_for(spec.tier, spec.param.shape, spec.layout, ranks(), shard_.experts, whole_experts_);
    e.pieces = e.split.pieces(rank());
    e.limit = backend::gradient_limit(e.split.geom, e.split.factored);
    e.ops = pick(e.tier, e.pdtype, e.pdtype, e.rank1);
    allocate(e);
    entries_.push_back(std::move(e));
    try {
      Tables next = build_tables();
      fit_workspace(next.groups);
      R::synchronize(stream_);  // the zeroing and the tables' uploads
      undo_ = std::move(tables_);
      tables_ = std::move(next);
    } catch (...) {
      entries_.pop_back();
      throw;
    }
    if (entries_.back().split.split == Split::whole) ++whole_experts_;
  }
  void pop_back() noexcept {
    if (entries_.back().split.split == Split::whole) --whole_experts_;
    entries_.pop_back();
    tables_ = std::move(undo_);
    point_workspace(tables_.groups);
  }

  const TensorSplit& split(std::size_t i) const { return entries_[i].split; }
  std::span<const Piece> pieces(std::size_t i) const { return entries_[i].pieces; }
  /// This rank's share of tensor i's state, viewed in device memory.
  ParamStateView view(std::size_t i) const {
    const Shares& s = entries_[i].state;
    return {Mem::view(s.m), Mem::view(s.v), Mem::view(s.v_row), Mem::view(s.v_col), 0};
  }
  index_t state_bytes(std::size_t i) const noexcept {
    const Shares& s = entries_[i].state;
    return static_cast<index_t>(s.m.bytes() + s.v.bytes() + s.v_row.bytes() + s.v_col.bytes());
  }
  /// Every byte of device memory this rank's engine holds: its state, its
  /// pieces' scratch, the step's tables (those of the last registration's
  /// undo included) and the statistics workspace of its groups.
  index_t device_bytes() const noexcept {
    std::size_t b = workspace_.bytes() + outcome_.bytes() + total_.bytes();
    for (const Entry& e : entries_)
      b += e.state.m.bytes() + e.state.v.bytes() + e.state.v_row.bytes() + e.state.v_col.bytes() +
           e.scratch_f.bytes() + e.scratch_d.bytes() + e.done.bytes();
    for (const Tables* t : {&tables_, &undo_}) {
      b += t->d_tasks.bytes() + t->d_steps.bytes() + t->sums.bytes() + t->divisors.bytes() + t->shard_sums.bytes() +
           t->check_items.bytes() + t->grad_tasks.bytes() + t->first.bytes() + t->value.bytes() +
           t->partial.bytes();
      for (const Group& g : t->groups) b += g.items.bytes() + g.tasks.bytes();
    }
    return static_cast<index_t>(b);
  }
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
    s.m = gather_array(e, ShardArray::m, e.state.m);
    s.v = gather_array(e, ShardArray::v, e.state.v);
    s.v_row = gather_array(e, ShardArray::v_row, e.state.v_row);
    s.v_col = gather_array(e, ShardArray::v_col, e.state.v_col);
    return s;
  }
  void check_arrays(std::size_t i, const ParamState& got, const std::string& who) const {
    const FullSizes want = full_sizes(entries_[i].split, entries_[i].momentum);
    skewadam::detail::check_array_sizes({want.m, want.v, want.v_row, want.v_col}, got, who);
  }
  staged_type stage_begin() const { return staged_type(entries_.size()); }
  /// Uploads this rank's share of tensor i's complete arrays.
  void stage(staged_type& staged, std::size_t i, ParamState&& full) const {
    const Entry& e = entries_[i];
    Shares d;
    Mem::upload(d.m, share_of(e.split, rank(), ShardArray::m, full.m), stream_);
    Mem::upload(d.v, share_of(e.split, rank(), ShardArray::v, full.v), stream_);
    Mem::upload(d.v_row, share_of(e.split, rank(), ShardArray::v_row, full.v_row), stream_);
    Mem::upload(d.v_col, share_of(e.split, rank(), ShardArray::v_col, full.v_col), stream_);
    R::synchronize(stream_);  // the host copies are freed at return
    staged[i] = std::move(d);
  }
  void commit(staged_type&& staged) noexcept {
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      if (!staged[i]) continue;
      Entry& e = entries_[i];
      std::swap(e.state, *staged[i]);
      point_state(e);
      for (std::size_t q = 0; q < e.pieces.size(); ++q) {
        DeviceTask& d = tables_.tasks[e.first_piece + q];
        const DeviceTask& mine = e.tasks[q];
        d.m = mine.m;
        d.v = mine.v;
        d.v_row = mine.v_row;
        d.v_col = mine.v_col;
      }
    }
    tables_.tasks_dirty = true;
  }

  /// Completes every rank's copy of a parameter from its owners (collective;
  /// through the host).
  void gather_param(std::size_t i, const ParamView& param) {
    const Entry& e = entries_[i];
    if (e.split.geom.numel() == 0 || ranks() == 1) return;
    const std::size_t elem = static_cast<std::size_t>(dtype_size(param.dtype));
    const std::size_t n = static_cast<std::size_t>(e.split.geom.numel()) * elem;
    host_bytes_.resize(n);
    R::to_host(host_bytes_.data(), param.data, n, stream_);
    gather_shards(*comm_, e.split, ShardArray::param, host_bytes_.data(), elem, host_bytes_.data());
    R::to_device(param.data, host_bytes_.data(), n, stream_);
    R::synchronize(stream_);
  }

  // ----------------------------------------------------------------- step
  /// Sum of g^2 over the listed gradients (collective): each rank sums its
  /// own slices on the device, the ranks' sums are added in rank order.
  double grad_sum_squares(std::span<const StepItem> items) const {
    double sum = 0;
    const Tables& t = tables_;
    if (!t.check_items.empty()) {
      sync_grad_table(items);
      R::template launch<&backend::cuda::squares_kernel<>>(grid(t.check_items.size()), backend::cuda::block_threads,
                                                            stream_, t.grad_tasks.data(), t.check_items.data(),
                                                            t.partial.data());
      R::template launch<&backend::cuda::total_kernel<>>(1u, backend::cuda::block_threads, stream_, t.partial.data(),
                                                          static_cast<index_t>(t.partial.size()), total_.data());
      R::to_host(&sum, total_.data(), sizeof sum, stream_);
    }
    return sum_over_ranks(*comm_, sum);
  }

  std::optional<Offender> step(std::span<const StepItem> items, NonFinitePolicy policy) {
    last_exchange_bytes_ = 0;
    mark_stepped(entries_, items, stepped_);
    regroup(items);
    prepare(items);
    if (std::optional<Offender> bad = preflight(policy)) return bad;

    const Tables& t = tables_;
    for (const Group& g : t.groups) {
      g.ops->statistics(g.arrays, t.d_tasks.data(), t.d_steps.data(), stream_);
      g.ops->shard_sums(g.arrays, t.d_tasks.data(), t.d_steps.data(), stream_);
    }
    exchange_statistics();
    for (const Group& g : t.groups) g.ops->finish(g.arrays, t.d_tasks.data(), t.d_steps.data(), stream_);
    exchange_clip();
    for (const Group& g : t.groups) g.ops->apply(g.arrays, t.d_tasks.data(), t.d_steps.data(), stream_);
    return std::nullopt;
  }

 private:
  struct Entry {
    Tier tier = Tier::backbone;
    Dtype pdtype = Dtype::f32;
    void* param = nullptr;
    bool rank1 = false;
    bool momentum = false;
    float limit = 0;
    TensorSplit split;
    std::vector<Piece> pieces;
    Shares state;
    std::vector<index_t> elem_off;  ///< per piece, into m and v
    std::vector<index_t> row_off;   ///< per piece, into v_row
    std::vector<DeviceTask> tasks;  ///< per piece: state and scratch (the tables add the rest)
    Array<float> scratch_f;
    Array<double> scratch_d;
    Array<unsigned> done;
    std::size_t first_piece = 0;         ///< its first piece's index in the tables
    const Passes* ops = nullptr;         ///< of the gradient dtype it was last stepped with
    const StepItem* item = nullptr;      ///< during a step; null: not stepped
    bool cut() const noexcept { return split.factored && split.cuts_matrices(); }
  };

  struct Group {
    const Passes* ops = nullptr;
    Array<WorkItem> items;
    Array<std::int32_t> tasks;
    backend::cuda::GroupArrays arrays;
    std::size_t workspace = 0;     ///< doubles of statistics workspace its passes need
    std::size_t workspace_at = 0;  ///< where they start in the engine's
  };

  /// Every piece of every tensor, as the kernels read them.
  struct Tables {
    std::vector<DeviceTask> tasks;  ///< what d_tasks holds, or will once uploaded (tasks_dirty)
    Array<DeviceTask> d_tasks;
    bool tasks_dirty = false;
    std::vector<TaskStep> steps;
    Array<TaskStep> d_steps;
    std::vector<Group> groups;
    std::vector<std::size_t> entry_of;  ///< per piece: its tensor
    Array<double> sums;                 ///< per piece: its sum of u^2 (DeviceTask::matrix_sum)
    Array<float> divisors;              ///< per piece: its clip divisor
    Array<double> shard_sums;           ///< the cut pieces' (c + 1) sums, back to back
    std::vector<index_t> shard_at;      ///< per piece: its offset there, or -1
    Array<WorkItem> check_items;        ///< chunks of every piece; item.block is its slot
    mutable std::vector<GradTask> host_grad_tasks;
    Array<GradTask> grad_tasks;
    Array<index_t> first;
    Array<float> value;
    Array<double> partial;
  };

  // ---------------------------------------------------------- allocation
  static MatrixGeometry piece_geometry(const Entry& e, const Piece& p) {
    return e.split.factored ? MatrixGeometry{1, p.size(), e.split.geom.cols} : MatrixGeometry{1, 1, p.size()};
  }

  void allocate(Entry& e) {
    const index_t c = e.split.geom.cols;
    index_t elems = 0, rows = 0;
    backend::cuda::ScratchSizes total;
    std::vector<backend::cuda::ScratchSizes> sizes;
    for (const Piece& p : e.pieces) {
      e.elem_off.push_back(elems);
      e.row_off.push_back(rows);
      elems += e.split.elements(p);
      if (e.split.factored) rows += p.size();
      DeviceTask d;
      d.geom = piece_geometry(e, p);
      d.param = static_cast<char*>(e.param) + e.split.first_element(p) * dtype_size(e.pdtype);
      d.element_base = e.split.first_element(p);
      d.tier = tier_index(e.tier);
      d.host_divisors = 1;
      if (e.split.factored) {
        d.row_blocks = backend::cuda::row_blocks_of(d.geom);
        if (e.split.cuts_matrices()) d.full_rows = e.split.geom.rows;
      } else {
        d.chunks = backend::cuda::chunks_of(d.geom);
      }
      // each piece's scratch 64-byte aligned, as a whole tensor's is (the
      // quad walks load its 1 / col_j as 16-byte quads)
      backend::cuda::ScratchSizes sz = backend::cuda::scratch_sizes(d, e.split.factored);
      sz.floats = (sz.floats + 15) / 16 * 16;
      sz.doubles = (sz.doubles + 7) / 8 * 8;
      sizes.push_back(sz);
      total.floats += sz.floats;
      total.doubles += sz.doubles;
      total.counters += sz.counters;
      e.tasks.push_back(d);
    }
    const auto n = static_cast<std::size_t>(elems);
    if (e.momentum) Mem::zeroed(e.state.m, n, stream_);
    if (e.split.factored) {
      Mem::zeroed(e.state.v_row, static_cast<std::size_t>(rows), stream_);
      Mem::zeroed(e.state.v_col, e.pieces.size() * static_cast<std::size_t>(c), stream_);
    } else {
      Mem::zeroed(e.state.v, n, stream_);
    }
    e.scratch_f = Array<float>(total.floats);
    e.scratch_d = Array<double>(total.doubles);
    if (total.counters > 0) Mem::zeroed(e.done, total.counters, stream_);
    std::size_t f = 0, x = 0, k = 0;
    for (std::size_t q = 0; q < e.tasks.size(); ++q) {
      backend::cuda::place_scratch(e.tasks[q], e.split.factored, e.scratch_f.data() + f, e.scratch_d.data() + x,
                                   e.done.data() + k);
      f += sizes[q].floats;
      x += sizes[q].doubles;
      k += sizes[q].counters;
    }
    point_state(e);
  }

  /// Points e's piece tasks at its state arrays.
  static void point_state(Entry& e) {
    const index_t c = e.split.geom.cols;
    for (std::size_t q = 0; q < e.tasks.size(); ++q) {
      DeviceTask& d = e.tasks[q];
      d.m = e.state.m.empty() ? nullptr : e.state.m.data() + e.elem_off[q];
      d.v = e.state.v.empty() ? nullptr : e.state.v.data() + e.elem_off[q];
      d.v_row = e.state.v_row.empty() ? nullptr : e.state.v_row.data() + e.row_off[q];
      d.v_col = e.state.v_col.empty() ? nullptr : e.state.v_col.data() + static_cast<index_t>(q) * c;
    }
  }

  /// The tables of every registered tensor (uploads in stream order).
  Tables build_tables() {
    namespace cu = backend::cuda;
    Tables t;
    std::size_t shard_total = 0;
    for (Entry& e : entries_) {
      e.first_piece = t.tasks.size();
      for (std::size_t q = 0; q < e.pieces.size(); ++q) {
        t.tasks.push_back(e.tasks[q]);
        t.entry_of.push_back(static_cast<std::size_t>(&e - entries_.data()));
        t.shard_at.push_back(e.cut() ? static_cast<index_t>(shard_total) : -1);
        if (e.cut()) shard_total += static_cast<std::size_t>(e.split.geom.cols + 1);
      }
    }
    const std::size_t n = t.tasks.size();
    t.sums = Array<double>(n);
    t.divisors = Array<float>(n);
    t.shard_sums = Array<double>(shard_total);
    for (std::size_t k = 0; k < n; ++k) {
      DeviceTask& d = t.tasks[k];
      d.matrix_sum = t.sums.data() + k;
      d.divisor = t.divisors.data() + k;
      d.shard_sums = t.shard_at[k] >= 0 ? t.shard_sums.data() + t.shard_at[k] : nullptr;
      d.grad = nullptr;
    }
    Mem::upload(t.d_tasks, t.tasks, stream_);
    t.steps.assign(n, TaskStep{});
    Mem::upload(t.d_steps, t.steps, stream_);
    std::vector<const Passes*> ops;
    for (const Entry& e : entries_) ops.push_back(e.ops);
    t.groups = build_groups(ops, t);

    std::vector<WorkItem> checks;
    for (std::size_t k = 0; k < n; ++k) {
      const index_t size = t.tasks[k].geom.numel();
      for (index_t o = 0; o < size; o += cu::chunk_elems) {
        const auto slot = static_cast<index_t>(checks.size());
        checks.push_back(WorkItem{static_cast<std::int32_t>(k), 0, o, std::min(size, o + cu::chunk_elems), slot});
      }
    }
    cu::check_launch_size(checks.size());
    Mem::upload(t.check_items, checks, stream_);
    t.host_grad_tasks.assign(n, GradTask{});
    Mem::upload(t.grad_tasks, t.host_grad_tasks, stream_);
    t.first = Array<index_t>(checks.size());
    t.value = Array<float>(checks.size());
    t.partial = Array<double>(checks.size());
    return t;
  }

  /// Every group's work lists over the pieces, for tensors with passes `ops`.
  std::vector<Group> build_groups(const std::vector<const Passes*>& ops, const Tables& t) const {
    std::vector<const Passes*> order;
    for (std::size_t i = 0; i < entries_.size(); ++i)
      if (!entries_[i].pieces.empty() && std::find(order.begin(), order.end(), ops[i]) == order.end())
        order.push_back(ops[i]);
    std::vector<Group> groups;
    for (const Passes* o : order) {
      backend::cuda::GroupLists lists;
      lists.factored = o->factored;
      for (std::size_t i = 0; i < entries_.size(); ++i) {
        const Entry& e = entries_[i];
        if (ops[i] != o) continue;
        lists.count(e.split.geom);  // owned here or not: a matrix is cut as one process cuts it
        for (std::size_t q = 0; q < e.pieces.size(); ++q) {
          const DeviceTask& d = t.tasks[e.first_piece + q];
          lists.add(static_cast<std::int32_t>(e.first_piece + q), d.geom, d.row_blocks, d.chunks, e.cut(),
                    d.full_rows);
        }
      }
      Group g;
      g.ops = o;
      Mem::upload(g.items, lists.concatenated(), stream_);
      Mem::upload(g.tasks, lists.tasks, stream_);
      g.arrays = backend::cuda::GroupArrays::of(lists, g.items.data(), g.tasks.data());
      g.workspace = lists.workspace_doubles();
      groups.push_back(std::move(g));
    }
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
      workspace_ = Array<double>(need);
      point_workspace(tables_.groups);
      point_workspace(undo_.groups);
    }
    point_workspace(groups);
  }
  void point_workspace(std::vector<Group>& groups) noexcept {
    for (Group& g : groups) g.arrays.workspace = g.workspace == 0 ? nullptr : workspace_.data() + g.workspace_at;
  }

  // ---------------------------------------------------------- the step
  /// Moves tensors whose gradient dtype changed to the group of the new one.
  void regroup(std::span<const StepItem> items) {
    std::vector<const Passes*> ops;
    for (const Entry& e : entries_) ops.push_back(e.ops);
    bool changed = false;
    for (const StepItem& it : items) {
      const Entry& e = entries_[static_cast<std::size_t>(it.index)];
      const Passes* o = pick(e.tier, e.pdtype, it.grad.dtype, e.rank1);
      if (o == e.ops) continue;
      ops[static_cast<std::size_t>(it.index)] = o;
      changed = true;
    }
    if (!changed) return;
    R::synchronize(stream_);  // the old lists may still be read
    std::vector<Group> groups = build_groups(ops, tables_);
    fit_workspace(groups);
    tables_.groups = std::move(groups);
    for (std::size_t i = 0; i < entries_.size(); ++i) entries_[i].ops = ops[i];
  }

  /// The pieces' gradient pointers and step values, uploaded.
  void prepare(std::span<const StepItem> items) {
    Tables& t = tables_;
    for (const Entry& e : entries_) {
      for (std::size_t q = 0; q < e.pieces.size(); ++q) {
        const std::size_t k = e.first_piece + q;
        const void* g = nullptr;
        if (e.item != nullptr)
          g = static_cast<const char*>(e.item->grad.data) +
              e.split.first_element(e.pieces[q]) * dtype_size(e.item->grad.dtype);
        if (t.tasks[k].grad != g) {
          t.tasks[k].grad = g;
          t.tasks_dirty = true;
        }
        t.steps[k] = e.item != nullptr ? TaskStep{e.item->scalars, e.item->key, e.item->scope, 0} : TaskStep{};
      }
    }
    if (t.tasks_dirty) {
      R::to_device(t.d_tasks.data(), t.tasks.data(), t.tasks.size() * sizeof(DeviceTask), stream_);
      t.tasks_dirty = false;
    }
    if (!t.steps.empty()) R::to_device(t.d_steps.data(), t.steps.data(), t.steps.size() * sizeof(TaskStep), stream_);
    sync_grad_table(items);
  }

  /// The pieces' gradients of `items` (the others null), uploaded when changed.
  void sync_grad_table(std::span<const StepItem> items) const {
    const Tables& t = tables_;
    std::vector<GradTask>& h = grad_room_;
    h.assign(t.tasks.size(), GradTask{});
    for (const StepItem& it : items) {
      const Entry& e = entries_[static_cast<std::size_t>(it.index)];
      for (std::size_t q = 0; q < e.pieces.size(); ++q) {
        const Piece& p = e.pieces[q];
        h[e.first_piece + q] = GradTask{static_cast<const char*>(it.grad.data) +
                                            e.split.first_element(p) * dtype_size(it.grad.dtype),
                                        it.grad.dtype, e.limit, e.split.elements(p)};
      }
    }
    auto same = [](const GradTask& a, const GradTask& b) {
      return a.grad == b.grad && a.dtype == b.dtype && a.limit == b.limit && a.matrix_size == b.matrix_size;
    };
    if (std::equal(h.begin(), h.end(), t.host_grad_tasks.begin(), t.host_grad_tasks.end(), same)) return;
    if (!h.empty()) R::to_device(t.grad_tasks.data(), h.data(), h.size() * sizeof(GradTask), stream_);
    std::swap(t.host_grad_tasks, h);
  }

  /// Step 0: this rank's first offender (scanned on the device), then the
  /// ranks' agreement.
  std::optional<Offender> preflight(NonFinitePolicy policy) {
    namespace cu = backend::cuda;
    const Tables& t = tables_;
    std::optional<Offender> mine;
    if (policy != NonFinitePolicy::unchecked && !t.check_items.empty()) {
      R::template launch<&cu::scan_kernel<>>(grid(t.check_items.size()), cu::block_threads, stream_,
                                             static_cast<const GradTask*>(t.grad_tasks.data()),
                                             static_cast<const TaskStep*>(t.d_steps.data()),
                                             static_cast<const WorkItem*>(t.check_items.data()), t.first.data(),
                                             t.value.data());
      R::template launch<&cu::decide_kernel<>>(1u, cu::block_threads, stream_,
                                               static_cast<const index_t*>(t.first.data()),
                                               static_cast<const float*>(t.value.data()),
                                               static_cast<index_t>(t.first.size()),
                                               static_cast<const WorkItem*>(t.check_items.data()), t.d_steps.data(),
                                               static_cast<int>(t.tasks.size()), outcome_.data());
      cu::CheckOutcome out;
      R::to_host(&out, outcome_.data(), sizeof out, stream_);
      if (out.bad) {
        const auto k = static_cast<std::size_t>(out.task);
        const std::size_t i = t.entry_of[k];
        const Entry& e = entries_[i];
        const Piece& p = e.pieces[k - e.first_piece];
        mine = Offender{static_cast<index_t>(i), e.split.first_element(p) + out.element, out.value};
      }
    }
    return agree_on_step(*comm_, std::span<const std::size_t>(stepped_), mine, last_exchange_bytes_);
  }

  /// Step 2: the cut matrices' column sums and sums of R_i, summed over the
  /// ranks in rank order, back to the device as totals.
  void exchange_statistics() {
    const Tables& t = tables_;
    bool any = false;
    for (std::size_t i : stepped_) any = any || entries_[i].cut();
    if (!any) return;
    shard_host_.resize(t.shard_sums.size());
    R::to_host(shard_host_.data(), t.shard_sums.data(), t.shard_sums.bytes(), stream_);
    // one slot of c + 1 per matrix of every stepped cut tensor, zero where
    // this rank owns no rows of it
    out_.clear();
    for (std::size_t i : stepped_) {
      const Entry& e = entries_[i];
      if (!e.cut()) continue;
      const auto w = static_cast<std::size_t>(e.split.geom.cols + 1);
      const std::size_t base = out_.size();
      out_.resize(base + static_cast<std::size_t>(e.split.geom.batch) * w, 0.0);
      for (std::size_t q = 0; q < e.pieces.size(); ++q) {
        const auto at = static_cast<std::size_t>(t.shard_at[e.first_piece + q]);
        std::copy_n(shard_host_.begin() + static_cast<std::ptrdiff_t>(at), w,
                    out_.begin() + static_cast<std::ptrdiff_t>(base + static_cast<std::size_t>(e.pieces[q].matrix) * w));
      }
    }
    in_.resize(out_.size() * static_cast<std::size_t>(ranks()));
    comm_->all_gather(std::as_bytes(std::span<const double>(out_)), std::as_writable_bytes(std::span<double>(in_)));
    last_exchange_bytes_ += static_cast<index_t>(8 * out_.size());
    const std::size_t stride = out_.size();
    for (std::size_t x = 0; x < stride; ++x) {
      double v = in_[x];
      for (int r = 1; r < ranks(); ++r) v += in_[static_cast<std::size_t>(r) * stride + x];
      out_[x] = v;
    }
    std::size_t base = 0;
    for (std::size_t i : stepped_) {
      const Entry& e = entries_[i];
      if (!e.cut()) continue;
      const auto w = static_cast<std::size_t>(e.split.geom.cols + 1);
      for (std::size_t q = 0; q < e.pieces.size(); ++q) {
        const auto at = static_cast<std::size_t>(t.shard_at[e.first_piece + q]);
        std::copy_n(out_.begin() + static_cast<std::ptrdiff_t>(base + static_cast<std::size_t>(e.pieces[q].matrix) * w),
                    w, shard_host_.begin() + static_cast<std::ptrdiff_t>(at));
      }
      base += static_cast<std::size_t>(e.split.geom.batch) * w;
    }
    R::to_device(t.shard_sums.data(), shard_host_.data(), t.shard_sums.bytes(), stream_);
  }

  /// Step 3: the pieces' sums of u^2 to the host, every clipped tensor's
  /// divisors (dist/step_exchange.hpp) back to the device.
  void exchange_clip() {
    const Tables& t = tables_;
    bool any = false;
    for (std::size_t i : stepped_) any = any || (entries_[i].ops->clip && !entries_[i].pieces.empty());
    sums_host_.resize(t.sums.size());
    divisors_host_.assign(t.divisors.size(), 1.0f);
    if (any) R::to_host(sums_host_.data(), t.sums.data(), t.sums.bytes(), stream_);
    struct Tensors {
      ShardedEngine& x;
      bool clips(std::size_t i) const { return x.entries_[i].ops->clip; }
      const TensorSplit& split(std::size_t i) const { return x.entries_[i].split; }
      bool per_matrix(std::size_t i) const { return x.entries_[i].item->scope == ClipScope::matrix; }
      std::size_t pieces(std::size_t i) const { return x.entries_[i].pieces.size(); }
      index_t matrix(std::size_t i, std::size_t q) const { return x.entries_[i].pieces[q].matrix; }
      double sum_u2(std::size_t i, std::size_t q) const { return x.sums_host_[x.entries_[i].first_piece + q]; }
      float divisor(std::size_t i, double sum, index_t count) const {
        const Entry& e = x.entries_[i];
        return visit_rule<Tiers>(e.tier, e.rank1,
                                 [&]<class Rule>() { return Rule::clip::divisor(sum, count, e.item->scalars); });
      }
      void set_divisor(std::size_t i, std::size_t q, float d) const {
        x.divisors_host_[x.entries_[i].first_piece + q] = d;
      }
    };
    Tensors view{*this};
    last_exchange_bytes_ += clip_divisors(*comm_, std::span<const std::size_t>(stepped_), view, clip_);
    if (any) R::to_device(t.divisors.data(), divisors_host_.data(), t.divisors.bytes(), stream_);
  }

  // ---------------------------------------------------------- helpers
  static const Passes* pick(Tier t, Dtype p, Dtype g, bool rank1) {
    return backend::cuda::passes_for<R, Tiers>(t, p, g, rank1);
  }
  static unsigned grid(std::size_t blocks) { return static_cast<unsigned>(blocks); }


  /// A complete state array of e, gathered from its owners (collective).
  std::vector<float> gather_array(const Entry& e, ShardArray a, const Array<float>& local) const {
    std::vector<float> full;
    if (!shard_keeps(e.split, e.momentum, a) || e.split.geom.numel() == 0) return full;
    const FullSizes s = full_sizes(e.split, e.momentum);
    switch (a) {
      case ShardArray::m: full.resize(s.m); break;
      case ShardArray::v: full.resize(s.v); break;
      case ShardArray::v_row: full.resize(s.v_row); break;
      case ShardArray::v_col: full.resize(s.v_col); break;
      case ShardArray::param: return full;
    }
    std::vector<float> mine(local.size());
    if (!mine.empty()) R::to_host(mine.data(), local.data(), local.bytes(), stream_);
    gather_shards(*comm_, e.split, a, reinterpret_cast<const std::byte*>(mine.data()), sizeof(float),
                  reinterpret_cast<std::byte*>(full.data()));
    return full;
  }

  Comm* comm_;
  ShardOptions shard_;
  Stream stream_{};
  std::vector<Entry> entries_;
  index_t whole_experts_ = 0;
  index_t last_exchange_bytes_ = 0;
  Tables tables_;
  Tables undo_;  ///< the tables before the last add (pop_back)
  Array<backend::cuda::CheckOutcome> outcome_;
  Array<double> total_;
  Array<double> workspace_;  ///< the statistics passes' column partials (fit_workspace)
  // reused every step
  std::vector<std::size_t> stepped_;
  mutable std::vector<GradTask> grad_room_;
  std::vector<double> shard_host_, out_, in_, sums_host_;
  std::vector<float> divisors_host_;
  ClipScratch clip_;
  std::vector<std::byte> host_bytes_;
};

}  // namespace skewadam::dist
