"""A NumPy reference of SkewAdam's update rule (docs/spec.md), written from
the specification alone, and the conformance cases it generates
(docs/conformance.md)."""

from .cases import Case, case_dirs, check_outputs, compare, run_case, write_case
from .philox import fnv1a32, philox4x32, rounding_bits
from .rule import ADAMW, BACKBONE, EXACT_MOMENTUM, EXPERTS, ROUTER, Hyper, Rounding, Rule, run, step

__all__ = ["Case", "case_dirs", "check_outputs", "compare", "run_case", "write_case", "fnv1a32", "philox4x32",
           "rounding_bits", "ADAMW", "BACKBONE", "EXACT_MOMENTUM", "EXPERTS", "ROUTER", "Hyper", "Rounding", "Rule",
           "run", "step"]
