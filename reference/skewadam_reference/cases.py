"""Conformance case folders (docs/conformance.md): reading, writing, running
through the reference rule, and the checking rule.
"""

import dataclasses
import json
import math
import pathlib

import numpy as np

from . import philox, rounding
from .rule import (ADAMW, BACKBONE, EXACT_MOMENTUM, EXPERTS, MOMENTUM_STORAGES, ROUTER, GradClip, Hyper, Rounding,
                   run)

FORMAT = "skewadam-golden/1"


class CaseError(ValueError):
    pass


def case_dirs(folder):
    """Every case folder (one holding case.json) directly under `folder`, sorted."""
    folder = pathlib.Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if (p / "case.json").is_file())


class Case:
    """A case folder's settings and arrays, with the optional keys filled in."""

    def __init__(self, folder):
        self.dir = pathlib.Path(folder)
        self.name = self.dir.name
        where = str(self.dir / "case.json")
        try:
            j = json.loads((self.dir / "case.json").read_text())
        except (OSError, ValueError) as e:
            raise CaseError(f"{where}: {e}") from None
        if j.get("format", FORMAT) != FORMAT:
            raise CaseError(f"{where}: unknown format {j['format']!r}")
        self.shape = tuple(int(d) for d in j["shape"])
        self.steps = int(j["steps"])
        self.momentum = bool(j["tier"]["momentum"])
        self.factored = bool(j["tier"]["factored"])
        hj = j["hyper"]
        self.lr_schedule = [float(x) for x in hj["lr_schedule"]]
        if len(self.lr_schedule) != self.steps:
            raise CaseError(f"{where}: lr_schedule has {len(self.lr_schedule)} values for {self.steps} steps")
        scope = {"tensor": "tensor", "matrix": "matrix", "per_matrix": "matrix"}.get(j.get("clip_scope", "tensor"))
        if scope is None:
            raise CaseError(f"{where}: unknown clip_scope {j['clip_scope']!r} (expected tensor or matrix)")
        self.hyper = Hyper(lr=self.lr_schedule[0], beta1=hj["beta1"], beta2=hj["beta2"], eps=hj["eps"],
                           weight_decay=hj["weight_decay"], clip_threshold=hj["clip_threshold"], clip_scope=scope)
        self.rule_name = j.get("rule", "skewadam")
        if self.rule_name == "adamw":
            if not self.momentum or self.factored:
                raise CaseError(f"{where}: rule adamw keeps momentum and an exact second moment "
                                "(tier.momentum true, tier.factored false)")
            self.rule = ADAMW
        elif self.rule_name == "skewadam":
            self.rule = {(True, True): BACKBONE, (False, True): EXPERTS, (False, False): ROUTER,
                         (True, False): EXACT_MOMENTUM}[(self.momentum, self.factored)]
        else:
            raise CaseError(f"{where}: unknown rule {self.rule_name!r} (expected skewadam or adamw)")
        self.momentum_storage = j.get("momentum_storage", "f32")
        if self.momentum_storage not in MOMENTUM_STORAGES:
            raise CaseError(f"{where}: unknown momentum_storage {self.momentum_storage!r} "
                            f"(expected {', '.join(MOMENTUM_STORAGES)})")
        if self.momentum_storage != "f32":
            if not self.momentum:
                raise CaseError(f"{where}: momentum_storage {self.momentum_storage} needs tier.momentum true")
            self.rule = dataclasses.replace(self.rule, momentum_storage=self.momentum_storage)
        self.param_dtype = j.get("param_dtype", "f32")
        self.grad_dtype = j.get("grad_dtype", "f32")
        if self.param_dtype not in rounding.DTYPES:
            raise CaseError(f"{where}: unknown param_dtype {self.param_dtype!r}")
        if self.grad_dtype not in ("f32", self.param_dtype):
            raise CaseError(f"{where}: grad_dtype must be f32 or the param_dtype")
        self.param_name = j.get("param_name", self.name)
        rj = j.get("rounding", {})
        self.rounding = Rounding(mode=rj.get("mode", "stochastic"), seed=int(rj.get("seed", 0x5EED5EED)),
                                 stream=philox.fnv1a32(self.param_name))
        if "stream" in rj and int(rj["stream"]) != self.rounding.stream:
            raise CaseError(f"{where}: rounding.stream {rj['stream']} is not FNV-1a of param_name "
                            f"{self.param_name!r} ({self.rounding.stream})")
        if self.rounding.mode not in ("stochastic", "nearest"):
            raise CaseError(f"{where}: unknown rounding.mode {self.rounding.mode!r}")
        self.grad_clip = None
        if "grad_clip" in j:
            cj = j["grad_clip"]
            if not isinstance(cj, dict) or not isinstance(cj.get("max_norm"), (int, float)):
                raise CaseError(f"{where}: grad_clip must be {{\"max_norm\": number, \"norm\": ...}}")
            if not (math.isfinite(cj["max_norm"]) and cj["max_norm"] > 0):
                raise CaseError(f"{where}: grad_clip.max_norm must be finite and > 0")
            if cj.get("norm", "current") not in ("current", "previous"):
                raise CaseError(f"{where}: unknown grad_clip.norm {cj['norm']!r} (expected current or previous)")
            self.grad_clip = GradClip(float(cj["max_norm"]), cj.get("norm", "current"))
        self.tolerance = j["tolerance"]
        self.state_tolerance = j.get("state_tolerance", {})
        self.description = j.get("description", "")

    def array(self, name):
        return np.load(self.dir / f"{name}.npy")

    def state_names(self):
        names = ["exp_avg"] if self.momentum else []
        return names + (["v_row", "v_col"] if self.factored and len(self.shape) >= 2 else ["v"])

    def expected(self):
        """{name: (array, tolerance)} of every checked output."""
        out = {"params": (self.array("params"), self.tolerance)}
        for name in self.state_names():
            out[name] = (self.array(name), self.state_tolerance[name])
        return out


