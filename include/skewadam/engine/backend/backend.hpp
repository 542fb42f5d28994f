#pragma once
// The Backend concept: what the engine (engine.hpp) asks of a backend. A
// backend owns its scratch, and every loop, launch, thread and reduction over the
// pieces of a step; the engine's skeleton calls its passes in order, and the
// placement (engine/placement/local.hpp, engine/placement/sharded.hpp) decides the pieces
// and the exchanges between them. backend::CpuBackend<Arch>
// (engine/backend/cpu/cpu_backend.hpp) and backend::CudaBackend<R>
// (engine/backend/cuda/cuda_backend.hpp) model it.
//
// A piece is what this process steps of a tensor: whole matrices (one piece
// for a tensor in one process), one matrix's row slice, or one matrix's
// element range, with its place in the tensor (PieceSpec). The engine owns
// the state, in the backend's memory (its memory_type, a MemoryPolicy:
// engine/state_store.hpp): a backend is told where each piece's arrays are
// (PieceState) when the tensor is added, and again by point() when an import
// moves them, and where the step counts are with each step
// (StepSettings::counts).
//
// One step, as the engine runs it (every member may enqueue work on a device
// instead of doing it at once; "host" marks the members that return host
// values, and wait for a device):
//
//   prepare(items, settings)  the step's gradients, hyperparameters, seed
//   begin()                   each stepped tensor's scalars and rounding key
//                             from its own count + 1 (and, with
//                             settings.max_norm, the global-norm scale from
//                             this process's sum of g^2)
//   check(policy) -> Verdict  the non-finite scan; known: the host has the
//                             answer; else the device decides, and every
//                             later pass leaves a rejected step alone
//   outcome()         host    the first offender, waiting for the device
//   reject()                  undoes what check() wrote (a rejected step)
//   run(passes)               the listed passes of the step, in this order:
//                             no exchange comes between them, so a backend
//                             may fuse them (the CPU backend runs statistics
//                             and apply in one parallel region):
//     Pass::statistics        every piece's statistics
//     Pass::finish            every piece's C_j, vbar and sum of u^2 (a cut
//                             piece's from the totals set_cut_sums() gave),
//                             and the clip divisors unless host_divisors
//     Pass::apply             the update of every piece
//     Pass::count             counts of an applied step advance
//   cut_sums()        host    the cut pieces' column sums of g^2 and sum of
//                             R_i, c + 1 doubles per matrix (after
//                             statistics); the placement replaces them with
//                             the totals over processes, set_cut_sums()
//                             hands them back
//   clip_sums()       host    every piece's sums of u^2, B doubles per piece
//                             (after finish)
//   divisors(), set_divisors()  host_divisors pieces: the clip divisors,
//                             written by the placement, then handed back
//
// and outside a step: memory() (its memory policy), add(spec, pieces,
// kernels, state) (a tensor's kernels, which the engine picks by rule and
// dtypes with kernels<Rule, P, G>(): for a gradient of the parameter's dtype,
// and for an fp32 one; and where its pieces' arrays are), pop_back(),
// point(i, state), grad_sum_squares(items), clip_sum_squares(),
// scratch_bytes(), set_threads(n), threads().

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../../detail/config.hpp"
#include "../../state/param_state.hpp"
#include "../../state/state_layout.hpp"
#include "../../types/shape.hpp"
#include "../../types/tensor_view.hpp"
#include "../engine_types.hpp"
#include "../nonfinite.hpp"
#include "../optimizer_options.hpp"

