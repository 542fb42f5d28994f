#pragma once
// A CPU step in two phases, so that NonFinitePolicy (nonfinite.hpp) can reject
// a step before anything is written.
//
// How it is detected, and why it costs almost nothing
// ---------------------------------------------------
// The step runs in two phases (placement/local.hpp):
//  1. Tensors whose statistics pass writes only their small factored
//     statistics R and C (factored rules without momentum: the experts, 95 %
//     of an MoE's parameters) run their statistics pass as usual; R and C are
//     copied first (B (r + c) floats, never numel). A non-finite gradient makes
//     its row's R_i and column's C_j non-finite, so checking R and C afterwards
//     detects it inside the existing pass. Every other tensor (with momentum,
//     or with an element-wise second moment, whose statistics pass overwrites
//     state of the parameter's size) has its gradient scanned instead, in the
//     same parallel region.
//  2. If nothing offends, the remaining passes run: the apply pass of the first
//     group, every pass of the second. Otherwise R and C are restored from the
//     copies and nothing else has been written.
// The results are bit-identical to a single-phase step (tests check it).

#include <cstdint>

#include "../../config.hpp"
#include "../../dtype.hpp"
#include "../gradient_check.hpp"
#include "../work.hpp"

namespace skewadam::backend::cpu {

/// A backend kernel that scans a gradient instead of stepping it. Its task is
/// cut into element chunks (task.factored = false); unit k writes to
/// task.unit_sum[k] the offset of the chunk's first offending element, or -1.
/// Factored says whether the scanned tensor's own rule is factored (it sets
/// the limit).
template <class G, bool Factored>
struct GradientScan {
  static void statistics(const TensorTask& t, const Unit& u, Scratch /*scratch*/) {
    const G* g = static_cast<const G*>(t.grad) + u.matrix * t.geom.matrix_size();
    const index_t at = first_offending(g + u.begin, u.end - u.begin, t.scalars.grad_scale,
                                       gradient_limit(t.geom, Factored));
    t.unit_sum[u.block] = static_cast<double>(at);
  }
  static void finalize(const TensorTask& /*t*/, Scratch /*scratch*/) {}
  static const KernelTable* table() noexcept {
    static constexpr KernelTable k{&statistics, &finalize, nullptr};
    return &k;
  }
};

inline const KernelTable* gradient_scan_kernels(Dtype grad, bool factored) noexcept {
  switch (grad) {
    case Dtype::f32: return factored ? GradientScan<float, true>::table() : GradientScan<float, false>::table();
    case Dtype::bf16: return factored ? GradientScan<bf16, true>::table() : GradientScan<bf16, false>::table();
    case Dtype::f16: return factored ? GradientScan<f16, true>::table() : GradientScan<f16, false>::table();
  }
  return nullptr;
}

/// A kernel table's passes, split for a two-phase step: the statistics and
/// finalize passes alone, and the apply pass alone. Results are identical to
/// the full table's, because a backend keeps everything apply needs in the
/// task's own memory (state, MatrixScratch), never in per-run scratch.
struct PhaseKernels {
  const KernelTable* full = nullptr;
  KernelTable statistics_only{};
  KernelTable apply_only{};
};

inline void no_statistics(const TensorTask&, const Unit&, Scratch) {}
inline void no_finalize(const TensorTask&, Scratch) {}

inline PhaseKernels split_phases(const KernelTable* full) noexcept {
  return PhaseKernels{full, {full->statistics, full->finalize, nullptr}, {&no_statistics, &no_finalize, full->apply}};
}

}  // namespace skewadam::backend::cpu
