"""Builds skewadam._skewadam, a torch extension over the header-only C++
library in ../include: the CPU backend always, and the CUDA backend too when
the installed torch has CUDA and nvcc is found (SKEWADAM_CUDA=0 turns it off,
=1 requires it).

    python3 -m venv --system-site-packages VENV
    VENV/bin/pip install --no-build-isolation --no-deps ./python

The kernels are compiled for this machine's processor (-march=native), its
widest CPU level alone; set SKEWADAM_MARCH to another -march value
(x86-64-v3, say) for a build that runs elsewhere, and
SKEWADAM_RUNTIME_DISPATCH=1 for one that holds every level the flags allow
and picks one at run time (SKEWADAM_CPU_ARCH). SKEWADAM_COMPILED names a
build folder of the library's compiled mode (skewadam::compiled: its
libskewadam_compiled.a and generated/), whose kernels are then linked
instead of compiled here (the project's tests build it so). MAX_JOBS sets
how many sources compile at once (default: the cores).
"""

import os
import pathlib
import shutil
import sys

from setuptools import setup

try:
    import torch
    from torch.utils import cpp_extension
except ImportError:  # pragma: no cover - stated to the user
    sys.exit("skewadam: building needs torch installed (Debian: python3-torch), and pip's "
             "--no-build-isolation so that the build sees it")

HERE = pathlib.Path(__file__).resolve().parent
INCLUDE = HERE.parent / "include"
if not (INCLUDE / "skewadam" / "skewadam.hpp").is_file():
    sys.exit(f"skewadam: the library's headers are not at {INCLUDE}; build from the repository's "
             "python/ folder (pip install ./python)")


def include_dirs():
    # Eigen and the other header-only dependencies: the system's, or folders
    # named in CPATH (scripts/gpu-check points it at scripts/gpu-pack's folder)
    dirs = [str(INCLUDE)]
    cpath = [d for d in os.environ.get("CPATH", "").split(os.pathsep) if d]
    for eigen in ("/usr/include/eigen3", "/usr/local/include/eigen3", *cpath):
        if os.path.isfile(os.path.join(eigen, "Eigen", "Core")):
            dirs.append(eigen)
            break
    else:
        sys.exit("skewadam: Eigen's headers were not found (Debian: libeigen3-dev; or name their folder in CPATH)")
    return dirs + [d for d in cpath if d not in dirs]


def with_cuda():
    want = os.environ.get("SKEWADAM_CUDA", "auto")
    found = torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None and (
        shutil.which("nvcc") or os.path.exists(os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc")))
    if want == "1" and not found:
        sys.exit("skewadam: SKEWADAM_CUDA=1, but this torch has no CUDA or nvcc was not found")
    return bool(found) and want != "0"


march = os.environ.get("SKEWADAM_MARCH", "native")
cxx = ["-std=c++20", "-O3", "-g0", f"-march={march}", "-fopenmp", "-fno-math-errno",
       # GCC 12's AVX-512 intrinsics warn as (maybe-)uninitialized once inlined
       # (GCC bug 105593)
       "-Wno-uninitialized", "-Wno-maybe-uninitialized"]
sources = ["src/module.cpp"]
kwargs = dict(include_dirs=include_dirs(), extra_link_args=["-fopenmp"])
if os.environ.get("SKEWADAM_RUNTIME_DISPATCH", "0") == "1":
    cxx.append("-DSKEWADAM_RUNTIME_DISPATCH")
compiled = os.environ.get("SKEWADAM_COMPILED")
if compiled:
    library = os.path.join(compiled, "libskewadam_compiled.a")
    generated = os.path.join(compiled, "generated")
    if not (os.path.isfile(library) and os.path.isfile(os.path.join(generated, "skewadam", "compiled_levels.hpp"))):
        sys.exit(f"skewadam: SKEWADAM_COMPILED={compiled} holds no libskewadam_compiled.a and generated/ "
                 "(a build folder of the library with SKEWADAM_BUILD_COMPILED=ON, built)")
    cxx.append("-DSKEWADAM_COMPILED")
    kwargs["include_dirs"].append(generated)
    kwargs["extra_objects"] = [library]
if with_cuda():
    cxx.append("-DSKEWADAM_PYTHON_WITH_CUDA")
    extension = cpp_extension.CUDAExtension(
        "skewadam._skewadam", sources + ["src/cuda_engines.cu"],
        extra_compile_args={"cxx": cxx,
                            "nvcc": ["-std=c++20", "-O3", "--expt-relaxed-constexpr", "-fmad=false",
                                     "-diag-suppress=20012,20013,20014,20015,445"]},
        **kwargs)
else:
    extension = cpp_extension.CppExtension("skewadam._skewadam", sources, extra_compile_args={"cxx": cxx}, **kwargs)

setup(ext_modules=[extension], cmdclass={"build_ext": cpp_extension.BuildExtension})
