"""SkewAdam for PyTorch: each parameter population of a Mixture-of-Experts
model keeps only the optimizer state that pays.

    import skewadam
    opt = skewadam.SkewAdam(model.named_parameters(), lr=3e-4, weight_decay=0.05)

The classes are torch.optim.Optimizer subclasses over the header-only C++
library (CPU backend; CUDA backend when built with it). See TieredOptimizer
for the keyword arguments they share. save_checkpoint() and load_checkpoint()
write and read the library's checkpoint file, the one C++ programs write.
"""

from . import _skewadam, optim
from .optim import (
    VARIANTS,
    CheckpointError,
    NonFiniteGradientError,
    StepReport,
    TieredOptimizer,
    load_checkpoint,
    save_checkpoint,
)

# The optimizer classes, one per variant the library names (VARIANTS).
globals().update({name: getattr(optim, name) for name in VARIANTS})

__version__ = _skewadam.version
#: whether this build holds the CUDA engines (parameters on a CUDA device)
cuda = _skewadam.cuda

__all__ = [
    *VARIANTS,
    "VARIANTS",
    "CheckpointError",
    "NonFiniteGradientError",
    "StepReport",
    "TieredOptimizer",
    "cuda",
    "load_checkpoint",
    "save_checkpoint",
]
