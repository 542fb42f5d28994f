#!/usr/bin/python3
"""Independent check of skewadam-replay's --out files against a golden case.

    check_golden.py CASE_DIR OUT_DIR     exit 0 if every array is within tolerance
    check_golden.py --self-test GOLDEN   checks that this checker rejects perturbed outputs

Uses only NumPy and the checking rule of docs/conformance.md, as the
reference implementation states it (reference/skewadam_reference/cases.py):
|got - expected| <= atol + rtol |expected| element-wise; for a 16-bit
parameter, every element within `ulps` values of its dtype and at most
max_mismatch_fraction of the elements not identical.
"""
import os
import pathlib
import sys
import tempfile

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "reference"))
from skewadam_reference import cases, rounding  # noqa: E402
from skewadam_reference.cases import Case, case_dirs, check_outputs, load_outputs  # noqa: E402


def check(case_dir, out_dir, quiet=False):
    ok, messages = check_outputs(Case(case_dir), load_outputs(out_dir))
    if not quiet:
        print("\n".join(messages))
    return ok


def perturbations(case):
    """Outputs that must be rejected: the expected parameters with one value
    moved out of its tolerance; for a 16-bit parameter, also with more
    values than allowed moved by one value of the dtype."""
    params = case.array("params")
    flat = params.reshape(-1)
    k = flat.size // 2
    tol = case.tolerance
    if "ulps" not in tol:
        bad = flat.copy()
        bad[k] += np.float32(2.5 * (tol["atol"] + tol["rtol"] * abs(float(bad[k]))))
        yield "one value 2.5 tolerances off", bad.reshape(params.shape)
        return
    dtype = case.param_dtype
    k = int(np.argmax(np.abs(flat)))  # at its element's largest magnitude: the spacing the rule uses there
    far = flat.copy()
    step = float(cases.spacing(abs(float(flat[k])), dtype))
    far[k] -= np.float32(np.sign(flat[k]) * (tol["ulps"] + 1) * step)  # towards zero: still a value of dtype
    yield f"one value {tol['ulps'] + 1:g} {dtype} spacings off", far.reshape(params.shape)
    bits = rounding.nearest(flat, dtype)
    many = bits.copy()
    count = int(np.floor(tol["max_mismatch_fraction"] * flat.size)) + 1
    idx = np.linspace(0, flat.size - 1, count).astype(np.int64)
    many[idx] ^= np.uint16(1)  # the neighbouring value, on more elements than allowed
    yield f"{count} values one {dtype} value off", rounding.to_f32(many, dtype).reshape(params.shape)


def self_test(golden):
    cases = case_dirs(golden)
    if not cases:
        print(f"no case in {golden}")
        return False
    for case_dir in cases:
        case = Case(case_dir)
        with tempfile.TemporaryDirectory() as tmp:
            for name, (expected, _) in case.expected().items():
                np.save(os.path.join(tmp, name + ".npy"), expected)
            if not check(case_dir, tmp, quiet=True):
                print(f"{case.name}: the expected values themselves were rejected")
                return False
            for what, bad in perturbations(case):
                np.save(os.path.join(tmp, "params.npy"), bad)
                if check(case_dir, tmp, quiet=True):
                    print(f"{case.name}: a perturbed output ({what}) was accepted")
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
