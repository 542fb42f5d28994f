#pragma once
// The sharded placement: the optimizer state spread over the ranks of a
// communicator (data parallelism with ZeRO stage 1/2 sharding, and expert
// parallelism). dist/sharded_optimizer.hpp names the optimizer it makes.
//
// A rank keeps state only for what it owns (dist/shard_plan.hpp): row slices
// of every backbone and router tensor, whole experts of every expert bank (or
// row slices: ShardOptions::experts), and reads only its own slice of each
// gradient (after a reduce-scatter, only that slice needs to be valid) and
// writes only its own slice of each parameter. Its exchanges, between the
// engine's passes (engine.hpp):
//
//   agree       a small all-gather: every rank steps the same tensors, and
//               the first offending gradient of any rank (lowest tensor, then
//               element) rejects the step everywhere, before anything changes
//   statistics  per matrix cut between ranks, each rank's c column sums of
//               g^2 and its sum of R_i, in double
//   clip        each rank's sum of u^2 per matrix, where a clip's scope spans
//               ranks; every rank then forms the same divisors
//
// Every exchange is an all-gather whose parts each rank adds in rank order
// (never an all-reduce, whose order is not promised), in one wire format,
// double: all ranks hold the same statistics and divisors bit for bit, and
// the same rank count gives the same bits on every run. Matrices a rank owns
// whole (every matrix at one rank, expert banks dealt out by expert) are
// computed exactly as the local placement computes them, bit for bit; a
// matrix cut between ranks adds its partial sums in another order than one
// process does, within the golden tolerances. Stochastic rounding keys each
// element by its index in the whole tensor, as one process does.
//
// Export, import and gather_params move arrays between the ranks' shares and
// complete tensors through dist/shard_transfer.hpp.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../comm/communicator.hpp"
#include "../../detail/config.hpp"
#include "../../state/param_state.hpp"
#include "../../state/state_layout.hpp"
#include "../../types/shape.hpp"
#include "../../types/tier.hpp"
#include "../backend/backend.hpp"
#include "shard_plan.hpp"
#include "shard_transfer.hpp"

namespace skewadam::dist {

struct ShardOptions {
  ExpertSharding experts = ExpertSharding::experts;
};

/// The state sharded over the ranks of a Comm (which must outlive it).
template <Communicator Comm>
class Sharded {
 public:
  static constexpr bool sharded = true;
  static constexpr bool host_divisors = true;
  using communicator_type = Comm;
  using options_type = ShardOptions;

  Sharded(Comm& comm, ShardOptions shard) : comm_(&comm), shard_(shard) {
    if (shard.experts != ExpertSharding::experts && shard.experts != ExpertSharding::rows)
      throw std::invalid_argument("shard.experts: unknown value " + std::to_string(static_cast<int>(shard.experts)));
    if (comm.size() < 1 || comm.rank() < 0 || comm.rank() >= comm.size())
      throw std::invalid_argument("comm: rank " + std::to_string(comm.rank()) + " of " + std::to_string(comm.size()) +
                                  " is not a valid position in a group");
  }

  Comm& comm() const noexcept { return *comm_; }
  int rank() const noexcept { return comm_->rank(); }
  int ranks() const noexcept { return comm_->size(); }

  /// How a tensor is dealt out (separately stored experts round-robin).
  TensorSplit split(Tier tier, const Shape& shape, StateLayout layout) {
    TensorSplit s = split_for(tier, shape, layout, ranks(), shard_.experts, whole_experts_);
    if (s.split == Split::whole) ++whole_experts_;
    return s;
  }
  void unsplit(const TensorSplit& s) noexcept {
    if (s.split == Split::whole) --whole_experts_;
  }

