#!/usr/bin/python3
"""The Python package's optimizer step side by side with what a PyTorch user
would otherwise run, on the same parameters (bench/compare.py's shapes and
its paper-proportioned set), on the CPU at 1 and 2 threads and on a CUDA
device when there is one:

  skewadam    skewadam.SkewAdam(...).step(): the library, called from Python
  torch-ops   the same rule written with PyTorch tensor ops
              (compare.TorchOpsSkewAdam, on the parameters' device)
  AdamW       torch.optim.AdamW(..., foreach=True)

Usage: VENV/bin/python bench/python_bench.py [--threads 1,2] [--steps 9] [--quick] [--markdown]

Every implementation steps its own copy of the parameters (same values, same
gradients); each is timed over --steps steps after two warm-up steps, and
the implementations take turns, one round each, --rounds times, so that a
slow phase of a noisy machine falls on all. Reported: the median over all
timed steps, and the others' times over skewadam's (above 1: skewadam is
faster). The environment is compare.py's (glibc keeps freed memory for
PyTorch's temporaries, OpenMP threads wait passively).
"""

import argparse
import os
import pathlib
import platform
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import compare  # noqa: E402

if __name__ == "__main__":
    compare._reexec_with_environment()

import torch  # noqa: E402

import skewadam  # noqa: E402


def named(params):
    """(name, tensor) pairs whose names give the tiers of compare.py's spec."""
    out = []
    for i, (p, tier) in enumerate(params):
        out.append((f"{tier}.{i}" if tier != "backbone" else f"layer.{i}", p))
    return out


def build(kind, spec, device):
    params = compare.make_params(spec)
    if device.type != "cpu":
        moved = []
        for p, tier in params:
            q = p.to(device)
            q.grad = p.grad.to(device)
            moved.append((q, tier))
        params = moved
    if kind == "skewadam":
        opt = skewadam.SkewAdam(named(params), lr=3e-4, weight_decay=0.05, threads=torch.get_num_threads())
    elif kind == "torch-ops":
        opt = compare.TorchOpsSkewAdam(params)
    else:
        opt = torch.optim.AdamW([p for p, _ in params], lr=3e-4, weight_decay=0.05, foreach=True)
    return opt, params


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_case(spec, threads, device, steps, rounds, kinds):
    torch.set_num_threads(threads)
    built = {k: build(k, spec, device) for k in kinds}
    times = {k: [] for k in kinds}
    for opt, _ in built.values():
        opt.step()
        opt.step()
    sync(device)
    for _ in range(rounds):
        for k in kinds:
            opt = built[k][0]
            for _ in range(steps):
                t0 = time.perf_counter()
                opt.step()
                sync(device)
                times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def cases(quick):
    f32, bf16 = torch.float32, torch.bfloat16
    out = [("experts f32 4096x2048", [((4096, 2048), "experts", f32)]),
           ("experts bf16 4096x2048", [((4096, 2048), "experts", bf16)]),
           ("paper-proportioned step f32 (53M)", compare.paper_model(f32)),
           ("paper-proportioned step bf16 (53M)", compare.paper_model(bf16))]
    if not quick:
        out[2:2] = [("experts f32 4096x4096", [((4096, 4096), "experts", f32)]),
                    ("experts bf16 4096x4096", [((4096, 4096), "experts", bf16)]),
                    ("backbone f32 4096x4096", [((4096, 4096), "backbone", f32)])]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--device", default="cpu,cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--torch-malloc", default="warm", choices=["warm", "default"])
    ap.add_argument("--omp-wait-policy", default="passive", choices=["passive", "default"])
    args = ap.parse_args()
    kinds = ["skewadam", "torch-ops", "AdamW"]
    rows = []
    for dev in args.device.split(","):
        device = torch.device(dev)
        for threads in ([int(t) for t in args.threads.split(",")] if device.type == "cpu" else [0]):
            for name, spec in cases(args.quick):
                ms = time_case(spec, threads if threads else torch.get_num_threads(), device, args.steps,
                               args.rounds, kinds)
                rows.append((name, dev, threads if threads else "-", ms))
                print(f"{name:36s} {dev:5s} thr {threads or '-'}: " +
                      "  ".join(f"{k} {ms[k]:8.2f} ms" for k in kinds), file=sys.stderr, flush=True)
    load = os.getloadavg()[0]
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; torch {torch.__version__};"
          f" skewadam {skewadam.__version__}; load average {load:.2f} after the run")
    sep = " | " if args.markdown else "  "
    head = ["case", "device", "thr", "skewadam ms", "torch-ops ms", "AdamW (foreach) ms", "torch-ops / skewadam",
            "AdamW / skewadam"]
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    else:
        print(sep.join(head))
    for name, dev, thr, ms in rows:
        cells = [name, dev, str(thr), f"{ms['skewadam']:.2f}", f"{ms['torch-ops']:.2f}", f"{ms['AdamW']:.2f}",
                 f"{ms['torch-ops'] / ms['skewadam']:.1f}x", f"{ms['AdamW'] / ms['skewadam']:.1f}x"]
        print(("| " + " | ".join(cells) + " |") if args.markdown else sep.join(cells))


if __name__ == "__main__":
    main()
