"""Shared fixtures of the Python package's tests.

The tests run on the CPU, and again on a CUDA device when torch has one and
this build of the package holds the CUDA engines (the `device` fixture).
SKEWADAM_REPLAY names the skewadam-replay binary and SKEWADAM_GOLDEN_DIR the
golden cases (the CMake build sets both when ctest runs these tests).
"""

import os
import pathlib

import pytest
import torch

import skewadam

ROOT = pathlib.Path(__file__).resolve().parents[2]


def devices():
    out = ["cpu"]
    if torch.cuda.is_available() and skewadam.cuda:
        out.append("cuda")
    return out


@pytest.fixture(params=devices())
def device(request):
    return torch.device(request.param)


@pytest.fixture(scope="session")
def golden_dir():
    d = pathlib.Path(os.environ.get("SKEWADAM_GOLDEN_DIR", ROOT.parent / "shared" / "golden"))
    if not d.is_dir():
        pytest.fail(f"golden cases not found at {d} (set SKEWADAM_GOLDEN_DIR)")
    return d


@pytest.fixture(scope="session")
def replay():
    path = os.environ.get("SKEWADAM_REPLAY")
    if not path:
        pytest.skip("SKEWADAM_REPLAY is not set (the path of the C++ build's skewadam-replay)")
    if not os.access(path, os.X_OK):
        pytest.fail(f"SKEWADAM_REPLAY={path}: not an executable")
    return path


def golden_cases():
    d = pathlib.Path(os.environ.get("SKEWADAM_GOLDEN_DIR", ROOT.parent / "shared" / "golden"))
    return sorted(p.name for p in d.iterdir() if (p / "case.json").is_file()) if d.is_dir() else []
