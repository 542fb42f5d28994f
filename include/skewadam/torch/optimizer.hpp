#pragma once
// SkewAdam as a torch::optim::Optimizer (LibTorch 1.13 and 2.x; CPU or CUDA tensors).
//
//   #include <skewadam/torch/optimizer.hpp>
//
//   skewadam::libtorch::Options options;
//   options.hyperparameters.backbone = {.lr = 3e-4, .weight_decay = 0.05};
//   options.hyperparameters.experts = {.lr = 3e-4, .weight_decay = 0.05};
//   options.hyperparameters.router = {.lr = 3e-4};
//   options.max_grad_norm = 1.0;
//   skewadam::libtorch::SkewAdam optimizer(model->named_parameters(), options);
//   ...
//   optimizer.zero_grad();
//   loss.backward();
//   optimizer.step();
//
// Tiers come from parameter names through ordered rules (tier_assignment.hpp):
// `experts` -> experts; `router`, or a name component that is exactly `gate`
// (the MoE layer's own gating projection, not an expert's `gate_proj`) ->
// router; everything else -> backbone. Options::tier_rules overrides them;
// with the defaults off, a name that matches no rule is an error.
//
// The optimizer holds one torch param group per tier, in the order backbone,
// experts, router (a group may be empty). A group's options are that tier's
// Hyperparameters, so torch learning-rate schedulers and code that edits
// `param_groups()[i].options()` work as usual; they are read at every step.
//
// Parameters: contiguous tensors of float32, bfloat16 or float16, all on one
// device, whose storage stays where it was when the optimizer was built
// (create the optimizer after `model->to(...)`). CPU tensors step on the CPU
// backend. CUDA tensors step on the CUDA backend, on torch's current stream,
// without waiting for it, once one translation unit of the program compiled
// by nvcc includes <skewadam/torch/cuda.cuh> (see there); step counts then
// stay on the device and last_step(), steps() and param_state() read them
// when asked. The data is updated in place, exactly as
// skewadam::Optimizer updates it. A parameter whose .grad() is undefined is
// skipped that step: its state and step count do not change. A gradient may
// be float32 or the parameter's dtype; a non-contiguous one is copied first.
// A tensor registered under two names (tied weights) is updated once, under
// its first name. A step with a NaN or infinite gradient is skipped as a whole
// by default (Options::nonfinite; last_step() says which gradient).
//
// state(): one ParamState per parameter, whose tensors view the optimizer's
// own state (no copy). save()/load() write and read the complete state through
// torch::serialize archives (torch::save(optimizer, ...) works too): the
// archive carries the library's own checkpoint (checkpoint.hpp,
// docs/checkpoint-format.md) as one byte tensor, so a state saved through
// torch loads with skewadam::load_checkpoint and back; load() checks every
// name, tier, rule, dtype and shape before it changes anything, and a resumed
// run continues bit for bit. save_checkpoint()/load_checkpoint() write and
// read the library's checkpoint file itself, the one skewadam::save_checkpoint
// writes in C++ (and the Python package's skewadam.save_checkpoint).
//
// Sharding over a torch process group (Options::process_group, with LibTorch
// built with distributed support): every rank builds the optimizer with the
// same parameters, holds the averaged gradients (as after DDP's all-reduce)
// and calls step() together; each rank keeps the state of its share only
// (backbone and router tensors by row slices, expert banks by whole experts:
// dist/shard_plan.hpp), and after step() every rank holds the complete
// updated parameters, as torch's ZeroRedundancyOptimizer does. state() then
// views this rank's share (flat tensors, its pieces in order). To save,
// every rank calls consolidate_checkpoint(), then rank 0 saves (torch::save);
// to load, every rank loads that archive. The archive is the single-process
// one, so a sharded run resumes in one process, or with another rank count.
// CUDA tensors shard the same way, through the sharded CUDA engine that
// torch/cuda.cuh registers (an NCCL group's bytes staged through the
// parameters' device).
//
// This header is not part of <skewadam/skewadam.hpp>: it needs LibTorch.
//
// Layout: options.hpp (Options, GroupOptions), tensors.hpp (dtypes, shapes,
// views, ParamState), archive.hpp (the torch::serialize archive), core.hpp
// (the library's optimizer behind one interface), this file (the class).

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>
#include <torch/serialize/archive.h>
#include <torch/version.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../checkpoint.hpp"
#include "../engine/nonfinite.hpp"
#include "../math/hyperparameters.hpp"
#include "../optimizer.hpp"
#include "../rules/decode_momentum.hpp"
#include "../state/optimizer_state.hpp"
#include "../state/param_state.hpp"
#include "../state/state_layout.hpp"
#include "../tiers/tier_assignment.hpp"
#include "../tiers/tier_rules.hpp"
#include "../tiers/tier_table.hpp"
#include "../tiers/variants.hpp"
#include "../types/shape.hpp"
#include "../types/tensor_view.hpp"
#include "../types/tier.hpp"
#include "archive.hpp"
#include "backward_pass.hpp"
#include "core.hpp"
#include "options.hpp"
#include "tensors.hpp"

namespace skewadam::libtorch {

/// Everything of the adapter but which rule each tier follows: the optimizer
/// underneath comes from CoreMakers and the tiers' state layouts from a
/// TierTable, so that this class, torch-heavy, is compiled once for every
/// TierRules alias. Optimizer<Tiers, Backend> (below) is the class to use.
class OptimizerBase : public ::torch::optim::Optimizer {
 public:
  using NamedParameters = ::torch::OrderedDict<std::string, at::Tensor>;

