#pragma once
// BackwardPasses: what the step inside backward knows of the backward passes
// its hooks run in (torch/optimizer.hpp). Autograd tells a hook nothing about
// the pass it runs in, so the first hook of a pass queues a callback on the
// pass (Engine::queue_callback). The callback runs when the pass ends
// normally; a pass that raises part way is dropped without running it. A hook
// then tells a new pass from the running one (no callback of ours pending),
// and step(), zero_grad() or the next pass's first hook learns that the last
// pass was cut short (its callback was dropped unrun), so that the optimizer
// step it opened is closed instead of wedged.
//
// A reentrant activation checkpoint runs each segment's backward as a pass
// of its own inside the outer one: its hooks count as the outer pass's as
// long as a hook ran in the outer pass first (a parameter outside every
// segment, as an output head); otherwise each segment looks like a new pass.

#include <torch/csrc/autograd/engine.h>

#include <functional>
#include <memory>
#include <mutex>

namespace skewadam::libtorch::detail {

class BackwardPasses {
 public:
  /// What a hook's call finds.
  enum class Pass {
    running,      ///< a pass whose first hook already ran (or no pass at all)
    fresh,        ///< the first hook of a new pass; the last one ended normally
    after_a_cut,  ///< the first hook of a new pass; the last one was cut short
  };

  BackwardPasses() : state_(std::make_shared<State>()) {}

  /// What the hook now running finds (changes nothing).
  Pass classify() const {
    const std::lock_guard<std::mutex> lock(state_->m);
    if (state_->pending > 0) return Pass::running;
    return state_->cut ? Pass::after_a_cut : Pass::fresh;
  }
  /// Marks the pass the calling hook runs in as begun: its end, normal or
  /// not, is noted. Outside a pass (a hook called by hand) it notes nothing.
  void begin() {
    auto sentinel = std::make_shared<Sentinel>(state_);
    {
      const std::lock_guard<std::mutex> lock(state_->m);
      state_->cut = false;
      ++state_->pending;
    }
    try {
      ::torch::autograd::Engine::get_default_engine().queue_callback([sentinel] { sentinel->settle(); });
    } catch (...) {  // not inside a backward pass: nothing will end it
      sentinel->settle();
    }
  }
  /// Whether the last pass was cut short and that is not yet acknowledged.
  bool cut() const {
    const std::lock_guard<std::mutex> lock(state_->m);
    return state_->pending == 0 && state_->cut;
  }
  void acknowledge() {
    const std::lock_guard<std::mutex> lock(state_->m);
    state_->cut = false;
  }

 private:
  struct State {
    std::mutex m;
    int pending = 0;   ///< passes begun whose callback neither ran nor was dropped
    bool cut = false;  ///< a pass was dropped with its callback unrun
  };
  /// Held by the queued callback: destroyed with the pass's task, after the
  /// callback ran or without it.
  struct Sentinel {
    explicit Sentinel(const std::shared_ptr<State>& s) : state(s) {}
    Sentinel(const Sentinel&) = delete;
    Sentinel& operator=(const Sentinel&) = delete;
    ~Sentinel() {
      if (done) return;
      if (const std::shared_ptr<State> s = state.lock()) {
        const std::lock_guard<std::mutex> lock(s->m);
        --s->pending;
        s->cut = true;
      }
    }
    /// The pass ended normally (or there is none to end).
    void settle() {
      if (done) return;
      done = true;
      if (const std::shared_ptr<State> s = state.lock()) {
        const std::lock_guard<std::mutex> lock(s->m);
        --s->pending;
      }
    }
    std::weak_ptr<State> state;
    bool done = false;
  };

  std::shared_ptr<State> state_;
};

}  // namespace skewadam::libtorch::detail
