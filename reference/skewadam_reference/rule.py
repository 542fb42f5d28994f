"""The update rule of one tensor, step by step (docs/spec.md §3 and §4).

Written for reading, not for speed: every quantity is computed in float64
from the fp32 coefficients of docs/spec.md §3.1, the optimizer state stays in
float64 between steps, and the parameter is rounded to its dtype after every
step (fp32 parameters to nearest; 16-bit ones as the case's rounding says,
from the fp32 result of the step).
"""

import math
from dataclasses import dataclass, field

import numpy as np

from . import philox, rounding


@dataclass(frozen=True)
class Rule:
    """One tensor's rule: which first moment, which second moment, whether
    the update is clipped by its RMS (docs/spec.md §1.1), and how the
    momentum is stored (extension E7)."""

    momentum: bool
    second_moment: str  # "factored", "exact" or "adam"
    clip: bool = True
    momentum_storage: str = "f32"  # or "bf16", "float8_blocks", "int8_blocks" (docs/spec.md §5, E7)


# The library's named rules (docs/spec.md §1.1).
BACKBONE = Rule(True, "factored")
EXPERTS = Rule(False, "factored")
ROUTER = Rule(False, "exact")
EXACT_MOMENTUM = Rule(True, "exact")
ADAMW = Rule(True, "adam", clip=False)
BACKBONE_BF16 = Rule(True, "factored", momentum_storage="bf16")
BACKBONE_8BIT = Rule(True, "factored", momentum_storage="float8_blocks")
BACKBONE_LINEAR_8BIT = Rule(True, "factored", momentum_storage="int8_blocks")
MOMENTUM_STORAGES = ("f32", "bf16", "float8_blocks", "int8_blocks")


@dataclass
class Hyper:
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    clip_threshold: float = 1.0
    clip_scope: str = "tensor"  # or "matrix"


@dataclass
class Rounding:
    """How a 16-bit parameter is stored (ignored for fp32 parameters)."""

    mode: str = "stochastic"  # or "nearest"
    seed: int = 0x5EED5EED
    stream: int = 0  # the tensor stream: philox.fnv1a32(parameter name)


def f32(x):
    """x (a double) rounded to the nearest fp32, as a Python float."""
    return float(np.float32(x))


# The floor under the mean of a matrix's row statistics, an fp32 constant.
ROW_MEAN_FLOOR = f32(1e-15)


def power(base, t):
    """base^t for an integer t >= 1 by repeated squaring, in double."""
    result, b = 1.0, base
    while t:
        if t & 1:
            result *= b
        b *= b
        t >>= 1
    return result


def step_scalars(h, t):
    """The per-step coefficients: formed in double, rounded to fp32 once."""
    bc1 = 1.0 - power(h.beta1, t)
    bc2 = 1.0 - power(h.beta2, t)
    return {
        "lr": f32(h.lr),
        "beta1": f32(h.beta1),
        "one_minus_beta1": f32(1.0 - h.beta1),
        "beta2": f32(h.beta2),
        "one_minus_beta2": f32(1.0 - h.beta2),
        "momentum_scale": f32(math.sqrt(bc2) / bc1),
        "sqrt_bc2": f32(math.sqrt(bc2)),
        "decay": f32(1.0 - h.lr * h.weight_decay),
        "eps": f32(h.eps),
        "eps_sqrt_bc2": f32(h.eps * math.sqrt(bc2)),
        "clip_threshold": f32(h.clip_threshold),
    }


def matrices(shape):
    """(B, r, c): a tensor as B matrices of its last two dimensions; a rank-1
    tensor is one matrix of one row."""
    if len(shape) == 1:
        return 1, 1, shape[0]
    return int(np.prod(shape[:-2], dtype=np.int64)), shape[-2], shape[-1]


def factored(rule, shape):
    return rule.second_moment == "factored" and len(shape) >= 2


@dataclass
class TensorState:
    """A tensor's optimizer state (float64) and step count."""

    step: int = 0
    arrays: dict = field(default_factory=dict)  # m; v, or v_row and v_col
    clipped_steps: int = 0  # steps on which the update clipping changed u

    @staticmethod
    def fresh(rule, shape):
        b, r, c = matrices(shape)
        arrays = {}
        if rule.momentum:
            arrays["m"] = np.zeros(shape)
        if factored(rule, shape):
            arrays["v_row"] = np.zeros((b, r))
            arrays["v_col"] = np.zeros((b, c))
        else:
            arrays["v"] = np.zeros(shape)
        return TensorState(0, arrays)


