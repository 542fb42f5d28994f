"""The case format and the checking rule of docs/conformance.md.

The mutation tests show that the 16-bit check is sharp: the reference itself,
changed in any one way an implementation could get the rounding wrong (the
key, the bits' place, the rounding rule, where the weight decay is applied),
fails every case it applies to; unchanged, it passes them all.
"""

import json
import shutil
import numpy as np
import pytest

from conftest import GOLDEN
from skewadam_reference import cases, catalog, mutations, rounding, rule
from skewadam_reference.cases import Case, check_outputs, run_case

SIXTEEN_BIT = [d for d in cases.case_dirs(GOLDEN) if Case(d).param_dtype != "f32"]
STOCHASTIC = [d for d in SIXTEEN_BIT if Case(d).rounding.mode == "stochastic"]
NEAREST = [d for d in SIXTEEN_BIT if Case(d).rounding.mode == "nearest"]


def passes(case_dir):
    case = Case(case_dir)
    ok, _ = check_outputs(case, run_case(case))
    return ok


def test_the_project_has_16_bit_cases_of_both_roundings_and_dtypes():
    assert len(STOCHASTIC) >= 4 and len(NEAREST) >= 2
    assert {Case(d).param_dtype for d in STOCHASTIC} == {"bf16", "f16"}
    assert {Case(d).param_dtype for d in NEAREST} == {"bf16", "f16"}


# --------------------------------------------------------------- mutations
@pytest.mark.parametrize("case_dir", SIXTEEN_BIT, ids=lambda d: d.name)
def test_unchanged_reference_passes(case_dir):
    assert passes(case_dir)


@pytest.mark.parametrize("case_dir, mutation", [
    pytest.param(d, m, id=f"{d.name}-{m}") for d in STOCHASTIC for m in sorted(mutations.STOCHASTIC)
    if mutations.applies(m, mutations.STOCHASTIC, Case(d))])
def test_a_wrong_stochastic_rounding_fails(case_dir, mutation):
    with mutations.applied(mutation, mutations.STOCHASTIC):
        assert not passes(case_dir)


@pytest.mark.parametrize("mutation", sorted(mutations.NEAREST))
@pytest.mark.parametrize("case_dir", NEAREST, ids=lambda d: d.name)
def test_a_wrong_nearest_rounding_fails(case_dir, mutation):
    with mutations.applied(mutation, mutations.NEAREST):
        assert not passes(case_dir)


@pytest.mark.parametrize("case_dir", SIXTEEN_BIT, ids=lambda d: d.name)
def test_small_arithmetic_differences_pass(case_dir):
    # pre-rounding values up to 2 fp32 ulps off, as another fp32 implementation's
    with mutations.arithmetic_noise(2, seed=0):
        assert passes(case_dir)


# ------------------------------------------------------------ the format
def test_a_case_without_the_optional_keys_means_fp32_and_the_tier_rule(tmp_path):
    src = GOLDEN / "backbone_2d"
    shutil.copytree(src, tmp_path / "plain")
    j = json.loads((tmp_path / "plain" / "case.json").read_text())
    for key in ("param_dtype", "grad_dtype", "rule", "param_name", "rounding", "format"):
        j.pop(key, None)
    (tmp_path / "plain" / "case.json").write_text(json.dumps(j))
    case = Case(tmp_path / "plain")
    assert (case.param_dtype, case.grad_dtype, case.rule, case.param_name) == ("f32", "f32", rule.BACKBONE, "plain")
    assert check_outputs(case, run_case(case))[0]


def test_a_stream_that_is_not_the_names_is_refused(tmp_path):
    shutil.copytree(GOLDEN / "bf16_backbone_2d", tmp_path / "c")
    j = json.loads((tmp_path / "c" / "case.json").read_text())
    j["rounding"]["stream"] += 1
    (tmp_path / "c" / "case.json").write_text(json.dumps(j))
    with pytest.raises(cases.CaseError, match="rounding.stream"):
        Case(tmp_path / "c")


def test_fp32_tolerance_rule():
    tol = {"rtol": 1e-3, "atol": 1e-6}
    e = np.array([1.0, 0.0, -2.0], np.float32)
    assert cases.compare("a", e + np.float32(5e-4), e, tol)[0] is False  # 0 + 5e-4 > 1e-6
    assert cases.compare("a", e * np.float32(1.0009), e, tol)[0] is True
    assert cases.compare("a", np.array([1.0, np.nan, -2.0], np.float32), e, tol)[0] is False