 protected:
  /// How the optimizer underneath is built for one TierRules alias and
  /// backend: a registered device engine (torch/core.hpp), else the CPU
  /// backend's, in one process or sharded over a process group.
  struct CoreMakers {
    CoreFactory (*device)(std::string_view device_type);
    std::unique_ptr<Core> (*cpu)(const PerTier<Hyperparameters>&, const skewadam::OptimizerOptions&);
#if SKEWADAM_TORCH_DISTRIBUTED
    ShardedCoreFactory (*sharded_device)(std::string_view device_type);
    std::unique_ptr<Core> (*cpu_sharded)(ProcessGroupCommunicator&, const PerTier<Hyperparameters>&,
                                         const skewadam::OptimizerOptions&, dist::ShardOptions);
#endif
  };

  static std::vector<std::pair<std::string, at::Tensor>> to_pairs(const NamedParameters& d) {
    std::vector<std::pair<std::string, at::Tensor>> v;
    v.reserve(d.size());
    for (const auto& item : d) v.emplace_back(item.key(), item.value());
    return v;
  }

  OptimizerBase(const std::vector<std::pair<std::string, at::Tensor>>& named_parameters, Options options,
                const CoreMakers& makers, const TierTable& tiers)
      : ::torch::optim::Optimizer(std::vector<::torch::optim::OptimizerParamGroup>{},
                                  std::make_unique<GroupOptions>(Tier::backbone, options.hyperparameters.backbone)),
        makers_(&makers),
        tiers_(&tiers),
        rules_(std::move(options.tier_rules)),
        max_grad_norm_(skewadam::detail::checked_max_grad_norm(options.max_grad_norm, "Options.max_grad_norm")),
        clip_norm_(skewadam::detail::checked_clip_norm(options.clip_norm, "Options.clip_norm")) {
    for (Tier t : all_tiers)
      validate(options.hyperparameters[t], "Options.hyperparameters." + std::string(tier_name(t)));
    device_ = device_of(named_parameters);
    core_ = make_core(options);

    PerTier<std::vector<at::Tensor>> groups;
    std::vector<std::unique_ptr<ParamState>> states;
    for (const auto& [name, tensor] : named_parameters) {
      const std::string who = "parameter '" + name + "'";
      if (name.empty()) throw std::invalid_argument("named_parameters: a parameter has an empty name");
      if (core_->find(name)) throw std::invalid_argument(who + ": the name appears twice");
      if (!tensor.defined()) throw std::invalid_argument(who + ": undefined tensor");
      if (by_impl_.count(tensor.unsafeGetTensorImpl())) continue;  // tied: already registered
      Param p;
      p.name = name;
      p.tensor = tensor;
      p.tier = rules_.assign(name);
      check_param_tensor(p, who, true);
      p.dtype = detail::dtype_of_tensor(tensor, who);
      p.shape = detail::shape_of_tensor(tensor, who);
      p.data = tensor.data_ptr();
      p.id = core_->add(p.name, p.tier, detail::param_view(p.tensor, p.dtype, p.shape));
      auto state = std::make_unique<ParamState>();
      state->name = p.name;
      state->tier = p.tier;
      p.state = state.get();
      states.push_back(std::move(state));
      by_impl_.emplace(tensor.unsafeGetTensorImpl(), params_.size());
      groups[p.tier].push_back(tensor);
      params_.push_back(std::move(p));
    }
    for (Tier t : all_tiers)
      add_param_group(::torch::optim::OptimizerParamGroup(
          groups[t], std::make_unique<GroupOptions>(t, options.hyperparameters[t])));
    // after the groups: add_param_group refuses parameters that have state
    for (std::size_t i = 0; i < params_.size(); ++i)
      state_[detail::state_key_of<detail::TorchStateKey>(params_[i].tensor)] = std::move(states[i]);
    refresh_views();
  }

 public:
  OptimizerBase(const OptimizerBase&) = delete;
  OptimizerBase& operator=(const OptimizerBase&) = delete;
  OptimizerBase(OptimizerBase&&) = delete;  // the backward hooks point at it
  OptimizerBase& operator=(OptimizerBase&&) = delete;
  ~OptimizerBase() override { remove_backward_hooks(); }

  // ------------------------------------------------------------------ step
  /// One update of every parameter that has a gradient. With a closure, runs
  /// it first (with gradients enabled) and returns its loss. A step with a
  /// non-finite gradient is skipped or raises, as Options::nonfinite says;
  /// last_step() tells which. On a device the step is enqueued on the
  /// framework's current stream and step() does not wait for it (except
  /// under NonFinitePolicy::raise, which must know before returning).
  ///
  /// After step_in_backward(), backward has already stepped each parameter
  /// whose gradient it completed; step() then steps those that still hold a
  /// gradient (set by hand) and ends the optimizer step (finish_step). The
  /// same holds after step_parameter(). After a backward that raised part
  /// way, step() only ends the step it opened (last_step().interrupted): the
  /// gradients that backward left are not stepped (zero_grad() drops them).
  at::Tensor step(LossClosure closure = nullptr) override {
    at::Tensor loss;
    if (closure) {
      at::AutoGradMode enable_grad(true);
      loss = closure();
    }
    if (passes_.cut()) {
      close_open_step();
      return loss;
    }
    if (in_backward_ || core_->step_open()) {
      for (std::size_t i = 0; i < params_.size(); ++i)
        if (params_[i].tensor.grad().defined() && !(core_->step_open() && core_->stepped_in_open_step(params_[i].id)))
          step_one(i);
      if (core_->step_open()) {
        (void)core_->finish_step(StepEnd::completed);
        return loss;
      }
    }
    begin_step();
    try {
      for (Param& p : params_) {
        check_param_tensor(p, "parameter '" + p.name + "'", false);
        p.stepping = bind_grad(p);
      }
      core_->before_step();
      core_->step();
    } catch (...) {
      core_->clear_grads();  // never keep views of gradients past this call
      throw;
    }
    core_->clear_grads();
    // a parameter that had a gradient is taken as written (the step may still
    // be running on a device; param_state() and last_step() read its answer)
    for (Param& p : params_)
      if (p.stepping) p.tensor.unsafeGetTensorImpl()->bump_version();
    return loss;
  }

