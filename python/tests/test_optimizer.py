"""The optimizer classes as a PyTorch user meets them: tiers and param
groups, the library's AdamW against torch's, schedulers, save and load,
frozen and tied parameters, non-finite steps and bad input."""

import copy
import gc
import io
import math

import pytest
import torch
from torch import nn

import skewadam

# Every variant the library names (on CUDA, each needs its CUDA engine).
VARIANTS = [getattr(skewadam, name) for name in skewadam.VARIANTS]


class TinyMoE(nn.Module):
    """Every tier: an embedding tied to the LM head, a dense layer and a
    LayerNorm (backbone), a router, and a stacked bank of experts."""

    def __init__(self, d=16, experts=4, ff=24, vocab=32, dtype=torch.float32, device="cpu"):
        super().__init__()
        g = torch.Generator().manual_seed(7)
        self.embed = nn.Embedding(vocab, d)
        self.dense = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.router = nn.Linear(d, experts, bias=False)
        self.experts_up = nn.Parameter(torch.randn(experts, d, ff, generator=g) * 0.1)
        self.experts_down = nn.Parameter(torch.randn(experts, ff, d, generator=g) * 0.1)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied
        with torch.no_grad():
            for p in self.parameters():
                if p.dim() >= 1 and p is not self.experts_up and p is not self.experts_down:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        self.to(device=device, dtype=dtype)
        self.router.float()
        self.norm.float()
        self.after_embed = None  # a function of the embedding's output, for tests of backward
        self.checkpoint = None   # None, or the dense layer under torch.utils.checkpoint: "reentrant" or
                                 # "non-reentrant", "... twice": in two segments (one weight, used twice)

    def forward(self, tokens):
        # computed in fp32 whatever the parameters' dtype (torch's CPU kernels
        # lack some fp16 products); the gradients come back in their dtype
        f = nn.functional
        x = self.embed(tokens).float()
        if self.after_embed is not None:
            x = self.after_embed(x)

        def dense(x):
            return torch.relu(f.linear(x, self.dense.weight.float(), self.dense.bias.float()))
        if self.checkpoint is None:
            x = x + dense(x)
        else:
            from torch.utils.checkpoint import checkpoint
            reentrant = not self.checkpoint.startswith("non-reentrant")
            x = x + checkpoint(dense, x, use_reentrant=reentrant)
            if self.checkpoint.endswith("twice"):
                x = x + checkpoint(dense, x, use_reentrant=reentrant)
        h = self.norm(x)
        gates = torch.softmax(self.router(h), -1)  # [B, T, E]
        up = torch.relu(torch.einsum("btd,edf->btef", x, self.experts_up.float()))
        y = torch.einsum("btef,efd->bted", up, self.experts_down.float())
        x = x + (gates.unsqueeze(-1) * y).sum(-2)
        return f.linear(x, self.head.weight.float())


def batch(step, device, vocab=32):
    """Sequences that follow t -> 5 t + 3 (mod vocab) from random starts: a
    pattern the model can learn."""
    g = torch.Generator().manual_seed(1000 + step)
    seq = [torch.randint(0, vocab, (4,), generator=g)]
    for _ in range(8):
        seq.append((5 * seq[-1] + 3) % vocab)
    return torch.stack(seq, 1).to(device)


def train(model, opt, steps, device, first=0):
    for t in range(first, first + steps):
        tokens = batch(t, device)
        opt.zero_grad()
        logits = model(tokens[:, :-1]).float()
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
    return loss


def bits(model):
    return {n: p.detach().cpu().view(torch.int16 if p.element_size() == 2 else torch.int32).clone()
            for n, p in model.named_parameters()}


def state_of(opt):
    """Everything the optimizer holds, as plain CPU data."""
    sd = opt.state_dict()
    return {n: {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in s.items()}
            for n, s in sd["state"].items()}, sd["skewadam"]["steps"]


