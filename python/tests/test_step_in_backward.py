"""The step inside backward in the training loops users write: a backward
that raises part way, nonfinite="raise", gradient accumulation, frozen
parameters, two optimizers on one model, an optimizer dropped with its hooks
on, activation checkpointing; each on torch's gradient-accumulator hooks
(torch 1.13) and on register_post_accumulate_grad_hook (torch 2.1 and later;
on 1.13, a stand-in that behaves as it does)."""

import gc
import weakref

import pytest
import torch
from torch import nn

import skewadam
from test_optimizer import TinyMoE, batch, bits, same_state, state_of


def _post_accumulate_stand_in(self, hook):
    """torch 2.1's Tensor.register_post_accumulate_grad_hook on an older
    torch: hook(tensor) once backward has accumulated the tensor's gradient;
    the tensor holds the hook, and so whatever the hook holds."""
    with torch.enable_grad():
        accumulator = self.expand_as(self).grad_fn.next_functions[0][0]
    handle = accumulator.register_hook(lambda *_args: hook(self))
    self.__dict__.setdefault("_post_accumulate_hooks", []).append(accumulator)
    return handle


@pytest.fixture(params=["accumulator", "post-accumulate"])
def hook_path(request, monkeypatch):
    """Which torch hook the optimizer's step inside backward uses."""
    native = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")
    if request.param == "post-accumulate" and not native:
        monkeypatch.setattr(torch.Tensor, "register_post_accumulate_grad_hook", _post_accumulate_stand_in,
                            raising=False)
    if request.param == "accumulator" and native:
        monkeypatch.delattr(torch.Tensor, "register_post_accumulate_grad_hook")
    return request.param


class RaiseInBackward(torch.autograd.Function):
    """x itself; its backward raises an out-of-memory error, as an
    allocation failing inside backward does."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise torch.cuda.OutOfMemoryError("out of memory (raised by the test inside backward)")


class NaNInBackward(torch.autograd.Function):
    """x itself; its backward makes the gradient NaN."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * float("nan")


def loss_of(model, t, device):
    tokens = batch(t, device)
    logits = model(tokens[:, :-1]).float()
    return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))


def plain_step(model, opt, t, device, leave=()):
    """The plain step of batch t, the parameters named in `leave` without a
    gradient."""
    opt.zero_grad()
    loss_of(model, t, device).backward()
    for name, p in model.named_parameters():
        if name in leave:
            p.grad = None
    opt.step()


def inside_step(model, opt, t, device):
    """Step t of the loop with the step inside backward."""
    opt.zero_grad()
    loss_of(model, t, device).backward()
    assert all(p.grad is None for p in model.parameters() if p.requires_grad)  # stepped and freed
    opt.step()
    assert opt.last_step().applied and not opt.last_step().interrupted


def train_both(plain_model, plain, model, opt, steps, device):
    """Steps `steps` of the plain loop and of the loop stepping inside backward."""
    for t in steps:
        plain_step(plain_model, plain, t, device)
        inside_step(model, opt, t, device)


def same(a_model, a_opt, b_model, b_opt):
    a, b = bits(a_model), bits(b_model)
    return all(torch.equal(a[k], b[k]) for k in a) and same_state(state_of(a_opt), state_of(b_opt))


@pytest.mark.parametrize("ends_it", ["zero_grad", "step", "next backward"])
def test_a_backward_that_raises_part_way_leaves_a_step_that_ends(hook_path, ends_it, device):
    plain_model, model = TinyMoE(device=device), TinyMoE(device=device)
    plain = skewadam.SkewAdam(plain_model.named_parameters(), lr=1e-2)
    opt = skewadam.SkewAdam(model.named_parameters(), lr=1e-2)
    opt.step_in_backward()
    plain_step(plain_model, plain, 0, device)
    loss_of(model, 0, device).backward()
    opt.step()

    # backward steps everything after the embedding, then raises
    model.after_embed = RaiseInBackward.apply
    with pytest.raises(torch.cuda.OutOfMemoryError, match="out of memory"):
        loss_of(model, 1, device).backward()
    model.after_embed = None
    with pytest.raises(RuntimeError, match=r"zero_grad\(\) or step\(\) ends it"):
        opt.state_dict()  # not mid-step; the message says how to end it
    if ends_it == "zero_grad":
        opt.zero_grad()
    elif ends_it == "step":
        opt.step()  # ends the cut-short step; steps nothing more
    if ends_it != "next backward":
        r = opt.last_step()
        assert r.interrupted and r.applied
        assert r.not_stepped == ["embed.weight"]
        assert r.stepped == len(opt.names()) - 1
        assert "backward raised part way" in r.message
        assert opt.steps == 2
        plain_step(plain_model, plain, 1, device, leave=("embed.weight",))
        assert same(plain_model, plain, model, opt)
    else:
        plain_step(plain_model, plain, 1, device, leave=("embed.weight",))
    train_both(plain_model, plain, model, opt, (2, 3), device)  # training goes on
    assert opt.steps == 4
    assert same(plain_model, plain, model, opt)


