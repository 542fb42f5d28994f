#!/usr/bin/python3
"""Side-by-side: the library's fused SkewAdam step against what a user would
otherwise run on CPU, on the same parameters, at 1 and 2 threads.

  skewadam   the library (skewadam-bench, step/... and model/... benchmarks)
  torch-ops  the same rule written with PyTorch tensor ops, the way a Python
             optimizer does it (docs/spec.md §3; bf16 with E1 + E2, the
             stochastic rounding done with torch.randint and integer ops)
  torch      torch.optim.AdamW, as constructed by default
  adamw      the library's own fused AdamW rule (skewadam-bench step/adamw/...)

Usage: /usr/bin/python3 bench/compare.py [--bench build/bench/skewadam-bench]
           [--threads 1,2] [--steps 5] [--quick] [--markdown]

Times are medians of --steps timed steps after two warm-up steps (torch) and
of --reps repetitions of each skewadam-bench benchmark, interleaved in random
order with the others' so that a burst of load elsewhere does not hit one
benchmark's every repetition. Ratios are the other
implementation's time divided by the library's SkewAdam time: above 1 means
the library is faster.

The PyTorch code allocates fresh full-size temporaries every step. By default
the torch measurements run with glibc's allocator told to keep freed memory
(MALLOC_MMAP_MAX_=0, MALLOC_TRIM_THRESHOLD_ huge), so those temporaries reuse
warm pages: PyTorch's best case. --torch-malloc=default measures glibc's
default instead, where every temporary above the mmap threshold is fresh
pages and pays a page fault per 4 KiB (very expensive on some VMs).

Every measurement (torch and skewadam-bench) runs with OMP_WAIT_POLICY=passive
unless --omp-wait-policy=default: on a machine shared with other work, OpenMP
threads spinning at barriers take CPU time from the threads they wait for,
which made 2-thread runs of both PyTorch and the library 1.5-3x slower here.
"""

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

WARM_MALLOC = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40), "MALLOC_TOP_PAD_": str(1 << 28)}


def _reexec_with_environment():
    """glibc and libgomp read their settings at start-up: re-run this script
    with them set (before torch is imported). skewadam-bench inherits them."""
    if os.environ.get("SKEWADAM_COMPARE_ENV") == "set":
        return
    env = dict(os.environ, SKEWADAM_COMPARE_ENV="set")
    if "--torch-malloc=default" not in sys.argv:
        env.update(WARM_MALLOC)
    if "--omp-wait-policy=default" not in sys.argv:
        env["OMP_WAIT_POLICY"] = "passive"
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


if __name__ == "__main__":
    _reexec_with_environment()

import torch  # noqa: E402


# ----------------------------------------------------------------- the rule
class TorchOpsSkewAdam:
    """SkewAdam with PyTorch tensor ops (docs/spec.md §3), one tensor at a time.

    params: list of (tensor, tier) with tier in {"backbone", "experts",
    "router"}. backbone: momentum + factored; experts: factored; router:
    exact. Rank-1 tensors use the exact second moment. bf16 parameters are
    updated in fp32 and written back with unbiased stochastic rounding, weight
    decay fused before the single rounding (docs/spec.md §5, E1 and E2).
    """

    def __init__(self, params, lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05, clip_threshold=1.0):
        self.params = params
        self.lr, self.beta1, self.beta2 = lr, betas[0], betas[1]
        self.eps, self.wd, self.clip = eps, weight_decay, clip_threshold
        self.state = [dict(step=0) for _ in params]

    @torch.no_grad()
    def step(self):
        lr, b1, b2, eps = self.lr, self.beta1, self.beta2, self.eps
        for (p, tier), st in zip(self.params, self.state):
            if p.grad is None:
                continue
            g = p.grad if p.grad.dtype == torch.float32 else p.grad.float()
            st["step"] += 1
            t = st["step"]
            bc1 = 1.0 - b1 ** t
            bc2 = 1.0 - b2 ** t
            momentum = tier == "backbone"
            factored = tier != "router" and p.dim() >= 2
            if momentum:
                if "m" not in st:
                    st["m"] = torch.zeros_like(g)
                m = st["m"]
                m.mul_(b1).add_(g, alpha=1.0 - b1)
                u = m * (math.sqrt(bc2) / bc1)
            else:
                u = g * math.sqrt(bc2)
            if factored:
                if "v_row" not in st:
                    st["v_row"] = torch.zeros(g.shape[:-1], dtype=torch.float32, device=g.device)
                    st["v_col"] = torch.zeros(g.shape[:-2] + g.shape[-1:], dtype=torch.float32, device=g.device)
                r, c = st["v_row"], st["v_col"]
                g2 = g * g
                r.mul_(b2).add_(g2.mean(dim=-1), alpha=1.0 - b2)
                c.mul_(b2).add_(g2.mean(dim=-2), alpha=1.0 - b2)
                vbar = r.mean(dim=-1, keepdim=True).clamp_min(1e-15)
                row = (r / vbar).clamp_min(eps).sqrt()
                col = c.clamp_min(eps).sqrt()
                u.div_(row.unsqueeze(-1)).div_(col.unsqueeze(-2))
            else:
                if "v" not in st:
                    st["v"] = torch.zeros_like(g)
                v = st["v"]
                v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
                u.div_(v.clamp_min(eps).sqrt())
            rms = u.pow(2).mean().sqrt()
            u.div_(torch.clamp_min(rms / self.clip, 1.0))
            if p.dtype == torch.float32:
                if self.wd:
                    p.mul_(1.0 - lr * self.wd)
                p.add_(u, alpha=-lr)
            else:
                x = p.float()
                x.mul_(1.0 - lr * self.wd).add_(u, alpha=-lr)
                bits = x.view(torch.int32)
                bits.add_(torch.randint(0, 1 << 16, x.shape, dtype=torch.int32, device=x.device)).bitwise_and_(-65536)
                p.copy_(x)


