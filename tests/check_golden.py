#!/usr/bin/python3
"""Independent check of skewadam-replay's --out files against a golden case.

    check_golden.py CASE_DIR OUT_DIR     exit 0 if every array is within tolerance
    check_golden.py --self-test GOLDEN   checks that this checker rejects perturbed outputs

Uses only NumPy and the golden README's rule:
|got - expected| <= atol + rtol * |expected|, element-wise.
"""
import json
import os
import shutil
import sys
import tempfile

import numpy as np


def expected_arrays(case_dir):
    with open(os.path.join(case_dir, "case.json")) as f:
        case = json.load(f)
    arrays = {"params": (np.load(os.path.join(case_dir, "params.npy")), case["tolerance"])}
    for name, tol in case.get("state_tolerance", {}).items():
        path = os.path.join(case_dir, name + ".npy")
        if os.path.exists(path):
            arrays[name] = (np.load(path), tol)
    return arrays


def check(case_dir, out_dir, quiet=False):
    ok = True
    for name, (expected, tol) in expected_arrays(case_dir).items():
        path = os.path.join(out_dir, name + ".npy")
        if not os.path.exists(path):
            print(f"{name}: missing from {out_dir}")
            ok = False
            continue
        got = np.load(path)
        if got.shape != expected.shape or got.dtype != np.float32:
            print(f"{name}: shape {got.shape} {got.dtype}, expected {expected.shape} float32")
            ok = False
            continue
        allowed = tol["atol"] + tol["rtol"] * np.abs(expected.astype(np.float64))
        err = np.abs(got.astype(np.float64) - expected.astype(np.float64))
        frac = np.where(np.isfinite(err), err / allowed, np.inf)
        worst = float(frac.max()) if frac.size else 0.0
        good = bool(np.all(frac <= 1.0))
        if not quiet:
            print(f"{name}: worst error {worst:.4f} of tolerance {'ok' if good else 'FAIL'}")
        ok = ok and good
    return ok


def self_test(golden):
    cases = sorted(d for d in os.listdir(golden) if os.path.exists(os.path.join(golden, d, "case.json")))
    if not cases:
        print("no cases found")
        return False
    for c in cases:
        case_dir = os.path.join(golden, c)
        with tempfile.TemporaryDirectory() as tmp:
            for name, (expected, tol) in expected_arrays(case_dir).items():
                np.save(os.path.join(tmp, name + ".npy"), expected)
            if not check(case_dir, tmp, quiet=True):
                print(f"{c}: the expected values themselves were rejected")
                return False
            params, tol = expected_arrays(case_dir)["params"]
            bad = params.copy()
            flat = bad.reshape(-1)
            k = flat.size // 2
            flat[k] += np.float32(2.5 * (tol["atol"] + tol["rtol"] * abs(float(flat[k]))))
            np.save(os.path.join(tmp, "params.npy"), bad)
            if check(case_dir, tmp, quiet=True):
                print(f"{c}: a perturbed output was accepted")
                return False
    print(f"checker self-test: {len(cases)} cases, perturbed outputs rejected")
    return True


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--self-test":
        sys.exit(0 if self_test(sys.argv[2]) else 1)
    if len(sys.argv) != 3:
        print(__doc__)
        sys.exit(2)
    sys.exit(0 if check(sys.argv[1], sys.argv[2]) else 1)
