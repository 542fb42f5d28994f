"""Ways to get the rounding of a 16-bit parameter wrong, and small
arithmetic differences, applied to the reference rule: what the checking rule
of docs/conformance.md must reject, and what it must accept.

Each is a context manager that replaces a function of the rule module for
its duration.
"""

import contextlib
from dataclasses import replace

import numpy as np

from . import philox, rounding, rule

ORIGINAL_STORE = rule.store_param
ORIGINAL_STEP = rule.step


def _with_bits(bits_of):
    """store_param with other random bits: bits_of(how, t, n) -> uint32[n]."""

    def store(x, dtype, how, t):
        if dtype == "f32" or how.mode == "nearest":
            return ORIGINAL_STORE(x, dtype, how, t)
        flat = x.reshape(-1)
        out = rounding.stochastic(flat, bits_of(how, t, flat.size), dtype)
        return rounding.to_f32(out, dtype).reshape(x.shape)

    return store


def _swapped_halves(how, t, n):
    b = philox.rounding_bits(how.seed, how.stream, t, n + 8)
    idx = np.arange(n)
    return b[(idx // 8) * 8 + (idx % 8 + 4) % 8]


def _toward_zero(x, dtype, how, t):
    """Truncation: the neighbour towards zero, always."""
    if dtype == "f32":
        return x
    near = rounding.nearest(x.reshape(-1), dtype)
    back = rounding.to_f32(near, dtype)
    near = np.where(np.abs(back) > np.abs(x.reshape(-1)), near - np.uint16(1), near).astype(np.uint16)
    return rounding.to_f32(near, dtype).reshape(x.shape)


def _unfused_weight_decay(rule_, h, state, param, grad, dtype="f32", store=rule.Rounding()):
    """Weight decay applied to the stored parameter and rounded on its own
    (to nearest), then the update from the decayed value: the two roundings
    the fused store avoids."""
    decay = rule.f32(1.0 - h.lr * h.weight_decay)
    decayed = ORIGINAL_STORE((np.asarray(param, np.float64) * decay).astype(np.float32), dtype,
                             rule.Rounding("nearest"), state.step + 1)
    return ORIGINAL_STEP(rule_, replace(h, weight_decay=0.0), state, decayed, grad, dtype, store)


# Wrong stochastic rounding: (the rule function replaced, its replacement).
STOCHASTIC = {
    "another seed": ("store_param", _with_bits(lambda h, t, n: philox.rounding_bits(h.seed + 1, h.stream, t, n))),
    "another tensor stream": ("store_param",
                              _with_bits(lambda h, t, n: philox.rounding_bits(h.seed, h.stream ^ 1, t, n))),
    "the step before": ("store_param", _with_bits(lambda h, t, n: philox.rounding_bits(h.seed, h.stream, t - 1, n))),
    "the next element's bits": ("store_param",
                                _with_bits(lambda h, t, n: philox.rounding_bits(h.seed, h.stream, t, n, first=1))),
    "high and low halves swapped": ("store_param", _with_bits(_swapped_halves)),
    "the complement of the bits": ("store_param",
                                   _with_bits(lambda h, t, n: 0xFFFF - philox.rounding_bits(h.seed, h.stream, t, n))),
    "round to nearest": ("store_param", lambda x, d, how, t: ORIGINAL_STORE(x, d, replace(how, mode="nearest"), t)),
    "round toward zero": ("store_param", _toward_zero),
    "weight decay rounded on its own": ("step", _unfused_weight_decay),
}
# Wrong round-to-nearest.
NEAREST = {
    "stochastic rounding": ("store_param",
                            lambda x, d, how, t: ORIGINAL_STORE(x, d, replace(how, mode="stochastic", seed=1), t)),
    "round toward zero": ("store_param", _toward_zero),
}


def applies(name, mutations, case):
    """Whether a mutation changes anything on this case."""
    return mutations[name][0] != "step" or case.hyper.weight_decay != 0


@contextlib.contextmanager
def applied(name, mutations):
    attribute, replacement = mutations[name]
    old = getattr(rule, attribute)
    setattr(rule, attribute, replacement)
    try:
        yield
    finally:
        setattr(rule, attribute, old)


@contextlib.contextmanager
def arithmetic_noise(ulps, seed):
    """Every fp32 result x moved by a random whole number of fp32 ulps in
    [-ulps, ulps] before it is stored: a stand-in for an implementation whose
    fp32 arithmetic (summation order, fused multiply-adds) differs slightly."""
    rng = np.random.default_rng(seed)

    def noisy(x, dtype, how, t):
        off = rng.integers(-ulps, ulps + 1, x.shape).astype(np.int64)
        moved = (x.view(np.uint32).astype(np.int64) + off).astype(np.uint32).view(np.float32)
        return ORIGINAL_STORE(moved.reshape(x.shape), dtype, how, t)

    old = rule.store_param
    rule.store_param = noisy
    try:
        yield
    finally:
        rule.store_param = old