def run_case(case):
    """The reference's outputs for a case: {"params": ..., state files ...}."""
    params, state, _ = run(case.rule, case.hyper, case.shape, case.array("param0"), case.array("grads"),
                           case.lr_schedule, case.param_dtype, case.rounding, case.grad_clip)
    return {"params": params, **state}


# ----------------------------------------------------------- the checking rule
MANTISSA_BITS = {"bf16": 7, "f16": 10}
MIN_EXPONENT = {"bf16": -126, "f16": -14}


def spacing(magnitude, dtype):
    """The distance between neighbouring values of dtype at each magnitude
    (at 0 and among subnormals: the subnormal spacing)."""
    m = np.abs(np.asarray(magnitude, dtype=np.float64))
    _, e = np.frexp(m)  # m = f * 2^e, f in [0.5, 1): the binade's exponent is e - 1
    e = np.where(m > 0, e - 1, MIN_EXPONENT[dtype])
    return np.ldexp(1.0, np.maximum(e, MIN_EXPONENT[dtype]) - MANTISSA_BITS[dtype])


def compare(name, got, expected, tol, dtype="f32"):
    """Checks one array; returns (ok, worst, message).

    rtol/atol: |got - expected| <= atol + rtol |expected| element-wise;
    worst is the largest error as a fraction of that.

    ulps/max_mismatch_fraction (a 16-bit parameter, arrays [steps, *shape]):
    every value within `ulps` spacings of the dtype of the expected one, the
    spacing taken at the element's largest expected magnitude over the run;
    and at most max_mismatch_fraction of all values not identical. worst is
    the larger of (largest difference in spacings / ulps) and (mismatch
    fraction / max_mismatch_fraction).
    """
    got = np.asarray(got)
    if got.shape != expected.shape:
        return False, np.inf, f"{name}: shape {got.shape}, expected {expected.shape}"
    if got.dtype != np.float32:
        return False, np.inf, f"{name}: dtype {got.dtype}, expected float32"
    if "ulps" in tol:
        if dtype == "f32" or not (rounding.representable(got, dtype) and rounding.representable(expected, dtype)):
            return False, np.inf, f"{name}: values are not all {dtype} values (an ulps tolerance needs 16-bit values)"
        e = expected.astype(np.float64)
        largest = np.abs(e).max(axis=0, initial=0.0) if e.ndim > 1 else np.abs(e)
        with np.errstate(invalid="ignore"):
            diff = np.abs(got.astype(np.float64) - e) / spacing(largest, dtype)
        diff = np.where(np.isnan(diff), np.inf, diff)
        far = float(diff.max(initial=0.0))
        differ = int(np.count_nonzero(got.view(np.uint32) != expected.view(np.uint32)))
        fraction = differ / max(got.size, 1)

        def ratio(x, bound):
            return 0.0 if x == 0 else (x / bound if bound > 0 else np.inf)

        worst = max(ratio(far, tol["ulps"]), ratio(fraction, tol["max_mismatch_fraction"]))
        ok = bool(far <= tol["ulps"] and fraction <= tol["max_mismatch_fraction"])
        msg = (f"{name}: {differ} of {got.size} values differ ({100 * fraction:.3f} %, at most "
               f"{100 * tol['max_mismatch_fraction']:g} %), by at most {far:g} {dtype} spacings (at most "
               f"{tol['ulps']:g})")
        return ok, worst, msg
    e = expected.astype(np.float64)
    allowed = tol["atol"] + tol["rtol"] * np.abs(e)
    err = np.abs(got.astype(np.float64) - e)
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(err == 0, 0.0, err / allowed)
    frac = np.where(np.isnan(err) | np.isnan(frac), np.inf, frac)
    worst = float(frac.max()) if frac.size else 0.0
    return bool(worst <= 1.0), worst, f"{name}: worst error {worst:.4f} of tolerance"


