#!/usr/bin/python3
"""Writes the conformance cases (docs/conformance.md) from the reference rule.

    generate.py OUT_DIR [--seed N] [--case NAME ...]
        writes every case (or those named) into OUT_DIR/<name>/; with --seed,
        cases of the same kinds from other data (for an external folder)
    generate.py --check GOLDEN_DIR
        regenerates the project's cases in a temporary folder and checks that
        GOLDEN_DIR holds exactly them, byte for byte

The project's cases (tests/golden) are `generate.py tests/golden`.
"""
import argparse
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from skewadam_reference import catalog  # noqa: E402
from skewadam_reference.cases import case_dirs, same_folder  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the folder to write the cases into (with --check: the folder to compare)")
    ap.add_argument("--seed", type=int, default=catalog.BASE_SEED,
                    help=f"base seed of the inputs (default {catalog.BASE_SEED}: the project's cases)")
    ap.add_argument("--case", action="append", help="write only this case (repeatable)")
    ap.add_argument("--check", action="store_true", help="compare the folder with freshly generated cases")
    args = ap.parse_args()
    known = {s.name for s in catalog.SPECS}
    for name in args.case or []:
        if name not in known:
            ap.error(f"--case {name}: no such case (known: {', '.join(sorted(known))})")
    if not args.check:
        written = catalog.generate(args.out, args.seed, args.case)
        print(f"{len(written)} cases written to {args.out}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        written = catalog.generate(tmp, args.seed, args.case)
        problems = []
        present = {d.name for d in case_dirs(args.out)}
        problems += [f"{n}: missing from {args.out}" for n in sorted(set(written) - present)]
        problems += [f"{n}: in {args.out} but not generated" for n in sorted(present - set(written))]
        for name in sorted(set(written) & present):
            problems += [f"{name}/{d}" for d in same_folder(pathlib.Path(tmp) / name, pathlib.Path(args.out) / name)]
    if problems:
        print("\n".join(problems))
        print(f"{args.out} differs from the generated cases (regenerate: reference/generate.py {args.out})")
        return 1
    print(f"{args.out}: the {len(written)} generated cases, byte for byte")
    return 0


if __name__ == "__main__":
    sys.exit(main())