def step(rule, h, state, param, grad, dtype="f32", store=Rounding()):
    """One step of one tensor, in place on `state`; returns the new parameter.

    param: the parameter's values (fp32 values exactly representable in
    dtype); grad: the gradient's values (fp32). The result has the same
    shape, as fp32 values of dtype.
    """
    state.step += 1
    t = state.step
    s = step_scalars(h, t)
    shape = param.shape
    b, r, c = matrices(shape)
    g = np.asarray(grad, dtype=np.float64).reshape(b, r, c)
    st = state.arrays

    # Numerator (§3.2 step 4).
    if rule.momentum and rule.momentum_storage != "f32":
        m = stored_momentum(rule.momentum_storage, s, st["m"].reshape(b, r, c), g, store, t)
        st["m"] = m.reshape(shape)
        numerator = m * s["momentum_scale"]
    elif rule.momentum:
        m = s["beta1"] * st["m"].reshape(b, r, c) + s["one_minus_beta1"] * g
        st["m"] = m.reshape(shape)
        numerator = m * s["momentum_scale"]
    else:
        numerator = g * s["sqrt_bc2"]

    # Second moment and denominator (§3.2 step 3).
    if factored(rule, shape):
        g2 = g * g
        st["v_row"] = s["beta2"] * st["v_row"] + s["one_minus_beta2"] * g2.mean(axis=2)
        st["v_col"] = s["beta2"] * st["v_col"] + s["one_minus_beta2"] * g2.mean(axis=1)
        vbar = np.maximum(st["v_row"].mean(axis=1), ROW_MEAN_FLOOR)
        row = np.sqrt(np.maximum(st["v_row"] / vbar[:, None], s["eps"]))
        col = np.sqrt(np.maximum(st["v_col"], s["eps"]))
        denominator = row[:, :, None] * col[:, None, :]
    else:
        v = s["beta2"] * st["v"].reshape(b, r, c) + s["one_minus_beta2"] * g * g
        st["v"] = v.reshape(shape)
        if rule.second_moment == "adam":
            denominator = np.sqrt(v) + s["eps_sqrt_bc2"]
        else:
            denominator = np.sqrt(np.maximum(v, s["eps"]))

    u = numerator / denominator  # §3.2 step 5

    # Update clipping (§3.2 step 6): the divisor is an fp32 value.
    if rule.clip:
        axes = (0, 1, 2) if h.clip_scope == "tensor" else (1, 2)
        rms = np.sqrt(np.mean(u * u, axis=axes, keepdims=True))
        divisor = np.maximum(rms / s["clip_threshold"], 1.0).astype(np.float32).astype(np.float64)
        state.clipped_steps += int(np.any(divisor > 1.0))
        u = u / divisor

    # Decoupled weight decay and the update, then one rounding (§3.2 steps 1 and 7, §4).
    p = np.asarray(param, dtype=np.float64).reshape(b, r, c)
    x = (p * s["decay"] - s["lr"] * u).reshape(shape).astype(np.float32)
    return store_param(x, dtype, store, t)


# Extension E7: the momentum's random bits use the seed XOR this constant
# ("momentum" in ASCII), so that they are independent of the parameter's.
MOMENTUM_SEED_XOR = 0x6D6F6D656E74756D
# The float8 map's second 16 bits per element: the seed XOR this ("mlowbits").
MOMENTUM_SECOND_SEED_XOR = 0x6D6C6F7762697473
MOMENTUM_BLOCK = 256
FLT_MAX = float(np.finfo(np.float32).max)