  /// The step inside backward (on = true): from now on a hook on each
  /// parameter's gradient accumulator steps that parameter as soon as
  /// backward has completed its gradient, and then frees the gradient, so
  /// that no more than a few gradients are alive at once instead of all of
  /// them. step() after backward ends the optimizer step. The bits are those
  /// of the plain step().
  ///
  /// - What needs every gradient is refused here, up front
  ///   (std::invalid_argument: max_grad_norm by the current norm, a pending
  ///   clip scale), and a parameter another optimizer already steps inside
  ///   backward. Options::clip_norm = ClipNorm::previous clips by the
  ///   previous step's norm instead, inside backward.
  /// - Frozen parameters (requires_grad false) are left alone, as torch's
  ///   optimizers leave them.
  /// - Non-finite gradients skip their own tensor alone (last_step() after
  ///   step() names the first and counts them); under NonFinitePolicy::raise
  ///   the hook throws out of backward, and the offending gradient is freed
  ///   with the others it consumed.
  /// - A backward that raises part way (out of memory, a failing function)
  ///   leaves stepped what it stepped: zero_grad(), step() or the next
  ///   backward's first hook ends that optimizer step, whose report says so
  ///   (StepReport::interrupted, stepped, not_stepped). Training goes on.
  /// - Gradients are not accumulated over several backward passes in this
  ///   mode: each backward steps what it reaches. A second backward before
  ///   step() is refused by its first hook (std::logic_error), before it
  ///   changes anything.
  ///
  /// on = false removes the hooks (so does the destructor).
  void step_in_backward(bool on = true) {
    if (!on) {
      remove_backward_hooks();
      return;
    }
    if (in_backward_) return;
    check_step_inside_backward();
    std::vector<Hook> added;
    try {
      for (std::size_t i = 0; i < params_.size(); ++i) {
        const at::Tensor& t = params_[i].tensor;
        if (!t.requires_grad()) continue;  // frozen: backward never completes a gradient
        std::shared_ptr<::torch::autograd::Node> acc = ::torch::autograd::impl::grad_accumulator(t);
        if (!acc) throw std::invalid_argument("parameter '" + params_[i].name + "': not a leaf tensor");
        const std::uintptr_t key = acc->add_post_hook(std::make_unique<BackwardHook>(this, i));
        added.push_back(Hook{std::move(acc), key});
      }
    } catch (...) {
      for (Hook& h : added) h.node->del_post_hook(h.key);
      throw;
    }
    hooks_ = std::move(added);
    in_backward_ = true;
  }
  /// Whether the step inside backward is on (step_in_backward()).
  bool steps_in_backward() const noexcept { return in_backward_; }
  /// What a step_in_backward() hook does, for a hook of the caller's own (the
  /// Python package's): steps the named parameter now with its gradient,
  /// which it then frees; step() ends the optimizer step.
  void step_parameter(const std::string& name) { backward_hook(index_of(name)); }

  /// Ends an optimizer step that a step inside backward left open (as
  /// zero_grad() does before it zeroes): as cut short when the last backward
  /// raised part way, else as completed. last_step() then reports it.
  void end_open_step() { close_open_step(); }
  /// Throws what step_in_backward() refuses up front (std::invalid_argument):
  /// what needs every gradient (max_grad_norm by the current norm, a pending clip scale); a
  /// parameter another optimizer already steps inside backward; a parameter
  /// whose gradient is reduced between processes after backward completes
  /// it (a DistributedDataParallel module's: its reducer's hook on the
  /// gradient accumulator), which a hook would step unreduced.
  void check_step_inside_backward() const {
    core_->check_step_inside_backward();
    for (const Param& p : params_) {
      if (!p.tensor.requires_grad()) continue;
      const std::shared_ptr<::torch::autograd::Node> acc = ::torch::autograd::impl::grad_accumulator(p.tensor);
      if (!acc) continue;
      for (const auto& h : acc->post_hooks()) {
        if (const auto* other = dynamic_cast<const BackwardHook*>(h.get()); other != nullptr && other->owner != this)
          throw std::invalid_argument("parameter '" + p.name +
                                      "': another optimizer already steps it inside backward (turn that one's step "
                                      "inside backward off, or destroy it, first)");
        if (dynamic_cast<const ::torch::autograd::utils::LambdaPostHook*>(h.get()) != nullptr)
          throw std::invalid_argument(
              "parameter '" + p.name +
              "': its gradient is reduced between processes after backward completes it (a DistributedDataParallel "
              "module holds it), and the step inside backward would step it unreduced; use the plain step() with "
              "DDP, or shard the optimizer over the process group instead of DDP");
      }
    }
  }

