#pragma once
// Checkpoints of a sharded optimizer, in the single-process format
// (checkpoint.hpp, docs/checkpoint-format.md): state stored per parameter by
// name and logical shape, never by shard. A run saved with N ranks therefore
// resumes with M ranks, or in one process with skewadam::load_checkpoint, and
// the other way round.
//
//   skewadam::dist::save_checkpoint(opt, "run/optimizer.ckpt");   // collective; rank 0 writes
//   skewadam::dist::load_checkpoint(opt, "run/optimizer.ckpt");   // collective; every rank reads
//   auto bytes = skewadam::dist::checkpoint_bytes(opt);            // collective; rank 0's hold it all
//
// Saving streams the file one parameter at a time: the ranks gather that
// parameter's complete state arrays from their owners (every rank takes part;
// rank 0 writes them, the others drop them), so no rank ever holds more than
// one complete tensor's state besides its own share. A failure on rank 0
// (the file cannot be written) is raised as CheckpointError on every rank,
// after the gathers, and the previous file is left in place. Loading has
// every rank read the file (a file system all ranks see) and keep only its
// share of each parameter as it is read, checked exactly as load_checkpoint
// checks it; on error nothing has changed, on any rank that raised.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../checkpoint.hpp"
#include "sharded_optimizer.hpp"

namespace skewadam::dist {

namespace detail {
/// Streams `opt`'s checkpoint into the Sink that rank 0 opens (`open(target)`
/// emplaces it into the std::optional `target`; `commit(sink)` completes it);
/// collective. Every rank learns whether rank 0 succeeded, and raises if not.
template <class Sink, class Opt, class Open, class Commit>
void save_from_rank0(Opt& opt, const SaveOptions& options, Open&& open, Commit&& commit) {
  using skewadam::detail::ckpt::GuardedSink;
  if (options.include_params) opt.gather_params();
  // collective, in parameter order on every rank
  const auto fetch = [&](ParamId id) { return opt.engine().export_arrays(static_cast<std::size_t>(id.index)); };
  std::string failure;
  if (opt.rank() == 0) {
    std::optional<Sink> target;
    GuardedSink<Sink> sink(nullptr);
    try {
      open(target);
      sink = GuardedSink<Sink>(&*target);
    } catch (const std::exception& e) {
      sink.fail(e.what());
    }
    skewadam::detail::ckpt::save_with(opt, sink, options, fetch);
    failure = sink.failure();
    if (failure.empty()) {
      try {
        commit(*target);
      } catch (const std::exception& e) {
        failure = e.what();
        if (failure.empty()) failure = "saving failed";
      }
    }
  } else {
    skewadam::detail::ckpt::NullSink sink;
    skewadam::detail::ckpt::save_with(opt, sink, options, fetch);
  }
  std::uint64_t length = failure.size();
  opt.comm().broadcast(std::as_writable_bytes(std::span<std::uint64_t>(&length, 1)), 0);
  if (length == 0) return;
  failure.resize(static_cast<std::size_t>(length));
  opt.comm().broadcast(std::as_writable_bytes(std::span<char>(failure.data(), failure.size())), 0);
  throw CheckpointError(CheckpointError::Kind::io, "rank 0: " + failure);
}
}  // namespace detail

/// Saves the complete state (and, with options.include_params, the gathered
/// parameter values) to `file`; collective, rank 0 writes.
template <class Tiers, class Backend, class Comm>
void save_checkpoint(Optimizer<Tiers, Backend, Sharded<Comm>>& opt, const std::filesystem::path& file,
                     const SaveOptions& options = {}) {
  using skewadam::detail::ckpt::AtomicFileSink;
  detail::save_from_rank0<AtomicFileSink>(
      opt, options, [&](std::optional<AtomicFileSink>& target) { target.emplace(file); },
      [](AtomicFileSink& sink) { sink.commit(); });
}

/// The bytes save_checkpoint() would write: on rank 0 the complete
/// checkpoint, on every other rank nothing (collective).
template <class Tiers, class Backend, class Comm>
std::vector<std::byte> checkpoint_bytes(Optimizer<Tiers, Backend, Sharded<Comm>>& opt,
                                        const SaveOptions& options = {}) {
  using skewadam::detail::ckpt::MemorySink;
  std::vector<std::byte> out;
  detail::save_from_rank0<MemorySink>(
      opt, options, [&](std::optional<MemorySink>& target) { target.emplace(out); }, [](MemorySink&) {});
  return out;
}

/// Loads `file` (saved by either save_checkpoint, with any rank count) into
/// `opt`, whose parameters must be those saved (by name, in any order).
/// Collective; every rank reads the file. Parameter values are loaded into
/// every rank's full buffers as LoadOptions says.
template <class Tiers, class Backend, class Comm>
void load_checkpoint(Optimizer<Tiers, Backend, Sharded<Comm>>& opt, const std::filesystem::path& file,
                     const LoadOptions& options = {}) {
  skewadam::detail::ckpt::FileSource src(file);
  skewadam::detail::ckpt::load(opt, src, options);
}

/// Loads a checkpoint held in memory: every rank passes the same bytes (rank
/// 0's checkpoint_bytes(), or a file's) and keeps its share. Collective.
template <class Tiers, class Backend, class Comm>
void load_checkpoint(Optimizer<Tiers, Backend, Sharded<Comm>>& opt, std::span<const std::byte> bytes,
                     const LoadOptions& options = {}) {
  skewadam::detail::ckpt::MemorySource src(bytes, "checkpoint in memory");
  skewadam::detail::ckpt::load(opt, src, options);
}

}  // namespace skewadam::dist