def test_ulps_rule_measures_in_spacings_at_each_elements_largest_magnitude():
    tol = {"ulps": 1, "max_mismatch_fraction": 0.25}

    def bf16(*bits):
        return rounding.to_f32(np.array(bits, np.uint16), "bf16")

    # two steps of three elements: 1 then just below 1; 0.5 then 0.25; +0 twice
    e = np.stack([bf16(0x3F80, 0x3F00, 0x0000), bf16(0x3F7F, 0x3E80, 0x0000)])

    def check(got):
        return cases.compare("p", got.astype(np.float32), e, tol, "bf16")

    ok, worst, _ = check(np.stack([e[0], bf16(0x3F7E, 0x3E80, 0x0000)]))
    # one value in six differs (a quarter allowed: 2/3 of the bound), by 2^-8: half a spacing at 1
    assert ok and worst == pytest.approx(2 / 3)
    # at 0.25 a spacing of the element's largest magnitude (0.5, spacing 2^-8) is two of its own
    assert check(np.stack([e[0], bf16(0x3F7F, 0x3E81, 0x0000)]))[0]
    assert check(np.stack([e[0], bf16(0x3F7F, 0x3E82, 0x0000)]))[0]
    assert not check(np.stack([e[0], bf16(0x3F7F, 0x3E83, 0x0000)]))[0]
    assert check(np.stack([e[0], bf16(0x3F7F, 0x3E80, 0x8000)]))[0]  # -0 for +0: no distance, one mismatch
    assert check(np.stack([e[0], bf16(0x3F7F, 0x3E80, 0x0001)]))[0]  # the smallest subnormal: one spacing at 0
    assert not check(np.stack([e[0], bf16(0x3F7F, 0x3E80, 0x0002)]))[0]  # two
    assert not check(np.stack([bf16(0x3F81, 0x3F01, 0x0000), bf16(0x3F7E, 0x3E80, 0x0000)]))[0]  # 3 of 6 differ
    assert not check(np.stack([e[0], bf16(0x3F7F, 0x3E80, 0x7FC0)]))[0]  # NaN


def test_generation_is_deterministic_and_another_seed_gives_other_data(tmp_path):
    names = ["bf16_bias_1d", "mat_1x1"]
    catalog.generate(tmp_path / "a", names=names)
    catalog.generate(tmp_path / "b", names=names)
    catalog.generate(tmp_path / "c", base_seed=catalog.BASE_SEED + 1, names=names)
    for n in names:
        assert cases.same_folder(tmp_path / "a" / n, tmp_path / "b" / n) == []
        assert cases.same_folder(tmp_path / "a" / n, GOLDEN / n) == []
        assert "grads.npy: differs" in cases.same_folder(tmp_path / "a" / n, tmp_path / "c" / n)
        assert passes(tmp_path / "c" / n)


GLOBAL_CLIP = [d for d in cases.case_dirs(GOLDEN) if Case(d).grad_clip is not None]


def test_the_project_has_cases_of_both_global_clip_norms():
    assert {Case(d).grad_clip.norm for d in GLOBAL_CLIP} == {"current", "previous"}


@pytest.mark.parametrize("case_dir", GLOBAL_CLIP, ids=lambda d: d.name)
def test_a_case_run_with_the_other_norm_or_none_fails(case_dir):
    """The global clip is checked sharply: the other norm, or no clip, fails
    each clipping case (the spikes and the steps after them differ)."""
    case = Case(case_dir)
    other = "previous" if case.grad_clip.norm == "current" else "current"
    for clip in (None, rule.GradClip(case.grad_clip.max_norm, other)):
        case.grad_clip = clip
        ok, _ = check_outputs(case, run_case(case))
        assert not ok, f"{case.name} passed with grad_clip {clip}"


def test_clipping_by_the_previous_norm_scales_each_step_by_the_last_steps_norm():
    rng = np.random.default_rng(3)
    grads = rng.standard_normal((5, 4, 6)).astype(np.float32)
    grads[2] *= 50
    norms = [float(np.sqrt(np.sum(g.astype(np.float64) ** 2))) for g in grads]
    got = rule.clipped_grads(grads, rule.GradClip(10.0, "previous"))
    assert got[0] is None  # no norm before the first step: it only measures
    for k in range(1, 5):
        factor = np.float32(min(10.0 / (norms[k - 1] + 1e-6), 1.0))
        assert np.array_equal(got[k], grads[k] * factor)
    assert not np.array_equal(got[3], grads[3]) and np.array_equal(got[2], grads[2])  # the spike passes, then bites
    now = rule.clipped_grads(grads, rule.GradClip(10.0, "current"))
    assert np.array_equal(now[2], grads[2] * np.float32(10.0 / (norms[2] + 1e-6)))


def test_a_malformed_grad_clip_is_refused(tmp_path):
    src = GOLDEN / "global_clip_previous"
    for bad, words in (({"max_norm": -1}, "max_norm"), ({"max_norm": 1, "norm": "next"}, "grad_clip.norm"),
                       ("25", "grad_clip")):
        shutil.copytree(src, tmp_path / "c", dirs_exist_ok=True)
        j = json.loads((tmp_path / "c" / "case.json").read_text())
        j["grad_clip"] = bad
        (tmp_path / "c" / "case.json").write_text(json.dumps(j))
        with pytest.raises(cases.CaseError, match=words):
            Case(tmp_path / "c")
