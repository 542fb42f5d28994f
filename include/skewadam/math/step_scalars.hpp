#pragma once
// Per-step scalar coefficients, computed once per tensor per step on the host.
//
// Formed in double and rounded to fp32 once, as the reference does: forming
// 1 - beta2 in fp32 from beta2 = 0.9999f is 1.7e-4 off.

#include <cmath>
#include <math.h>
#include <cstdint>

#include "../detail/config.hpp"
#include "hyperparameters.hpp"

namespace skewadam {

struct StepScalars {
  std::int64_t step = 0;      ///< t, starting at 1
  float lr = 0;               ///< learning rate of this step
  float beta1 = 0;
  float one_minus_beta1 = 0;
  float beta2 = 0;
  float one_minus_beta2 = 0;
  float momentum_scale = 0;   ///< sqrt(1 - beta2^t) / (1 - beta1^t)
  float sqrt_bc2 = 0;         ///< sqrt(1 - beta2^t)
  float decay = 1;            ///< 1 - lr * weight_decay
  float eps = 0;
  float eps_sqrt_bc2 = 0;     ///< eps * sqrt(1 - beta2^t), for AdamW's eps-in-denominator
  float clip_threshold = 1;
  float grad_scale = 1;       ///< multiplies every gradient (global-norm clipping, E6)
};

namespace detail {

/// a * b rounded to double, never contracted with a following addition into
/// a fused multiply-add, whatever the compiler's contraction setting: on the
/// device __dmul_rn (which nvcc never fuses), on the host a volatile store.
SKEWADAM_HD inline double rounded_product(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  volatile double p = a * b;
  return p;
#endif
}

/// x^n (n >= 0) by binary powering in double-double: each product's
/// rounding error is recovered exactly with a fused multiply-add (fma is
/// correctly rounded in the host's C library and on the device alike), so the
/// result is within about 2 log2(n) 2^-104 of x^n (relative) before its one
/// rounding to double. Host and device
/// give the same bits; and for every beta in {0.9, 0.95, 0.98, 0.99, 0.999,
/// 0.9999} and n in 1 .. 10^6 the step's fp32 scalars equal those formed with
/// std::pow (tests/unit/test_step_scalars.cpp).
SKEWADAM_HD inline double power(double x, std::int64_t n) {
  double hi = 1.0, lo = 0.0;  // the result so far
  double bh = x, bl = 0.0;    // x^(2^k)
  auto mul = [](double& ah, double& al, double ch, double cl) {
    const double p = rounded_product(ah, ch);
    const double e = ::fma(ah, ch, -p);  // ah * ch - p, exactly
    const double t = e + (rounded_product(ah, cl) + rounded_product(al, ch));
    ah = p + t;
    al = t - (ah - p);
  };
  while (n > 0) {
    if (n & 1) mul(hi, lo, bh, bl);
    n >>= 1;
    if (n > 0) mul(bh, bl, bh, bl);
  }
  return hi + lo;
}

}  // namespace detail

// Also callable from CUDA device code (the CUDA backend forms the scalars on
// the device, so that lr and the step count may live in device memory): only
// correctly rounded operations (+, -, *, /, sqrt, fma; beta^t by
// detail::power, not the C library's pow, which the device computes
// differently), none contracted, so the host and the device form the same
// bits.
SKEWADAM_HD inline StepScalars make_step_scalars(const Hyperparameters& h, std::int64_t t, double grad_scale = 1.0) {
  StepScalars s;
  s.step = t;
  const double bc1 = 1.0 - detail::power(h.beta1, t);
  const double bc2 = 1.0 - detail::power(h.beta2, t);
  s.lr = static_cast<float>(h.lr);
  s.beta1 = static_cast<float>(h.beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  s.beta2 = static_cast<float>(h.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  s.momentum_scale = static_cast<float>(::sqrt(bc2) / bc1);
  s.sqrt_bc2 = static_cast<float>(::sqrt(bc2));
  s.decay = static_cast<float>(1.0 - detail::rounded_product(h.lr, h.weight_decay));
  s.eps = static_cast<float>(h.eps);
  s.eps_sqrt_bc2 = static_cast<float>(h.eps * ::sqrt(bc2));
  s.clip_threshold = static_cast<float>(h.clip_threshold);
  s.grad_scale = static_cast<float>(grad_scale);
  return s;
}

/// The factor global-norm clipping applies to the gradients as they are
/// read, as torch.nn.utils.clip_grad_norm_ computes it:
/// min(max_norm / (norm + 1e-6), 1), and 1 when the norm is not finite. (Also
/// device code: the CUDA backend clips every step on the device.)
SKEWADAM_HD inline double grad_clip_scale(double norm, double max_norm) {
  const double scale = max_norm / (norm + 1e-6);
  return ::isfinite(norm) && scale < 1.0 ? scale : 1.0;
}

/// The factor every gradient of a step is read with: with max_norm > 0, the
/// global-norm clip's from the step's sum of g^2 (over every process);
/// otherwise `given` (a clip_grad_norm() scale before the step, or 1). The
/// one place the scale is formed, by every backend and placement (device
/// code too: the CUDA backend forms it on the device).
SKEWADAM_HD inline double step_grad_scale(double given, double max_norm, double norm_sq) {
  return max_norm > 0 ? grad_clip_scale(::sqrt(norm_sq), max_norm) : given;
}

}  // namespace skewadam
