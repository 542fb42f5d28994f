#!/usr/bin/env python3
"""Roofline table of the CPU steps: each tier's time per step, the bytes per
element its traffic model counts (bench/skewadam_bench.cpp), the bandwidth
that makes, and its share of two references measured in the same run: the
library's own fused AdamW step (the same kind of work at full traffic) and a
copy kernel (stream/copy, what the memory system gives a plain loop).

Every benchmark runs --reps times in one skewadam-bench process, in an order
that Google Benchmark draws at random for each repetition
(--benchmark_enable_random_interleaving), so that a slow phase of a shared
machine falls on all of them; the table gives medians. The ratios the CPU
kernels are held to (experts against AdamW, bf16 against f32, backbone
against AdamW) follow, each with its target.

  /usr/bin/python3 bench/roofline.py --bench build/bench/skewadam-bench [--reps 9]
      [--threads 1,2] [--env SKEWADAM_CPU_ARCH=avx2]

The load average before and after is printed with the tables.
"""

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys

from ab import load_average  # bench/ab.py, beside this script

TIERS = ["experts", "backbone", "router", "adamw"]
SHAPE = {"router": "128x4096"}
# NUM / DEN at THREADS must be at most LIMIT.
TARGETS = [
    ("step/experts/f32", "step/adamw/f32", 1, 0.65),
    ("step/experts/f32", "step/adamw/f32", 2, 0.65),
    ("step/experts/bf16", "step/experts/f32", 1, 0.60),
    ("step/backbone/f32", "step/adamw/f32", 1, 0.95),
]


def names(threads):
    out = []
    for t in threads:
        out += [f"stream/copy/threads:{t}/", f"stream/read/threads:{t}/"]
        for tier in TIERS:
            for dtype in ("f32", "bf16"):
                out.append(f"step/{tier}/{dtype}/{SHAPE.get(tier, '4096x4096')}/threads:{t}/")
        for p in ("statistics", "apply"):
            out.append(f"pass/experts/f32/4096x4096/{p}/threads:{t}/")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default="build/bench/skewadam-bench")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--min-time", default="0.2")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the benchmark process")
    args = ap.parse_args()
    if args.reps < 1:
        sys.exit("roofline.py: --reps must be at least 1")
    threads = [int(t) for t in args.threads.split(",") if t]
    env = dict(os.environ)
    for kv in args.env:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            sys.exit(f"roofline.py: --env {kv!r}: expected NAME=VALUE")
        env[k] = v
    flt = "^(" + "|".join(re.escape(n) for n in names(threads)) + ")"
    cmd = [args.bench, f"--benchmark_filter={flt}", "--benchmark_format=json",
           f"--benchmark_min_time={args.min_time}", f"--benchmark_repetitions={args.reps}",
           "--benchmark_enable_random_interleaving=true"]
    before = load_average()
    data = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)
    after = load_average()

    times, bytes_per = {}, {}
    for b in data["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        key = re.sub(r"/real_time$", "", b["run_name"] if "run_name" in b else b["name"])
        key = re.sub(r"/\d+x\d+/", "/", key)
        unit = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b.get("time_unit", "ns")]
        times.setdefault(key, []).append(b["real_time"] * unit)
        if "bytes_per_second" in b and b["real_time"] > 0:
            # bytes counted per element times elements: bytes per iteration
            bytes_per[key] = b["bytes_per_second"] * b["real_time"] * unit * 1e-3
    med = {k: statistics.median(v) for k, v in times.items()}
    gbs = {k: bytes_per[k] / (med[k] * 1e-3) / 1e9 for k in med if k in bytes_per}
    elems = {}
    for b in data["benchmarks"]:
        if b.get("run_type") == "iteration" and "bytes_per_elem" in b:
            key = re.sub(r"/\d+x\d+/", "/", re.sub(r"/real_time$", "", b.get("run_name", b["name"])))
            elems[key] = b["bytes_per_elem"]

    ctx = data.get("context", {})
    arch = ctx.get("skewadam.arch", "?")
    print(f"skewadam-bench {args.bench}: kernels {arch}, {ctx.get('num_cpus', '?')} CPUs reported, "
          f"{platform.machine()}; medians of {args.reps} randomly interleaved repetitions; "
          f"load average {before} before, {after} after\n")
    for t in threads:
        sfx = f"/threads:{t}"
        adamw, copy = gbs.get(f"step/adamw/f32{sfx}"), gbs.get(f"stream/copy{sfx}")
        print(f"{t} thread{'s' if t > 1 else ''}:\n")
        print("| benchmark | ms | B/element | GB/s | of AdamW f32's GB/s | of copy's GB/s |")
        print("|---|---|---|---|---|---|")
        for k in sorted(med, key=lambda k: (not k.startswith("stream"), not k.startswith("step"), k)):
            if not k.endswith(sfx):
                continue
            g = gbs.get(k)
            share = lambda ref: f"{g / ref:.2f}" if g and ref else ""
            be = elems.get(k, 8 if k.startswith("stream/copy") else 4 if k.startswith("stream/read") else "")
            print(f"| {k[:-len(sfx)]} | {med[k]:.3f} | {be if be == '' else f'{be:g}'} | "
                  f"{'' if g is None else f'{g:.1f}'} | {share(adamw)} | {share(copy)} |")
        print()
    print("| ratio of times | threads | measured | target | |")
    print("|---|---|---|---|---|")
    for num, den, t, limit in TARGETS:
        a, b = med.get(f"{num}/threads:{t}"), med.get(f"{den}/threads:{t}")
        if a is None or b is None:
            continue
        r = a / b
        print(f"| {num[5:]} / {den[5:]} | {t} | {r:.3f} | <= {limit:.2f} | {'met' if r <= limit else 'not met'} |")


if __name__ == "__main__":
    main()