def stored_momentum(storage, s, m, g, store, t):
    """The momentum of step t stored in fewer bits (docs/spec.md §5, E7),
    decoded: m [b, r, c] holds the values stored at the step before (fp32
    values), g the gradient. Exact: every operation is an fp32 operation,
    each product rounded on its own."""
    f = np.float32
    m32 = m.astype(f)
    mp = f(s["beta1"]) * m32 + f(s["one_minus_beta1"]) * g.astype(f)  # each product rounded, then the sum
    b = mp.shape[0]
    flat = mp.reshape(b, -1)  # each matrix's elements in C order
    size = flat.shape[1]
    bits = philox.rounding_bits(store.seed ^ MOMENTUM_SEED_XOR, store.stream, t, flat.size).reshape(b, size)
    if storage == "bf16":
        out = rounding.to_f32(rounding.stochastic_bf16(flat.reshape(-1), bits.reshape(-1)), "bf16")
        return out.reshape(m.shape).astype(np.float64)
    if storage == "float8_blocks":
        low = philox.rounding_bits(store.seed ^ MOMENTUM_SECOND_SEED_XOR, store.stream, t, flat.size).reshape(b, size)
        bits = (bits.astype(np.uint32) << np.uint32(16)) | low.astype(np.uint32)
        encode, decode = float8_encode_block, float8_decode
    elif storage == "int8_blocks":
        encode, decode = int8_encode_block, int8_decode
    else:
        raise ValueError(f"unknown momentum storage {storage!r}")
    out = np.empty_like(flat)
    for k in range(b):
        for start in range(0, size, MOMENTUM_BLOCK):
            block = slice(start, start + MOMENTUM_BLOCK)
            scale, codes = encode(flat[k, block], bits[k, block])
            out[k, block] = decode(codes, scale)
    return out.reshape(m.shape).astype(np.float64)


def finite_amax(x):
    """The largest |x| over the finite elements (0 if none), fp32."""
    a = np.abs(np.asarray(x, dtype=np.float32))
    a = a[np.isfinite(a)]
    return np.float32(a.max()) if a.size else np.float32(0)


def int8_encode_block(x, bits):
    """Linear 8-bit codes of one block (E7): the scale a / 127 and the codes
    as int8 values, -128 for NaN."""
    f = np.float32
    x = np.asarray(x, dtype=f)
    amax = finite_amax(x)
    scale = f(amax / f(127))
    with np.errstate(over="ignore", divide="ignore"):
        inv = f(min(float(f(f(127) / amax)), FLT_MAX)) if amax > 0 else f(0)
    u = (np.asarray(bits, dtype=np.uint32) & np.uint32(0xFFFF)).astype(f) * f(2.0 ** -16)
    with np.errstate(invalid="ignore"):
        y = x * inv  # rounded on its own
        y = np.where(np.isnan(y), x, y)  # an infinity in a block whose finite values are all 0
        q = np.clip(np.floor(y + u), f(-127), f(127))  # the sum in fp32
    q = np.where(np.isnan(x), f(-128), q)
    return scale, q.astype(np.int8)


def int8_decode(codes, scale):
    codes = np.asarray(codes, dtype=np.int8)
    with np.errstate(invalid="ignore", over="ignore"):
        v = codes.astype(np.float32) * np.float32(scale)
    return np.where(codes == -128, np.float32(np.nan), v).astype(np.float32)


FLOAT8_TOP = 1.5
FLOAT8_MIN_EXPONENT = -94
FLOAT8_MAX_EXPONENT = 126


def float8_exponent(amax):
    """The block's exponent k: the least with amax <= 1.5 * 2^k, within [-94, 126]."""
    amax = np.float32(amax)
    if not amax >= np.float32(2.0 ** -94):
        return FLOAT8_MIN_EXPONENT
    b = int(np.array(amax, dtype=np.float32).view(np.uint32))
    k = (b >> 23) - 127
    if (b & 0x7FFFFF) > 0x400000:
        k += 1
    return min(k, FLOAT8_MAX_EXPONENT)


def float8_encode_block(x, r):
    """Float8 codes of one block (E7): the scale 2^k and the stored bytes
    (uint8), with the elements' 32 random bits r."""
    f = np.float32
    x = np.asarray(x, dtype=f)
    r = np.asarray(r, dtype=np.uint32)
    k = float8_exponent(finite_amax(x))
    scale = f(2.0 ** k)
    inv = f(2.0 ** -k)
    codes = np.zeros(x.shape, dtype=np.uint8)
    for j in range(x.size):
        codes[j] = float8_code(x[j], inv, int(r[j]))
    return scale, codes


def float8_code(x, inv, r):
    """The stored byte of one element x with scale factor inv = 2^-k and its
    32 random bits r (docs/spec.md E7). Integer and fp32 operations only."""
    f = np.float32
    x = f(x)
    if np.isnan(x):
        return 0x80
    sign = 0x80 if np.signbit(x) else 0
    with np.errstate(under="ignore", over="ignore"):
        y = f(abs(x) * inv)  # one fp32 product
    if not y <= f(FLOAT8_TOP):
        c = 127
    elif y >= f(2.0 ** -30):
        yb = int(np.array(y, dtype=f).view(np.uint32))
        c = (yb - (96 << 23) + (r >> 11)) >> 21
    else:
        t = f(y * f(2.0 ** 32))  # exact
        lo = math.floor(float(t))
        frac = f(t - f(lo))  # exact
        threshold = math.ceil(float(frac) * 2.0 ** 32)  # frac * 2^32 is exact in fp32
        c = lo + (1 if r + threshold >= 2 ** 32 else 0)  # r plus the fraction carries
    return 0 if c == 0 else (sign | c)


