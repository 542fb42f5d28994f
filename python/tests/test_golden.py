"""Every golden case (docs/conformance.md: the project's, tests/golden, and
those of the folder SKEWADAM_GOLDEN_DIR names) through the Python API, bit for
bit what skewadam-replay computes, and within the case's tolerances of its
expected values (the checking rule of the reference implementation,
reference/skewadam_reference/cases.py)."""

import subprocess
import sys

import pytest
import torch

# (the reference's checking rule is numpy's; without numpy these tests skip)
np = pytest.importorskip("numpy", reason="the golden cases are .npy files and the reference's rule numpy's")

import skewadam

from conftest import GOLDEN_DIR, ROOT, case_dirs, external_golden_dir, golden_cases

sys.path.insert(0, str(ROOT / "reference"))
from skewadam_reference.cases import Case, compare  # noqa: E402

# The tier of a variant that runs a case's rule, by (momentum, factored).
RULES = {
    (True, True): (skewadam.SkewAdam, "backbone"),
    (False, True): (skewadam.SkewAdam, "experts"),
    (False, False): (skewadam.SkewAdam, "router"),
    (True, False): (skewadam.ExactExpertsAblation, "experts"),
}
# The variant that stores the backbone's momentum as a case says (the linear
# 8-bit map, int8_blocks, is a C++ rule without a variant: the replay runs its
# cases on every backend).
STORED_MOMENTUM = {"bf16": skewadam.SkewAdamBf16Momentum, "float8_blocks": skewadam.SkewAdam8bit}
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
STATE_FILES = {"exp_avg": "m", "v_row": "v_row", "v_col": "v_col", "v": "v"}


def run_case(case, device):
    if case.param_dtype != "f32" and case.rounding.mode == "nearest":
        pytest.skip("the Python package stores 16-bit parameters by stochastic rounding only")
    if case.grad_dtype != case.param_dtype:
        pytest.skip("torch keeps a parameter's gradient in the parameter's dtype: a case with fp32 gradients "
                    f"for a {case.param_dtype} parameter runs in C++ only")
    h = case.hyper
    variant, tier = (skewadam.AdamW, "backbone") if case.rule_name == "adamw" else RULES[(case.momentum,
                                                                                          case.factored)]
    if case.momentum_storage != "f32":
        if not case.factored:
            pytest.skip("the Python package stores momentum in fewer bits with the backbone's factored rule only")
        if case.momentum_storage not in STORED_MOMENTUM:
            pytest.skip(f"no Python variant stores momentum as {case.momentum_storage} (a C++ rule)")
        variant = STORED_MOMENTUM[case.momentum_storage]
    dtype = DTYPES[case.param_dtype]
    param = torch.tensor(case.array("param0"), device=device).to(dtype)
    grads = torch.tensor(case.array("grads"), device=device).to(dtype)
    clip = {} if case.grad_clip is None else {"max_grad_norm": case.grad_clip.max_norm,
                                              "clip_norm": case.grad_clip.norm}
    opt = variant({case.param_name: param}, lr=h.lr, betas=(h.beta1, h.beta2), eps=h.eps,
                  weight_decay=h.weight_decay, clip_threshold=h.clip_threshold, clip_scope=h.clip_scope,
                  seed=case.rounding.seed, tier_rules=[(".*", tier)], threads=2, **clip)
    group = next(g for g in opt.param_groups if g["tier"] == tier)
    params = []
    for t in range(case.steps):
        param.grad = grads[t].clone()
        group["lr"] = case.lr_schedule[t]
        opt.step()
        params.append(param.detach().float().cpu().clone())
    state = opt.state_dict()["state"][case.param_name]
    arrays = {k: state[v].numpy() for k, v in STATE_FILES.items() if v in state}
    if "exp_avg" in arrays:
        arrays["exp_avg"] = opt.momentum(case.param_name).numpy()  # decoded from its storage
    return torch.stack(params).numpy(), arrays


@pytest.mark.parametrize("case_dir", golden_cases())
def test_golden_case_matches_replay_bit_for_bit(case_dir, replay, device, tmp_path):
    case = Case(case_dir)
    params, state = run_case(case, device)
    subprocess.run([replay, str(case_dir), "--out", str(tmp_path)], check=False, capture_output=True)
    want = np.load(tmp_path / "params.npy")
    assert params.shape == want.shape
    if device.type == "cpu":  # the same CPU kernels: the same bits
        assert np.array_equal(params.view(np.uint32), want.view(np.uint32))
    ok, _, message = compare("params", params, case.array("params"), case.tolerance, case.param_dtype)
    assert ok, message
    saved = {f.stem for f in tmp_path.glob("*.npy")} - {"params"}
    assert saved == set(state), "the rule keeps the arrays the case names"
    for name, got in state.items():
        if device.type == "cpu":
            assert np.array_equal(got.view(np.uint32), np.load(tmp_path / f"{name}.npy").view(np.uint32)), name
        ok, _, message = compare(name, got, case.array(name), case.state_tolerance[name])
        assert ok, message


def test_every_case_is_run():
    assert case_dirs(GOLDEN_DIR), f"no golden case in {GOLDEN_DIR}"
    external = external_golden_dir()
    if external is not None:
        assert case_dirs(external), f"SKEWADAM_GOLDEN_DIR={external}: no golden case (a folder holding case.json)"
    assert len(golden_cases()) == len(case_dirs(GOLDEN_DIR)) + (len(case_dirs(external)) if external else 0)
