#pragma once
// What the LibTorch adapter (torch/optimizer.hpp) is built with, Options, and
// its param groups' options, GroupOptions: a tier and that tier's
// hyperparameters, which torch's schedulers and archives see.

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#if !defined(SKEWADAM_TORCH_DISTRIBUTED)
#if __has_include(<torch/csrc/distributed/c10d/ProcessGroup.hpp>)
#define SKEWADAM_TORCH_DISTRIBUTED 1
#else
#define SKEWADAM_TORCH_DISTRIBUTED 0
#endif
#endif

#include "../engine/grad_norm_clip.hpp"
#include "../engine/nonfinite.hpp"
#include "../engine/placement/shard_plan.hpp"
#include "../math/hyperparameters.hpp"
#include "../tiers/tier_assignment.hpp"
#include "../tiers/tier_settings.hpp"
#include "../types/tier.hpp"
#if SKEWADAM_TORCH_DISTRIBUTED
#include "process_group.hpp"
#endif

namespace skewadam::libtorch {

/// What the optimizer is built with.
struct Options {
  /// Hyperparameters of each tier; they become the param groups' options.
  PerTier<Hyperparameters> hyperparameters{};
  /// Ordered name rules (defaults: experts, router/gate, backbone).
  TierAssigner tier_rules{};
  /// > 0: clip the global gradient norm to this before every step, as
  /// torch::nn::utils::clip_grad_norm_ would, without writing the gradients.
  double max_grad_norm = 0.0;
  /// Which norm max_grad_norm clips by: this step's (exact; not inside
  /// backward) or the previous step's, which the step inside backward can
  /// clip by (engine/grad_norm_clip.hpp, docs/spec.md E8).
  ClipNorm clip_norm = ClipNorm::current;
  /// Stochastic-rounding seed of bf16/fp16 parameters.
  std::uint64_t seed = 0x5eed5eedULL;
  /// Threads of the optimizer step; 0: OpenMP's default.
  int threads = 0;
  /// What a step with a NaN or infinite gradient does (nonfinite.hpp): by
  /// default it is skipped as a whole and last_step() names the gradient.
  NonFinitePolicy nonfinite = NonFinitePolicy::skip_step;
#if SKEWADAM_TORCH_DISTRIBUTED
  /// Set: the state is sharded over this group's ranks and step() is
  /// collective (see the top of this file). Null: one process.
  c10::intrusive_ptr<::c10d::ProcessGroup> process_group{};
  /// With process_group: where its collectives' bytes are staged. Unset:
  /// the parameters' CUDA device for an NCCL group, else the CPU (Gloo, MPI).
  std::optional<at::Device> process_group_staging{};
  /// With process_group: expert banks dealt out by whole experts (the
  /// default) or cut into row slices like the backbone.
  dist::ExpertSharding expert_sharding = dist::ExpertSharding::experts;
#endif

  /// Every tier with the same hyperparameters.
  static Options uniform(const Hyperparameters& h) {
    Options o;
    o.hyperparameters = {h, h, h};
    return o;
  }
};

/// A param group's options: its tier and that tier's hyperparameters.
class GroupOptions : public ::torch::optim::OptimizerCloneableOptions<GroupOptions> {
 public:
  GroupOptions() = default;
  GroupOptions(Tier tier, const Hyperparameters& h) : tier_(tier), hyper_(h) {}

  Tier tier() const noexcept { return tier_; }
  const Hyperparameters& hyperparameters() const noexcept { return hyper_; }
  Hyperparameters& hyperparameters() noexcept { return hyper_; }

  double get_lr() const override { return hyper_.lr; }
  void set_lr(const double lr) override { hyper_.lr = lr; }

  void serialize(::torch::serialize::OutputArchive& archive) const override {
    archive.write("tier", c10::IValue(static_cast<std::int64_t>(tier_index(tier_))));
    archive.write("lr", c10::IValue(hyper_.lr));
    archive.write("beta1", c10::IValue(hyper_.beta1));
    archive.write("beta2", c10::IValue(hyper_.beta2));
    archive.write("eps", c10::IValue(hyper_.eps));
    archive.write("weight_decay", c10::IValue(hyper_.weight_decay));
    archive.write("clip_threshold", c10::IValue(hyper_.clip_threshold));
    archive.write("clip_scope", c10::IValue(static_cast<std::int64_t>(hyper_.clip_scope)));
  }

  void serialize(::torch::serialize::InputArchive& archive) override {
    auto number = [&](const char* key) {
      c10::IValue v;
      archive.read(key, v);
      if (!v.isDouble()) throw std::invalid_argument(std::string("archive: hyperparameter '") + key + "' is not a number");
      return v.toDouble();
    };
    auto integer = [&](const char* key) {
      c10::IValue v;
      archive.read(key, v);
      if (!v.isInt()) throw std::invalid_argument(std::string("archive: '") + key + "' is not an integer");
      return v.toInt();
    };
    const std::int64_t t = integer("tier");
    if (t < 0 || t >= tier_count) throw std::invalid_argument("archive: tier " + std::to_string(t) + " is out of range");
    const std::int64_t scope = integer("clip_scope");
    if (scope != 0 && scope != 1)
      throw std::invalid_argument("archive: clip_scope " + std::to_string(scope) + " is out of range");
    Hyperparameters h;
    h.lr = number("lr");
    h.beta1 = number("beta1");
    h.beta2 = number("beta2");
    h.eps = number("eps");
    h.weight_decay = number("weight_decay");
    h.clip_threshold = number("clip_threshold");
    h.clip_scope = static_cast<ClipScope>(scope);
    validate(h, std::string("archive.") + std::string(tier_name(static_cast<Tier>(t))));
    tier_ = static_cast<Tier>(t);
    hyper_ = h;
  }

 private:
  Tier tier_ = Tier::backbone;
  Hyperparameters hyper_{};
};

}  // namespace skewadam::libtorch
