#pragma once
// What the optimizer front-end (optimizer.hpp) asks of the engine under it.
//
// Optimizer<Tiers, Backend, Placement> does everything that does not depend on
// where the state lives or how the loops run, once: names and tiers, every
// argument check (overlapping memory included), per-tier hyperparameters and
// schedules, the non-finite policy and StepReport, global gradient-norm
// clipping, step counts and rounding streams, export/import of the state,
// state_bytes. The engine, Placement::engine<Tiers, Backend>, holds the state
// on the backend's memory and runs the passes of a step over it:
//
//   check_memory(name, p, g) throws std::invalid_argument (naming the
//                           parameter) unless p and g are in memory the
//                           backend can reach (the CUDA backend: device memory).
//   add(spec)               allocate the state (and scratch) of one more tensor;
//                           strong guarantee. pop_back() undoes the last add.
//   step(items, policy)     one step of the listed tensors, each with its
//                           scalars and rounding key. Unless the policy is
//                           unchecked, no state and no parameter changes when a
//                           gradient offends; the first offender (in item order,
//                           then element order) is returned. May throw
//                           std::invalid_argument before changing anything.
//   grad_sum_squares(items) sum of g^2 over the listed gradients, in double, in
//                           an order fixed by the shapes (and rank count).
//   export_arrays(i)        host copy of tensor i's complete state arrays.
//   check_arrays(i, s, who) throws std::invalid_argument (naming who) unless s
//                           has exactly the arrays tensor i keeps.
//   stage_begin(), stage(staged, i, s), commit(staged)
//                           import in two halves: stage() takes tensor i's
//                           complete arrays into a staged_type (this process's
//                           share of them; it may allocate and throw), one
//                           tensor at a time, so that a sharded import never
//                           holds more than one complete tensor; commit()
//                           swaps the staged state in, noexcept.
//   state_bytes(i)          optimizer-state bytes this process holds of tensor i.
//   host_memory             whether parameters and state are in host memory;
//                           when not, read_memory(dst, src, n) and
//                           write_memory(dst, src, n) copy parameter bytes to
//                           and from the host (checkpoints' parameter values),
//                           and host_arrays(i) is a host copy of tensor i's
//                           state (else a view of it).
//   set_threads(n), threads()
//
// A placement decides what of each tensor a process holds and adds the
// exchanges between the passes (placement/local.hpp: everything, no exchange;
// placement/sharded.hpp: row slices and whole experts, all-gathers); a backend
// holds the loops, threads and memory (backend/cpu/cpu_backend.hpp;
// backend/cuda/cuda_backend.hpp, whose local engine is placement/local_cuda.hpp).

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "config.hpp"
#include "nonfinite.hpp"
#include "param_state.hpp"
#include "random.hpp"
#include "state_layout.hpp"
#include "step_scalars.hpp"
#include "tensor_view.hpp"
#include "tier.hpp"

namespace skewadam {

/// A tensor being registered: already checked by the front-end.
struct TensorRegistration {
  index_t index = 0;  ///< its position (ParamId)
  Tier tier = Tier::backbone;
  StateLayout layout{};
  ParamView param;
};

/// One tensor of a step (or of a gradient-norm sum).
struct StepItem {
  index_t index = 0;  ///< its position (ParamId)
  Tier tier = Tier::backbone;
  ParamView param;
  GradView grad;
  StepScalars scalars{};  ///< of its step t (its step count + 1)
  RoundingKey key{};
  ClipScope scope = ClipScope::tensor;
};

/// The first offending gradient an engine found; the front-end names it.
struct Offender {
  index_t index = -1;    ///< the tensor
  index_t element = -1;  ///< flat index of its first offending element, or -1 (see NonFiniteGradient)
  float value = 0;       ///< that element after global-norm scaling
};

namespace detail {
/// check_arrays() of an engine whose tensor i keeps arrays of sizes `have`
/// (m, v, v_row, v_col): std::invalid_argument naming who and the array
/// unless `got` has exactly those sizes.
inline void check_array_sizes(const std::array<std::size_t, 4>& have, const ParamState& got, const std::string& who) {
  const std::array<std::size_t, 4> sizes{got.m.size(), got.v.size(), got.v_row.size(), got.v_col.size()};
  constexpr const char* names[4] = {"m", "v", "v_row", "v_col"};
  for (std::size_t k = 0; k < 4; ++k)
    if (have[k] != sizes[k])
      throw std::invalid_argument(who + ": " + names[k] + " has " + std::to_string(sizes[k]) + " values, expected " +
                                  std::to_string(have[k]));
}
}  // namespace detail

/// The interface above, as a concept; Optimizer checks it with a readable
/// message where an engine is formed.
template <class E>
concept OptimizerEngine = requires(E& e, const E& ce, const TensorRegistration& spec, std::span<const StepItem> items,
                                   NonFinitePolicy policy, std::size_t i, const ParamState& s,
                                   const std::string& who, ParamState&& full, typename E::staged_type& staged,
                                   const ParamView& p, const GradView& g) {
  ce.check_memory(std::string_view(who), p, g);
  e.add(spec);
  { e.pop_back() } noexcept;
  { e.step(items, policy) } -> std::same_as<std::optional<Offender>>;
  { ce.grad_sum_squares(items) } -> std::same_as<double>;
  { ce.export_arrays(i) } -> std::same_as<ParamState>;
  ce.check_arrays(i, s, who);
  { ce.stage_begin() } -> std::same_as<typename E::staged_type>;
  ce.stage(staged, i, std::move(full));
  { e.commit(std::move(staged)) } noexcept;
  { ce.state_bytes(i) } -> std::same_as<index_t>;
  { E::host_memory } -> std::convertible_to<bool>;
  e.set_threads(1);
  { ce.threads() } -> std::same_as<int>;
};

/// The memory copies of an engine whose memory is not the host's.
template <class E>
concept DeviceMemoryEngine = OptimizerEngine<E> && !E::host_memory &&
                             requires(E& e, const E& ce, void* p, const void* cp, std::size_t n, std::size_t i) {
                               ce.read_memory(p, cp, n);
                               e.write_memory(p, cp, n);
                               { ce.host_arrays(i) } -> std::same_as<ParamState>;
                             };

}  // namespace skewadam