  /// Zeroes the gradients (set_to_none: frees them), as torch's zero_grad,
  /// after ending an optimizer step that a step inside backward left open:
  /// one cut short by an exception (its report says so), or one whose step()
  /// was not called.
  void zero_grad(bool set_to_none = true) {
    end_open_step();
    for (auto& group : param_groups())
      for (auto& p : group.params()) {
        if (!p.mutable_grad().defined()) continue;
        if (set_to_none) {
          p.mutable_grad().reset();
        } else {
          p.mutable_grad().detach_();
          p.mutable_grad().zero_();
        }
      }
  }

  /// What the last step() did: applied, or skipped for a non-finite gradient
  /// (which one, where) under NonFinitePolicy::skip_step. On a device it
  /// waits for the step to be decided.
  const StepReport& last_step() const { return core_->last_step(); }

  // ------------------------------------------------------------ inspection
  /// The tier a name is assigned by this optimizer's rules.
  Tier tier_of(std::string_view name) const { return rules_.assign(name); }
  /// Registered parameters, in registration order.
  std::vector<std::string> names() const {
    std::vector<std::string> n;
    n.reserve(params_.size());
    for (const Param& p : params_) n.push_back(p.name);
    return n;
  }
  /// The tier a registered parameter is in.
  Tier tier(const std::string& name) const { return params_[index_of(name)].tier; }
  /// A registered parameter's shape.
  const Shape& shape(const std::string& name) const { return params_[index_of(name)].shape; }
  /// How a parameter's state is dealt out over the ranks of
  /// Options::process_group (dist/shard_plan.hpp): which rows or experts this
  /// rank keeps.
  const dist::TensorSplit& split(const std::string& name) const {
    const dist::TensorSplit* s = core_->split(params_[index_of(name)].id);
    if (s == nullptr)
      throw std::logic_error("split('" + name + "'): this optimizer is not sharded (Options::process_group is null)");
    return *s;
  }
  /// The state of a registered parameter (its step count read now; on a
  /// device that waits for the steps enqueued so far).
  const ParamState& param_state(const std::string& name) const {
    const Param& p = params_[index_of(name)];
    p.state->step = core_->step_count(p.id);
    return *p.state;
  }
  /// A parameter's first moment decoded to fp32, in its shape, on the CPU
  /// (a copy; the state of a rule that stores it in bf16 or 8 bits is its
  /// words, param_state(name).m); undefined for a rule without momentum.
  /// Sharded: the complete momentum, gathered (collective).
  at::Tensor momentum(const std::string& name) const {
    const Param& p = params_[index_of(name)];
    const StateLayout layout = (*tiers_)[p.tier].layout;
    if (!layout.momentum || p.shape.numel() == 0) return {};
    std::vector<float> words;
    if (sharded()) {
      words = core_->export_state().params[static_cast<std::size_t>(p.id.index)].state.m;
    } else {
      const at::Tensor host = param_state(name).m.to(at::kCPU).contiguous();
      words.assign(host.data_ptr<float>(), host.data_ptr<float>() + host.numel());
    }
    const std::vector<float> values = decode_momentum(layout.storage, p.shape.matrices(), words);
    at::Tensor out = at::empty(std::vector<std::int64_t>(p.shape.begin(), p.shape.end()), at::kFloat);
    std::memcpy(out.data_ptr<float>(), values.data(), 4 * values.size());
    return out;
  }
  /// The device the parameters and the state are on.
  at::Device device() const noexcept { return device_; }
  /// What tier t's rule keeps and is called (tier_table.hpp).
  const TierFacts& tier_facts(Tier t) const { return (*tiers_)[t]; }
  /// The optimizer underneath, whatever its backend and placement.
  const Core& engine_core() const noexcept { return *core_; }
  /// Whether the state is sharded over Options::process_group.
  bool sharded() const noexcept { return core_->ranks() > 1 || comm_ != nullptr; }
  /// This process's rank in the group, and the group's size (0 and 1 unsharded).
  int rank() const noexcept { return core_->rank(); }
  int ranks() const noexcept { return core_->ranks(); }
  /// Optimizer state bytes (docs/spec.md §2) this process keeps, total and per
  /// tier (sharded: this rank's share).
  index_t state_bytes() const noexcept { return core_->state_bytes(); }
  index_t state_bytes(Tier t) const noexcept { return core_->state_bytes(t); }
  /// The options of a tier's param group (its hyperparameters).
  GroupOptions& group_options(Tier t) { return static_cast<GroupOptions&>(param_groups_.at(group_index(t)).options()); }
  const GroupOptions& group_options(Tier t) const {
    return static_cast<const GroupOptions&>(param_groups_.at(group_index(t)).options());
  }
  /// Sets the learning rate of every tier.
  void set_lr(double lr) {
    if (!(lr >= 0.0) || !std::isfinite(lr))
      throw std::invalid_argument("lr = " + std::to_string(lr) + ": must be finite and >= 0");
    for (Tier t : all_tiers) group_options(t).set_lr(lr);
  }
  double max_grad_norm() const noexcept { return max_grad_norm_; }
  ClipNorm clip_norm() const noexcept { return clip_norm_; }
  std::uint64_t seed() const noexcept { return core_->seed(); }
  /// Steps taken so far (on a device, read when asked).
  std::int64_t steps() const { return core_->steps(); }

