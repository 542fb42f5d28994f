#pragma once
// ShardedOptimizer<Tiers, Comm>: the optimizer front-end (optimizer.hpp) with
// its state sharded over the ranks of a communicator (engine/placement/sharded.hpp):
// data parallelism with ZeRO stage 1/2 sharding, and expert parallelism.
//
//   skewadam::mpi::MpiCommunicator comm;
//   skewadam::dist::ShardedOptimizer<skewadam::SkewAdamTiers, skewadam::mpi::MpiCommunicator> opt(comm, hyper);
//   opt.add("embed", Tier::backbone, full_param_view, full_grad_view);   // same list on every rank
//   ...
//   opt.step();            // collective: updates this rank's slices only
//   opt.gather_params();   // collective: every rank's parameters complete again
//
// Every rank registers the full parameter list (same names, tiers, shapes and
// order) with views of full-size buffers; everything the front-end checks
// and offers (the overlap check, NonFinitePolicy and StepReport, global
// gradient-norm clipping, schedules, export/import) is the same as in one
// process. A rank keeps state only for what it owns (shard_plan.hpp).
//
// Checkpoints are the single-process format (checkpoint.hpp, collective), so
// a run saved with N ranks resumes with M ranks, or in one process.

#include "../comm/communicator.hpp"
#include "../engine/backend/cpu/cpu_backend.hpp"
#include "../engine/placement/sharded.hpp"
#include "../optimizer.hpp"
#include "../tiers/tier_rules.hpp"

namespace skewadam::dist {

template <class Tiers = SkewAdamTiers, Communicator Comm = SelfCommunicator,
          class Arch = typename backend::DefaultBackend::arch>
using ShardedOptimizer = Optimizer<Tiers, backend::CpuBackend<Arch>, Sharded<Comm>>;

}  // namespace skewadam::dist