def same_state(a, b):
    (sa, na), (sb, nb) = a, b
    if na != nb or sa.keys() != sb.keys():
        return False
    for n in sa:
        if sa[n].keys() != sb[n].keys():
            return False
        for k in sa[n]:
            x, y = sa[n][k], sb[n][k]
            if isinstance(x, torch.Tensor):
                if not torch.equal(x.view(torch.int32), y.view(torch.int32)):
                    return False
            elif x != y:
                return False
    return True


# ----------------------------------------------------------------- tiers
def test_tiers_param_groups_and_state_bytes(device):
    model = TinyMoE(device=device)
    opt = skewadam.SkewAdam(model.named_parameters(), lr=3e-4, weight_decay=0.05,
                            per_tier={"router": {"weight_decay": 0.0}})
    assert [g["tier"] for g in opt.param_groups] == ["backbone", "experts", "router"]
    assert [g["weight_decay"] for g in opt.param_groups] == [0.05, 0.05, 0.0]
    assert opt.tier_of("experts_up") == "experts"
    assert opt.tier_of("router.weight") == "router"
    assert opt.tier_of("dense.weight") == "backbone"
    # the tied head is the embedding: registered once, under its first name
    assert "head.weight" not in opt.names() and "embed.weight" in opt.names()
    E, d, ff, vocab = 4, 16, 24, 32
    backbone = 4 * (vocab * d) + 4 * (vocab + d)  # embedding: momentum + factored
    backbone += 4 * d * d + 4 * (d + d) + 3 * 8 * d  # dense weight; dense bias, norm weight and bias (rank 1: m + v)
    experts = 4 * E * (d + ff) + 4 * E * (ff + d)
    router = 4 * E * d
    assert opt.state_bytes("backbone") == backbone
    assert opt.state_bytes("experts") == experts
    assert opt.state_bytes("router") == router
    assert opt.state_bytes() == backbone + experts + router
    # the state that the views show is the optimizer's: a step changes it
    train(model, opt, 1, device)
    assert opt.state[model.experts_up]["v_row"].abs().sum() > 0
    assert opt.param_state("experts_up")["step"] == 1


def test_on_cuda_the_optimizers_memory_is_torchs_and_goes_back_to_it(device):
    if device.type != "cuda":
        pytest.skip("torch's caching allocator holds the optimizer's memory on CUDA tensors only")
    model = TinyMoE(device=device)
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    opt = skewadam.SkewAdam(model.named_parameters(), lr=3e-4)
    held = torch.cuda.memory_allocated(device) - before
    # the state, its scratch and the step's tables, each block rounded up by torch
    assert held >= opt.state_bytes() > 0
    train(model, opt, 2, device)
    assert opt.steps == 2
    opt.zero_grad(set_to_none=True)
    del opt
    gc.collect()
    torch.cuda.synchronize(device)
    assert torch.cuda.memory_allocated(device) == before


def test_backbone_momentum_in_bf16_and_8_bits_keeps_its_blocks_words(device):
    model = TinyMoE(device=device)
    full = skewadam.SkewAdam(TinyMoE(device=device).named_parameters(), lr=1e-2)
    half = skewadam.SkewAdamBf16Momentum(TinyMoE(device=device).named_parameters(), lr=1e-2)
    opt = skewadam.SkewAdam8bit(model.named_parameters(), lr=1e-2)
    # the embedding [32, 16]: 512 elements, 2 blocks of 256 (a scale word and 64 words of codes each)
    m = opt.param_state("embed.weight")["m"]
    assert m.dtype == torch.float32 and m.shape == (2 * (1 + 64),)
    assert half.param_state("embed.weight")["m"].shape == (256,)
    d = 16
    assert full.state_bytes("backbone") - half.state_bytes("backbone") == 2 * (32 * d + d * d + 3 * d)
    assert opt.state_bytes("backbone") < half.state_bytes("backbone")
    assert opt.state_bytes("experts") == full.state_bytes("experts")
    train(model, opt, 2, device)
    codes = m.cpu().view(torch.int8)
    assert codes.abs().max() > 0  # the views are the optimizer's state: the steps changed them


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.__name__)
def test_every_variant_trains(variant, device):
    model = TinyMoE(device=device)
    opt = variant(model.named_parameters(), lr=1e-2)
    first = train(model, opt, 1, device).item()
    last = train(model, opt, 30, device, first=1).item()
    assert math.isfinite(last) and last < first
    assert opt.steps == 31


