"""The library's checkpoint file between Python and C++.

skewadam.save_checkpoint writes the file skewadam::save_checkpoint writes in
C++, and skewadam.load_checkpoint reads it. SKEWADAM_CHECKPOINT_INTEROP names
the C++ half (tests/checkpoint/interop.cpp), which trains the same small
model with the core library from the gradients this test writes: the two
languages' files after the same steps must be identical byte for byte, and a
run saved by either resumes in the other bit for bit."""

import subprocess

import pytest
import torch

import skewadam

from conftest import program

# The model of interop.cpp, in its order: names, dtypes, shapes.
MODEL = (
    ("embed.weight", torch.float32, (12, 8)),
    ("layers.0.attn.proj.weight", torch.bfloat16, (8, 8)),
    ("layers.0.experts.w_in", torch.float32, (3, 8, 6)),
    ("layers.0.router.weight", torch.float32, (3, 8)),
    ("norm.bias", torch.float32, (8,)),
)
# interop.cpp's hyperparameters and seed.
HYPER = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, clip_threshold=1.0, clip_scope="tensor",
             seed=1234, threads=2)
STEPS = 6
VARIANTS = {"skewadam": skewadam.SkewAdam, "skewadam-8bit": skewadam.SkewAdam8bit}


@pytest.fixture(scope="session")
def interop():
    return program("SKEWADAM_CHECKPOINT_INTEROP", "skewadam-checkpoint-interop")


@pytest.fixture()
def data(tmp_path):
    """Initial values and every step's gradients, written for the C++ half
    (float32 .npy; a bf16 parameter's values are bf16 values)."""
    np = pytest.importorskip("numpy", reason="the C++ half reads .npy files that numpy writes")
    g = torch.Generator().manual_seed(7)
    values, grads = [], []
    for i, (_, dtype, shape) in enumerate(MODEL):
        p = torch.randn(shape, generator=g).to(dtype)
        gr = (torch.randn((STEPS, *shape), generator=g) * 0.1).to(dtype)
        gr[2].mul_(40.0)  # a step whose update is clipped
        np.save(tmp_path / f"p{i}.npy", p.float().numpy())
        np.save(tmp_path / f"g{i}.npy", gr.float().numpy())
        values.append(p)
        grads.append(gr)
    return tmp_path, values, grads


def build(variant, values):
    params = {name: v.clone().requires_grad_(True) for (name, _, _), v in zip(MODEL, values)}
    return params, VARIANTS[variant](list(params.items()), **HYPER)


def train(params, opt, grads, first, last):
    for t in range(first, last):
        for (name, _, _), g in zip(MODEL, grads):
            params[name].grad = g[t].clone()
        opt.step()
        assert opt.last_step().applied


def cpp(interop, folder, variant, first, last, load=None, save=None):
    cmd = [interop, str(folder), variant, str(first), str(last)]
    if load:
        cmd += ["--load", str(load)]
    if save:
        cmd += ["--save", str(save)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def same_bits(a, b):
    """Equal dtype, shape and bits (None equals None)."""
    if a is None or b is None:
        return a is None and b is None
    return (a.dtype == b.dtype and a.shape == b.shape and
            torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_python_and_cpp_write_the_same_file_and_resume_each_other(variant, interop, data):
    folder, values, grads = data
    mid = STEPS // 2

    # uninterrupted, in each language: the same bytes
    params, opt = build(variant, values)
    train(params, opt, grads, 0, STEPS)
    skewadam.save_checkpoint(opt, folder / "python.ckpt", include_params=True)
    cpp(interop, folder, variant, 0, STEPS, save=folder / "cpp.ckpt")
    full = (folder / "cpp.ckpt").read_bytes()
    assert (folder / "python.ckpt").read_bytes() == full, "Python and C++ wrote different files"

    # C++ to Python: steps 1..mid in C++, the rest in Python
    cpp(interop, folder, variant, 0, mid, save=folder / "cpp-mid.ckpt")
    resumed, opt2 = build(variant, [torch.zeros_like(v) for v in values])
    skewadam.load_checkpoint(opt2, folder / "cpp-mid.ckpt")  # the state and the parameter values
    assert opt2.steps == mid
    train(resumed, opt2, grads, mid, STEPS)
    for name in params:
        assert same_bits(resumed[name].detach(), params[name].detach()), name
        assert same_bits(opt2.momentum(name), opt.momentum(name)), name
    skewadam.save_checkpoint(opt2, folder / "python-resumed.ckpt", include_params=True)
    assert (folder / "python-resumed.ckpt").read_bytes() == full

    # Python to C++: steps 1..mid in Python, the rest in C++
    half, opt3 = build(variant, values)
    train(half, opt3, grads, 0, mid)
    skewadam.save_checkpoint(opt3, folder / "python-mid.ckpt", include_params=True)
    cpp(interop, folder, variant, mid, STEPS, load=folder / "python-mid.ckpt", save=folder / "cpp-resumed.ckpt")
    assert (folder / "cpp-resumed.ckpt").read_bytes() == full


def test_load_checkpoint_restores_the_groups_hyperparameters_and_refuses_a_mismatch(interop, data):
    folder, values, grads = data
    cpp(interop, folder, "skewadam", 0, 2, save=folder / "cpp.ckpt")
    params, opt = build("skewadam", values)
    for group in opt.param_groups:
        group["lr"] = 0.5
    skewadam.load_checkpoint(opt, folder / "cpp.ckpt")
    assert [g["lr"] for g in opt.param_groups] == [HYPER["lr"]] * 3
    assert [g["weight_decay"] for g in opt.param_groups] == [HYPER["weight_decay"]] * 3

    # another rule on the backbone: refused, naming it, and nothing changes
    other, opt8 = build("skewadam-8bit", values)
    train(other, opt8, grads, 0, 1)
    before = {n: t.detach().clone() for n, t in other.items()}
    state_before = opt8.state_dict()
    with pytest.raises(skewadam.CheckpointError, match="backbone"):
        skewadam.load_checkpoint(opt8, folder / "cpp.ckpt")
    assert all(same_bits(before[n], other[n].detach()) for n in other)
    assert opt8.steps == 1
    after = opt8.state_dict()["state"]
    for name, s in state_before["state"].items():
        for k, v in s.items():
            assert same_bits(v, after[name][k]) if isinstance(v, torch.Tensor) else v == after[name][k]


def test_save_and_load_checkpoint_bad_arguments(tmp_path):
    w = torch.zeros(4, 4, requires_grad=True)
    opt = skewadam.SkewAdam([("w", w)])
    with pytest.raises(TypeError, match="save_checkpoint: expected a skewadam optimizer"):
        skewadam.save_checkpoint(torch.optim.SGD([w], lr=0.1), tmp_path / "x.ckpt")
    with pytest.raises(TypeError, match="include_params"):
        skewadam.save_checkpoint(opt, tmp_path / "x.ckpt", include_params="yes")
    with pytest.raises(skewadam.CheckpointError, match="missing.ckpt"):
        skewadam.load_checkpoint(opt, tmp_path / "missing.ckpt")
    (tmp_path / "foreign.ckpt").write_bytes(b"not a checkpoint at all, just some bytes")
    with pytest.raises(ValueError):  # CheckpointError is a ValueError
        skewadam.load_checkpoint(opt, tmp_path / "foreign.ckpt")
    assert opt.steps == 0
