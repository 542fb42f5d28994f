"""The conformance cases: inputs, settings, and expected outputs from the
reference rule (docs/conformance.md lists what each set covers).

Every case is a function of a NumPy Generator, so the whole set is
determined by one base seed: the in-repository cases use BASE_SEED; another
seed gives another set of the same kinds (same names, settings and shapes,
other data), e.g. to check an implementation on cases it has never seen.
"""

import math
import zlib
from dataclasses import dataclass, field

import numpy as np

from . import philox, rounding
from .cases import FORMAT, write_case
from .rule import (ADAMW, BACKBONE, BACKBONE_8BIT, BACKBONE_BF16, BACKBONE_LINEAR_8BIT, EXACT_MOMENTUM, EXPERTS, ROUTER,
                   GradClip, Hyper, Rounding, run)

BASE_SEED = 20260730
DEFAULT_SEED = 0x5EED5EED  # the library's default rounding seed


@dataclass
class Spec:
    """One case: what it checks and how its inputs are drawn."""

    name: str
    description: str
    shape: tuple
    rule: object
    inputs: object  # (rng, spec) -> (param0, grads), float32
    steps: int = 30
    hyper: dict = field(default_factory=dict)  # overrides of Hyper's defaults, lr included
    lr_schedule: object = None  # (steps, rng) -> the lr of every step; None: hyper's lr every step
    param_dtype: str = "f32"
    grad_dtype: str = "f32"
    rounding: str = "stochastic"
    seed: int = DEFAULT_SEED
    param_name: str = ""
    grad_clip: object = None  # a GradClip: global gradient-norm clipping (E6, E8)