namespace skewadam::backend {

/// One piece of a tensor that this process steps.
struct PieceSpec {
  MatrixGeometry geom{};  ///< factored: matrices of rows x cols; element-wise: matrices of 1 x elements
  index_t first = 0;      ///< flat index in the tensor of its element 0
  bool factored = false;  ///< its rule's factored statistics apply (rank >= 2)
  /// A row slice of a matrix cut between processes: its column statistics
  /// are summed over them (cut_sums) before its finish pass; full_rows is the
  /// matrix's row count.
  bool cut = false;
  index_t full_rows = 0;
  /// Its clip divisors come from the placement (divisors()), not from its
  /// own sums (the clip's scope spans processes).
  bool host_divisors = false;
  /// Its slots, which the engine assigns: where its matrices' sums of u^2
  /// and clip divisors start among every piece's (clip_sums(), divisors()),
  /// and, when cut, where its c + 1 values start among the cut pieces'
  /// (cut_sums(); -1 otherwise).
  index_t clip_at = 0;
  index_t cut_at = -1;
};

/// Where a piece's state arrays are, in the backend's memory (the engine's
/// StateStore owns them): null where its rule keeps no such array.
struct PieceState {
  float* m = nullptr;
  float* v = nullptr;
  float* v_row = nullptr;
  float* v_col = nullptr;
};

/// Points a piece's task (its members m, v, v_row, v_col) at its arrays.
template <class Task>
void point_piece(Task& task, const PieceState& at) noexcept {
  task.m = at.m;
  task.v = at.v;
  task.v_row = at.v_row;
  task.v_col = at.v_col;
}

/// The passes of a step (see the top of this file), as a set.
enum class Pass : unsigned { statistics = 1, finish = 2, apply = 4, count = 8 };
struct Passes {
  unsigned bits = 0;
  constexpr Passes() noexcept = default;
  constexpr Passes(Pass p) noexcept : bits(static_cast<unsigned>(p)) {}  // NOLINT: a pass is a set of one
  constexpr bool has(Pass p) const noexcept { return (bits & static_cast<unsigned>(p)) != 0; }
  constexpr bool empty() const noexcept { return bits == 0; }
  friend constexpr Passes operator|(Passes a, Passes b) noexcept {
    Passes r;
    r.bits = a.bits | b.bits;
    return r;
  }
};

/// What check() found: `known` when the host has the answer (`offender`),
/// otherwise it is on the device (outcome() fetches it).
struct Verdict {
  bool known = true;
  std::optional<Offender> offender;
};

/// What the engine needs of a backend's memory (memory/host_memory.hpp).
template <class M>
concept MemoryPolicy = requires(const M& m, typename M::template array<float>& a, std::vector<float>& v,
                                 std::string_view name, const ParamView& p, const GradView& g, void* dst,
                                 const void* src, std::size_t n) {
  { M::host } -> std::convertible_to<bool>;
  m.zeroed(a, n);
  m.upload(a, std::move(v));
  m.download(a, v);
  { M::view(a) } -> std::same_as<std::span<const float>>;
  m.read(dst, src, n);
  m.write(dst, src, n);
  m.check(name, p, g);
  m.scope();
  m.wait();
};

template <class B>
concept Backend =
    std::constructible_from<B, const OptimizerOptions&> && MemoryPolicy<typename B::memory_type> &&
    requires(B& b, const B& cb, const TensorRegistration& reg, std::span<const PieceSpec> pieces,
             std::array<typename B::kernels_type, 2> kernels, std::size_t i, std::span<const PieceState> state,
             std::span<const StepItem> items, const StepSettings& settings, NonFinitePolicy policy,
             Passes passes) {
      { cb.memory() } -> std::same_as<typename B::memory_type>;
      b.add(reg, pieces, kernels, state);
      { b.pop_back() } noexcept;
      { b.point(i, state) } noexcept;
      { cb.scratch_bytes() } -> std::same_as<index_t>;
      b.prepare(items, settings);
      b.begin();
      { b.check(policy) } -> std::same_as<Verdict>;
      b.reject();
      b.run(passes);
      { b.cut_sums() } -> std::same_as<std::span<double>>;
      b.set_cut_sums();
      { b.clip_sums() } -> std::same_as<std::span<const double>>;
      { b.divisors() } -> std::same_as<std::span<float>>;
      b.set_divisors();
      { cb.outcome() } -> std::same_as<std::optional<Offender>>;
      { cb.grad_sum_squares(items) } -> std::same_as<double>;
      { cb.clip_sum_squares() } -> std::same_as<double>;
      b.set_threads(1);
      { cb.threads() } -> std::same_as<int>;
    };

}  // namespace skewadam::backend