def test_nonfinite_raise_inside_backward_raises_out_of_it_and_training_goes_on(hook_path, device):
    plain_model, model = TinyMoE(device=device), TinyMoE(device=device)
    plain = skewadam.SkewAdam(plain_model.named_parameters(), lr=1e-2, nonfinite="raise")
    opt = skewadam.SkewAdam(model.named_parameters(), lr=1e-2, nonfinite="raise")
    opt.step_in_backward()
    model.after_embed = NaNInBackward.apply
    with pytest.raises(skewadam.NonFiniteGradientError, match="embed.weight"):
        loss_of(model, 0, device).backward()
    model.after_embed = None
    assert model.embed.weight.grad is None  # consumed, as every gradient a hook takes
    opt.step()  # ends the step backward left; nothing keeps raising
    assert opt.last_step().interrupted
    plain_step(plain_model, plain, 0, device, leave=("embed.weight",))
    train_both(plain_model, plain, model, opt, (1, 2), device)
    assert same(plain_model, plain, model, opt)


def test_a_second_backward_before_step_is_refused_before_it_changes_anything(hook_path):
    plain_model, model = TinyMoE(), TinyMoE()
    plain = skewadam.SkewAdam(plain_model.named_parameters(), lr=1e-2)
    opt = skewadam.SkewAdam(model.named_parameters(), lr=1e-2)
    opt.step_in_backward()
    loss_of(model, 0, "cpu").backward()
    after_first = bits(model)
    with pytest.raises(RuntimeError, match="second backward") as refused:
        loss_of(model, 1, "cpu").backward()
    message = str(refused.value)
    assert "accumulated" in message and "step()" in message
    assert "finish_step" not in message and "ParamId" not in message  # no C++ name
    assert all(torch.equal(after_first[k], v) for k, v in bits(model).items())
    opt.zero_grad()  # drops the refused backward's gradients; the first backward's step ends
    assert not opt.last_step().interrupted
    plain_step(plain_model, plain, 0, "cpu")
    assert same(plain_model, plain, model, opt)
    # the loop as it should be: step() after each backward
    train_both(plain_model, plain, model, opt, (1, 2), "cpu")
    assert same(plain_model, plain, model, opt)


def test_frozen_parameters_are_left_alone(hook_path):
    plain_model, model = TinyMoE(), TinyMoE()
    for m in (plain_model, model):
        m.norm.weight.requires_grad_(False)
    plain = skewadam.SkewAdam(plain_model.named_parameters(), lr=1e-2)
    opt = skewadam.SkewAdam(model.named_parameters(), lr=1e-2)
    opt.step_in_backward()
    train_both(plain_model, plain, model, opt, range(3), "cpu")
    assert same(plain_model, plain, model, opt)
    assert opt.param_state("norm.weight")["step"] == 0


def test_the_hooks_go_with_their_optimizer_and_two_never_both_step(hook_path):
    plain_model, model = TinyMoE(), TinyMoE()
    plain = skewadam.SkewAdam(plain_model.named_parameters(), lr=1e-2)
    first = skewadam.SkewAdam(model.named_parameters(), lr=1e-2)
    first.step_in_backward()
    second = skewadam.SkewAdam(model.named_parameters(), lr=1e-2)
    with pytest.raises(ValueError, match="another optimizer already steps it inside backward"):
        second.step_in_backward()
    assert not second.steps_in_backward
    # a dropped optimizer is collected, its hooks with it
    gone = weakref.ref(first)
    del first
    gc.collect()
    assert gone() is None
    loss_of(model, 0, "cpu").backward()
    assert all(p.grad is not None for p in model.parameters())  # accumulated as usual
    model.zero_grad(set_to_none=True)
    # now the second one steps each parameter once
    second.step_in_backward()
    train_both(plain_model, plain, model, second, range(2), "cpu")
    assert same(plain_model, plain, model, second)
    second.step_in_backward(False)
    third = skewadam.SkewAdam(model.named_parameters(), lr=1e-2)
    third.step_in_backward()  # the second's hooks are off: accepted


@pytest.mark.parametrize("mode", ["reentrant", "non-reentrant"])
def test_activation_checkpointing_gives_the_plain_steps_bits(hook_path, mode):
    plain_model, model = TinyMoE(), TinyMoE()
    plain_model.checkpoint = model.checkpoint = mode
    plain = skewadam.SkewAdam(plain_model.named_parameters(), lr=1e-2)
    opt = skewadam.SkewAdam(model.named_parameters(), lr=1e-2)
    opt.step_in_backward()
    train_both(plain_model, plain, model, opt, range(3), "cpu")
    assert same(plain_model, plain, model, opt)


