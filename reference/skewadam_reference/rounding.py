"""Storing an fp32 result into a parameter of dtype f32, bf16 or f16
(docs/spec.md §4.2).

16-bit values are handled as their bit patterns (uint16) and widened to fp32
for arithmetic; NumPy has float16 but no bfloat16.
"""

import numpy as np

DTYPES = ("f32", "bf16", "f16")


def _f32_bits(x):
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


def bf16_to_f32(bits):
    """Widens bf16 bit patterns to fp32 values (exact)."""
    return (np.asarray(bits, dtype=np.uint32) << np.uint32(16)).view(np.float32)


def f16_to_f32(bits):
    return np.asarray(bits, dtype=np.uint16).view(np.float16).astype(np.float32)


def to_f32(bits, dtype):
    return bf16_to_f32(bits) if dtype == "bf16" else f16_to_f32(bits)


def nearest_bf16(x):
    """Round to nearest, ties to even; infinities stay; a NaN becomes the
    quiet NaN of its sign (0x7FC0 or 0xFFC0)."""
    b = _f32_bits(x).astype(np.uint64)
    lsb = (b >> np.uint64(16)) & np.uint64(1)
    rounded = ((b + np.uint64(0x7FFF) + lsb) >> np.uint64(16)).astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    quiet = np.where(b >> np.uint64(31), np.uint16(0xFFC0), np.uint16(0x7FC0)).astype(np.uint16)
    return np.where(nan, quiet, rounded)


def nearest_f16(x):
    with np.errstate(over="ignore"):  # beyond the largest finite f16: infinity, as round-to-nearest says
        return np.asarray(x, dtype=np.float32).astype(np.float16).view(np.uint16)


def nearest(x, dtype):
    """Bits of x rounded to the nearest value of dtype (ties to even)."""
    return nearest_bf16(x) if dtype == "bf16" else nearest_f16(x)


def stochastic_bf16(x, r):
    """Unbiased stochastic rounding to bf16 with 16 random bits r per element.

    The 16 bits below the bf16 part of x's pattern, L, decide: adding r to
    them carries into the bf16 part (rounding away from zero) exactly when
    r >= 2^16 - L, with probability L / 2^16. bf16 values are evenly spaced
    in the bits of one binade, so this is proportional to the distance from
    the lower neighbour (and carries across binades correctly). NaN and
    infinities round to nearest.
    """
    b = _f32_bits(x)
    special = (b & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    carried = ((b.astype(np.uint64) + r.astype(np.uint64)) >> np.uint64(16)) & np.uint64(0xFFFF)
    return np.where(special, nearest_bf16(x), carried.astype(np.uint16))


F16_MAX_FINITE_BITS = 0x7BFF


def stochastic_f16(x, r):
    """Unbiased stochastic rounding to f16 with 16 random bits r per element.

    With lo < |x| < hi the two f16 magnitudes around |x|, the result is hi
    when r < 2^16 (|x| - lo) / (hi - lo), else lo; the sign is x's. A value
    that is already an f16 is kept; above the largest finite f16 the result
    is that largest value (no rounding to infinity); NaN and infinities round
    to nearest.
    """
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # NaN and infinities: replaced below
        return _stochastic_f16(x, r)


def _stochastic_f16(x, r):
    ax = np.abs(x).astype(np.float64)
    sign = (_f32_bits(x) >> np.uint32(16)).astype(np.uint16) & np.uint16(0x8000)
    near = nearest_f16(np.abs(x))
    near_val = f16_to_f32(near).astype(np.float64)
    lo = np.where(near_val <= ax, near, near - np.uint16(1)).astype(np.uint16)
    hi = (lo + np.uint16(1)).astype(np.uint16)
    lo_val = f16_to_f32(lo).astype(np.float64)
    hi_val = f16_to_f32(np.minimum(hi, np.uint16(0x7C00))).astype(np.float64)
    p_up = (ax - lo_val) / (hi_val - lo_val)  # exact: a few bits, in double
    up = r.astype(np.float64) < p_up * 65536.0
    pick = np.where(up, hi, lo)
    pick = np.where(near_val == ax, near, pick)                       # already an f16
    pick = np.where((hi >= 0x7C00) & (near_val != ax), lo, pick)       # beyond the largest finite
    out = (pick | sign).astype(np.uint16)
    special = (_f32_bits(x) & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    return np.where(special, nearest_f16(x), out)


def stochastic(x, r, dtype):
    return stochastic_bf16(x, r) if dtype == "bf16" else stochastic_f16(x, r)


def representable(values, dtype):
    """Whether every fp32 value is exactly a value of dtype."""
    v = np.asarray(values, dtype=np.float32)
    if dtype == "f32":
        return True
    back = to_f32(nearest(v, dtype), dtype)
    return bool(np.array_equal(back.view(np.uint32), v.view(np.uint32)))