  // --------------------------------------------------------- save and load
  /// Writes the complete state as the library's checkpoint (checkpoint.hpp:
  /// per parameter by name its tier, dtype, shape, step count, rounding stream
  /// and state arrays; per tier its rule and the param group's
  /// hyperparameters; the step count and seed), in one byte tensor on the
  /// CPU, whatever the device: it loads on any device.
  /// Sharded: only on rank 0, after consolidate_checkpoint() (and no step
  /// since); elsewhere it throws std::logic_error and writes nothing.
  void save(::torch::serialize::OutputArchive& archive) const override {
    check_no_open_step("save");
    check_groups();
    std::vector<std::byte> local;
    const std::vector<std::byte>* source = &local;
    if (sharded()) {
      if (rank() != 0)
        throw std::logic_error("save: rank " + std::to_string(rank()) +
                               " of a sharded optimizer; rank 0 saves, after every rank called consolidate_checkpoint()");
      if (!consolidated_)
        throw std::logic_error("save: a sharded optimizer saves what consolidate_checkpoint() gathered; call it on "
                               "every rank first (and again after a step)");
      source = &*consolidated_;
    } else {
      push_groups();
      local = core_->checkpoint();
    }
    detail::write_archive(archive, *source);
  }

  /// A host copy of the complete state (optimizer_state.hpp), with the
  /// param groups' hyperparameters; parameters in registration order
  /// (names()). Sharded: collective, every rank receives all of it.
  OptimizerState export_state() const {
    check_no_open_step("export_state");
    push_groups();
    return core_->export_state();
  }

  /// Replaces the complete state with `state` (parameters in registration
  /// order, as export_state() gives them; its hyperparameters become the
  /// param groups' options). Everything is checked first: on error
  /// std::invalid_argument names the problem and nothing changes. As after
  /// load(), tensors taken from state() or param_state() before no longer
  /// view the optimizer's state. Sharded: collective, every rank passes the
  /// same state.
  void import_state(OptimizerState state) {
    check_no_open_step("import_state");
    check_groups();
    core_->import_state(std::move(state));
    state_replaced();
  }

  /// Sharded: gathers the complete checkpoint onto rank 0 for save()
  /// (collective; the other ranks keep nothing). Unsharded: nothing to do.
  void consolidate_checkpoint() {
    check_no_open_step("consolidate_checkpoint");
    if (!sharded()) return;
    push_groups();
    std::vector<std::byte> bytes = core_->checkpoint();
    if (rank() == 0) consolidated_ = std::move(bytes);
  }

  /// Reads what save() wrote (or the bytes of skewadam::save_checkpoint of an
  /// optimizer with the same parameters), on any device. Everything is
  /// checked against the registered parameters first (load_checkpoint); on
  /// any mismatch it throws std::invalid_argument saying what differs, and
  /// nothing changes. The state arrays are replaced: tensors taken from
  /// state() or param_state() before load() no longer view the optimizer's
  /// state. Sharded: collective, every rank loads the same archive (rank
  /// 0's) and keeps its share.
  void load(::torch::serialize::InputArchive& archive) override {
    check_no_open_step("load");
    const at::Tensor bytes = detail::read_archive(archive);
    try {
      core_->load(detail::bytes_of(bytes));
    } catch (const CheckpointError& e) {
      throw std::invalid_argument(std::string("archive: ") + e.what());
    }
    state_replaced();
  }

  /// Writes the complete state as the library's checkpoint file, exactly as
  /// skewadam::save_checkpoint writes it for the C++ optimizer over the same
  /// parameters (the param groups' hyperparameters are the tiers'), so a run
  /// saved here resumes in C++ and the other way round, bit for bit.
  /// `options.include_params` also stores the parameter values. Atomic (a
  /// temporary file renamed over `file`). Sharded: collective, rank 0 writes.
  void save_checkpoint(const std::filesystem::path& file, const SaveOptions& options = {}) {
    check_no_open_step("save_checkpoint");
    push_groups();
    core_->save_file(file, options);
  }

  /// Loads a checkpoint file written by save_checkpoint() here or by
  /// skewadam::save_checkpoint in C++ (the same parameters by name, in any
  /// order): the state, the step count, the seed and the tiers'
  /// hyperparameters (which become the param groups' options), and the
  /// parameter values where the file holds them (`options`). All or nothing:
  /// on any mismatch it throws CheckpointError saying what differs, and
  /// nothing changes. Tensors taken from state() or param_state() before no
  /// longer view the optimizer's state. Sharded: collective.
  void load_checkpoint(const std::filesystem::path& file, const LoadOptions& options = {}) {
    check_no_open_step("load_checkpoint");
    check_groups();
    core_->load_file(file, options);
    state_replaced();
  }

 private:
  struct Param {
    std::string name;
    at::Tensor tensor;
    Tier tier = Tier::backbone;
    Dtype dtype = Dtype::f32;
    Shape shape{};
    void* data = nullptr;
    ParamId id{};
    ParamState* state = nullptr;  // owned by state_
    bool stepping = false;        // had a gradient in the last step()
  };

  /// Steps parameter `index` once its gradient accumulator has run.
  struct BackwardHook final : ::torch::autograd::FunctionPostHook {
    BackwardHook(OptimizerBase* o, std::size_t i) : owner(o), index(i) {}
    ::torch::autograd::variable_list operator()(const ::torch::autograd::variable_list& outputs,
                                                const ::torch::autograd::variable_list&) override {
      owner->backward_hook(index);
      return outputs;
    }
    OptimizerBase* owner;
    std::size_t index;
  };
  struct Hook {
    std::shared_ptr<::torch::autograd::Node> node;  // kept alive: a tensor holds its accumulator weakly
    std::uintptr_t key = 0;
  };
  void remove_backward_hooks() noexcept {
    for (Hook& h : hooks_) h.node->del_post_hook(h.key);
    hooks_.clear();
    in_backward_ = false;
  }

