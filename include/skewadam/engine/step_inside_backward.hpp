#pragma once
// StepInsideBackward: the optimizer step a framework takes inside backward
// (Optimizer::step(ParamId) for each parameter as backward completes its
// gradient, then finish_step()), as the front-end keeps it between those
// calls. Closed, or open with the step's number (the lr schedule's position
// every parameter of it is stepped at), the settings its parameters were
// stepped with, and which parameters it has stepped.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "engine_types.hpp"

namespace skewadam {

class StepInsideBackward {
 public:
  bool open() const noexcept { return open_; }
  /// Whether parameter i (by ParamId order) has been stepped in the open step.
  bool stepped(std::size_t i) const noexcept { return open_ && i < stepped_.size() && stepped_[i] != 0; }
  /// The open step's number, when the lr schedule needs one.
  std::optional<std::int64_t> number() const noexcept { return open_ ? number_ : std::nullopt; }
  /// The settings its parameters were stepped with.
  const StepSettings& settings() const noexcept { return settings_; }

  /// Parameter i of `params` was stepped as step `number` with `settings`;
  /// the first opens the step.
  void stepped_one(std::size_t i, std::size_t params, std::optional<std::int64_t> number, const StepSettings& settings) {
    if (!open_) {
      stepped_.assign(params, 0);
      open_ = true;
    }
    number_ = number;
    settings_ = settings;
    stepped_[i] = 1;
  }
  /// Parameter i's step left it unchanged (it raised): it may be stepped again.
  void unstep(std::size_t i) noexcept { stepped_[i] = 0; }
  /// The step is over.
  void close() noexcept {
    open_ = false;
    number_.reset();
  }

 private:
  bool open_ = false;
  std::optional<std::int64_t> number_;
  std::vector<char> stepped_;  ///< by ParamId
  StepSettings settings_{};
};

}  // namespace skewadam
