#pragma once
// The optimizer underneath skewadam::libtorch::Optimizer, behind one
// interface whatever its backend and placement: Core. CoreOf<Opt> wraps any
// front-end type (optimizer.hpp) in it, written once: the CPU backend in one
// process, sharded over a process group, or the CUDA backend.
//
// Engines for tensors on a device are registered by device type (the name
// torch gives it: "cuda"), per Tiers, by the translation unit that can build
// them, in one process and sharded over a communicator (dist::AnyCommunicator,
// so that the registering unit needs no transport's headers).
// <skewadam/torch/cuda.cuh>, compiled by nvcc, registers the CUDA backend's;
// the adapter, compiled by any C++ compiler, finds them here when its
// parameters are CUDA tensors. This header needs neither LibTorch nor CUDA,
// so both kinds of translation unit include it.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../checkpoint.hpp"
#include "../comm/any_communicator.hpp"
#include "../engine/nonfinite.hpp"
#include "../engine/optimizer_options.hpp"
#include "../engine/placement/shard_plan.hpp"
#include "../engine/placement/sharded.hpp"
#include "../math/hyperparameters.hpp"
#include "../optimizer.hpp"
#include "../state/optimizer_state.hpp"
#include "../state/param_state.hpp"
#include "../types/tensor_view.hpp"
#include "../types/tier.hpp"

namespace skewadam::libtorch {

class Core {
 public:
  virtual ~Core() = default;
  virtual ParamId add(const std::string& name, Tier tier, ParamView param) = 0;
  virtual void set_hyperparameters(Tier t, const Hyperparameters& h) = 0;
  virtual Hyperparameters hyperparameters(Tier t) const = 0;
  virtual void set_grad(ParamId id, GradView g) = 0;
  virtual void clear_grad(ParamId id) = 0;
  virtual void clear_grads() noexcept = 0;
  /// One step. Device engines enqueue it and return (unless the policy is
  /// raise); last_step() then waits for the device's answer.
  virtual void step() = 0;
  virtual const StepReport& last_step() const = 0;
  /// The step inside backward (Optimizer::step(ParamId), finish_step()):
  /// one parameter now, with its gradient set; sharded, every rank then holds
  /// its complete updated values.
  virtual void step(ParamId id) = 0;
  virtual StepReport finish_step(StepEnd how) = 0;
  virtual bool step_open() const noexcept = 0;
  virtual bool stepped_in_open_step(ParamId id) const = 0;
  /// What every step inside backward would refuse (max_grad_norm...).
  virtual void check_step_inside_backward() const = 0;
  virtual std::int64_t step_count(ParamId id) const = 0;
  virtual std::int64_t steps() const = 0;
  /// The state arrays this process keeps of a parameter (in device memory
  /// for a device engine; this rank's share when sharded).
  virtual ParamStateView state(ParamId id) const = 0;
  virtual index_t state_bytes() const noexcept = 0;
  virtual index_t state_bytes(Tier t) const noexcept = 0;
  virtual std::uint64_t seed() const noexcept = 0;
  virtual std::optional<ParamId> find(std::string_view name) const = 0;
  /// Whether a gradient is set for the parameter now (none between steps).
  virtual bool has_grad(ParamId id) const = 0;
  /// A host copy of the complete state (optimizer_state.hpp; sharded:
  /// collective).
  virtual OptimizerState export_state() const = 0;
  /// Replaces the complete state with `state` (Optimizer::import_state):
  /// everything is checked first, and on error nothing changes. Sharded:
  /// collective, every rank passes the same state and keeps its share.
  virtual void import_state(OptimizerState state) = 0;
  /// The library's checkpoint (checkpoint.hpp). Sharded: collective, rank 0
  /// receives it all, the other ranks nothing.
  virtual std::vector<std::byte> checkpoint() = 0;
  /// Loads a checkpoint's state (not parameter values); all or nothing.
  /// Sharded: collective, every rank passes the same bytes.
  virtual void load(std::span<const std::byte> bytes) = 0;
  /// Writes the library's checkpoint file (skewadam::save_checkpoint).
  /// Sharded: collective, rank 0 writes.
  virtual void save_file(const std::filesystem::path& file, const SaveOptions& options) = 0;
  /// Loads a checkpoint file (skewadam::load_checkpoint); all or nothing.
  /// Sharded: collective.
  virtual void load_file(const std::filesystem::path& file, const LoadOptions& options) = 0;
  /// Before each step: a device engine follows the framework's current stream.
  virtual void before_step() {}
  virtual int rank() const noexcept { return 0; }
  virtual int ranks() const noexcept { return 1; }
  /// How the parameter's state is dealt out over the ranks; null unsharded.
  virtual const dist::TensorSplit* split(ParamId) const { return nullptr; }
};

/// Core over the front-end type Opt; `optimizer()` is the front-end itself.
template <class Opt>
class CoreOf : public Core {
 public:
  template <class... Args>
  explicit CoreOf(Args&&... args) : opt_(std::forward<Args>(args)...) {}

