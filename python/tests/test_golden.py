"""Every golden case (the folder's format: ../../shared/golden/README.md)
through the Python API, bit for bit what skewadam-replay computes, and
within the case's tolerances of its expected values."""

import json
import subprocess

import numpy as np
import pytest
import torch

import skewadam

from conftest import golden_cases

# The tier of a variant that runs a case's rule, by (momentum, factored).
RULES = {
    (True, True): (skewadam.SkewAdam, "backbone"),
    (False, True): (skewadam.SkewAdam, "experts"),
    (False, False): (skewadam.SkewAdam, "router"),
    (True, False): (skewadam.ExactExpertsAblation, "experts"),
}
STATE_FILES = {"exp_avg": "m", "v_row": "v_row", "v_col": "v_col", "v": "v"}


def run_case(case_dir, device):
    c = json.loads((case_dir / "case.json").read_text())
    h = c["hyper"]
    variant, tier = RULES[(c["tier"]["momentum"], c["tier"]["factored"])]
    param = torch.tensor(np.load(case_dir / "param0.npy"), device=device)
    grads = torch.tensor(np.load(case_dir / "grads.npy"), device=device)
    opt = variant({case_dir.name: param}, lr=h["lr"], betas=(h["beta1"], h["beta2"]), eps=h["eps"],
                  weight_decay=h["weight_decay"], clip_threshold=h["clip_threshold"], clip_scope=c["clip_scope"],
                  tier_rules=[(".*", tier)], threads=2)
    group = next(g for g in opt.param_groups if g["tier"] == tier)
    params = []
    for t in range(c["steps"]):
        param.grad = grads[t].clone()
        group["lr"] = h["lr_schedule"][t]
        opt.step()
        params.append(param.detach().cpu().clone())
    state = opt.state_dict()["state"][case_dir.name]
    return c, torch.stack(params).numpy(), {k: state[v].numpy() for k, v in STATE_FILES.items() if v in state}


@pytest.mark.parametrize("case", golden_cases())
def test_golden_case_matches_replay_bit_for_bit(case, golden_dir, replay, device, tmp_path):
    case_dir = golden_dir / case
    c, params, state = run_case(case_dir, device)
    subprocess.run([replay, str(case_dir), "--out", str(tmp_path)], check=False, capture_output=True)
    want = np.load(tmp_path / "params.npy")
    assert params.shape == want.shape
    if device.type == "cpu":  # the same CPU kernels: the same bits
        assert np.array_equal(params.view(np.uint32), want.view(np.uint32))
    expected = np.load(case_dir / "params.npy")
    tol = c["tolerance"]
    assert np.allclose(params, expected, rtol=tol["rtol"], atol=tol["atol"])
    saved = {f.stem for f in tmp_path.glob("*.npy")} - {"params"}
    assert saved == set(state), "the rule keeps the arrays the case names"
    for name, got in state.items():
        if device.type == "cpu":
            assert np.array_equal(got.view(np.uint32), np.load(tmp_path / f"{name}.npy").view(np.uint32)), name
        st = c["state_tolerance"][name]
        assert np.allclose(got, np.load(case_dir / f"{name}.npy"), rtol=st["rtol"], atol=st["atol"]), name


def test_every_case_is_run(golden_dir):
    cases = golden_cases()
    assert cases, "no golden case found"
    assert len(cases) == sum(1 for p in golden_dir.iterdir() if (p / "case.json").is_file())