  /// What every step begins with: the groups' hyperparameters.
  void begin_step() {
    push_groups();
    consolidated_.reset();  // a consolidated checkpoint is of the state before this step
    grad_copies_.clear();   // a device step's: no longer read (this step is on the same stream)
  }

  /// Hands p's gradient to the core (checked); false when it has none.
  bool bind_grad(Param& p) {
    const at::Tensor& g = p.tensor.grad();
    if (!g.defined()) {
      core_->clear_grad(p.id);
      return false;
    }
    const std::string who = "gradient of '" + p.name + "'";
    if (g.layout() != at::kStrided) throw std::invalid_argument(who + ": sparse gradients are not supported");
    if (g.device() != device_)
      throw std::invalid_argument(who + ": on " + g.device().str() + "; it must be on the parameter's device (" +
                                  device_.str() + ")");
    if (g.sizes() != p.tensor.sizes()) throw std::invalid_argument(who + ": its sizes differ from the parameter's");
    const Dtype gd = detail::dtype_of_tensor(g, who);
    if (gd != Dtype::f32 && gd != p.dtype)
      throw std::invalid_argument(who + ": dtype " + std::string(dtype_name(gd)) +
                                  " must be float32 or the parameter's (" + std::string(dtype_name(p.dtype)) + ")");
    const at::Tensor* src = &g;
    if (!g.is_contiguous()) {
      grad_copies_.push_back(g.contiguous());
      src = &grad_copies_.back();
    }
    core_->set_grad(p.id, detail::grad_view(*src, gd, p.shape));
    return true;
  }

  /// A step_in_backward() hook: parameter i's gradient is complete. Ends
  /// the optimizer step a cut-short backward left open, refuses a second
  /// backward before step() (accumulation) and a gradient completed twice in
  /// one backward, then steps it.
  void backward_hook(std::size_t i) {
    switch (passes_.classify()) {
      case detail::BackwardPasses::Pass::running:
        break;
      case detail::BackwardPasses::Pass::after_a_cut:
        close_open_step();
        passes_.begin();
        break;
      case detail::BackwardPasses::Pass::fresh:
        if (core_->step_open())
          throw std::logic_error(
              "step inside backward: a second backward began before step() ended the optimizer step the last one "
              "took; gradients are not accumulated over several backward passes in this mode, as each backward "
              "steps every parameter it reaches. Call step() after each backward, or turn the step inside backward "
              "off to accumulate. Nothing was changed");
        passes_.begin();
        break;
    }
    const Param& p = params_[i];
    if (core_->step_open() && core_->stepped_in_open_step(p.id))
      throw std::logic_error("parameter '" + p.name +
                             "': its gradient was completed twice in one backward (as when it is used in several "
                             "segments of a reentrant activation checkpoint); the step inside backward steps each "
                             "parameter once: use non-reentrant checkpointing, or turn the step inside backward off");
    step_one(i);
  }

  /// std::logic_error naming `what` while an optimizer step taken inside
  /// backward is open, saying how to end it.
  void check_no_open_step(std::string_view what) const {
    if (!core_->step_open()) return;
    throw std::logic_error(std::string(what) +
                           (passes_.cut() ? ": the optimizer step a backward began is still open, as that backward "
                                            "raised part way; zero_grad() or step() ends it"
                                          : ": the optimizer step begun inside backward is still open; step() ends "
                                            "it"));
  }

  /// Ends an optimizer step a step inside backward left open: as cut short
  /// when the last backward raised part way, else as completed.
  void close_open_step() {
    const bool cut = passes_.cut();
    passes_.acknowledge();
    if (core_->step_open()) (void)core_->finish_step(cut ? StepEnd::interrupted : StepEnd::completed);
  }

  /// The step inside backward of parameter i (its hook, or step() for a
  /// gradient no hook stepped): steps it, then frees its gradient. Under
  /// NonFinitePolicy::raise an offending gradient is freed too (consumed:
  /// the error names it).
  void step_one(std::size_t i) {
    Param& p = params_[i];
    if (!p.tensor.grad().defined()) return;
    if (!core_->step_open()) begin_step();
    try {
      check_param_tensor(p, "parameter '" + p.name + "'", false);
      (void)bind_grad(p);
      core_->before_step();
      core_->step(p.id);
    } catch (const NonFiniteGradientError&) {
      core_->clear_grad(p.id);
      p.tensor.mutable_grad().reset();
      throw;
    } catch (...) {
      core_->clear_grad(p.id);
      throw;
    }
    core_->clear_grad(p.id);
    if (device_.is_cpu()) {
      grad_copies_.clear();  // done with: the host step has run
    } else {
      // the step is enqueued on the device's current stream: the memory goes
      // back to the allocator only once that stream is past it, whichever
      // stream the gradient was made on
      const c10::Stream s = c10::impl::getDeviceGuardImpl(device_.type())->getStream(device_);
      p.tensor.mutable_grad().record_stream(s);
    }
    p.tensor.unsafeGetTensorImpl()->bump_version();
    p.tensor.mutable_grad().reset();  // freed (a device step holds it through grad_copies_ or the stream)
  }


  /// The one device every parameter is on (the CPU for an empty list).
  static at::Device device_of(const std::vector<std::pair<std::string, at::Tensor>>& named) {
    std::optional<at::Device> d;
    std::string first;
    for (const auto& [name, tensor] : named) {
      if (!tensor.defined()) continue;
      if (!d) {
        d = tensor.device();
        first = name;
      } else if (tensor.device() != *d) {
        throw std::invalid_argument("parameter '" + name + "': on " + tensor.device().str() + ", while '" + first +
                                    "' is on " + d->str() + "; every parameter must be on one device");
      }
    }
    return d.value_or(at::Device(at::kCPU));
  }