  Opt& optimizer() noexcept { return opt_; }
  const Opt& optimizer() const noexcept { return opt_; }

  ParamId add(const std::string& name, Tier tier, ParamView param) override { return opt_.add(name, tier, param); }
  void set_hyperparameters(Tier t, const Hyperparameters& h) override { opt_.set_hyperparameters(t, h); }
  Hyperparameters hyperparameters(Tier t) const override { return opt_.hyperparameters(t); }
  void set_grad(ParamId id, GradView g) override { opt_.set_grad(id, g); }
  void clear_grad(ParamId id) override { opt_.clear_grad(id); }
  void clear_grads() noexcept override { opt_.clear_grads(); }
  void step() override {
    opt_.step();
    if constexpr (Opt::sharded) {
      if (opt_.last_step().applied) opt_.gather_params();  // every rank: the complete parameters
    }
  }
  const StepReport& last_step() const override { return opt_.last_step(); }
  void step(ParamId id) override {
    opt_.step(id);
    if constexpr (Opt::sharded) opt_.gather_param(id);
  }
  StepReport finish_step(StepEnd how) override { return opt_.finish_step(how); }
  bool step_open() const noexcept override { return opt_.step_open(); }
  bool stepped_in_open_step(ParamId id) const override { return opt_.stepped_in_open_step(id); }
  void check_step_inside_backward() const override { opt_.check_step_inside_backward(); }
  std::int64_t step_count(ParamId id) const override { return opt_.step_count(id); }
  std::int64_t steps() const override { return opt_.steps(); }
  ParamStateView state(ParamId id) const override {
    if constexpr (Opt::sharded) return opt_.local_state(id);
    else return opt_.state(id);
  }
  index_t state_bytes() const noexcept override { return opt_.state_bytes(); }
  index_t state_bytes(Tier t) const noexcept override { return opt_.state_bytes(t); }
  std::uint64_t seed() const noexcept override { return opt_.seed(); }
  std::optional<ParamId> find(std::string_view name) const override { return opt_.find(name); }
  bool has_grad(ParamId id) const override { return opt_.grad(id).present(); }
  OptimizerState export_state() const override { return opt_.export_state(); }
  void import_state(OptimizerState state) override { opt_.import_state(std::move(state)); }
  std::vector<std::byte> checkpoint() override { return checkpoint_bytes(opt_); }
  void load(std::span<const std::byte> bytes) override {
    load_checkpoint(opt_, bytes, LoadOptions{.params = ParamValues::ignore});
  }
  void save_file(const std::filesystem::path& file, const SaveOptions& options) override {
    skewadam::save_checkpoint(opt_, file, options);
  }
  void load_file(const std::filesystem::path& file, const LoadOptions& options) override {
    skewadam::load_checkpoint(opt_, file, options);
  }
  int rank() const noexcept override {
    if constexpr (Opt::sharded) return opt_.rank();
    else return 0;
  }
  int ranks() const noexcept override {
    if constexpr (Opt::sharded) return opt_.ranks();
    else return 1;
  }
  const dist::TensorSplit* split(ParamId id) const override {
    if constexpr (Opt::sharded) return &opt_.split(id);
    else return nullptr;
  }