# ------------------------------------------------------------ input makers
def normal(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def plain(scale=1.0, param_scale=0.5):
    """Parameter ~ N(0, param_scale^2), gradients ~ N(0, scale^2)."""

    def make(rng, spec):
        return normal(rng, spec.shape, param_scale), normal(rng, (spec.steps,) + spec.shape, scale)

    return make


def skewed(rng, spec, scale=1.0):
    """Gradients whose rows and columns have different scales (so that the
    factored statistics differ from an exact second moment)."""
    p = normal(rng, spec.shape, 0.5)
    g = normal(rng, (spec.steps,) + spec.shape, scale)
    if len(spec.shape) >= 2:
        rows = np.exp(rng.uniform(-1.5, 1.5, spec.shape[:-1] + (1,)))
        cols = np.exp(rng.uniform(-1.0, 1.0, spec.shape[-1]))
        g = (g * rows * cols).astype(np.float32)
    return p, g


def growing(rng, spec):
    """Large gradients (1e3), growing 15 % a step, with 10x spikes."""
    p = normal(rng, spec.shape, 0.5)
    g = normal(rng, (spec.steps,) + spec.shape, 1e3)
    g *= (1.15 ** np.arange(spec.steps, dtype=np.float64)).reshape((-1,) + (1,) * len(spec.shape)).astype(np.float32)
    for t in (6, 13, 21, 27):
        g[t] *= 10
    return p, g.astype(np.float32)


def spiky(rng, spec):
    """Gradients ~ N(0, 1) with 30x spikes on steps 5, 12 and 19 and 4x on
    step 20: a global-norm clip at 1.3x the usual norm bites on those."""
    p = normal(rng, spec.shape, 0.5)
    g = normal(rng, (spec.steps,) + spec.shape)
    for t, k in ((4, 30.0), (11, 30.0), (18, 30.0), (19, 4.0)):
        g[t] *= k
    return p, g.astype(np.float32)


def bank_spikes(rng, spec):
    """A bank [E, r, c]: expert 0 gets 30x spikes at steps 10 and 20, expert
    E-1 sees no gradient on some steps (tokens routed elsewhere)."""
    p, g = skewed(rng, spec)
    g[9, 0] *= 30
    g[19, 0] *= 30
    for t in (2, 3, 7, 11, 12, 13, 25):
        g[t, -1] = 0
    return p, g


def zero_rows_cols(rng, spec):
    """Row 3 and column 5 always zero, row 7 zero from step 12, column 0 zero
    on steps 1-8, and an all-zero first step."""
    p, g = skewed(rng, spec)
    g[:, 3, :] = 0
    g[:, :, 5] = 0
    g[11:, 7, :] = 0
    g[:8, :, 0] = 0
    g[0] = 0
    return p, g


def mixed_scales(rng, spec):
    """Rows of gradients from 1e-12 to 1e12: the eps floor binds on the
    small rows and the update clipping on the large ones."""
    p = normal(rng, spec.shape, 0.5)
    g = normal(rng, (spec.steps,) + spec.shape)
    scales = 10.0 ** np.linspace(-12, 12, spec.shape[0])
    return p, (g * scales[:, None]).astype(np.float32)


def heavy_tails(rng, spec):
    """Gradients whose magnitudes are spread log-uniformly over 14 decades,
    one column 1000 times the rest: most of each block of momentum lies many
    decades below its largest value, some below 2^-41 of the block's scale."""
    p = normal(rng, spec.shape, 0.5)
    g = normal(rng, (spec.steps,) + spec.shape)
    g *= 10.0 ** rng.uniform(-14.0, 0.0, size=g.shape)
    g[..., 3] *= 1000.0
    return p, g.astype(np.float32)


def zero_grads(rng, spec):
    """No gradient at all: only weight decay moves the parameter."""
    return normal(rng, spec.shape, 0.5), np.zeros((spec.steps,) + spec.shape, np.float32)


def f16_subnormal(rng, spec):
    """Parameters in f16's subnormal range (below 2^-14), updated by steps of
    about lr = 1e-6 (fifteen subnormal spacings)."""
    return normal(rng, spec.shape, 2e-5), normal(rng, (spec.steps,) + spec.shape)


def f16_saturating(rng, spec):
    """Parameters at and near f16's largest finite value (65504), pushed
    beyond it by the updates on half of the elements."""
    p = np.full(spec.shape, 65504.0, np.float32)
    p[1::2] = 65472.0
    p[:, ::3] *= -1
    g = normal(rng, (spec.steps,) + spec.shape)
    g = np.where(np.sign(g) == -np.sign(p), g, -g).astype(np.float32)  # updates grow |p|
    g[:, 2:] = normal(rng, (spec.steps,) + p[2:].shape)  # the other rows: both ways
    return p, g


def warmup_cosine(peak, warmup):
    """The paper's schedule: linear warm-up over `warmup` steps to `peak`,
    then cosine decay to 0 at the last step."""

    def schedule(steps, rng):
        out = []
        for t in range(1, steps + 1):
            if t <= warmup:
                out.append(peak * t / warmup)
            else:
                out.append(peak * 0.5 * (1.0 + math.cos(math.pi * (t - warmup) / (steps - warmup))))
        return out

    return schedule


def random_lr(lo, hi):
    """A new lr every step, uniform in [lo, hi)."""

    def schedule(steps, rng):
        return rng.uniform(lo, hi, steps)

    return schedule


def stepped(values):
    """lr changing by steps: `values` is a list of (first step, lr)."""

    def schedule(steps, rng):
        out = []
        for t in range(1, steps + 1):
            out.append([lr for first, lr in values if first <= t][-1])
        return out

    return schedule


# --------------------------------------------------------------- the cases
WD = {"weight_decay": 0.05}
SPECS = [
    # The three tiers.
    Spec("backbone_2d", "Backbone tier (momentum + factored) on a matrix, weight decay 0.05.",
         (16, 24), BACKBONE, skewed, hyper={"lr": 0.01, **WD}),
    Spec("expert_2d", "Expert tier (factored, no momentum) on a matrix, weight decay 0.05.",
         (20, 12), EXPERTS, skewed, hyper={"lr": 0.01, **WD}),
    Spec("router_2d", "Router tier (exact second moment, no momentum), no weight decay, beta2 0.9999 "
         "(1 - beta2 must be formed in double: 1.0f - 0.9999f is 1.7e-4 off).",
         (8, 48), ROUTER, plain(), hyper={"lr": 0.01, "beta2": 0.9999}),
    # The ablations and the baseline.
    Spec("exact_momentum_2d", "Momentum + exact second moment (the exact-experts ablation's rule), "
         "weight decay 0.1.", (16, 24), EXACT_MOMENTUM, plain(), hyper={"lr": 0.01, "weight_decay": 0.1}),
    Spec("experts_momentum_bank3d", "Experts-with-momentum ablation: momentum + factored on an expert bank "
         "[E, r, c], clip scope matrix.", (4, 8, 12), BACKBONE, bank_spikes,
         hyper={"lr": 0.01, "clip_scope": "matrix", **WD}),
    Spec("exact_experts_bank3d", "Exact-experts ablation: momentum + exact second moment on an expert bank, "
         "clip scope matrix.", (4, 6, 10), EXACT_MOMENTUM, bank_spikes,
         hyper={"lr": 0.01, "clip_scope": "matrix", **WD}),
    Spec("factored_router_2d", "Factored-router ablation: the router's matrix with a factored second moment, "
         "no momentum, beta2 0.9999.", (8, 48), EXPERTS, skewed, hyper={"lr": 0.01, "beta2": 0.9999}),
    Spec("uniform_3d", "Uniform ablation (momentum + factored) on a bank [E, r, c], clip scope tensor.",
         (3, 9, 16), BACKBONE, skewed, hyper={"lr": 0.01, **WD}),
    Spec("adafactor_1d", "Adafactor-like rule (no momentum, factored) on a rank-1 tensor: the exact "
         "second moment without momentum.", (41,), EXPERTS, plain(), hyper={"lr": 0.01, **WD}),
    Spec("adamw_2d", "AdamW rule: momentum, eps added to sqrt(v) (not a floor), no update clipping, "
         "weight decay 0.1.", (16, 24), ADAMW, skewed, hyper={"lr": 0.01, "weight_decay": 0.1}),
    Spec("adamw_1d_large_grads", "AdamW rule on a rank-1 tensor with large gradients and eps 1e-3 (visible "
         "beside sqrt(v) on the small elements): the update is never clipped.", (37,), ADAMW,
         lambda rng, s: (normal(rng, s.shape, 0.5), (normal(rng, (s.steps,) + s.shape)
                                                      * np.logspace(-4, 3, s.shape[0])).astype(np.float32)),
         hyper={"lr": 0.01, "eps": 1e-3, **WD}),
    # Ranks, banks and clip scopes.
    Spec("bias_1d_fallback", "Rank-1 tensor under momentum + factored: falls back to the exact second "
         "moment (state v, not v_row / v_col).", (37,), BACKBONE, plain(), hyper={"lr": 0.01, **WD}),
    Spec("bank3d_tensor_clip", "Expert bank [E, r, c], factored, no momentum, clip scope tensor (one RMS over "
         "all experts, as the reference). Expert 0 gets 30x gradient spikes at steps 10 and 20, the last "
         "expert sees no gradient on some steps.", (4, 12, 10), EXPERTS, bank_spikes, hyper={"lr": 0.01, **WD}),
    Spec("bank3d_matrix_clip", "The inputs of bank3d_tensor_clip with clip scope matrix: each [r, c] matrix "
         "is clipped by its own RMS, as 4 separate tensors would be.", (4, 12, 10), EXPERTS, bank_spikes,
         hyper={"lr": 0.01, "clip_scope": "matrix", **WD}),
    Spec("rank4_factored", "Rank-4 tensor, momentum + factored over the last two dimensions (6 matrices of "
         "5 x 7), clip scope tensor.", (2, 3, 5, 7), BACKBONE, skewed, hyper={"lr": 0.01, **WD}),
    Spec("rank4_matrix_clip", "Rank-4 tensor, factored, no momentum, clip scope matrix (one RMS per 4 x 6 "
         "matrix), gradient spikes on one matrix.", (3, 2, 4, 6), EXPERTS, bank_spikes,
         hyper={"lr": 0.01, "clip_scope": "matrix", **WD}),
    # Odd shapes.
    Spec("mat_1x1", "1 x 1 matrix, momentum + factored (the row factor is always 1).", (1, 1), BACKBONE, plain(),
         hyper={"lr": 0.01, **WD}),
    Spec("mat_1xN", "One row (1 x 33), factored, no momentum: the row factor is 1, the column factors carry "
         "all the scaling.", (1, 33), EXPERTS, skewed, hyper={"lr": 0.01}),
    Spec("mat_Nx1", "One column (29 x 1), factored, no momentum: each row statistic is its element's "
         "own g^2.", (29, 1), EXPERTS, skewed, hyper={"lr": 0.01, **WD}),
    Spec("prime_bank_5x7x11", "Prime sizes: a bank [5, 7, 11], momentum + factored, clip scope matrix.",
         (5, 7, 11), BACKBONE, bank_spikes, hyper={"lr": 0.01, "clip_scope": "matrix", **WD}),
    Spec("prime_31x13_router", "Prime sizes: a 31 x 13 matrix under the router's rule.", (31, 13), ROUTER,
         plain(), hyper={"lr": 0.01, **WD}),
    Spec("zero_row_col", "Momentum + factored; row 3 and column 5 are always zero, row 7 is zero from step 12 "
         "on, column 0 is zero on steps 1-8, and step 1 has an all-zero gradient (the 1e-15 floor under the "
         "row mean keeps 0/0 away).", (12, 18), BACKBONE, zero_rows_cols, hyper={"lr": 0.01, **WD}),
    # Gradient scales.
    Spec("tiny_grads_noclip", "Momentum + factored with tiny gradients (1e-6): the second moments sit under "
         "the eps floor, the update clipping never acts.", (18, 20), BACKBONE, plain(1e-6),
         hyper={"lr": 0.01, **WD}),
    Spec("vbar_floor", "Factored, no momentum, gradients of 1e-9: the floor under the row mean, 1e-15, binds "
         "on every step and changes the row factors.", (10, 14), EXPERTS, plain(1e-9, 0.02),
         hyper={"lr": 0.05}),
    Spec("clip_large_grads", "Momentum + factored with large, growing gradients (1e3, x1.15 a step, 10x "
         "spikes): the update clipping acts.", (18, 20), BACKBONE, growing, hyper={"lr": 0.01}),
    Spec("huge_grads", "Momentum + factored with gradients of 1e15 (g^2 near 1e30, still finite in fp32).",
         (12, 16), BACKBONE, plain(1e15), hyper={"lr": 0.01, **WD}),
    Spec("router_mixed_scales", "Router rule, rows of gradients from 1e-12 to 1e12: the eps floor binds on "
         "the small rows, the clipping is set by the large ones.", (9, 20), ROUTER, mixed_scales,
         hyper={"lr": 0.01}),
    # Hyperparameters and schedules.
    Spec("reference_defaults", "The reference's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, no weight "
         "decay, clip threshold 1, clip scope tensor, on the backbone rule.", (16, 20), BACKBONE, skewed),
    Spec("custom_hyper", "Momentum + exact with betas (0.8, 0.95), eps 1e-5 (the floor binds on many "
         "elements), clip threshold 0.5, weight decay 0.02 and a random lr every step.", (14, 22),
         EXACT_MOMENTUM, plain(0.01), hyper={"beta1": 0.8, "beta2": 0.95, "eps": 1e-5, "clip_threshold": 0.5,
                                             "weight_decay": 0.02}, lr_schedule=random_lr(0.005, 0.025)),
    Spec("cosine_warmup_schedule", "Momentum + factored under the paper's schedule: linear warm-up over 4 "
         "steps to lr 3e-2, then cosine decay to 0 at step 40.", (16, 32), BACKBONE, skewed, steps=40,
         hyper=WD, lr_schedule=warmup_cosine(0.03, 4)),
    Spec("lr_steps_with_zero", "Factored, no momentum, weight decay 0.1, lr 0.02, then 0 on steps 11-15 (the "
         "parameter stays, the state moves on), then 0.005.", (10, 16), EXPERTS, skewed,
         hyper={"weight_decay": 0.1}, lr_schedule=stepped([(1, 0.02), (11, 0.0), (16, 0.005)])),
    # Momentum stored in fewer bits (spec.md §5, E7).
    Spec("momentum_bf16_2d", "Backbone rule with its momentum stored in bf16, stochastically rounded (E7): a "
         "matrix of 40 x 70 (10.9 blocks of 256 elements), weight decay 0.05.", (40, 70), BACKBONE_BF16, skewed,
         hyper={"lr": 0.01, **WD}, param_name="blocks.0.attn.o.weight"),
    Spec("momentum_int8_bank3d", "Backbone rule with 8-bit momentum, a scale per block of 256 (E7), on a bank "
         "[3, 24, 50]: each matrix of 1200 elements ends inside a block; expert 0 gets 30x spikes (its blocks' "
         "scales jump), the last sees no gradient on some steps.", (3, 24, 50), BACKBONE_LINEAR_8BIT, bank_spikes,
         hyper={"lr": 0.01, "clip_scope": "matrix", **WD}, param_name="blocks.1.moe.experts.w2"),
    Spec("momentum_int8_bf16_param", "bf16 parameter with bf16 gradients and 8-bit momentum (E7): a "
         "matrix of 33 x 31, mixed-scale rows (blocks of tiny and of large values), a 64-bit seed.", (33, 31),
         BACKBONE_LINEAR_8BIT, mixed_scales, hyper={"lr": 0.01, **WD}, param_dtype="bf16", grad_dtype="bf16",
         seed=0x0123456789ABCDEF, param_name="blocks.0.mlp.w3"),
    Spec("momentum_int8_1d", "8-bit momentum (E7) on a rank-1 tensor of 300 elements (the exact fallback): "
         "a block of 256 and one of 44.", (300,), BACKBONE_LINEAR_8BIT, plain(), hyper={"lr": 0.01, **WD},
         param_name="blocks.0.norm.weight"),
    Spec("momentum_float8_bank3d", "Backbone rule with float8 momentum, a power-of-two scale per block of 256 "
         "(E7), on a bank [3, 24, 50]: each matrix of 1200 elements ends inside a block; expert 0 gets 30x "
         "spikes, the last sees no gradient on some steps.", (3, 24, 50), BACKBONE_8BIT, bank_spikes,
         hyper={"lr": 0.01, "clip_scope": "matrix", **WD}, param_name="blocks.1.moe.experts.w2"),
    Spec("momentum_float8_bf16_param", "bf16 parameter with bf16 gradients and float8 momentum (E7): a "
         "matrix of 33 x 31, rows from 1e-12 to 1e12 (blocks spanning six decades), a 64-bit seed.", (33, 31),
         BACKBONE_8BIT, mixed_scales, hyper={"lr": 0.01, **WD}, param_dtype="bf16", grad_dtype="bf16",
         seed=0x0123456789ABCDEF, param_name="blocks.0.mlp.w3"),
    Spec("momentum_float8_heavy_tails", "Float8 momentum (E7) on a matrix of 20 x 40 whose gradients spread "
         "over 14 decades with one outlier column: codes below 2^-30 of the scale (the t = y * 2^32 path) and "
         "below 2^-41.", (20, 40), BACKBONE_8BIT, heavy_tails, hyper={"lr": 0.01, **WD},
         param_name="blocks.0.attn.q.weight"),
    Spec("momentum_float8_1d", "Float8 momentum (E7) on a rank-1 tensor of 300 elements (the exact fallback): "
         "a block of 256 and one of 44.", (300,), BACKBONE_8BIT, plain(), hyper={"lr": 0.01, **WD},
         param_name="blocks.0.norm.weight"),
    # Global gradient-norm clipping (E6, E8): the case's one tensor is the whole model.
    Spec("global_clip_current", "Global gradient-norm clipping by the step's own norm (E6, max_norm 25, about "
         "1.3x the usual norm) on the backbone rule: a matrix of 16 x 24 with 30x gradient spikes on steps 5, "
         "12 and 19 and 4x on step 20, each clipped as it comes.", (16, 24), BACKBONE, spiky, steps=24,
         hyper={"lr": 0.01, **WD}, grad_clip=GradClip(25.0, "current")),
    Spec("global_clip_previous", "Global gradient-norm clipping by the previous step's norm (E8, max_norm 25) "
         "on the same inputs as global_clip_current: the first step only measures the norm (params[0] is param0), "
         "each spike passes and the step after it is scaled down by it.", (16, 24), BACKBONE, spiky, steps=24,
         hyper={"lr": 0.01, **WD},
         grad_clip=GradClip(25.0, "previous")),
    Spec("global_clip_previous_bf16_float8", "Clipping by the previous step's norm (E8, max_norm 40, about 1.25x "
         "the usual norm) on a bf16 parameter with bf16 gradients and float8 momentum (E7): a matrix of 33 x 31 "
         "with spikes.", (33, 31),
         BACKBONE_8BIT, spiky, steps=24, hyper={"lr": 0.01, **WD}, param_dtype="bf16", grad_dtype="bf16",
         param_name="blocks.0.attn.o.weight", grad_clip=GradClip(40.0, "previous")),
    # 16-bit parameters.
    Spec("bf16_backbone_2d", "bf16 parameter, fp32 gradients, momentum + factored, weight decay 0.05 fused "
         "before one stochastic rounding, the library's default seed.", (16, 24), BACKBONE, skewed,
         hyper={"lr": 0.01, **WD}, param_dtype="bf16", param_name="blocks.0.attn.q.weight"),
    Spec("bf16_experts_bank", "bf16 expert bank with bf16 gradients, factored, no momentum, clip scope "
         "matrix, stochastic rounding with a 64-bit seed.", (4, 16, 12), EXPERTS, bank_spikes,
         hyper={"lr": 0.01, "clip_scope": "matrix", **WD}, param_dtype="bf16", grad_dtype="bf16",
         seed=0x0123456789ABCDEF, param_name="blocks.1.moe.experts.w1"),
    Spec("bf16_bias_1d", "bf16 rank-1 tensor with bf16 gradients under momentum + factored (the exact "
         "fallback), stochastic rounding.", (257,), BACKBONE, plain(), hyper={"lr": 0.01, **WD},
         param_dtype="bf16", grad_dtype="bf16", seed=7, param_name="blocks.0.norm.bias"),
    Spec("bf16_router_nearest", "bf16 router (exact, no momentum) with fp32 gradients, stored by "
         "round-to-nearest-even.", (8, 48),
         ROUTER, plain(), hyper={"lr": 0.01, "beta2": 0.9999}, param_dtype="bf16", rounding="nearest",
         param_name="blocks.1.moe.router.weight"),
    Spec("bf16_decay_only", "bf16 parameter with zero bf16 gradients, lr 0.01, weight decay 0.1: only the fused "
         "weight decay moves it, by 0.1 % a step, less than half a bf16 spacing (0.2 to 0.4 %): stochastic "
         "rounding keeps it on average, round-to-nearest would never move it.", (16, 16), ROUTER, zero_grads,
         hyper={"lr": 0.01, "weight_decay": 0.1}, param_dtype="bf16", grad_dtype="bf16", param_name="embed.weight"),
    Spec("bf16_adamw_2d", "bf16 parameter and gradients under the AdamW rule (eps added to sqrt(v), no clipping), weight "
         "decay 0.1, stochastic rounding.", (12, 20), ADAMW, skewed, hyper={"lr": 0.01, "weight_decay": 0.1},
         param_dtype="bf16", grad_dtype="bf16", param_name="lm_head.weight"),
    Spec("f16_backbone_2d", "f16 parameter with f16 gradients, momentum + factored, weight decay 0.05, "
         "stochastic rounding.", (16, 24), BACKBONE, skewed, hyper={"lr": 0.01, **WD}, param_dtype="f16",
         grad_dtype="f16", param_name="blocks.0.mlp.w1"),
    Spec("f16_subnormal", "f16 parameter (f16 gradients) in f16's subnormal range (|p| < 2^-14), lr 1e-6: stochastic "
         "rounding between subnormal neighbours.", (16, 16), ROUTER, f16_subnormal, hyper={"lr": 1e-6},
         param_dtype="f16", grad_dtype="f16", param_name="blocks.0.norm.weight"),
    Spec("f16_saturation", "f16 parameter (f16 gradients) at and near the largest finite f16 (65504, spacing 32 there), lr 8: "
         "results beyond it are stored as 65504, never infinity.", (8, 32), ROUTER, f16_saturating,
         hyper={"lr": 8.0}, param_dtype="f16", grad_dtype="f16", param_name="scale"),
    Spec("f16_rank4_nearest", "f16 rank-4 tensor with f16 gradients, factored, no momentum, clip scope matrix, stored by "
         "round-to-nearest-even.", (2, 2, 6, 10), EXPERTS, bank_spikes,
         hyper={"lr": 0.01, "clip_scope": "matrix", **WD}, param_dtype="f16", rounding="nearest",
         grad_dtype="f16", param_name="conv.weight"),
]


# ------------------------------------------------------------ tolerances
def _round_up(x, digits=3):
    """x rounded up to `digits` significant digits."""
    if x <= 0:
        return 0.0
    e = math.floor(math.log10(x)) - digits + 1
    return float(f"{math.ceil(x / 10.0 ** e - 1e-9) * 10.0 ** e:.{digits}g}")


RTOL = 2e-5
# 16-bit parameters (docs/conformance.md, "Checking 16-bit parameters").
ULPS = 1
MAX_MISMATCH_FRACTION = 0.02


def param_tolerance(params, dtype):
    if dtype != "f32":
        return {"ulps": ULPS, "max_mismatch_fraction": MAX_MISMATCH_FRACTION}
    scale = float(np.max(np.abs(params))) if params.size else 0.0
    return {"rtol": RTOL, "atol": _round_up(max(2e-6 * scale, 2e-6))}


def state_tolerance(a):
    scale = float(np.max(np.abs(a))) if a.size else 0.0
    return {"rtol": RTOL, "atol": _round_up(5e-6 * scale) if scale > 0 else 1e-30}


# ------------------------------------------------------------------ build
def global_clip_steps(grads, clip):
    """On how many steps the global-norm clip scales the gradients down."""
    norms = [math.sqrt(float(np.sum(np.square(g.astype(np.float64))))) for g in grads]
    seen = norms if clip.norm == "current" else [None] + norms[:-1]
    return sum(1 for n in seen if n is not None and clip.max_norm / (n + 1e-6) < 1.0)


def case_seed(base, name):
    return (base * 1_000_003 + zlib.crc32(name.encode())) % 2**63


def build(spec, base_seed=BASE_SEED):
    """(settings, arrays) of one case."""
    rng = np.random.default_rng(case_seed(base_seed, spec.name))
    param0, grads = spec.inputs(rng, spec)
    param0 = param0.astype(np.float32)
    grads = grads.astype(np.float32)
    if spec.param_dtype != "f32":
        param0 = rounding.to_f32(rounding.nearest(param0, spec.param_dtype), spec.param_dtype)
    if spec.grad_dtype != "f32":
        grads = rounding.to_f32(rounding.nearest(grads, spec.grad_dtype), spec.grad_dtype)
    h = Hyper(**spec.hyper)
    if spec.lr_schedule is None:
        lrs = [h.lr] * spec.steps
    else:
        lrs = [float(x) for x in spec.lr_schedule(spec.steps, rng)]
    param_name = spec.param_name or spec.name
    store = Rounding(spec.rounding, spec.seed, philox.fnv1a32(param_name))
    params, state, final = run(spec.rule, h, spec.shape, param0, grads, lrs, spec.param_dtype, store,
                               spec.grad_clip)
    clip_note = (f" [RMS clipping active on {final.clipped_steps} of {spec.steps} steps.]" if spec.rule.clip
                 else " [no update clipping.]")
    if spec.grad_clip is not None:
        clip_note += f" [global-norm clip active on {global_clip_steps(grads, spec.grad_clip)} of {spec.steps} steps.]"

    settings = {"format": FORMAT, "description": spec.description + clip_note, "shape": list(spec.shape),
                "steps": spec.steps,
                "tier": {"momentum": spec.rule.momentum, "factored": spec.rule.second_moment == "factored"}}
    if spec.rule.second_moment == "adam":
        settings["rule"] = "adamw"
    if spec.rule.momentum_storage != "f32":
        settings["momentum_storage"] = spec.rule.momentum_storage
    settings["hyper"] = {"lr": lrs[0], "lr_schedule": lrs, "beta1": h.beta1, "beta2": h.beta2, "eps": h.eps,
                         "weight_decay": h.weight_decay, "clip_threshold": h.clip_threshold}
    settings["clip_scope"] = h.clip_scope
    if spec.param_dtype != "f32":
        settings["param_dtype"] = spec.param_dtype
    if spec.param_dtype != "f32" or spec.rule.momentum_storage != "f32":  # the random bits' key, in full
        settings["param_name"] = param_name
        settings["rounding"] = {"mode": spec.rounding}
        if spec.rounding == "stochastic":
            settings["rounding"].update({"seed": spec.seed, "stream": store.stream})
    if spec.grad_dtype != "f32":
        settings["grad_dtype"] = spec.grad_dtype
    if spec.grad_clip is not None:
        settings["grad_clip"] = {"max_norm": spec.grad_clip.max_norm, "norm": spec.grad_clip.norm}
    settings["tolerance"] = param_tolerance(params, spec.param_dtype)
    settings["state_tolerance"] = {k: state_tolerance(a) for k, a in state.items()}
    arrays = {"param0": param0, "grads": grads, "params": params, **state}
    return settings, arrays


def generate(folder, base_seed=BASE_SEED, names=None):
    """Writes every case (or those named) into folder/<name>/; returns the names."""
    written = []
    for spec in SPECS:
        if names and spec.name not in names:
            continue
        settings, arrays = build(spec, base_seed)
        write_case(f"{folder}/{spec.name}", settings, arrays)
        written.append(spec.name)
    return written