# ----------------------------------------------------- AdamW against torch
def test_adamw_follows_torch_adamw_for_200_steps(device):
    torch.manual_seed(3)
    shapes = [(64, 48), (48,), (4, 16, 24)]
    ours = [torch.randn(s, device=device) for s in shapes]
    theirs = [p.clone() for p in ours]
    for p in ours + theirs:
        p.requires_grad_(True)
    kw = dict(lr=3e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    a = skewadam.AdamW({f"p{i}": p for i, p in enumerate(ours)}, **kw)
    b = torch.optim.AdamW(theirs, **kw)
    g = torch.Generator().manual_seed(11)
    for _ in range(200):
        for p, q in zip(ours, theirs):
            grad = torch.randn(p.shape, generator=g).to(device)
            p.grad, q.grad = grad.clone(), grad.clone()
        a.step()
        b.step()
    for p, q, p0 in zip(ours, theirs, [torch.randn(s) for s in shapes]):
        # The same update in another arrangement of fp32 operations: the
        # updates (at most lr each) agree to a few ulp, and the parameters'
        # own roundings (torch decays and updates in two, the library in one)
        # differ by at most an ulp of the parameter per step; the moments do
        # not depend on the parameters, so nothing compounds over 200 steps.
        torch.testing.assert_close(p.detach(), q.detach(), rtol=200 * 2**-23, atol=200 * kw["lr"] * 2**-20)
        assert (p.detach().cpu() - p0).abs().max() > 0.1  # and the run moved them
    # the moments are torch's too
    for i, q in enumerate(theirs):
        st = b.state[q]
        mine = a.state_dict()["state"][f"p{i}"]
        torch.testing.assert_close(mine["m"], st["exp_avg"].cpu(), rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(mine["v"], st["exp_avg_sq"].cpu(), rtol=1e-5, atol=1e-9)


# ----------------------------------------------------------- schedulers
def test_a_torch_lr_scheduler_drives_every_tier(device):
    def run(schedule):
        model = TinyMoE(device=device)
        opt = skewadam.SkewAdam(model.named_parameters(), lr=1e-2)
        sched = schedule(opt)
        lrs = []
        for t in range(12):
            lrs.append([g["lr"] for g in opt.param_groups])
            train(model, opt, 1, device, first=t)
            if sched is not None:
                sched.step()
            else:  # by hand: what the scheduler computes
                for g in opt.param_groups:
                    g["lr"] = 1e-2 * 0.5 * (1 + math.cos(math.pi * (t + 1) / 12))
        return bits(model), lrs

    scheduled, lrs = run(lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=12))
    by_hand, lrs_by_hand = run(lambda opt: None)
    assert lrs[0] == [1e-2] * 3 and lrs[5][0] < 1e-2
    for k in scheduled:
        assert torch.equal(scheduled[k], by_hand[k]), k
    constant, _ = run(lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0))
    assert any(not torch.equal(scheduled[k], constant[k]) for k in scheduled)


# ----------------------------------------------------------- save / load
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("variant", [skewadam.SkewAdam, skewadam.AdamW, skewadam.SkewAdam8bit],
                         ids=lambda v: v.__name__)
def test_save_and_load_mid_run_resumes_bit_for_bit(variant, dtype, device):
    model = TinyMoE(dtype=dtype, device=device)
    opt = variant(model.named_parameters(), lr=1e-2, weight_decay=0.05, seed=99)
    train(model, opt, 4, device)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    train(model, opt, 5, device, first=4)
    uninterrupted = bits(model)

    buf.seek(0)
    saved = torch.load(buf)
    resumed = TinyMoE(dtype=dtype, device=device)
    resumed.load_state_dict(saved["model"])
    opt2 = variant(resumed.named_parameters(), lr=0.5, seed=1)  # other values: the load restores them
    opt2.load_state_dict(saved["opt"])
    assert opt2.param_groups[0]["lr"] == 1e-2 and opt2.seed == 99 and opt2.steps == 4
    train(resumed, opt2, 5, device, first=4)
    after = bits(resumed)
    for k in uninterrupted:
        assert torch.equal(uninterrupted[k], after[k]), k
    assert same_state(state_of(opt), state_of(opt2))