  /// Every rank steps the same tensors, and the first offender of any rank
  /// (waiting for this rank's verdict) rejects the step on all of them.
  template <class Backend>
  backend::Verdict agree(const Backend& b, const backend::Verdict& verdict, std::span<const std::size_t> stepped,
                         index_t& bytes) const {
    struct Check {
      std::uint64_t stepped = 0;  ///< FNV-1a of the stepped tensors' indices
      std::int64_t param = -1;    ///< first offending tensor, or -1
      std::int64_t element = -1;
      float value = 0;
      float pad = 0;
    };
    const std::optional<Offender> mine = verdict.known ? verdict.offender : b.outcome();
    Check c;
    std::uint64_t h = 14695981039346656037ull;
    for (std::size_t i : stepped) {
      h ^= static_cast<std::uint64_t>(i) + 1;
      h *= 1099511628211ull;
    }
    c.stepped = h;
    if (mine) c = Check{h, mine->index, mine->element, mine->value, 0};
    std::vector<Check> all(static_cast<std::size_t>(ranks()));
    comm_->all_gather(std::as_bytes(std::span<const Check>(&c, 1)), std::as_writable_bytes(std::span<Check>(all)));
    bytes += static_cast<index_t>(sizeof(Check));
    for (std::size_t k = 0; k < all.size(); ++k)
      if (all[k].stepped != all[0].stepped)
        throw std::invalid_argument("step: rank " + std::to_string(k) +
                                    " has gradients for a different set of parameters than rank 0 (every rank "
                                    "must set the same gradients before a step)");
    const Check* first = nullptr;
    for (const Check& x : all)
      if (x.param >= 0 && (!first || x.param < first->param || (x.param == first->param && x.element < first->element)))
        first = &x;
    if (!first) return {};
    return {true, Offender{first->param, first->element, first->value}};
  }

  /// values[k] becomes the sum over ranks of every rank's values[k], added in
  /// rank order (collective; every rank passes as many values).
  void add_over_ranks(std::span<double> values, index_t& bytes) const {
    if (values.empty()) return;
    ordered_sum(*comm_, values, room_);
    bytes += static_cast<index_t>(8 * values.size());
  }
  double sum_over_ranks(double x) const {
    ordered_sum(*comm_, std::span<double>(&x, 1), room_);
    return x;
  }

  /// A rank's share of a tensor's arrays becomes the complete arrays,
  /// gathered from their owners (collective).
  void complete(const TensorSplit& split, bool momentum, ParamState& s) const {
    s.m = gather(split, momentum, ShardArray::m, s.m);
    s.v = gather(split, momentum, ShardArray::v, s.v);
    s.v_row = gather(split, momentum, ShardArray::v_row, s.v_row);
    s.v_col = gather(split, momentum, ShardArray::v_col, s.v_col);
  }
  /// Complete arrays become this rank's share of them.
  void share_of(const TensorSplit& split, bool, ParamState& s) const {
    s.m = dist::share_of(split, rank(), ShardArray::m, s.m);
    s.v = dist::share_of(split, rank(), ShardArray::v, s.v);
    s.v_row = dist::share_of(split, rank(), ShardArray::v_row, s.v_row);
    s.v_col = dist::share_of(split, rank(), ShardArray::v_col, s.v_col);
  }
  /// Completes every rank's copy of a parameter (host bytes) from its owners.
  void gather_param(const TensorSplit& split, std::byte* data, std::size_t elem) const {
    if (split.geom.numel() > 0 && ranks() > 1) gather_shards(*comm_, split, ShardArray::param, data, elem, data);
  }

  /// Whether a clipped tensor's sums of u^2 are summed over the ranks (its
  /// clip scope spans matrices or rows that other ranks hold).
  bool clip_exchanged(const TensorSplit& split, bool per_matrix) const {
    return exchange_bytes(split, true, per_matrix).clip > 0;
  }
  /// Rank 0's `failure` (empty: none) becomes every rank's (collective).
  void agree_on_failure(std::string& failure) const {
    std::uint64_t length = failure.size();
    comm_->broadcast(std::as_writable_bytes(std::span<std::uint64_t>(&length, 1)), 0);
    failure.resize(static_cast<std::size_t>(length));
    if (length > 0) comm_->broadcast(std::as_writable_bytes(std::span<char>(failure.data(), failure.size())), 0);
  }

 private:
  std::vector<float> gather(const TensorSplit& split, bool momentum, ShardArray a, const std::vector<float>& mine) const {
    std::vector<float> full;
    if (!shard_keeps(split, momentum, a) || split.geom.numel() == 0) return full;
    const FullSizes s = full_sizes(split, momentum);
    full.resize(a == ShardArray::m ? s.m : a == ShardArray::v ? s.v : a == ShardArray::v_row ? s.v_row : s.v_col);
    gather_shards(*comm_, split, a, reinterpret_cast<const std::byte*>(mine.data()), sizeof(float),
                  reinterpret_cast<std::byte*>(full.data()));
    return full;
  }

  Comm* comm_;
  ShardOptions shard_;
  index_t whole_experts_ = 0;
  mutable std::vector<double> room_;
};

}  // namespace skewadam::dist
