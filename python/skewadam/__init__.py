"""SkewAdam for PyTorch: each parameter population of a Mixture-of-Experts
model keeps only the optimizer state that pays.

    import skewadam
    opt = skewadam.SkewAdam(model.named_parameters(), lr=3e-4, weight_decay=0.05)

The classes are torch.optim.Optimizer subclasses over the header-only C++
library (CPU backend; CUDA backend when built with it). See TieredOptimizer
for the keyword arguments they share. save_checkpoint() and load_checkpoint()
write and read the library's checkpoint file, the one C++ programs write.
"""

from . import _skewadam
from .optim import (
    AdafactorLike,
    AdamW,
    CheckpointError,
    ExactExpertsAblation,
    ExpertMomentumAblation,
    FactoredRouterAblation,
    NonFiniteGradientError,
    SkewAdam,
    SkewAdam8bit,
    SkewAdamBf16Momentum,
    StepReport,
    TieredOptimizer,
    UniformAblation,
    load_checkpoint,
    save_checkpoint,
)

__version__ = _skewadam.version
#: whether this build holds the CUDA engines (parameters on a CUDA device)
cuda = _skewadam.cuda

__all__ = [
    "AdafactorLike",
    "AdamW",
    "CheckpointError",
    "ExactExpertsAblation",
    "ExpertMomentumAblation",
    "FactoredRouterAblation",
    "NonFiniteGradientError",
    "SkewAdam",
    "SkewAdam8bit",
    "SkewAdamBf16Momentum",
    "StepReport",
    "TieredOptimizer",
    "UniformAblation",
    "cuda",
    "load_checkpoint",
    "save_checkpoint",
]
