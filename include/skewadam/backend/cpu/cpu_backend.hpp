#pragma once
// CpuBackend<Arch>: runs a step's work on CPU threads, one parallel region per
// step for all tensors, so many small tensors share one fork/join. Inside it:
// the statistics units (a tensor is finalized by the thread that completes
// its last statistics unit), one barrier, the apply units. Units are taken
// dynamically by threads; since every unit's result is independent of who
// computes it and partials are combined in a fixed order, results are
// bit-identical for any thread count.
//
// On a machine shared with other work, OpenMP threads that spin while they
// wait take CPU time from the thread they wait for: OMP_WAIT_POLICY=passive
// (libgomp: or a small GOMP_SPINCOUNT) made a 2-thread step 2-3x faster here
// under a busy co-tenant (bench/RESULTS.md).
//
// Arch is an xsimd architecture tag (xsimd::avx2, xsimd::avx512bw, ...),
// skewadam::ScalarArch, or skewadam::DispatchArch (the default): the level
// chosen at run time among those compiled in, the widest the processor
// supports unless SKEWADAM_CPU_ARCH says otherwise (arch.hpp).

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "../../config.hpp"
#include "../work.hpp"
#include "arch.hpp"
#include "kernels.hpp"
#include "simd.hpp"

namespace skewadam::backend {

template <class Arch = DispatchArch>
class CpuBackend {
 public:
  using arch = Arch;

  /// Checks the architecture choice (SKEWADAM_CPU_ARCH) up front: an invalid
  /// one throws here, before any parameter is registered.
  CpuBackend() {
    if constexpr (std::is_same_v<Arch, DispatchArch>) (void)cpu::selected_arch();
  }

  /// The name of the architecture the kernels run ("avx512bw", "scalar"...).
  static const char* arch_name() { return Arch::name(); }

  template <class Rule, class P, class G>
  static const KernelTable* kernels() {
    if constexpr (std::is_same_v<Arch, DispatchArch>)
      return cpu::visit_arch(cpu::selected_arch(), []<class A>() { return cpu::Kernels<Rule, P, G, A>::table(); });
    else
      return cpu::Kernels<Rule, P, G, Arch>::table();
  }

  /// Threads used per step; 0 selects the hardware's count.
  void set_threads(int n) {
    if (n < 0) throw std::invalid_argument("threads = " + std::to_string(n) + ": must be >= 0 (0: hardware)");
    threads_ = n == 0 ? hardware_threads() : n;
    resize_scratch();
  }
  int threads() const noexcept { return threads_; }

  static int hardware_threads() noexcept {
#if defined(_OPENMP)
    return std::max(1, omp_get_max_threads());
#else
    return 1;
#endif
  }

  /// Makes room for factored matrices of up to `cols` columns. Called when a
  /// tensor is registered, so that step() never allocates.
  void reserve_columns(index_t cols) {
    if (cols > max_cols_) {
      max_cols_ = cols;
      resize_scratch();
    }
  }

  void run(std::span<const TensorTask> tasks, std::span<const Unit> units) {
    if (tasks.empty()) return;
    const auto nunits = static_cast<index_t>(units.size());
    bool any_apply = false;
    for (const TensorTask& t : tasks) any_apply = any_apply || t.kernel->apply != nullptr;
    // Statistics units left per task; the thread that finishes a task's last
    // one finalizes it, so no barrier separates the two phases. (Grows with
    // the number of tensors only, and is reused from step to step.)
    if (pending_.size() < tasks.size()) pending_.resize(tasks.size());
    std::fill(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(tasks.size()), index_t{0});
    index_t elements = 0;
    for (const Unit& u : units) {
      const TensorTask& t = tasks[static_cast<std::size_t>(u.task)];
      ++pending_[static_cast<std::size_t>(u.task)];
      elements += (u.end - u.begin) * (t.factored ? t.geom.cols : 1);
    }
    // A thread per Cutting::chunk_elems elements at most: a small step is
    // not worth waking threads for (the result does not depend on the count).
    const index_t by_work = std::max<index_t>(1, elements / Cutting::chunk_elems);
    const int nthreads = static_cast<int>(std::min<index_t>({index_t{threads_}, nunits, by_work}));
#if defined(_OPENMP)
#pragma omp parallel num_threads(nthreads)
#endif
    {
#if defined(_OPENMP)
      const Scratch scratch = scratch_.at(omp_get_thread_num());
#else
      const Scratch scratch = scratch_.at(0);
#endif
#if defined(_OPENMP)
#pragma omp for schedule(dynamic, 1) nowait
#endif
      for (index_t k = 0; k < nunits; ++k) {
        const Unit& u = units[static_cast<std::size_t>(k)];
        const TensorTask& t = tasks[static_cast<std::size_t>(u.task)];
        t.kernel->statistics(t, u, scratch);
        std::atomic_ref<index_t> left(pending_[static_cast<std::size_t>(u.task)]);
        if (left.fetch_sub(1, std::memory_order_acq_rel) == 1) t.kernel->finalize(t, scratch);
      }
      if (any_apply) {
#if defined(_OPENMP)
#pragma omp barrier
#pragma omp for schedule(dynamic, 1) nowait
#endif
        for (index_t k = 0; k < nunits; ++k) {
          const Unit& u = units[static_cast<std::size_t>(k)];
          const TensorTask& t = tasks[static_cast<std::size_t>(u.task)];
          if (t.kernel->apply) t.kernel->apply(t, u, scratch);
        }
      }
    }
    (void)nthreads;
  }

 private:
  void resize_scratch() { scratch_.resize(threads_, max_cols_); }

  int threads_ = hardware_threads();
  index_t max_cols_ = 0;
  ScratchSpace scratch_ = [] {
    ScratchSpace s;
    s.resize(hardware_threads(), 0);
    return s;
  }();
  std::vector<index_t> pending_;  ///< accessed through std::atomic_ref during run()
};

/// The backend an optimizer uses unless told otherwise: the architecture is
/// chosen at run time (arch.hpp).
using DefaultBackend = CpuBackend<>;
/// The widest architecture the compiler targets, fixed at compile time: one
/// set of kernels per program instead of one per compiled level.
using NativeBackend = CpuBackend<xsimd::default_arch>;

}  // namespace skewadam::backend
