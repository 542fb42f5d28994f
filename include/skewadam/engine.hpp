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
// An engine whose step counts live on its device (counts_on_device: the CUDA
// engine) steps without waiting for it, so the host learns a step's outcome
// only when it asks; instead of the step() above it has
//
//   step(items, policy, settings)
//                           enqueues one step; each tensor's scalars and key
//                           are formed on the device from its own count and
//                           `settings` (the tiers' hyperparameters, the
//                           global-norm scale, the seed); a rejected step
//                           changes nothing, counts included
//   counts(out) -> steps    the tensors' counts and the applied-step count
//                           (waits for the device)
//   clip_sum_squares()      the sum of g^2 the last clipping step formed
//                           (settings.max_norm; waits for the device)
//   outcome()               the last step's first offender, if it was rejected
//                           (waits for the device)
//   stage_counts(staged, counts, steps)
//                           counts of an import, committed with the state
//   capture(items, policy, settings) -> graph_type
//                           one step recorded for replay (a CUDA graph)
//   replay_problem(graph, items)
//                           why `graph` cannot run with these items, if it cannot
//   replay(graph, items, settings)
//                           runs it: one more step, counted on the device
//
// A placement decides what of each tensor a process holds and adds the
// exchanges between the passes (placement/local.hpp: everything, no exchange;
// placement/sharded.hpp: row slices and whole experts, all-gathers); a backend
// holds the loops, threads and memory (backend/cpu/cpu_backend.hpp;
// backend/cuda/cuda_backend.hpp, whose engines are placement/local_cuda.hpp
// and placement/sharded_cuda.hpp).

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
#include "hyperparameters.hpp"
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

/// What a step of an engine that counts on its device needs besides its items.
struct StepSettings {
  std::array<Hyperparameters, tier_count> hyper{};  ///< by tier_index, lr schedules applied
  double grad_scale = 1.0;                          ///< global-norm clipping's
  std::uint64_t seed = 0;                           ///< stochastic rounding's
  /// > 0: the step clips the global gradient norm to it on the device
  /// (its scale replaces grad_scale); clip_sum_squares() reads the sum
  double max_norm = 0;
};

/// Why a captured step cannot replay (replay_problem()).
struct ReplayProblem {
  index_t index = -1;  ///< the tensor whose gradient is not the captured one (pointer or dtype), or
                       ///< -1: the engine's tables changed since the capture (a parameter was
                       ///< added, a gradient changed dtype, or a state was imported)
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

/// Whether E counts steps on its device (the second form of step() above).
template <class E>
inline constexpr bool counts_on_device = requires { requires E::counts_on_device; };

/// The interface above, as concepts; Optimizer checks them with a readable
/// message where an engine is formed.
template <class E>
concept EngineBase = requires(E& e, const E& ce, const TensorRegistration& spec, std::size_t i, const ParamState& s,
                              const std::string& who, ParamState&& full, typename E::staged_type& staged,
                              const ParamView& p, const GradView& g, std::span<const StepItem> items) {
  ce.check_memory(std::string_view(who), p, g);
  e.add(spec);
  { e.pop_back() } noexcept;
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

template <class E>
concept HostCountingEngine = EngineBase<E> && !counts_on_device<E> &&
                             requires(E& e, std::span<const StepItem> items, NonFinitePolicy policy) {
                               { e.step(items, policy) } -> std::same_as<std::optional<Offender>>;
                             };

template <class E>
concept DeviceCountingEngine =
    EngineBase<E> && counts_on_device<E> &&
    requires(E& e, const E& ce, std::span<const StepItem> items, NonFinitePolicy policy, const StepSettings& st,
             std::span<std::int64_t> out, std::span<const std::int64_t> in, typename E::staged_type& staged,
             const typename E::graph_type& graph) {
      e.step(items, policy, st);
      { ce.counts(out) } -> std::same_as<std::int64_t>;
      { ce.outcome() } -> std::same_as<std::optional<Offender>>;
      { ce.clip_sum_squares() } -> std::same_as<double>;
      ce.stage_counts(staged, in, std::int64_t{0});
      { e.capture(items, policy, st) } -> std::same_as<typename E::graph_type>;
      { ce.replay_problem(graph, items) } -> std::same_as<std::optional<ReplayProblem>>;
      e.replay(graph, items, st);
    };

template <class E>
concept OptimizerEngine = HostCountingEngine<E> || DeviceCountingEngine<E>;

/// The memory copies of an engine whose memory is not the host's.
template <class E>
concept DeviceMemoryEngine = OptimizerEngine<E> && !E::host_memory &&
                             requires(E& e, const E& ce, void* p, const void* cp, std::size_t n, std::size_t i) {
                               ce.read_memory(p, cp, n);
                               e.write_memory(p, cp, n);
                               { ce.host_arrays(i) } -> std::same_as<ParamState>;
                             };

}  // namespace skewadam
