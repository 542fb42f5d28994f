"""Properties of the reference rule that docs/spec.md states."""

import math
from dataclasses import replace

import numpy as np

from skewadam_reference import rule
from skewadam_reference.rule import ADAMW, BACKBONE, EXPERTS, ROUTER, Hyper, Rounding, TensorState


def inputs(shape, steps, seed=1):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 0.5).astype(np.float32), rng.standard_normal((steps,) + shape).astype(
        np.float32)


def test_coefficients_are_formed_in_double_and_rounded_once():
    s = rule.step_scalars(Hyper(beta2=0.9999), 1)
    assert s["one_minus_beta2"] == float(np.float32(1e-4))  # not 1.0f - 0.9999f
    assert s["one_minus_beta2"] != float(np.float32(1.0) - np.float32(0.9999))
    for t in (1, 2, 7, 1000):
        s = rule.step_scalars(Hyper(beta1=0.9, beta2=0.999), t)
        bc1, bc2 = 1 - 0.9 ** t, 1 - 0.999 ** t
        assert s["momentum_scale"] == float(np.float32(math.sqrt(bc2) / bc1))
        assert s["sqrt_bc2"] == float(np.float32(math.sqrt(bc2)))


def test_power_by_squaring_is_far_more_exact_than_fp32():
    for base in (0.9, 0.999, 0.9999, 0.5):
        for t in (1, 2, 3, 10, 1000, 123457):
            assert math.isclose(rule.power(base, t), base ** t, rel_tol=2.0 ** -30, abs_tol=1e-300)


def test_state_shapes():
    shape = (2, 3, 5, 7)  # rank 4: factored over the last two dimensions
    _, state, _ = rule.run(BACKBONE, Hyper(), shape, *inputs(shape, 2), [1e-3] * 2)
    assert state["exp_avg"].shape == shape
    assert state["v_row"].shape == (2, 3, 5) and state["v_col"].shape == (2, 3, 7)
    _, state, _ = rule.run(BACKBONE, Hyper(), (11,), *inputs((11,), 2), [1e-3] * 2)
    assert set(state) == {"exp_avg", "v"}  # rank 1: the exact second moment
    _, state, _ = rule.run(ROUTER, Hyper(), (3, 4), *inputs((3, 4), 2), [1e-3] * 2)
    assert set(state) == {"v"}


def test_matrix_scope_makes_a_bank_behave_as_separate_matrices():
    shape = (3, 6, 5)
    p0, grads = inputs(shape, 8)
    grads[2, 0] *= 50  # clipping active on one matrix
    lrs = [0.01] * 8
    h = Hyper(weight_decay=0.05, clip_scope="matrix")
    bank, bank_state, _ = rule.run(EXPERTS, h, shape, p0, grads, lrs)
    for e in range(3):
        one, one_state, _ = rule.run(EXPERTS, h, shape[1:], p0[e], grads[:, e], lrs)
        assert np.array_equal(bank[:, e], one)
        assert np.array_equal(bank_state["v_row"][e], one_state["v_row"])
    tensor, _, _ = rule.run(EXPERTS, replace(h, clip_scope="tensor"), shape, p0, grads, lrs)
    assert not np.array_equal(tensor, bank)


def test_adamw_is_adam_with_decoupled_weight_decay():
    shape = (4, 6)
    p0, grads = inputs(shape, 5)
    h = Hyper(lr=0.01, weight_decay=0.1, eps=1e-3)
    got, _, _ = rule.run(ADAMW, h, shape, p0, grads, [h.lr] * 5)
    p, m, v = p0.astype(np.float64), 0.0, 0.0
    for t in range(1, 6):
        g = grads[t - 1].astype(np.float64)
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        p = p * (1 - h.lr * h.weight_decay) - h.lr * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + h.eps)
        assert np.allclose(got[t - 1], p, rtol=1e-5, atol=1e-6)


def test_eps_is_a_floor_under_the_second_moment():
    shape = (5,)
    p0 = np.zeros(shape, np.float32)
    g = np.full((1,) + shape, 1e-6, np.float32)  # g^2 (1 - beta2) far below eps
    out, _, _ = rule.run(ROUTER, Hyper(lr=1.0, eps=1e-8, clip_threshold=1e9), shape, p0, g, [1.0])
    expected = -(1e-6 * math.sqrt(1 - 0.999)) / math.sqrt(1e-8)
    assert np.allclose(out[0], expected, rtol=1e-6)


def test_stochastic_rounding_keeps_a_small_weight_decay_on_average():
    shape = (64, 64)
    p0 = np.full(shape, 1.0, np.float32)
    grads = np.zeros((20,) + shape, np.float32)
    h = Hyper(lr=0.01, weight_decay=0.1)  # 0.1 % a step: below half a bf16 spacing at 1 (0.39 %)
    near, _, _ = rule.run(ROUTER, h, shape, p0, grads, [h.lr] * 20, "bf16", Rounding("nearest"))
    assert np.all(near == 1.0)  # round-to-nearest loses it
    sr, _, _ = rule.run(ROUTER, h, shape, p0, grads, [h.lr] * 20, "bf16", Rounding("stochastic", 5, 6))
    assert abs(float(sr[-1].mean()) - (1 - 1e-3) ** 20) < 5e-4


def test_a_step_counts_once_per_call():
    st = TensorState.fresh(EXPERTS, (2, 2))
    for k in range(3):
        rule.step(EXPERTS, Hyper(), st, np.zeros((2, 2), np.float32), np.ones((2, 2), np.float32))
        assert st.step == k + 1


def test_stored_momentum_is_unbiased_and_within_one_step_of_the_fp32_recursion():
    # E7: from the same stored state, the stored momentum is one of the two
    # values next to m' (bf16) or within one scale of it (8 bits), and its
    # mean over many draws of the bits is m'.
    shape = (8, 64)
    rng = np.random.default_rng(5)
    g = rng.standard_normal(shape).astype(np.float32) * np.float32(0.01)
    m0 = rng.standard_normal(shape).astype(np.float32) * np.float32(0.01)
    s = rule.step_scalars(Hyper(), 3)
    mp = np.float32(s["beta1"]) * m0 + np.float32(s["one_minus_beta1"]) * g
    for storage in ("bf16", "int8_blocks"):
        draws = np.stack([rule.stored_momentum(storage, s, m0.reshape(1, *shape).astype(np.float64),
                                               g.reshape(1, *shape), Rounding(seed=seed), 3).reshape(shape)
                          for seed in range(200)])
        step = np.float32(np.abs(mp).max() / 127) if storage == "int8_blocks" else np.abs(mp) * 2.0 ** -7
        assert np.all(np.abs(draws - mp) <= step * (1 + 2.0 ** -10))
        assert np.abs(draws.mean(axis=0) - mp).max() < 0.2 * np.max(step)  # 200 draws: a few % of a step