# -------------------------------------------------------------- parameters
def paper_model(dtype):
    """The parameter set of skewadam-bench's model/... benchmarks: the paper's
    proportions (5 % backbone, 95 % experts, a router) at d_model 1024 with 8
    experts of ff 2048. LayerNorms and the router stay fp32."""
    d, e, ff, kv = 1024, 8, 2048, 256
    ps = [((d,), "backbone", torch.float32) for _ in range(6)]
    ps += [((d, d), "backbone", dtype), ((kv, d), "backbone", dtype), ((kv, d), "backbone", dtype),
           ((d, d), "backbone", dtype)]
    ps += [((e, d), "router", torch.float32)]
    ps += [((e, ff, d), "experts", dtype), ((e, ff, d), "experts", dtype), ((e, d, ff), "experts", dtype)]
    return ps


def make_params(spec, seed=1):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for shape, tier, dtype in spec:
        p = (torch.rand(shape, generator=gen) * 0.1 - 0.05).to(dtype)
        p.grad = ((torch.rand(shape, generator=gen) * 2 - 1) * 1e-3).to(dtype)
        out.append((p, tier))
    return out


def time_steps(step, steps):
    """Median wall-clock and calling-thread CPU time of a step, in ms."""
    step()
    step()
    wall, cpu = [], []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.thread_time()
        step()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3


def time_torch_ops(spec, threads, steps):
    torch.set_num_threads(threads)
    params = make_params(spec)
    opt = TorchOpsSkewAdam(params)
    ms = time_steps(opt.step, steps)
    del opt, params
    return ms


def time_torch_adamw(spec, threads, steps):
    torch.set_num_threads(threads)
    params = make_params(spec)
    opt = torch.optim.AdamW([p for p, _ in params], lr=3e-4, weight_decay=0.05)
    ms = time_steps(opt.step, steps)
    del opt, params
    return ms


# --------------------------------------------------------------- the library
def run_bench(bench, names, reps, min_time):
    pattern = "^(" + "|".join(sorted(set(names))) + ")(/real_time)?$"
    cmd = [bench, "--benchmark_filter=" + pattern, "--benchmark_format=json",
           "--benchmark_repetitions=%d" % reps, "--benchmark_min_time=%g" % min_time,
           "--benchmark_report_aggregates_only=true", "--benchmark_enable_random_interleaving=true"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    data = json.loads(out)
    result = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        name = b["run_name"]
        if name.endswith("/real_time"):
            name = name[: -len("/real_time")]
        scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b.get("time_unit", "ms")]
        result[name] = b["real_time"] * scale
        result[name + ":cpu"] = b["cpu_time"] * scale
        if "bytes_per_second" in b:
            result[name + ":GB/s"] = b["bytes_per_second"] / 1e9
    return result, data.get("context", {})


# ------------------------------------------------------------------- cases
def cases(quick):
    f32, bf16 = torch.float32, torch.bfloat16
    out = []
    shapes = [(4096, 2048)] if quick else [(4096, 2048), (4096, 4096)]
    for dtype, dn in ((f32, "f32"), (bf16, "bf16")):
        for r, c in shapes:
            out.append(dict(label="experts %s %dx%d" % (dn, r, c), spec=[((r, c), "experts", dtype)],
                            lib="step/experts/%s/%dx%d" % (dn, r, c), adamw="step/adamw/%s/%dx%d" % (dn, r, c)))
    if not quick:
        out.append(dict(label="backbone f32 4096x4096", spec=[((4096, 4096), "backbone", f32)],
                        lib="step/backbone/f32/4096x4096", adamw="step/adamw/f32/4096x4096"))
    for dtype, dn in ((f32, "f32"), (bf16, "bf16")):
        out.append(dict(label="paper-proportioned step %s (53M)" % dn, spec=paper_model(dtype),
                        lib="model/skewadam/%s/paper53M" % dn, adamw="model/adamw/%s/paper53M" % dn))
    return out


