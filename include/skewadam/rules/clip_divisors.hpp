#pragma once
// The clip divisors of one tensor from its matrices' sums of u^2: what every
// backend and placement forms them with (the CPU backend's finish pass, the
// CUDA kernels' and the engine's where the placement forms them), so that a
// tensor gets the same divisors wherever they are formed.
//
// A tensor-scope clip divides every matrix by the divisor of the sum over
// its B matrices, added in matrix order, one after another; a matrix-scope
// clip divides each by its own.

#include "../detail/config.hpp"
#include "../math/hyperparameters.hpp"
#include "../types/shape.hpp"

namespace skewadam {

/// The sum a tensor-scope clip divides by: sum_of(0) + sum_of(1) + ... +
/// sum_of(batch - 1), in that order, in double.
template <class SumOf>
SKEWADAM_HD double tensor_sum_u2(index_t batch, SumOf&& sum_of) {
  double total = 0.0;
  for (index_t b = 0; b < batch; ++b) total += sum_of(b);
  return total;
}

/// put(b, divisor of matrix b) for every matrix b of a tensor of geometry g,
/// under the clip scope: divisor(sum_u2, count) is the rule's Clip::divisor
/// with the step's scalars, sum_of(b) matrix b's sum of u^2.
template <class Divisor, class SumOf, class Put>
SKEWADAM_HD void clip_divisors(ClipScope scope, const MatrixGeometry& g, Divisor&& divisor, SumOf&& sum_of, Put&& put) {
  if (scope == ClipScope::tensor) {
    const float d = divisor(tensor_sum_u2(g.batch, sum_of), g.numel());
    for (index_t b = 0; b < g.batch; ++b) put(b, d);
  } else {
    for (index_t b = 0; b < g.batch; ++b) put(b, divisor(sum_of(b), g.matrix_size()));
  }
}

}  // namespace skewadam
