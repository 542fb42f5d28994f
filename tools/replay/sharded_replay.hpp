#pragma once
// skewadam-replay --shard: a golden case run by the sharded placement over MPI
// (built with SKEWADAM_WITH_MPI), on the CPU backend or on the emulated CUDA
// backend (engine/backend/cuda/cuda_backend.hpp). Every rank loads the case; the parameter is
// registered as an expert bank when it has rank >= 3 (sharded by whole
// experts, or by rows with --expert-rows), else as a backbone tensor (sharded
// by rows). After every step the ranks gather the parameter, so each holds the
// whole run; rank 0 reports and writes --out.

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <skewadam/checkpoint.hpp>
#include <skewadam/dist/sharded_optimizer.hpp>
#include <skewadam/mpi/communicator.hpp>
#include <skewadam/engine/placement/sharded.hpp>
#include <skewadam_tools/golden_case.hpp>

namespace skewadam::tools {

struct ShardedReplayOptions {
  bool expert_rows = false;
  std::optional<std::int64_t> stop_after;
  std::string save;
  std::string load;
  std::string case_key;  ///< metadata key naming the case in a checkpoint
};

struct ShardedReplayResult {
  CaseRun run;
  std::int64_t first = 0;  ///< steps run: [first, last)
  std::int64_t last = 0;
  int rank = 0;
  int ranks = 1;
  std::vector<index_t> state_bytes;  ///< per rank
  index_t exchange_bytes = 0;        ///< per rank, last step
  std::string split;
};

template <class Rule, class Backend = backend::DefaultBackend>
ShardedReplayResult run_sharded_case(const GoldenCase& c, const ShardedReplayOptions& o) {
  using Comm = mpi::MpiCommunicator;
  using Opt = Optimizer<TierRules<Rule, Rule, Rule>, Backend, dist::Sharded<Comm>>;
  static mpi::Environment env;  // MPI lives until the program exits
  Comm comm;
  dist::ShardOptions shard;
  shard.experts = o.expert_rows ? dist::ExpertSharding::rows : dist::ExpertSharding::experts;
  Opt opt(comm, c.hyper, c.options(0), shard);
  const Shape shape = c.tensor_shape();
  TypedValues param = c.initial_param();
  const TypedValues grads = c.typed_grads();
  const Tier tier = c.shape.size() >= 3 ? Tier::experts : Tier::backbone;
  const ParamId id = opt.add(c.param_name, tier, param.param_view(0, shape));

  ShardedReplayResult r;
  r.rank = comm.rank();
  r.ranks = comm.size();
  switch (opt.split(id).split) {
    case dist::Split::rows: r.split = "row slices"; break;
    case dist::Split::matrices: r.split = "whole experts"; break;
    case dist::Split::whole: r.split = "whole tensor"; break;
  }
  r.last = c.steps;
  if (!o.load.empty()) {
    const CheckpointInfo info = read_checkpoint_info(o.load);
    if (const std::string* saved = info.find_metadata(o.case_key); saved && *saved != c.name)
      throw CheckpointError(CheckpointError::Kind::mismatch,
                            o.load + ": saved from case '" + *saved + "', not '" + c.name + "'");
    const std::int64_t step = saved_case_step(info);
    if (step > c.steps)
      throw CheckpointError(CheckpointError::Kind::mismatch, o.load + ": saved after step " +
                                                                 std::to_string(step) + ", the case has " +
                                                                 std::to_string(c.steps) + " steps");
    load_checkpoint(opt, o.load, LoadOptions{.params = ParamValues::require});
    r.first = step;
  }
  if (o.stop_after) {
    if (*o.stop_after < 0 || *o.stop_after > c.steps)
      throw CaseError("--stop-after " + std::to_string(*o.stop_after) + ": the case has steps 1.." +
                      std::to_string(c.steps));
    r.last = *o.stop_after;
    if (r.last < r.first)
      throw CaseError("--stop-after " + std::to_string(r.last) + ": the checkpoint is already at step " +
                      std::to_string(r.first));
  }

  const std::int64_t n = c.numel();
  r.run.params.resize(static_cast<std::size_t>(c.steps * n));
  for (std::int64_t t = r.first; t < r.last; ++t) {
    opt.set_grad(id, grads.grad_view(t * n, shape));
    opt.set_lr(c.lr_schedule[static_cast<std::size_t>(t)]);
    opt.step();
    opt.gather_params();
    param.widen(0, n, r.run.params.data() + t * n);
  }
  r.exchange_bytes = opt.last_step_exchange_bytes();

  collect_state(c, opt, id, r.run);
  r.state_bytes = opt.state_bytes_per_rank();
  if (!o.save.empty())
    save_checkpoint(opt, o.save,
                    SaveOptions{.include_params = true,
                                .metadata = {{o.case_key, c.name}, {case_step_key, std::to_string(r.last)}}});
  return r;
}

}  // namespace skewadam::tools