def machine():
    model = "unknown"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "%s, %d CPUs, %.0f GiB, torch %s, Python %s" % (
        model, os.cpu_count() or 0,
        os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, torch.__version__,
        platform.python_version())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--bench", default=os.path.join(here, "..", "build", "bench", "skewadam-bench"))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=5, help="timed torch steps per case (median)")
    ap.add_argument("--reps", type=int, default=9, help="skewadam-bench repetitions (median)")
    ap.add_argument("--min-time", type=float, default=0.05, help="skewadam-bench --benchmark_min_time")
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--torch-malloc", choices=["warm", "default"], default="warm",
                    help="glibc allocator settings for the torch measurements (see above)")
    ap.add_argument("--omp-wait-policy", choices=["passive", "default"], default="passive",
                    help="OMP_WAIT_POLICY for every measurement (see above)")
    ap.add_argument("--filter", default="", help="only cases whose label contains this text")
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]

    load_before = " ".join(open("/proc/loadavg").read().split()[:3])
    cs = [c for c in cases(args.quick) if args.filter in c["label"]]
    if not cs:
        sys.exit("compare.py: no case matches --filter %r" % args.filter)
    names = ["stream/triad/threads:%d" % t for t in threads]
    for c in cs:
        for t in threads:
            names += ["%s/threads:%d" % (c["lib"], t), "%s/threads:%d" % (c["adamw"], t)]
    lib, context = run_bench(args.bench, names, args.reps, args.min_time)

    rows = []
    for c in cs:
        for t in threads:
            k, a = "%s/threads:%d" % (c["lib"], t), "%s/threads:%d" % (c["adamw"], t)
            ops = time_torch_ops(c["spec"], t, args.steps)
            ta = time_torch_adamw(c["spec"], t, args.steps)
            rows.append(dict(label=c["label"], t=t, sk=(lib[k], lib[k + ":cpu"]), gbs=lib.get(k + ":GB/s"),
                             ops=ops, ta=ta, aw=(lib[a], lib[a + ":cpu"])))
            print("  done: %s, %d thread(s)" % (c["label"], t), file=sys.stderr)

    print("machine: %s" % machine())
    print("torch allocator: %s" % ("glibc default" if args.torch_malloc == "default"
                                   else "warm (" + ", ".join("%s=%s" % kv for kv in WARM_MALLOC.items()) + ")"))
    print("OMP_WAIT_POLICY: %s" % os.environ.get("OMP_WAIT_POLICY", "(unset)"))
    print("load average before: %s, after: %s" % (load_before, " ".join(open("/proc/loadavg").read().split()[:3])))
    print("skewadam-bench: arch %s, %s" % (context.get("skewadam.arch", "?"), context.get("date", "")))
    for t in threads:
        name = "stream/triad/threads:%d" % t
        print("stream/triad, %d thread(s): %.2f ms, %.1f GB/s (12 bytes per element counted); CPU time of the "
              "calling thread %.2f ms" % (t, lib[name], lib[name + ":GB/s"], lib[name + ":cpu"]))

    head = ["case", "thr", "skewadam ms", "GB/s", "torch-ops ms", "torch AdamW ms", "skewadam AdamW ms",
            "torch-ops / skewadam", "torch AdamW / skewadam", "AdamW / skewadam"]

    def table(title, body):
        print()
        print(title)
        if args.markdown:
            print()
            print("| " + " | ".join(head) + " |")
            print("|" + "|".join("---" for _ in head) + "|")
            for r in body:
                print("| " + " | ".join(r) + " |")
        else:
            widths = [max(len(head[i]), *(len(r[i]) for r in body)) for i in range(len(head))]
            print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
            for r in body:
                print("  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))))

    def row(r, i):
        sk, ops, ta, aw = r["sk"][i], r["ops"][i], r["ta"][i], r["aw"][i]
        gbs = r["gbs"] * r["sk"][0] / sk if r["gbs"] else None
        return [r["label"], str(r["t"]), "%.2f" % sk, "%.1f" % gbs if gbs else "", "%.1f" % ops, "%.1f" % ta,
                "%.2f" % aw, "%.1fx" % (ops / sk), "%.1fx" % (ta / sk), "%.2fx" % (aw / sk)]

    table("Wall-clock time per step (median):", [row(r, 0) for r in rows])
    single = [row(r, 1) for r in rows if r["t"] == 1]
    if single:
        table("CPU time of the one working thread per step, 1 thread (median; insensitive to other "
              "processes taking the CPU, not to their memory traffic):", single)


if __name__ == "__main__":
    main()