def float8_unit(c):
    """The value of magnitude code c (0 ... 127) at scale 1."""
    if c >= 127:
        return np.float32(np.inf)
    if c >= 4:
        return np.array((c << 21) + (96 << 23), dtype=np.uint32).view(np.float32)[()]
    return np.float32(c * 2.0 ** -32)


def float8_decode(codes, scale):
    out = np.empty(len(codes), dtype=np.float32)
    for j, c in enumerate(np.asarray(codes, dtype=np.uint8)):
        c = int(c)
        if c == 0x80:
            out[j] = np.float32(np.nan)
            continue
        with np.errstate(over="ignore"):
            v = np.float32(float8_unit(c & 0x7F) * np.float32(scale))
        out[j] = -v if c & 0x80 else v
    return out


def store_param(x, dtype, store, t):
    """The fp32 result x of step t stored as dtype (docs/spec.md §4.2)."""
    if dtype == "f32":
        return x
    flat = x.reshape(-1)
    if store.mode == "nearest":
        bits = rounding.nearest(flat, dtype)
    else:
        bits = rounding.stochastic(flat, philox.rounding_bits(store.seed, store.stream, t, flat.size), dtype)
    return rounding.to_f32(bits, dtype).reshape(x.shape)


@dataclass(frozen=True)
class GradClip:
    """Global gradient-norm clipping (E6: norm "current"; E8: "previous")."""
    max_norm: float
    norm: str = "current"


def grad_clip_scale(norm, max_norm):
    """E6's factor, in double: min(max_norm / (norm + 1e-6), 1); 1 when the
    norm is not finite (E8: or there is none)."""
    if norm is None or not math.isfinite(norm):
        return 1.0
    return min(max_norm / (norm + 1e-6), 1.0)


def clipped_grads(grads, clip):
    """Each step's gradient as the step reads it: times the fp32 factor of
    global-norm clipping (the one tensor's norm is the global norm). E6 clips
    by the step's own norm; E8 by the norm the previous step left, and a step
    with none only measures it: its entry is None (no update)."""
    if clip is None:
        return [np.asarray(g, dtype=np.float32) for g in grads]
    out, previous = [], None
    for g in grads:
        g = np.asarray(g, dtype=np.float32)
        norm = math.sqrt(float(np.sum(np.square(g.astype(np.float64)))))
        if clip.norm == "previous" and previous is None:
            out.append(None)  # measured, not applied
        else:
            scale = grad_clip_scale(norm if clip.norm == "current" else previous, clip.max_norm)
            out.append((g * np.float32(scale)).astype(np.float32))
        previous = norm if math.isfinite(norm) else None
    return out


def run(rule, h, shape, param0, grads, lr_schedule, dtype="f32", store=Rounding(), clip=None):
    """Runs len(grads) steps from a fresh state, clipping the gradients'
    global norm as `clip` says (a GradClip, or None). Returns (params after
    each step, [steps, *shape] fp32; final state arrays, fp32, named as in a
    case folder; the final TensorState)."""
    state = TensorState.fresh(rule, tuple(shape))
    p = np.asarray(param0, dtype=np.float32)
    out = np.empty((len(grads),) + tuple(shape), dtype=np.float32)
    for k, g in enumerate(clipped_grads(grads, clip)):
        if g is not None:  # (None: a step that only measured the norm, E8)
            hk = Hyper(**{**h.__dict__, "lr": lr_schedule[k]})
            p = step(rule, hk, state, p, g, dtype, store)
        out[k] = p
    names = {"m": "exp_avg", "v": "v", "v_row": "v_row", "v_col": "v_col"}
    b, r, c = matrices(tuple(shape))
    final = {}
    for key, a in state.arrays.items():
        if key == "v_row":
            a = a.reshape(tuple(shape[:-2]) + (r,))
        elif key == "v_col":
            a = a.reshape(tuple(shape[:-2]) + (c,))
        final[names[key]] = a.astype(np.float32)
    return out, final, state
