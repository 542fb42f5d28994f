#pragma once
// Optimizer state of one parameter: plain data, fp32, allocated once when the
// parameter is registered. Which arrays are non-empty depends on the rule:
//   m      FullMomentum: numel
//   v      exact second moment (and rank-1 tensors under a factored rule): numel
//   v_row  factored: B * r, matrix b's rows at [b*r, (b+1)*r)
//   v_col  factored: B * c
// step counts the updates this parameter has received (t of its last step).

#include <cstdint>
#include <span>
#include <vector>

#include "../detail/config.hpp"
#include "../types/shape.hpp"
#include "../types/tier.hpp"

namespace skewadam {

struct ParamState {
  std::vector<float> m;
  std::vector<float> v;
  std::vector<float> v_row;
  std::vector<float> v_col;
  std::int64_t step = 0;

  index_t bytes() const noexcept {
    return 4 * static_cast<index_t>(m.size() + v.size() + v_row.size() + v_col.size());
  }
};

/// Read-only view of a parameter's state.
struct ParamStateView {
  std::span<const float> m;
  std::span<const float> v;
  std::span<const float> v_row;
  std::span<const float> v_col;
  std::int64_t step = 0;
};

/// Handle returned when a parameter is registered.
struct ParamId {
  index_t index = -1;
  friend constexpr bool operator==(ParamId, ParamId) = default;
};

}  // namespace skewadam
