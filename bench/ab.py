#!/usr/bin/env python3
"""Side-by-side timing of two skewadam-bench binaries (A/B): two builds of the
library (before and after a kernel change), or one build under two
environments (SKEWADAM_CPU_ARCH=avx2 against the default, say).

The two are run alternately, ROUNDS times each, so that a slow phase of a
noisy machine falls on both; the table gives, per benchmark, the median
wall-clock time of A and of B, the bandwidth counted by the benchmark
(bytes_per_second) and B's time over A's.

  bench/ab.py --a OLD/skewadam-bench --b NEW/skewadam-bench \\
      --filter 'step/experts/f32/4096x4096' --rounds 7 [--env-b SKEWADAM_CPU_ARCH=avx2]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys


def run(binary, flt, env_extra, min_time):
    env = dict(os.environ)
    for kv in env_extra:
        k, _, v = kv.partition("=")
        env[k] = v
    cmd = [binary, f"--benchmark_filter={flt}", "--benchmark_format=json", f"--benchmark_min_time={min_time}"]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    data = json.loads(out)
    res = {}
    for b in data["benchmarks"]:
        if b.get("run_type", "iteration") != "iteration":
            continue
        unit = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b.get("time_unit", "ns")]
        res[b["name"]] = (b["real_time"] * unit, b.get("bytes_per_second"))
    return res, data.get("context", {})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="benchmark binary A")
    ap.add_argument("--b", required=True, help="benchmark binary B (may equal A, with --env-a/--env-b)")
    ap.add_argument("--filter", required=True, help="--benchmark_filter regex")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--min-time", default="0.5", help="--benchmark_min_time per run (seconds)")
    ap.add_argument("--env-a", action="append", default=[], metavar="K=V")
    ap.add_argument("--env-b", action="append", default=[], metavar="K=V")
    ap.add_argument("--label-a", default="A")
    ap.add_argument("--label-b", default="B")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")

    times = {"a": {}, "b": {}}
    bw = {"a": {}, "b": {}}
    ctx = {}
    for r in range(args.rounds):
        for side, binary, env in (("a", args.a, args.env_a), ("b", args.b, args.env_b)):
            res, c = run(binary, args.filter, env, args.min_time)
            ctx[side] = c
            for name, (ms, bps) in res.items():
                times[side].setdefault(name, []).append(ms)
                if bps:
                    bw[side].setdefault(name, []).append(bps)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)

    arch = {s: ctx.get(s, {}).get("skewadam.arch", "?") for s in ("a", "b")}
    print(f"A = {args.label_a} (kernels {arch['a']}), B = {args.label_b} (kernels {arch['b']}); "
          f"medians of {args.rounds} alternating runs")
    print()
    print("| benchmark | A ms | A GB/s | B ms | B GB/s | B / A |")
    print("|---|---|---|---|---|---|")
    for name in sorted(set(times["a"]) & set(times["b"])):
        ta = statistics.median(times["a"][name])
        tb = statistics.median(times["b"][name])
        ga = statistics.median(bw["a"][name]) / 1e9 if name in bw["a"] else float("nan")
        gb = statistics.median(bw["b"][name]) / 1e9 if name in bw["b"] else float("nan")
        print(f"| {name} | {ta:.3f} | {ga:.1f} | {tb:.3f} | {gb:.1f} | {tb / ta:.3f} |")


if __name__ == "__main__":
    main()