def check_outputs(case, outputs):
    """Checks computed outputs ({name: array}) against a case; returns
    (ok, [messages]). A missing output fails."""
    ok, messages = True, []
    for name, (expected, tol) in case.expected().items():
        if name not in outputs:
            ok = False
            messages.append(f"{name}: missing")
            continue
        good, _, msg = compare(name, outputs[name], expected, tol, case.param_dtype if name == "params" else "f32")
        ok = ok and good
        messages.append(msg + ("" if good else "  FAIL"))
    return ok, messages


def load_outputs(folder):
    """The .npy files of an output folder (as skewadam-replay --out writes)."""
    return {p.stem: np.load(p) for p in pathlib.Path(folder).glob("*.npy")}


# ------------------------------------------------------------------ writing
def write_case(folder, settings, arrays):
    """Writes case.json (settings, a dict in the key order given) and the
    arrays (float32 .npy) into `folder`."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "case.json").write_text(format_json(settings) + "\n")
    for name, a in arrays.items():
        a = np.ascontiguousarray(a, dtype=np.float32)
        with open(folder / f"{name}.npy", "wb") as f:
            np.lib.format.write_array(f, a, version=(1, 0), allow_pickle=False)


def format_json(value, indent=""):
    """JSON with one key per line and lists of numbers on one line."""
    if isinstance(value, dict):
        inner = indent + " "
        items = [f"{inner}{json.dumps(k)}: {format_json(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, list) and all(not isinstance(x, (dict, list)) for x in value):
        return "[" + ", ".join(json.dumps(x) for x in value) + "]"
    if isinstance(value, list):
        inner = indent + " "
        return "[\n" + ",\n".join(inner + format_json(x, inner) for x in value) + "\n" + indent + "]"
    return json.dumps(value)


def same_folder(a, b):
    """Lists the differences between two case folders' files (empty: equal)."""
    a, b = pathlib.Path(a), pathlib.Path(b)
    fa = {p.name for p in a.iterdir()} if a.is_dir() else set()
    fb = {p.name for p in b.iterdir()} if b.is_dir() else set()
    diffs = [f"{n}: only in {a}" for n in sorted(fa - fb)] + [f"{n}: only in {b}" for n in sorted(fb - fa)]
    for n in sorted(fa & fb):
        if (a / n).read_bytes() != (b / n).read_bytes():
            diffs.append(f"{n}: differs")
    return diffs
