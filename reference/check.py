#!/usr/bin/python3
"""Checks that the reference rule reproduces every case of a folder within
the case's tolerances (docs/conformance.md).

    check.py FOLDER [--verbose]     exit 0 if every case is reproduced

A folder without a case fails: an empty set of cases proves nothing.
"""
import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from skewadam_reference.cases import Case, CaseError, case_dirs, check_outputs, run_case  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder")
    ap.add_argument("--verbose", action="store_true", help="print every array's check")
    args = ap.parse_args()
    cases = case_dirs(args.folder)
    if not cases:
        print(f"{args.folder}: no case (a folder holding case.json)")
        return 1
    failed = 0
    for d in cases:
        try:
            case = Case(d)
            ok, messages = check_outputs(case, run_case(case))
        except (CaseError, KeyError, OSError, ValueError) as e:
            ok, messages = False, [f"cannot run: {e}"]
        failed += not ok
        if args.verbose or not ok:
            print(f"{d.name}: {'reproduced' if ok else 'NOT reproduced'}")
            print("\n".join("  " + m for m in messages))
    print(f"{args.folder}: {len(cases) - failed} of {len(cases)} cases reproduced by the reference")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
