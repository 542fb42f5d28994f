#pragma once
// The local placement: one process holds the complete state of every tensor.
//
// Its engine over the CPU backend keeps each tensor's state in host vectors
// with the scratch of its passes (O(B + row_blocks * c + chunks) values,
// never the tensor's size), turns a step into backend tasks and units
// (backend/work.hpp) and runs them on the backend's threads. A checked step
// runs in two phases (backend/cpu/phases.hpp) so that an offending gradient
// is found before anything is written.

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

#include "../backend/cpu/cpu_backend.hpp"
#include "../backend/cpu/phases.hpp"
#include "../backend/work.hpp"
#include "../config.hpp"
#include "../dtype.hpp"
#include "../engine.hpp"
#include "../nonfinite.hpp"
#include "../optimizer_options.hpp"
#include "../param_state.hpp"
#include "../rule_dispatch.hpp"
#include "../state_layout.hpp"

namespace skewadam {

template <class Tiers, class Backend>
class LocalEngine {
  static_assert(sizeof(Backend) == 0,
                "skewadam::Local: no engine for this backend (backend::CpuBackend<Arch> has one; "
                "backend::CudaBackend<R> has one in placement/local_cuda.hpp)");
};

/// Everything in this process (the default placement).
struct Local {
  static constexpr bool sharded = false;
  struct communicator_type {};  ///< none
  struct options_type {};       ///< none
  template <class Tiers, class Backend>
  using engine = LocalEngine<Tiers, Backend>;
};

template <class Tiers, class Arch>
class LocalEngine<Tiers, backend::CpuBackend<Arch>> {
 public:
  using backend_type = backend::CpuBackend<Arch>;
  using staged_type = std::vector<ParamState>;

  explicit LocalEngine(const OptimizerOptions& options) { backend_.set_threads(options.threads); }

  /// Host memory: every address is the backend's.
  static constexpr bool host_memory = true;
  void check_memory(std::string_view, const ParamView&, const GradView&) const noexcept {}

  void set_threads(int n) { backend_.set_threads(n); }
  int threads() const noexcept { return backend_.threads(); }

  // ---------------------------------------------------------- allocation
  void add(const TensorRegistration& spec) {
    Tensor e;
    const ParamView& param = spec.param;
    const MatrixGeometry g = param.shape.matrices();
    const index_t n = param.numel();
    e.factored = factors(spec.layout, param.shape);
    if (n > 0) {  // empty tensors keep no state and are never stepped
      if (spec.layout.momentum) e.state.m.assign(static_cast<std::size_t>(n), 0.0f);
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
      // non-finite checks: the statistics pass of a factored rule without
      // momentum writes only v_row and v_col, which are copied before it
      e.restorable_statistics = e.factored && e.state.m.empty();
      if (e.restorable_statistics)
        e.statistics_backup.assign(e.state.v_row.size() + e.state.v_col.size(), 0.0f);
      e.scan.assign(static_cast<std::size_t>(g.batch * backend::Cutting::chunks_per_matrix(g)), -1.0);
      if (e.factored) backend_.reserve_columns(g.cols);
    }
    tensors_.push_back(std::move(e));
  }
  void pop_back() noexcept { tensors_.pop_back(); }

  // ---------------------------------------------------------------- state
  ParamStateView view(std::size_t i) const {
    const ParamState& s = tensors_[i].state;
    return {s.m, s.v, s.v_row, s.v_col, 0};
  }
  ParamState export_arrays(std::size_t i) const {
    ParamState s = tensors_[i].state;
    s.step = 0;
    return s;
  }
  void check_arrays(std::size_t i, const ParamState& got, const std::string& who) const {
    const ParamState& have = tensors_[i].state;
    detail::check_array_sizes({have.m.size(), have.v.size(), have.v_row.size(), have.v_col.size()}, got, who);
  }
  staged_type stage_begin() const { return staged_type(tensors_.size()); }
  void stage(staged_type& staged, std::size_t i, ParamState&& full) const { staged[i] = std::move(full); }
  void commit(std::vector<ParamState>&& staged) noexcept {
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      std::swap(tensors_[i].state, staged[i]);
      tensors_[i].state.step = 0;
    }
  }
  index_t state_bytes(std::size_t i) const noexcept { return tensors_[i].state.bytes(); }

  // ---------------------------------------------------------------- step
  double grad_sum_squares(std::span<const StepItem> items) const {
    double sum = 0;
    for (const StepItem& it : items) sum += backend::cpu::grad_sum_squares(it.grad);
    return sum;
  }

  std::optional<Offender> step(std::span<const StepItem> items, NonFinitePolicy policy) {
    tasks_.clear();
    stepped_.clear();
    for (const StepItem& it : items) {
      Tensor& e = tensors_[static_cast<std::size_t>(it.index)];
      backend::TensorTask task;
      task.param = it.param.data;
      task.grad = it.grad.data;
      task.geom = it.param.shape.matrices();
      task.factored = e.factored;
      task.scope = it.scope;
      task.scalars = it.scalars;
      task.key = it.key;
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
      e.kernels = pick(it.tier, it.param.dtype, it.grad.dtype, it.param.shape.rank() < 2);
      task.kernel = e.kernels->full;
      tasks_.push_back(task);
      stepped_.push_back(&it);
    }
    if (policy == NonFinitePolicy::unchecked) {
      units_.clear();
      for (std::size_t k = 0; k < tasks_.size(); ++k)
        backend::append_units(tasks_[k], static_cast<std::int32_t>(k), units_);
      backend_.run(tasks_, units_);
      return std::nullopt;
    }
    if (std::optional<Offender> bad = checked_statistics()) return bad;
    finish_checked_step();
    return std::nullopt;
  }

