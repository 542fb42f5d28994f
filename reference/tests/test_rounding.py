"""Storing fp32 results into 16-bit parameters: stochastic rounding is
unbiased with exactly the stated probabilities, round-to-nearest ties to even,
and the special values behave as docs/spec.md §4.2 says."""

import numpy as np
import pytest

from skewadam_reference import rounding

ALL_BITS = np.arange(1 << 16, dtype=np.uint32)


def neighbours(x, dtype):
    """(lower, upper) dtype values around |x| as fp32."""
    near = rounding.to_f32(rounding.nearest(np.float32(abs(x)), dtype), dtype)
    step = np.float32(2.0) ** (np.floor(np.log2(abs(x))) - (7 if dtype == "bf16" else 10))
    lo = near if near <= abs(x) else near - step
    return np.float32(lo), np.float32(lo + step)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("x", [1.2345678, -0.3141592, 3.0e-3, 700.1234, -1.0e-2 / 3])
def test_rounds_up_on_exactly_the_proportion_of_the_bits(dtype, x):
    x = np.float32(x)
    out = rounding.to_f32(rounding.stochastic(np.full(1 << 16, x), ALL_BITS, dtype), dtype)
    lo, hi = neighbours(x, dtype)
    ups = int(np.count_nonzero(np.abs(out) == hi))
    assert ups + int(np.count_nonzero(np.abs(out) == lo)) == 1 << 16  # only the two neighbours
    assert np.all(np.sign(out) == np.sign(x))
    frac = (float(abs(x)) - float(lo)) / (float(hi) - float(lo))
    assert ups == round(frac * (1 << 16))  # exact: the proportion has at most 16 bits here
    # hence unbiased: the mean over all bits is x itself
    assert abs(float(np.mean(out.astype(np.float64))) - float(x)) <= 2.0 ** -16 * (float(hi) - float(lo))


def test_f16_subnormals_round_up_with_the_proportion_rounded_up_to_16_bits():
    x = np.float32(3.0e-7)  # f16 subnormal spacing 2^-24 ~ 6e-8
    out = rounding.stochastic(np.full(1 << 16, x), ALL_BITS, "f16")
    lo = np.float64(np.floor(float(x) / 2.0 ** -24)) * 2.0 ** -24
    frac = (float(x) - lo) / 2.0 ** -24
    ups = int(np.count_nonzero(rounding.to_f32(out, "f16") > x))
    assert ups == int(np.ceil(frac * (1 << 16)))


def test_values_of_the_dtype_are_kept():
    for dtype in ("bf16", "f16"):
        v = rounding.to_f32(np.array([0x0000, 0x8000, 0x3C00, 0x0001, 0x3555, 0xB123], dtype=np.uint16), dtype)
        for bits in (ALL_BITS[:5], ALL_BITS[-5:]):
            assert np.array_equal(rounding.stochastic(v[:, None].repeat(5, 1).reshape(-1), np.tile(bits, 6), dtype),
                                  rounding.nearest(v, dtype).repeat(5))


def test_f16_saturates_at_the_largest_finite_value():
    x = np.array([65504.0, 65505.0, 65519.0, 65520.0, 1e6, -70000.0], dtype=np.float32)
    for r in (0, 0x7FFF, 0xFFFF):
        out = rounding.stochastic(x, np.full(x.size, r, dtype=np.uint32), "f16")
        assert list(out) == [0x7BFF] * 5 + [0xFBFF]


def test_special_values_round_to_nearest():
    x = np.array([np.inf, -np.inf, np.nan], dtype=np.float32)
    for dtype in ("bf16", "f16"):
        out = rounding.stochastic(x, np.array([0xFFFF] * 3, dtype=np.uint32), dtype)
        assert np.array_equal(out[:2], rounding.nearest(x[:2], dtype))
        assert np.isnan(rounding.to_f32(out[2:], dtype)).all()


def test_bf16_nearest_ties_to_even():
    x = np.array([1.00390625, 1.01171875, -1.00390625], dtype=np.float32)
    assert list(rounding.nearest(x, "bf16")) == [0x3F80, 0x3F82, 0xBF80]


def test_bf16_stochastic_rounding_carries_into_the_exponent():
    x = np.float32(np.nextafter(np.float32(2.0), np.float32(0)))  # just below 2: the upper neighbour is 2
    out = rounding.stochastic(np.array([x]), np.array([0xFFFF], dtype=np.uint32), "bf16")
    assert rounding.to_f32(out, "bf16")[0] == 2.0