  /// The engine for the parameters' device, in one process or sharded over
  /// Options::process_group: a registered one (torch/core.hpp; torch/cuda.cuh
  /// registers CUDA's), else the CPU backend for CPU tensors.
  std::unique_ptr<Core> make_core(const Options& options) {
    const skewadam::OptimizerOptions o{
        .seed = options.seed, .threads = options.threads, .nonfinite = options.nonfinite,
        .max_grad_norm = options.max_grad_norm, .clip_norm = options.clip_norm};
    const std::string type = c10::DeviceTypeName(device_.type(), /*lower_case=*/true);
#if SKEWADAM_TORCH_DISTRIBUTED
    if (options.process_group) {
      comm_ = std::make_unique<ProcessGroupCommunicator>(options.process_group, staging_of(options));
      const dist::ShardOptions shard{options.expert_sharding};
      if (const ShardedCoreFactory make = makers_->sharded_device(type)) {
        any_comm_ = std::make_unique<dist::CommunicatorRef<ProcessGroupCommunicator>>(*comm_);
        return make(*any_comm_, options.hyperparameters, o, shard, device_.index());
      }
      if (device_.is_cpu())
        return makers_->cpu_sharded(*comm_, options.hyperparameters, o, shard);
      throw std::invalid_argument("Options.process_group: the parameters are on " + device_.str() +
                                  ", and no sharded engine for " + type +
                                  " tensors is built into this program (for CUDA: compile one translation unit with "
                                  "nvcc that includes <skewadam/torch/cuda.cuh>; CMake: SKEWADAM_WITH_CUDA)");
    }
#endif
    if (const CoreFactory make = makers_->device(type)) return make(options.hyperparameters, o, device_.index());
    if (device_.is_cpu()) return makers_->cpu(options.hyperparameters, o);
    throw std::invalid_argument("parameters: on " + device_.str() + ", and no engine for " + type +
                                " tensors is built into this program (for CUDA: compile one translation unit with "
                                "nvcc that includes <skewadam/torch/cuda.cuh>; CMake: SKEWADAM_WITH_CUDA)");
  }

#if SKEWADAM_TORCH_DISTRIBUTED
  /// Options::process_group_staging, or its default for the group and the
  /// parameters' device.
  at::Device staging_of(const Options& options) const {
    if (options.process_group_staging) return *options.process_group_staging;
    if (!device_.is_cpu() && ProcessGroupCommunicator::backend_name(options.process_group) == "nccl") return device_;
    return at::Device(at::kCPU);
  }
#endif

  static std::size_t group_index(Tier t) { return static_cast<std::size_t>(tier_index(checked_tier(t))); }

  /// A registered parameter's place in params_, which is its ParamId's in
  /// the core (the core's registry of names is the only one).
  std::size_t index_of(const std::string& name) const {
    const std::optional<ParamId> id = core_->find(name);
    if (!id) throw std::invalid_argument("name: no parameter '" + name + "' is registered");
    return static_cast<std::size_t>(id->index);
  }

  /// A parameter must stay a contiguous tensor of a supported dtype on the
  /// optimizer's device, in the storage it had when it was registered.
  void check_param_tensor(const Param& p, const std::string& who, bool registering) const {
    const at::Tensor& t = p.tensor;
    if (t.device() != device_)
      throw std::invalid_argument(who + ": on " + t.device().str() + "; the optimizer's parameters are on " +
                                  device_.str() + " (create the optimizer after model->to(...))");
    if (t.layout() != at::kStrided) throw std::invalid_argument(who + ": sparse parameters are not supported");
    if (!t.is_contiguous())
      throw std::invalid_argument(who + ": not contiguous; call .contiguous() on the parameter first");
    if (registering) {
      detail::dtype_of_tensor(t, who);
      return;
    }
    if (t.data_ptr() != p.data || detail::dtype_of_tensor(t, who) != p.dtype ||
        !(detail::shape_of_tensor(t, who) == p.shape))
      throw std::invalid_argument(who + ": its data moved or changed dtype or shape since the optimizer was built "
                                        "(create the optimizer after model->to(...))");
  }

  /// After the core's state was replaced (imported or loaded): the param
  /// groups take its hyperparameters, a consolidated checkpoint is stale, and
  /// the state tensors view the new arrays.
  void state_replaced() {
    for (Tier tier : all_tiers) group_options(tier) = GroupOptions(tier, core_->hyperparameters(tier));
    consolidated_.reset();
    refresh_views();
  }

  /// Before the core steps or its state is read: the param groups checked,
  /// and their hyperparameters handed to the core.
  void push_groups() const {
    check_groups();
    for (Tier t : all_tiers) core_->set_hyperparameters(t, group_options(t).hyperparameters());
  }

  void check_groups() const {
    if (param_groups_.size() != static_cast<std::size_t>(tier_count))
      throw std::invalid_argument("param_groups: " + std::to_string(param_groups_.size()) +
                                  " groups; skewadam::libtorch keeps exactly one per tier and takes parameters "
                                  "only by name, at construction");
    std::size_t n = 0;
    for (Tier t : all_tiers) {
      const auto& g = param_groups_[group_index(t)];
      if (dynamic_cast<const GroupOptions*>(&g.options()) == nullptr ||
          static_cast<const GroupOptions&>(g.options()).tier() != t)
        throw std::invalid_argument("param_groups[" + std::to_string(group_index(t)) +
                                    "]: options are not this tier's GroupOptions");
      n += g.params().size();
    }
    if (n != params_.size())
      throw std::invalid_argument("param_groups: parameters were added or removed after construction; "
                                  "skewadam::libtorch takes parameters only by name, at construction");
  }

