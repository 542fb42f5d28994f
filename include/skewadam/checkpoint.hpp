#pragma once
// Checkpoints: an optimizer's complete state in one file, and back.
//
//   skewadam::save_checkpoint(opt, "run/optimizer.ckpt");
//   ...
//   skewadam::SkewAdam fresh(hyper);
//   /* register the same parameters, in any order */
//   skewadam::load_checkpoint(fresh, "run/optimizer.ckpt");
//   // steps from here on give the bits an uninterrupted run would have given
//
// A checkpoint holds, per parameter and by name, its tier, dtype, shape,
// step count, rounding stream and state arrays (with their logical shapes);
// per tier the rule's identity (rule_name.hpp), state layout and
// hyperparameters; the optimizer's step count (the lr schedule's position) and
// stochastic-rounding seed; optionally the parameter values, bit for bit; and
// optional metadata strings. Not saved: gradients, the lr schedule functions
// (code: install them again, their position is restored), the thread count,
// the non-finite policy and a pending clip_grad_norm() scale.
// The format (little-endian, versioned, CRC-32C per record) is specified in
// docs/checkpoint-format.md.
//
// Saving writes a temporary file in the target's folder, flushes and fsyncs
// it, then renames it over the target: a crash at any moment leaves either the
// previous checkpoint or the new one, never a mixture.
//
// Loading reads everything into temporaries and checks it all: every name,
// tier, dtype, shape and state array against the registered parameters, every
// tier's rule against the optimizer's, every checksum. Nothing is converted:
// a bf16 parameter does not load from an f32 one. Only then is the state
// swapped in, with no step that can fail. On any error a CheckpointError says
// exactly what is wrong (all mismatches, not just the first) and the optimizer
// and the parameters are unchanged. Until it commits, loading holds a second
// copy of the state (and of the parameter values it loads). A load restores
// the saved hyperparameters and seed; change them afterwards if need be.
//
// Neither saving nor loading may run concurrently with step() on the same
// optimizer.
//
// Layout: checkpoint/format.hpp (types, constants, records), file_io.hpp
// (memory and atomic files), writer.hpp (save), reader.hpp (walk, load).

#include <cstddef>
#include <filesystem>
#include <optional>
#include <span>
#include <vector>

#include "checkpoint/file_io.hpp"
#include "checkpoint/format.hpp"
#include "checkpoint/reader.hpp"
#include "checkpoint/writer.hpp"
#include "optimizer.hpp"

namespace skewadam {

namespace detail::ckpt {
/// A checkpoint records each tier's rule by name (rule_name.hpp).
template <class Tiers>
constexpr void require_rule_names() {
  static_assert(named_tiers_v<Tiers>,
                "skewadam checkpoints: every policy of a checkpointed rule needs a name; specialise "
                "skewadam::policy_name<P> (see rule_name.hpp) for a custom policy");
}
/// The work of save_checkpoint() and checkpoint_bytes(), once per backend and
/// placement whatever the tier rules.
template <class Backend, class Placement>
void save_file(const OptimizerBase<Backend, Placement>& opt, const std::filesystem::path& file,
               const SaveOptions& options) {
  save<AtomicFileSink>(
      opt, options, [&](std::optional<AtomicFileSink>& target) { target.emplace(file); },
      [](AtomicFileSink& sink) { sink.commit(); });
}
template <class Backend, class Placement>
std::vector<std::byte> save_bytes(const OptimizerBase<Backend, Placement>& opt, const SaveOptions& options) {
  std::vector<std::byte> out;
  save<MemorySink>(
      opt, options, [&](std::optional<MemorySink>& target) { target.emplace(out); }, [](MemorySink&) {});
  return out;
}
}  // namespace detail::ckpt

// ------------------------------------------------------------------ the API
//
// For every optimizer, whatever its backend and placement. Sharded, both are
// collective: saving streams the file one parameter at a time (the ranks
// gather that parameter's complete state from its owners, rank 0 writes it),
// so no rank holds more than one complete tensor's state besides its own; a
// failure on rank 0 is raised on every rank. Loading has every rank read the
// file (a file system all ranks see) and keep its share of each parameter as
// it is read. The file is the same whatever the rank count: a run saved with
// N ranks resumes with M ranks, or in one process, and the other way round.

/// Saves `opt` to `file` atomically (temporary file, fsync, rename).
template <class Tiers, class Backend, class Placement>
void save_checkpoint(const Optimizer<Tiers, Backend, Placement>& opt, const std::filesystem::path& file,
                     const SaveOptions& options = {}) {
  detail::ckpt::require_rule_names<Tiers>();
  detail::ckpt::save_file(opt, file, options);
}

/// The bytes save_checkpoint() would write (sharded: on rank 0; nothing on
/// the other ranks).
template <class Tiers, class Backend, class Placement>
std::vector<std::byte> checkpoint_bytes(const Optimizer<Tiers, Backend, Placement>& opt,
                                        const SaveOptions& options = {}) {
  detail::ckpt::require_rule_names<Tiers>();
  return detail::ckpt::save_bytes(opt, options);
}

/// Loads `file` into `opt`, whose parameters must be those saved (by name,
/// in any order). All or nothing: see the top of this file.
template <class Tiers, class Backend, class Placement>
void load_checkpoint(Optimizer<Tiers, Backend, Placement>& opt, const std::filesystem::path& file,
                     const LoadOptions& options = {}) {
  detail::ckpt::require_rule_names<Tiers>();
  detail::ckpt::FileSource src(file);
  detail::ckpt::load(opt, src, options);
}

/// Loads a checkpoint held in memory (sharded: every rank passes the same bytes).
template <class Tiers, class Backend, class Placement>
void load_checkpoint(Optimizer<Tiers, Backend, Placement>& opt, std::span<const std::byte> bytes,
                     const LoadOptions& options = {}) {
  detail::ckpt::require_rule_names<Tiers>();
  detail::ckpt::MemorySource src(bytes, "checkpoint in memory");
  detail::ckpt::load(opt, src, options);
}

/// Reads what a checkpoint holds (checking its structure and every record
/// checksum except those of the arrays, which are skipped).
inline CheckpointInfo read_checkpoint_info(const std::filesystem::path& file) {
  detail::ckpt::FileSource src(file);
  CheckpointInfo info;
  detail::ckpt::walk(src, info, [](const CheckpointInfo&) {}, [](const CheckpointInfo::Param&) { return std::vector<void*>{}; });
  return info;
}

inline CheckpointInfo read_checkpoint_info(std::span<const std::byte> bytes) {
  detail::ckpt::MemorySource src(bytes, "checkpoint in memory");
  CheckpointInfo info;
  detail::ckpt::walk(src, info, [](const CheckpointInfo&) {}, [](const CheckpointInfo::Param&) { return std::vector<void*>{}; });
  return info;
}

}  // namespace skewadam