def test_load_refuses_what_does_not_match_and_changes_nothing():
    model = TinyMoE()
    opt = skewadam.SkewAdam(model.named_parameters(), lr=1e-2)
    train(model, opt, 2, "cpu")
    good = opt.state_dict()

    other = TinyMoE()
    target = skewadam.SkewAdam(other.named_parameters(), lr=1e-2)
    train(other, target, 3, "cpu")
    before, groups_before = state_of(target), [dict(g, params=None) for g in target.param_groups]

    def refused(sd, says, error=ValueError):
        with pytest.raises(error, match=says):
            target.load_state_dict(sd)
        assert same_state(before, state_of(target))
        assert [dict(g, params=None) for g in target.param_groups] == groups_before

    refused(skewadam.AdamW(TinyMoE().named_parameters()).state_dict(), "saved by AdamW, loading into SkewAdam")
    wrong_shape = TinyMoE(ff=20)
    refused(skewadam.SkewAdam(wrong_shape.named_parameters()).state_dict(), r"parameter 'experts_up': shape")
    wrong_dtype = TinyMoE(dtype=torch.bfloat16)
    refused(skewadam.SkewAdam(wrong_dtype.named_parameters()).state_dict(), r"parameter 'dense.weight': dtype")
    retiered = skewadam.SkewAdam(TinyMoE().named_parameters(), tier_rules=[("^dense", "router")]).state_dict()
    refused(retiered, r"parameter 'dense.weight': tier router in the state_dict, backbone here")
    renamed = dict(good, state=dict(good["state"]), skewadam=dict(good["skewadam"]))
    renamed["skewadam"]["parameters"] = {("x." + k if k == "norm.bias" else k): v
                                         for k, v in good["skewadam"]["parameters"].items()}
    refused(renamed, r"parameter 'norm.bias': not in the state_dict.*'x.norm.bias': in the state_dict, not registered")
    short = dict(good, state={k: dict(v) for k, v in good["state"].items()})
    short["state"]["experts_up"]["v_row"] = short["state"]["experts_up"]["v_row"][:, :-1]
    refused(short, r"experts_up")  # the library's own check of the arrays' sizes
    refused(dict(good, skewadam=dict(good["skewadam"], format=7)), "format 7")
    refused({"state": {}}, "no 'param_groups'")
    refused([1, 2], "expected a dict", TypeError)
    # and the good one loads
    target.load_state_dict(good)
    assert same_state(state_of(opt), state_of(target))


# ---------------------------------------------------- frozen, tied, closure
def test_frozen_parameters_keep_their_values_and_state(device):
    model = TinyMoE(device=device)
    model.dense.weight.requires_grad_(False)
    frozen = model.dense.weight.detach().clone()
    opt = skewadam.SkewAdam(model.named_parameters(), lr=1e-2)
    train(model, opt, 3, device)
    assert torch.equal(model.dense.weight, frozen)
    assert opt.param_state("dense.weight")["step"] == 0
    assert opt.param_state("dense.bias")["step"] == 3


def test_tied_parameters_are_updated_once(device):
    model = TinyMoE(device=device)
    named = list(model.named_parameters(remove_duplicate=False)) if "remove_duplicate" in \
        model.named_parameters.__code__.co_varnames else list(model.named_parameters()) + [
            ("head.weight", model.head.weight)]
    assert any(n == "head.weight" for n, _ in named)
    opt = skewadam.SkewAdam(named, lr=1e-2)
    twin = TinyMoE(device=device)
    opt_twin = skewadam.SkewAdam(twin.named_parameters(), lr=1e-2)
    train(model, opt, 3, device)
    train(twin, opt_twin, 3, device)
    assert torch.equal(model.embed.weight, twin.embed.weight)
    assert opt.names() == opt_twin.names()


