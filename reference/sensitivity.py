#!/usr/bin/python3
"""How the 16-bit check of docs/conformance.md responds, on every 16-bit
case of a folder: to small differences in fp32 arithmetic (which it must
accept) and to wrong roundings (which it must reject).

    sensitivity.py [FOLDER] [--seeds N]     (FOLDER: tests/golden)

For arithmetic noise of 1, 2 and 4 fp32 ulps (mutations.arithmetic_noise,
N random draws each) it prints the largest share of values that differ and
the largest difference in spacings; for each wrong rounding
(mutations.STOCHASTIC, mutations.NEAREST) the smallest share.
"""
import argparse
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from skewadam_reference import mutations  # noqa: E402
from skewadam_reference.cases import Case, case_dirs, run_case, spacing  # noqa: E402


def measure(case):
    """(share of values not identical, largest difference in spacings)."""
    got = run_case(case)["params"]
    want = case.array("params")
    share = float(np.mean(got.view(np.uint32) != want.view(np.uint32)))
    e = want.astype(np.float64)
    far = float(np.max(np.abs(got - e) / spacing(np.abs(e).max(axis=0), case.param_dtype)))
    return share, far


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", nargs="?", default=str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "golden"))
    ap.add_argument("--seeds", type=int, default=10)
    args = ap.parse_args()
    cases = [Case(d) for d in case_dirs(args.folder)]
    cases = [c for c in cases if c.param_dtype != "f32"]
    if not cases:
        print(f"{args.folder}: no 16-bit case")
        return 1
    print(f"{'case':24} {'bound':>7} " + " ".join(f"{f'noise {k} ulp':>16}" for k in (1, 2, 4)) +
          f" {'wrong rounding':>16}")
    for c in cases:
        row = []
        for k in (1, 2, 4):
            results = []
            for seed in range(args.seeds):
                with mutations.arithmetic_noise(k, seed):
                    results.append(measure(c))
            row.append(f"{100 * max(r[0] for r in results):6.2f} % {max(r[1] for r in results):4.1f} sp")
        table = mutations.STOCHASTIC if c.rounding.mode == "stochastic" else mutations.NEAREST
        wrong = []
        for name in table:
            if mutations.applies(name, table, c):
                with mutations.applied(name, table):
                    wrong.append(measure(c)[0])
        bound = f"{100 * c.tolerance['max_mismatch_fraction']:g} %"
        print(f"{c.name:24} {bound:>7} " + " ".join(f"{r:>16}" for r in row) + f" {100 * min(wrong):14.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