 private:
  Opt opt_;
};

/// Core over a front-end whose engine runs on a device (the CUDA backend),
/// built with the tensors' device in its options (OptimizerOptions::device:
/// the engine makes it current for each call that needs it, and refuses
/// another device's tensors); each step follows the framework's current
/// stream of that device, `Device::current_stream(index)`.
template <class Opt, class Device>
class DeviceCore final : public CoreOf<Opt> {
  using Base = CoreOf<Opt>;

 public:
  template <class... Args>
  explicit DeviceCore(int device, Args&&... args) : Base(std::forward<Args>(args)...), device_(device) {}

  void before_step() override {
    const auto current = Device::current_stream(device_);
    if (current != this->optimizer().engine().backend().stream())
      this->optimizer().engine().backend().set_stream(current);  // (waits for the steps on the previous one)
  }

 private:
  int device_;
};

/// Builds the Core of a device engine: per-tier hyperparameters, options
/// (seed, threads, nonfinite, max_grad_norm), the device's index.
using CoreFactory = std::unique_ptr<Core> (*)(const PerTier<Hyperparameters>&, const OptimizerOptions&, int device);
/// Builds the Core of a device engine sharded over `comm` (which outlives
/// it): the same, and how the state is dealt out.
using ShardedCoreFactory = std::unique_ptr<Core> (*)(dist::AnyCommunicator& comm, const PerTier<Hyperparameters>&,
                                                     const OptimizerOptions&, dist::ShardOptions, int device);

namespace detail {
template <class Tiers>
struct DeviceCores {
  std::mutex mutex;
  std::map<std::string, CoreFactory, std::less<>> factories;
  std::map<std::string, ShardedCoreFactory, std::less<>> sharded;
};
template <class Tiers>
DeviceCores<Tiers>& device_cores() {
  static DeviceCores<Tiers> cores;
  return cores;
}
template <class Factory>
Factory find_factory(std::mutex& mutex, const std::map<std::string, Factory, std::less<>>& in,
                     std::string_view device_type) {
  const std::lock_guard<std::mutex> lock(mutex);
  const auto it = in.find(device_type);
  return it == in.end() ? nullptr : it->second;
}
}  // namespace detail

/// Registers the engine of Tiers for tensors of `device_type` (a translation
/// unit that can build it does this at load time; see torch/cuda.cuh).
template <class Tiers>
void register_device_core(std::string device_type, CoreFactory make) {
  auto& c = detail::device_cores<Tiers>();
  const std::lock_guard<std::mutex> lock(c.mutex);
  c.factories[std::move(device_type)] = make;
}

/// Registers the sharded engine of Tiers for tensors of `device_type`.
template <class Tiers>
void register_sharded_device_core(std::string device_type, ShardedCoreFactory make) {
  auto& c = detail::device_cores<Tiers>();
  const std::lock_guard<std::mutex> lock(c.mutex);
  c.sharded[std::move(device_type)] = make;
}

/// The registered engine of Tiers for `device_type`, or null.
template <class Tiers>
CoreFactory device_core(std::string_view device_type) {
  auto& c = detail::device_cores<Tiers>();
  return detail::find_factory(c.mutex, c.factories, device_type);
}

/// The registered sharded engine of Tiers for `device_type`, or null.
template <class Tiers>
ShardedCoreFactory sharded_device_core(std::string_view device_type) {
  auto& c = detail::device_cores<Tiers>();
  return detail::find_factory(c.mutex, c.sharded, device_type);
}

}  // namespace skewadam::libtorch
