// Per-rank optimizer state and communication per step of the paper's
// 6.78B-parameter MoE (skewadam-plan's preset inventory) sharded over N data-
// parallel ranks: SkewAdam's ShardedOptimizer against a flat ZeRO-sharded
// AdamW.
//
//   shard_volume [N ...]        (default: 2 8 64)
//
// The SkewAdam figures come from the shard plan the ShardedOptimizer runs
// (dist/shard_plan.hpp): the bytes it exchanges per step are exactly what
// ShardedOptimizer::last_step_exchange_bytes() measures (the MPI tests check
// the two agree), and its state is shard_state_bytes() per rank. Both
// optimizers also move the gradients (reduce-scatter) and the parameters
// (all-gather): with ring collectives, (N - 1) / N of the weights' bytes each
// way per rank, the same for both.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <skewadam/engine/placement/shard_plan.hpp>
#include <skewadam/rules.hpp>
#include <skewadam/tiers/tier_assignment.hpp>
#include <skewadam/tiers/tier_rules.hpp>
#include <skewadam_tools/model_presets.hpp>

namespace {

std::string human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", bytes, units[u]);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace skewadam;
  std::vector<int> counts;
  for (int i = 1; i < argc; ++i) {
    const int n = std::atoi(argv[i]);
    if (n < 1) {
      std::fprintf(stderr, "shard_volume: rank count '%s' must be >= 1\n", argv[i]);
      return 2;
    }
    counts.push_back(n);
  }
  if (counts.empty()) counts = {2, 8, 64};

  const std::vector<TensorSpec> model = tools::preset_inventory("paper-6.78b");
  const TierAssigner tiers;
  index_t weights = 0, numel = 0;
  for (const TensorSpec& t : model) {
    weights += t.weights_bytes();
    numel += t.numel();
  }
  std::printf("paper-6.78b: %zu tensors, %lld parameters, %s of weights\n\n", model.size(),
              static_cast<long long>(numel), human(static_cast<double>(weights)).c_str());
  std::printf("%6s  %-24s %16s %16s %22s %22s\n", "ranks", "optimizer", "state per rank", "(largest rank)",
              "optimizer exchange", "grads + params");
  for (int n : counts) {
    std::vector<index_t> state(static_cast<std::size_t>(n), 0);
    index_t exchange = 32;  // the step's agreement and non-finite check
    index_t whole = 0;
    for (const TensorSpec& t : model) {
      const Tier tier = tiers.assign(t.name);
      const StateLayout layout = SkewAdamTiers::layout(tier);
      const dist::TensorSplit s =
          dist::split_for(tier, t.shape, layout, n, dist::ExpertSharding::experts, whole);
      if (s.split == dist::Split::whole) ++whole;
      const dist::ExchangeBytes x = dist::exchange_bytes(s, /*clip_active=*/true, /*scope_per_matrix=*/false);
      exchange += x.statistics + x.clip;
      for (int r = 0; r < n; ++r) state[static_cast<std::size_t>(r)] += dist::shard_state_bytes(s, layout, r);
    }
    index_t total = 0;
    for (index_t b : state) total += b;
    const index_t largest = *std::max_element(state.begin(), state.end());
    // each rank sends its contribution once and receives everyone else's
    const double received = static_cast<double>(exchange) * (n - 1);
    const double moved = 2.0 * static_cast<double>(weights) * (n - 1) / n;
    const double adamw_state = 8.0 * static_cast<double>(numel) / n;
    std::printf("%6d  %-24s %16s %16s %13s sent, %s in %22s\n", n, "SkewAdam (sharded)",
                human(static_cast<double>(total) / n).c_str(), human(static_cast<double>(largest)).c_str(),
                human(static_cast<double>(exchange)).c_str(), human(received).c_str(), human(moved).c_str());
    std::printf("%6d  %-24s %16s %16s %22s %22s\n", n, "AdamW (flat ZeRO-1/2)", human(adamw_state).c_str(),
                human(adamw_state).c_str(), "8 B (grad norm)", human(moved).c_str());
  }
  std::printf("\nstate: fp32 optimizer state held by each rank (SkewAdam: mean over ranks, and its largest rank);\n"
              "optimizer exchange: bytes per step each rank sends for the optimizer's own statistics (column sums\n"
              "of the backbone and router matrices, clip sums), and receives from the other ranks;\n"
              "grads + params: reduce-scatter of the gradients and all-gather of the parameters per rank, both\n"
              "optimizers, ring collectives.\n");
  return 0;
}
