"""Shared fixtures of the Python package's tests.

The tests run on the CPU, and again on a CUDA device when torch has one and
this build of the package holds the CUDA engines (the `device` fixture).
SKEWADAM_REPLAY names the skewadam-replay binary (and
SKEWADAM_CHECKPOINT_INTEROP skewadam-checkpoint-interop). The golden cases are the
project's (tests/golden) and, when SKEWADAM_GOLDEN_DIR names a folder, that
folder's in addition (the CMake build sets both variables when ctest runs
these tests).
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


def program(variable, what):
    """The C++ build's program that the environment variable names: the test
    skips when it is not set, and fails when it names no executable."""
    path = os.environ.get(variable)
    if not path:
        pytest.skip(f"{variable} is not set (the path of the C++ build's {what})")
    if not os.access(path, os.X_OK):
        pytest.fail(f"{variable}={path}: not an executable")
    return path


@pytest.fixture(scope="session")
def replay():
    return program("SKEWADAM_REPLAY", "skewadam-replay")


GOLDEN_DIR = ROOT / "tests" / "golden"


def external_golden_dir():
    """The folder SKEWADAM_GOLDEN_DIR names, or None."""
    value = os.environ.get("SKEWADAM_GOLDEN_DIR", "")
    return pathlib.Path(value) if value else None


def case_dirs(folder):
    return sorted(p for p in folder.iterdir() if (p / "case.json").is_file()) if folder.is_dir() else []


def golden_cases():
    """pytest parameters of every case: the project's (id golden/<case>),
    then the external folder's (golden-external/<case>)."""
    out = [pytest.param(d, id=f"golden/{d.name}") for d in case_dirs(GOLDEN_DIR)]
    external = external_golden_dir()
    if external is not None:
        out += [pytest.param(d, id=f"golden-external/{d.name}") for d in case_dirs(external)]
    return out
