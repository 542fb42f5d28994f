#pragma once
// The Backend concept: what the engine (engine.hpp) asks of a backend. A
// backend owns memory, and every loop, launch, thread and reduction over the
// pieces of a step; the engine's skeleton calls its passes in order, and the
// placement (engine/placement/local.hpp, engine/placement/sharded.hpp) decides the pieces
// and the exchanges between them. backend::CpuBackend<Arch>
// (engine/backend/cpu/cpu_backend.hpp) and backend::CudaBackend<R>
// (engine/backend/cuda/cuda_backend.hpp) model it.
//
// A piece is what this process steps of a tensor: whole matrices (one piece
// for a tensor in one process), one matrix's row slice, or one matrix's
// element range, with its place in the tensor (PieceSpec). A backend keeps a
// tensor's state as its pieces' arrays concatenated in piece order: m and v
// element by element, v_row row by row, v_col c values per matrix.
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
//   resolve(verdict)  host    the first offender, waiting for the device
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
// and outside a step: add(spec, pieces, kernels) (a tensor's kernels, which
// the engine picks by rule and dtypes with kernels<Rule, P, G>(): for a
// gradient of the parameter's dtype, and for an fp32 one), pop_back(), view(i), share(i),
// stage(...), commit(...), counts(out), stage_counts(...), outcome(),
// grad_sum_squares(items), clip_sum_squares(), state_bytes(i),
// scratch_bytes(), check_memory(...), read_memory / write_memory,
// set_threads(n), threads(), and on_device(): an object that keeps the
// backend's device current while it lives (the engine holds one over each
// call that allocates, launches or copies; an empty one where the memory is
// the host's).

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
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
};

/// Where a piece's arrays start in its tensor's share, in values of m (its
/// words, state_layout.hpp), v, v_row and v_col; or the share's sizes.
struct PieceOffsets {
  index_t m = 0, v = 0, v_row = 0, v_col = 0;
};

/// Each piece's offsets in its tensor's share (the pieces' arrays
/// concatenated in piece order), then the share's sizes: pieces.size() + 1
/// entries.
inline std::vector<PieceOffsets> piece_offsets(const StateLayout& layout, std::span<const PieceSpec> pieces) {
  std::vector<PieceOffsets> at(1);
  for (const PieceSpec& p : pieces) {
    PieceOffsets next = at.back();
    next.m += momentum_words(layout, p.geom);
    if (p.factored) {
      next.v_row += p.geom.batch * p.geom.rows;
      next.v_col += p.geom.batch * p.geom.cols;
    } else {
      next.v += p.geom.numel();
    }
    at.push_back(next);
  }
  return at;
}

/// Points a piece's task (its members m, v, v_row, v_col) at offsets `at` of
/// its tensor's share (arrays with empty() and data()); null where the share
/// has no such array.
template <class Task, class Share>
void point_piece(Task& task, Share& share, const PieceOffsets& at) {
  auto in = [](auto& a, index_t k) -> float* { return a.empty() ? nullptr : a.data() + k; };
  task.m = in(share.m, at.m);
  task.v = in(share.v, at.v);
  task.v_row = in(share.v_row, at.v_row);
  task.v_col = in(share.v_col, at.v_col);
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
/// otherwise it is on the device (resolve() fetches it).
struct Verdict {
  bool known = true;
  std::optional<Offender> offender;
};

template <class B>
concept Backend =
    std::constructible_from<B, const OptimizerOptions&> &&
    requires(B& b, const B& cb, const TensorRegistration& reg, std::span<const PieceSpec> pieces,
             std::array<typename B::kernels_type, 2> kernels, std::size_t i,
             ParamState&& share, typename B::staged_type& staged, std::span<const StepItem> items,
             const StepSettings& settings, NonFinitePolicy policy, const Verdict& verdict,
             std::span<std::int64_t> out, std::span<const std::int64_t> in, std::span<const float> divisors,
             const std::string& who, const ParamView& p, const GradView& g, void* dst, const void* src,
             std::size_t n, Passes passes) {
      { B::host_memory } -> std::convertible_to<bool>;
      b.add(reg, pieces, kernels);
      { b.pop_back() } noexcept;
      cb.check_memory(std::string_view(who), p, g);
      { cb.view(i) } -> std::same_as<ParamStateView>;
      { cb.share(i) } -> std::same_as<ParamState>;
      { cb.stage_begin() } -> std::same_as<typename B::staged_type>;
      cb.stage(staged, i, std::move(share));
      cb.stage_counts(staged, in, std::int64_t{0});
      { b.commit(std::move(staged)) } noexcept;
      { cb.counts(out) } -> std::same_as<std::int64_t>;
      { cb.state_bytes(i) } -> std::same_as<index_t>;
      { cb.scratch_bytes() } -> std::same_as<index_t>;
      cb.read_memory(dst, src, n);
      b.write_memory(dst, src, n);
      b.prepare(items, settings);
      b.begin();
      { b.check(policy) } -> std::same_as<Verdict>;
      { cb.resolve(verdict) } -> std::same_as<std::optional<Offender>>;
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
      cb.on_device();
    };

}  // namespace skewadam::backend