 private:
  struct Tensor {
    bool factored = false;
    ParamState state;  ///< its step stays 0: the front-end counts steps
    std::vector<backend::MatrixScratch> matrices;
    std::vector<float> col_partial;
    std::vector<float> d_partial;
    std::vector<double> unit_sum;
    index_t row_blocks = 1;
    index_t chunks = 1;
    bool restorable_statistics = false;
    std::vector<float> statistics_backup;  ///< v_row then v_col
    std::vector<double> scan;              ///< per chunk: first offending offset, or -1
    const backend::cpu::PhaseKernels* kernels = nullptr;
  };

  Tensor& tensor_of(std::size_t k) { return tensors_[static_cast<std::size_t>(stepped_[k]->index)]; }

  /// Phase 1 of a checked step: the statistics of the tensors whose state it
  /// can restore, a gradient scan of the others. On an offending gradient
  /// restores that state and returns the first offender in item order;
  /// otherwise leaves phase 2 to finish_checked_step().
  std::optional<Offender> checked_statistics() {
    phase_tasks_.clear();
    units_.clear();
    for (std::size_t k = 0; k < tasks_.size(); ++k) {
      Tensor& e = tensor_of(k);
      backend::TensorTask t = tasks_[k];
      if (e.restorable_statistics) {
        std::copy(e.state.v_row.begin(), e.state.v_row.end(), e.statistics_backup.begin());
        std::copy(e.state.v_col.begin(), e.state.v_col.end(),
                  e.statistics_backup.begin() + static_cast<std::ptrdiff_t>(e.state.v_row.size()));
        t.kernel = &e.kernels->statistics_only;
      } else {
        t = scan_task(e, tasks_[k], stepped_[k]->grad.dtype);
      }
      phase_tasks_.push_back(t);
      backend::append_units(t, static_cast<std::int32_t>(k), units_);
    }
    backend_.run(phase_tasks_, units_);

    std::optional<std::size_t> first;
    for (std::size_t k = 0; k < tasks_.size() && !first; ++k) {
      const Tensor& e = tensor_of(k);
      const bool ok = e.restorable_statistics
                          ? backend::all_finite(e.state.v_row.data(), e.state.v_row.size()) &&
                                backend::all_finite(e.state.v_col.data(), e.state.v_col.size())
                          : std::all_of(e.scan.begin(), e.scan.end(), [](double x) { return x < 0; });
      if (!ok) first = k;
    }
    if (!first) return std::nullopt;

    for (std::size_t k = 0; k < tasks_.size(); ++k) {
      Tensor& e = tensor_of(k);
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
      const Tensor& e = tensor_of(k);
      backend::TensorTask t = tasks_[k];
      if (e.restorable_statistics) t.kernel = &e.kernels->apply_only;
      phase_tasks_.push_back(t);
      backend::append_units(t, static_cast<std::int32_t>(k), units_);
    }
    backend_.run(phase_tasks_, units_);
  }

  /// A task that scans the gradient of `task`, chunk by chunk, into e.scan.
  static backend::TensorTask scan_task(Tensor& e, const backend::TensorTask& task, Dtype grad) {
    backend::TensorTask t = task;
    t.kernel = backend::cpu::gradient_scan_kernels(grad, task.factored);
    t.factored = false;
    t.chunks_per_matrix = backend::Cutting::chunks_per_matrix(task.geom);
    t.unit_sum = e.scan.data();
    t.m = t.v = t.v_row = t.v_col = nullptr;
    return t;
  }

  /// The offender of task k, scanning its gradient if phase 1 did not.
  Offender describe_offender(std::size_t k) {
    Tensor& e = tensor_of(k);
    const StepItem& it = *stepped_[k];
    if (e.restorable_statistics) {
      phase_tasks_.assign(1, scan_task(e, tasks_[k], it.grad.dtype));
      units_.clear();
      backend::append_units(phase_tasks_[0], 0, units_);
      backend_.run(phase_tasks_, units_);
    }
    Offender r;
    r.index = it.index;
    const index_t chunk = backend::Cutting::chunk_elems;
    const index_t per_matrix = backend::Cutting::chunks_per_matrix(tasks_[k].geom);
    for (std::size_t u = 0; u < e.scan.size(); ++u) {
      if (e.scan[u] < 0) continue;
      const auto ui = static_cast<index_t>(u);
      r.element = (ui / per_matrix) * tasks_[k].geom.matrix_size() + (ui % per_matrix) * chunk +
                  static_cast<index_t>(e.scan[u]);
      r.value = backend::grad_element(it.grad, r.element) * it.scalars.grad_scale;
      break;
    }
    return r;
  }

  /// The backend's kernel table for (Rule, P, G), split into its two phases.
  template <class Rule, class P, class G>
  static const backend::cpu::PhaseKernels* phase_kernels() {
    static const backend::cpu::PhaseKernels k =
        backend::cpu::split_phases(backend_type::template kernels<Rule, P, G>());
    return &k;
  }
  static const backend::cpu::PhaseKernels* pick(Tier t, Dtype p, Dtype g, bool rank1) {
    return visit_rule<Tiers>(t, rank1, [&]<class Rule>() {
      return visit_dtypes(p, g, []<class P, class G>() { return phase_kernels<Rule, P, G>(); });
    });
  }

  std::vector<Tensor> tensors_;
  backend_type backend_;
  // reused every step; grow with the number of tensors, never with their size
  std::vector<backend::TensorTask> tasks_;
  std::vector<backend::TensorTask> phase_tasks_;
  std::vector<backend::Unit> units_;
  std::vector<const StepItem*> stepped_;
};

}  // namespace skewadam
