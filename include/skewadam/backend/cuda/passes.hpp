#pragma once
// The passes of a step over one group of tensors (those sharing a rule and
// dtypes, work_lists.hpp), as launches on a runtime R's stream, in the order
// a step runs them:
//
//   statistics   statistics_kernel over the units
//   shard sums   (a sharded placement) shard_sums_kernel over the pieces of
//                matrices cut between ranks; the placement then exchanges
//                the sums and writes the totals back (DeviceTask::shard_sums)
//   finish       columns_kernel (factored) or finalize_kernel (an
//                element-wise rule that clips): C_j, vbar, sum u^2, and,
//                unless DeviceTask::host_divisors, the clip divisors
//   apply        apply_kernel
//
// The local engine (placement/local_cuda.hpp) runs a group's passes back to
// back; the sharded engine (placement/sharded_cuda.hpp) runs every group's
// statistics, exchanges, every group's finish, exchanges, every group's apply.

#include "../../dtype.hpp"
#include "../../rule_dispatch.hpp"
#include "../../tier.hpp"
#include "kernels.cuh"
#include "work_lists.hpp"

namespace skewadam::backend::cuda {

template <class R>
struct GroupPasses {
  using Stream = typename R::stream_type;
  using Pass = void (*)(const GroupArrays&, const DeviceTask*, const TaskStep*, Stream);
  bool factored = false;
  bool clip = false;  ///< the rule clips (its finish forms sums of u^2)
  Pass statistics = nullptr;
  Pass shard_sums = nullptr;
  Pass finish = nullptr;
  Pass apply = nullptr;

  void run_all(const GroupArrays& g, const DeviceTask* tasks, const TaskStep* steps, Stream s) const {
    statistics(g, tasks, steps, s);
    finish(g, tasks, steps, s);
    apply(g, tasks, steps, s);
  }
};

namespace detail {

inline unsigned blocks(std::int32_t n) { return static_cast<unsigned>(n); }

template <class R, class Rule, class P, class G>
struct PassesOf {
  using S = typename Rule::second_moment;
  using C = typename Rule::clip;
  using Stream = typename R::stream_type;

  static void statistics(const GroupArrays& g, const DeviceTask* tasks, const TaskStep* steps, Stream s) {
    if (g.n_units > 0)
      R::template launch<&statistics_kernel<Rule, P, G>>(blocks(g.n_units), block_threads, s, tasks, steps, g.units,
                                                         g.workspace);
  }
  static void shard_sums(const GroupArrays& g, const DeviceTask* tasks, const TaskStep* steps, Stream s) {
    if constexpr (S::factored)
      if (g.n_shards > 0)
        R::template launch<&shard_sums_kernel<Rule, P, G>>(blocks(g.n_shards), block_threads, s, tasks, steps,
                                                           g.shards, static_cast<const double*>(g.workspace));
  }
  static void finish(const GroupArrays& g, const DeviceTask* tasks, const TaskStep* steps, Stream s) {
    if constexpr (S::factored) {
      if (g.n_columns > 0)
        R::template launch<&columns_kernel<Rule, P, G>>(blocks(g.n_columns), block_threads, s, tasks, steps,
                                                        g.columns, static_cast<const double*>(g.workspace));
    } else if constexpr (C::active) {
      if (g.n_tasks > 0)
        R::template launch<&finalize_kernel<Rule, P, G>>(blocks(g.n_tasks), block_threads, s, tasks, steps, g.tasks);
    }
  }
  static void apply(const GroupArrays& g, const DeviceTask* tasks, const TaskStep* steps, Stream s) {
    if constexpr (S::factored || C::active)
      if (g.n_applies > 0)
        R::template launch<&apply_kernel<Rule, P, G>>(blocks(g.n_applies), static_cast<unsigned>(apply_threads), s,
                                                      tasks, steps, g.applies);
  }
};

}  // namespace detail

/// The passes of (Rule, parameter dtype P, gradient dtype G) on runtime R.
template <class R, class Rule, class P, class G>
const GroupPasses<R>* passes_of() {
  using X = detail::PassesOf<R, Rule, P, G>;
  static const GroupPasses<R> p{Rule::second_moment::factored, Rule::clip::active, &X::statistics, &X::shard_sums,
                                &X::finish, &X::apply};
  return &p;
}

/// The passes of the rule Tiers gives tier t (rank1: a rank-1 tensor's) for
/// parameter dtype p and gradient dtype g.
template <class R, class Tiers>
const GroupPasses<R>* passes_for(Tier t, Dtype p, Dtype g, bool rank1) {
  return visit_rule<Tiers>(t, rank1, [&]<class Rule>() {
    return visit_dtypes(p, g, []<class P, class G>() { return passes_of<R, Rule, P, G>(); });
  });
}

}  // namespace skewadam::backend::cuda
