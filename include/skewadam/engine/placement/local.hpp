#pragma once
// The local placement: one process holds the complete state of every tensor.
// Each tensor is one piece (all its matrices), nothing is exchanged, and the
// backend forms the clip divisors itself, so a step needs nothing from the
// host once it is enqueued (a CUDA step can be captured in a graph).

#include <cstddef>
#include <optional>
#include <span>
#include <string>

#include "../../detail/config.hpp"
#include "../../state/param_state.hpp"
#include "../../state/state_layout.hpp"
#include "../../types/shape.hpp"
#include "../../types/tier.hpp"
#include "../backend/backend.hpp"
#include "../pieces.hpp"

namespace skewadam {

/// Everything in this process (the default placement).
struct Local {
  static constexpr bool sharded = false;
  /// Whether the clip divisors come from the placement (host) rather than
  /// from each piece's own sums on the backend.
  static constexpr bool host_divisors = false;
  struct communicator_type {};  ///< none
  struct options_type {};       ///< none

  int rank() const noexcept { return 0; }
  int ranks() const noexcept { return 1; }

  /// The whole tensor, owned by this process.
  TensorSplit split(Tier, const Shape& shape, StateLayout layout) const { return whole_split(shape, layout); }
  void unsplit(const TensorSplit&) noexcept {}

  /// One process decides alone: the backend's verdict stands.
  template <class Backend>
  backend::Verdict agree(const Backend&, const backend::Verdict& mine, std::span<const std::size_t>, index_t&) const {
    return mine;
  }
  /// Sums over processes: this one's are the totals.
  void add_over_ranks(std::span<double>, index_t&) const noexcept {}
  double sum_over_ranks(double x) const noexcept { return x; }
  /// A complete state array from this process's share: the share itself.
  void complete(const TensorSplit&, bool, ParamState&) const noexcept {}
  void share_of(const TensorSplit&, bool, ParamState&) const noexcept {}
  /// An error on one process is everyone's.
  void agree_on_failure(std::string&) const noexcept {}
};

}  // namespace skewadam