def test_a_weight_in_two_reentrant_segments_is_refused_with_what_to_do(hook_path):
    model = TinyMoE()
    model.checkpoint = "reentrant twice"
    opt = skewadam.SkewAdam(model.named_parameters(), lr=1e-2)
    opt.step_in_backward()
    with pytest.raises(RuntimeError, match="completed twice in one backward") as refused:
        loss_of(model, 0, "cpu").backward()
    assert "non-reentrant" in str(refused.value)
    opt.zero_grad()
    assert opt.last_step().interrupted
    # non-reentrant checkpointing: one gradient per parameter, stepped once
    plain_model, model = TinyMoE(), TinyMoE()
    plain_model.checkpoint = model.checkpoint = "non-reentrant twice"
    plain = skewadam.SkewAdam(plain_model.named_parameters(), lr=1e-2)
    opt = skewadam.SkewAdam(model.named_parameters(), lr=1e-2)
    opt.step_in_backward()
    train_both(plain_model, plain, model, opt, (0,), "cpu")
    assert same(plain_model, plain, model, opt)


def test_a_ddp_module_is_refused_as_it_reduces_gradients_after_backward(tmp_path):
    # DistributedDataParallel averages each gradient after backward completed
    # it; a step inside backward would step the local one (Gloo, one process)
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with Gloo is not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(TinyMoE())
        opt = skewadam.SkewAdam(ddp.named_parameters(), lr=1e-2)
        with pytest.raises(ValueError, match="DistributedDataParallel"):
            opt.step_in_backward()
        assert not opt.steps_in_backward
        # the plain step after DDP's reduction works
        opt.zero_grad()
        loss_of(ddp, 0, "cpu").backward()
        opt.step()
        assert opt.steps == 1
    finally:
        dist.destroy_process_group()


def test_clipping_by_the_previous_norm_gives_the_plain_steps_bits_and_resumes(hook_path, device):
    """clip_norm="previous" (docs/spec.md E8): the step inside backward
    clips, with the plain step's bits; state_dict carries the norm."""
    plain_model, model, resumed_model = TinyMoE(device=device), TinyMoE(device=device), TinyMoE(device=device)
    plain = skewadam.SkewAdam(plain_model.named_parameters(), lr=1e-2, max_grad_norm=0.05, clip_norm="previous")
    opt = skewadam.SkewAdam(model.named_parameters(), lr=1e-2, max_grad_norm=0.05, clip_norm="previous")
    opt.step_in_backward()  # accepted: clipping by the previous norm needs no other gradient
    # the first step has no norm before it: it measures it, and updates nothing
    before = bits(model)
    plain_step(plain_model, plain, 0, device)
    opt.zero_grad()
    loss_of(model, 0, device).backward()
    opt.step()
    for o in (plain, opt):
        assert o.last_step().measured and not o.last_step().applied and o.steps == 0
    assert all(torch.equal(before[k], v) for k, v in bits(model).items())
    train_both(plain_model, plain, model, opt, range(1, 3), device)
    assert same(plain_model, plain, model, opt)
    saved = opt.state_dict()
    norm = saved["skewadam"]["previous_grad_norm"]
    assert norm > 0.05  # the clip bites on the next step
    resumed_model.load_state_dict(model.state_dict())
    resumed = skewadam.SkewAdam(resumed_model.named_parameters(), lr=1e-2, max_grad_norm=0.05,
                                clip_norm="previous")
    resumed.load_state_dict(saved)
    assert resumed.state_dict()["skewadam"]["previous_grad_norm"] == norm
    resumed.step_in_backward()
    train_both(plain_model, plain, resumed_model, resumed, range(3, 5), device)
    assert same(plain_model, plain, resumed_model, resumed)
    # the clip changed the steps: without it, other bits
    unclipped_model = TinyMoE(device=device)
    unclipped = skewadam.SkewAdam(unclipped_model.named_parameters(), lr=1e-2)
    for t in range(5):
        plain_step(unclipped_model, unclipped, t, device)
    assert not same(plain_model, plain, unclipped_model, unclipped)
    bad = dict(saved, skewadam=dict(saved["skewadam"], previous_grad_norm=-1.0))
    with pytest.raises(ValueError, match="previous_grad_norm"):
        resumed.load_state_dict(bad)
    with pytest.raises(ValueError, match="clip_norm"):
        skewadam.SkewAdam(model.named_parameters(), max_grad_norm=1.0, clip_norm="next")
