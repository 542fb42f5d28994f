#pragma once
// Checkpoints of a ShardedOptimizer, in the single-process format
// (checkpoint.hpp, docs/checkpoint-format.md): state stored per parameter by
// name and logical shape, never by shard. A run saved with N ranks therefore
// resumes with M ranks, or in one process with skewadam::load_checkpoint, and
// the other way round.
//
//   skewadam::dist::save_checkpoint(opt, "run/optimizer.ckpt");   // collective; rank 0 writes
//   skewadam::dist::load_checkpoint(opt, "run/optimizer.ckpt");   // collective; every rank reads
//
// Saving gathers the complete state on every rank (export_state), and rank 0
// writes it through a single-process Optimizer holding the same parameters;
// a failure on rank 0 is raised as CheckpointError on every rank. Loading has
// every rank read the file (a file system all ranks see) into a
// single-process Optimizer, checked exactly as load_checkpoint checks it, and
// keep its own share; on error nothing has changed, on any rank that raised.
// Both hold the complete state of the model once while they run.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "../checkpoint.hpp"
#include "sharded_optimizer.hpp"

namespace skewadam::dist {

namespace detail {

/// A single-process optimizer holding `opt`'s parameters (full views) with
/// `opt`'s settings.
template <class Tiers, class Backend, class Comm>
auto single_process_mirror(const Optimizer<Tiers, Backend, Sharded<Comm>>& opt) {
  using Single = Optimizer<Tiers, Backend, Local>;
  PerTier<Hyperparameters> h;
  for (Tier t : all_tiers) h[t] = opt.hyperparameters(t);
  auto mirror = std::make_unique<Single>(h, OptimizerOptions{.seed = opt.seed(), .threads = 1});
  for (index_t i = 0; i < opt.size(); ++i) {
    const ParamId id{i};
    mirror->add(opt.name(id), opt.tier(id), opt.param(id));
  }
  return mirror;
}

}  // namespace detail

/// Saves the complete state (and, with options.include_params, the gathered
/// parameter values) to `file`; collective, rank 0 writes.
template <class Tiers, class Backend, class Comm>
void save_checkpoint(Optimizer<Tiers, Backend, Sharded<Comm>>& opt, const std::filesystem::path& file,
                     const SaveOptions& options = {}) {
  OptimizerState full = opt.export_state();
  if (options.include_params) opt.gather_params();
  std::string failure;
  if (opt.rank() == 0) {
    try {
      auto mirror = detail::single_process_mirror(opt);
      mirror->import_state(std::move(full));
      skewadam::save_checkpoint(*mirror, file, options);
    } catch (const std::exception& e) {
      failure = e.what();
      if (failure.empty()) failure = "saving failed";
    }
  }
  // every rank learns whether rank 0 succeeded
  std::uint64_t length = failure.size();
  opt.comm().broadcast(std::as_writable_bytes(std::span<std::uint64_t>(&length, 1)), 0);
  if (length == 0) return;
  failure.resize(static_cast<std::size_t>(length));
  opt.comm().broadcast(std::as_writable_bytes(std::span<char>(failure.data(), failure.size())), 0);
  throw CheckpointError(CheckpointError::Kind::io, "rank 0: " + failure);
}

/// Loads `file` (saved by either save_checkpoint, with any rank count) into
/// `opt`, whose parameters must be those saved (by name, in any order).
/// Collective; every rank reads the file. Parameter values are loaded into
/// every rank's full buffers as LoadOptions says.
template <class Tiers, class Backend, class Comm>
void load_checkpoint(Optimizer<Tiers, Backend, Sharded<Comm>>& opt, const std::filesystem::path& file,
                     const LoadOptions& options = {}) {
  auto mirror = detail::single_process_mirror(opt);
  skewadam::load_checkpoint(*mirror, file, options);
  opt.import_state(mirror->export_state());
}

}  // namespace skewadam::dist