  /// Points every ParamState's tensors at the library's state arrays (on the
  /// optimizer's device; sharded: this rank's share, flat).
  void refresh_views() {
    const bool flat = sharded();
    for (Param& p : params_) {
      const ParamStateView live = core_->state(p.id);
      const detail::StateShapes shapes = detail::state_shapes(p.shape, (*tiers_)[p.tier].layout);
      const auto sizes = [&](std::span<const float> s, const std::vector<std::int64_t>& logical) {
        return flat ? std::vector<std::int64_t>{static_cast<std::int64_t>(s.size())} : logical;
      };
      p.state->step = live.step;
      p.state->m = detail::view_of(live.m, sizes(live.m, shapes.m), device_);
      p.state->v = detail::view_of(live.v, sizes(live.v, shapes.full), device_);
      p.state->v_row = detail::view_of(live.v_row, sizes(live.v_row, shapes.rows), device_);
      p.state->v_col = detail::view_of(live.v_col, sizes(live.v_col, shapes.cols), device_);
    }
  }

  const CoreMakers* makers_;
  const TierTable* tiers_;
  TierAssigner rules_;
  double max_grad_norm_ = 0.0;
  ClipNorm clip_norm_ = ClipNorm::current;
  at::Device device_ = at::Device(at::kCPU);
  std::vector<Param> params_;
  std::unordered_map<const void*, std::size_t> by_impl_;
#if SKEWADAM_TORCH_DISTRIBUTED
  std::unique_ptr<ProcessGroupCommunicator> comm_;  // before core_: outlives it
  std::unique_ptr<dist::CommunicatorRef<ProcessGroupCommunicator>> any_comm_;  // comm_ for a device engine
#else
  std::nullptr_t comm_ = nullptr;
#endif
  std::unique_ptr<Core> core_;
  std::vector<at::Tensor> grad_copies_;                 // non-contiguous gradients a device step may still read
  std::optional<std::vector<std::byte>> consolidated_;  // sharded, rank 0: consolidate_checkpoint()'s bytes
  std::vector<Hook> hooks_;                             // step_in_backward()'s
  bool in_backward_ = false;                            // step_in_backward() is on
  detail::BackwardPasses passes_;                       // the backward passes its hooks ran in
};

/// SkewAdam (or any TierRules variant) behind torch's Optimizer interface:
/// OptimizerBase with the rules Tiers gives each tier.
template <class Tiers = SkewAdamTiers, class Backend = backend::DefaultBackend>
class Optimizer : public OptimizerBase {
 public:
  /// The front-end underneath CPU tensors in one process.
  using core_type = skewadam::Optimizer<Tiers, Backend>;
#if SKEWADAM_TORCH_DISTRIBUTED
  /// The front-end underneath CPU tensors sharded over Options::process_group.
  using sharded_core_type = skewadam::Optimizer<Tiers, Backend, dist::Sharded<ProcessGroupCommunicator>>;
#endif

  Optimizer(const NamedParameters& named_parameters, Options options = {})
      : Optimizer(to_pairs(named_parameters), std::move(options)) {}
  Optimizer(const std::vector<std::pair<std::string, at::Tensor>>& named_parameters, Options options = {})
      : OptimizerBase(named_parameters, std::move(options), makers(), TierTable::of<Tiers>()) {}

  /// The library's optimizer underneath CPU tensors in one process.
  const core_type& core() const {
    const auto* c = dynamic_cast<const CoreOf<core_type>*>(&engine_core());
    if (c == nullptr)
      throw std::logic_error("core(): this optimizer's parameters are on " + device().str() +
                             (sharded() ? ", sharded over a process group (sharded_core())" : "") +
                             "; core() is the CPU front-end in one process");
    return c->optimizer();
  }
#if SKEWADAM_TORCH_DISTRIBUTED
  /// The library's sharded optimizer underneath (Options::process_group).
  const sharded_core_type& sharded_core() const {
    const auto* c = dynamic_cast<const CoreOf<sharded_core_type>*>(&engine_core());
    if (c == nullptr) throw std::logic_error("sharded_core(): this optimizer is not sharded (Options::process_group is null)");
    return c->optimizer();
  }
#endif
 private:
  static const CoreMakers& makers() {
    static const CoreMakers m{
        &device_core<Tiers>,
        [](const PerTier<Hyperparameters>& h, const skewadam::OptimizerOptions& o) -> std::unique_ptr<Core> {
          return std::make_unique<CoreOf<core_type>>(h, o);
        },
#if SKEWADAM_TORCH_DISTRIBUTED
        &sharded_device_core<Tiers>,
        [](ProcessGroupCommunicator& comm, const PerTier<Hyperparameters>& h, const skewadam::OptimizerOptions& o,
           dist::ShardOptions shard) -> std::unique_ptr<Core> {
          return std::make_unique<CoreOf<sharded_core_type>>(comm, h, o, shard);
        },
#endif
    };
    return m;
  }
};

// ----------------------------------------------------------------- variants
// SkewAdam, SkewAdamBf16Momentum, SkewAdam8bit, the ablations, AdafactorLike
// and AdamW, as in the core (variants.hpp): Optimizer<Tiers> of each.
SKEWADAM_VARIANT_ALIASES()

}  // namespace skewadam::libtorch