def test_step_runs_the_closure_with_gradients_and_returns_its_loss(device):
    model = TinyMoE(device=device)
    opt = skewadam.SkewAdam(model.named_parameters(), lr=1e-2)
    tokens = batch(0, device)

    def closure():
        opt.zero_grad()
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))
        loss.backward()
        return loss

    with torch.no_grad():
        loss = opt.step(closure)
    assert loss.requires_grad and opt.steps == 1


# ---------------------------------------------------------- non-finite
def test_a_nan_gradient_skips_the_step_and_names_it(device):
    model = TinyMoE(device=device)
    opt = skewadam.SkewAdam(model.named_parameters(), lr=1e-2)
    train(model, opt, 2, device)
    before, state_before = bits(model), state_of(opt)
    tokens = batch(5, device)
    opt.zero_grad()
    model(tokens).float().sum().backward()
    with torch.no_grad():
        model.experts_down.grad[1, 2, 3] = float("nan")
    opt.step()
    report = opt.last_step()
    assert not report.applied and not report
    assert report.name == "experts_down" and report.element == 1 * 24 * 16 + 2 * 16 + 3
    assert "NaN" in report.message
    after = bits(model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert same_state(state_before, state_of(opt))
    train(model, opt, 1, device)
    assert opt.last_step().applied and opt.steps == 3

    raising = skewadam.SkewAdam(model.named_parameters(), nonfinite="raise")
    model.experts_down.grad[0, 0, 0] = float("inf")
    with pytest.raises(skewadam.NonFiniteGradientError, match="experts_down"):
        raising.step()


# ------------------------------------------------------------- bad input
def test_bad_input_raises_naming_the_argument():
    model = TinyMoE()
    named = list(model.named_parameters())
    with pytest.raises(TypeError, match="named_parameters"):
        skewadam.SkewAdam(model.parameters())
    with pytest.raises(TypeError, match="one tensor"):
        skewadam.SkewAdam(model.dense.weight)
    with pytest.raises(ValueError, match="empty"):
        skewadam.SkewAdam([])
    with pytest.raises(TypeError, match="parameter 'x': expected a tensor"):
        skewadam.SkewAdam([("x", 3.0)])
    with pytest.raises(ValueError, match="parameter 'ints'.*dtype"):
        skewadam.SkewAdam([("ints", torch.zeros(3, dtype=torch.int32))])
    with pytest.raises(ValueError, match="parameter 'nonleaf': not a leaf"):
        skewadam.SkewAdam([("nonleaf", torch.ones(3, requires_grad=True) * 2)])
    with pytest.raises(ValueError, match="parameter 'strided': not contiguous"):
        skewadam.SkewAdam([("strided", torch.zeros(4, 6).t())])
    with pytest.raises(ValueError, match="lr"):
        skewadam.SkewAdam(named, lr=-1.0)
    with pytest.raises(TypeError, match="lr"):
        skewadam.SkewAdam(named, lr="fast")
    with pytest.raises(ValueError, match="beta2"):
        skewadam.SkewAdam(named, betas=(0.9, 1.5))
    with pytest.raises(ValueError, match="clip_scope"):
        skewadam.SkewAdam(named, clip_scope="row")
    with pytest.raises(ValueError, match="per_tier: unknown tier 'expert'"):
        skewadam.SkewAdam(named, per_tier={"expert": {"lr": 1.0}})
    with pytest.raises(ValueError, match="unknown keyword 'momentum'"):
        skewadam.SkewAdam(named, per_tier={"experts": {"momentum": 0.9}})
    with pytest.raises(ValueError, match=r"tier_rules\[0\]: bad regular expression"):
        skewadam.SkewAdam(named, tier_rules=[("(unclosed", "experts")])
    with pytest.raises(ValueError, match=r"tier_rules\[0\]: unknown tier"):
        skewadam.SkewAdam(named, tier_rules=[("x", "gpu")])
    with pytest.raises(ValueError, match="nonfinite"):
        skewadam.SkewAdam(named, nonfinite="ignore")
    for bad in (float("inf"), -1.0, float("nan")):  # the library's check: finite and > 0, or 0 (off)
        with pytest.raises(ValueError, match="max_grad_norm"):
            skewadam.SkewAdam(named, max_grad_norm=bad)
    assert skewadam.SkewAdam(named, max_grad_norm=0.0)  # off, as None
    with pytest.raises(TypeError, match="max_grad_norm"):
        skewadam.SkewAdam(named, max_grad_norm="1")
    with pytest.raises(ValueError, match="threads"):
        skewadam.SkewAdam(named, threads=-1)
    with pytest.raises(TypeError, match="nonfinite"):
        skewadam.SkewAdam(named, nonfinite=None)
    with pytest.raises(ValueError, match="parameter 'meta'"):
        skewadam.SkewAdam([("meta", torch.empty(3, device="meta"))])
    with pytest.raises(ValueError, match="add_param_group"):
        skewadam.SkewAdam(named).add_param_group({"params": [torch.zeros(2, requires_grad=True)]})
    with pytest.raises(TypeError, match="state_dict"):
        copy.deepcopy(skewadam.SkewAdam(named))
    # the library's checks, translated: an unknown name or tier
    opt = skewadam.SkewAdam(named)
    for ask in (opt.tier_of, opt.param_state, opt.momentum):
        with pytest.raises(ValueError, match="name: no parameter 'nope' is registered"):
            ask("nope")
    with pytest.raises(ValueError, match="tier: unknown tier 'gpu'"):
        opt.state_bytes("gpu")
    with pytest.raises(TypeError):
        opt.state_bytes(3)

    # at step time: a group's bad value names it, and nothing changes
    opt = skewadam.SkewAdam(named, lr=1e-2)
    train(model, opt, 1, "cpu")
    before, state_before = bits(model), state_of(opt)
    opt.param_groups[1]["lr"] = float("nan")
    with pytest.raises(ValueError, match=r"experts\.lr = nan"):
        opt.step()
    opt.param_groups[1]["lr"] = -1.0
    with pytest.raises(ValueError, match="experts.lr"):
        opt.step()
    opt.param_groups[1]["lr"] = 1e-2
    opt.param_groups[2]["tier"] = "experts"
    with pytest.raises(ValueError, match=r"param_groups\[2\]"):
        opt.step()
    after = bits(model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert same_state(state_before, state_of(opt))


# ------------------------------------------------- the step inside backward
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("variant", [skewadam.SkewAdam, skewadam.AdamW, skewadam.SkewAdam8bit],
                         ids=lambda v: v.__name__)
def test_the_step_inside_backward_gives_the_plain_steps_bits_and_frees_gradients(variant, dtype, device):
    def run(inside):
        model = TinyMoE(dtype=dtype, device=device)
        opt = variant(model.named_parameters(), lr=1e-2, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=6)
        if inside:
            opt.step_in_backward()
            assert opt.steps_in_backward
        for t in range(6):
            tokens = batch(t, device)
            opt.zero_grad()
            logits = model(tokens[:, :-1]).float()
            loss = nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))
            loss.backward()
            if inside:  # backward has stepped and freed every gradient
                assert all(p.grad is None for p in model.parameters())
            opt.step()
            sched.step()
        assert opt.last_step().applied
        return bits(model), state_of(opt)

    plain_bits, plain_state = run(False)
    inside_bits, inside_state = run(True)
    for k in plain_bits:
        assert torch.equal(plain_bits[k], inside_bits[k]), k
    assert same_state(plain_state, inside_state)


def test_the_step_inside_backward_refuses_global_norm_clipping_up_front_and_can_be_removed(device):
    model = TinyMoE(device=device)
    opt = skewadam.SkewAdam(model.named_parameters(), lr=1e-2, max_grad_norm=1.0)
    with pytest.raises(ValueError, match="max_grad_norm"):
        opt.step_in_backward()
    assert not opt.steps_in_backward
    opt = skewadam.SkewAdam(model.named_parameters(), lr=1e-2)
    opt.step_in_backward()
    assert opt.steps_in_backward
    opt.step_in_backward(False)
    assert not opt.steps_in_backward
    train(model, opt, 1, device)  # the plain step: backward accumulated the gradients
    assert opt.steps == 1
