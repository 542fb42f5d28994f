#!/usr/bin/env python3
"""Side-by-side timing of two skewadam-bench binaries (A/B): two builds of the
library (before and after a kernel change), or one build under two
environments (SKEWADAM_CPU_ARCH=avx2 against the default, say).

The two are run alternately, ROUNDS times each (9 by default), in an order
drawn at random for each round (--seed), so that a slow phase of a noisy
machine falls on both; the table gives, per benchmark, the median wall-clock
time of A and of B, the bandwidth counted by the benchmark (bytes_per_second)
and B's time over A's.

--ratio NUM DEN (repeatable) adds the ratio of two benchmarks measured in the
same run: for each side, NUM's time over DEN's time is taken in each round and
the median (and range) of those ratios is reported. Both come from one
process, a few hundred milliseconds apart, so they share the machine's state
better than two medians do. NUM and DEN are regexes that must match exactly
one benchmark name each.

The load average before and after is printed with the tables (a shared
machine: record it with the figures).

  bench/ab.py --a OLD/skewadam-bench --b NEW/skewadam-bench \\
      --filter 'step/(experts|adamw)/f32/4096x4096/threads:1/' --rounds 9 \\
      --ratio 'experts/f32.*threads:1/' 'adamw/f32.*threads:1/' [--env-b SKEWADAM_CPU_ARCH=avx2]
"""

import argparse
import json
import os
import random
import re
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


def load_average():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def one_match(pattern, names, what):
    hits = [n for n in names if re.search(pattern, n)]
    if len(hits) != 1:
        sys.exit(f"--ratio {what} '{pattern}' must match exactly one benchmark, matches {hits}")
    return hits[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="benchmark binary A")
    ap.add_argument("--b", required=True, help="benchmark binary B (may equal A, with --env-a/--env-b)")
    ap.add_argument("--filter", required=True, help="--benchmark_filter regex")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--min-time", default="0.5", help="--benchmark_min_time per run (seconds)")
    ap.add_argument("--env-a", action="append", default=[], metavar="K=V")
    ap.add_argument("--env-b", action="append", default=[], metavar="K=V")
    ap.add_argument("--label-a", default="A")
    ap.add_argument("--label-b", default="B")
    ap.add_argument("--ratio", nargs=2, action="append", default=[], metavar=("NUM", "DEN"),
                    help="report NUM's time over DEN's, per run (regexes, one benchmark each)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the order of A and B in each round")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")

    rng = random.Random(args.seed)
    sides = {"a": (args.a, args.env_a), "b": (args.b, args.env_b)}
    times = {"a": {}, "b": {}}
    bw = {"a": {}, "b": {}}
    runs = {"a": [], "b": []}  # per round: name -> ms
    ctx = {}
    load_before = load_average()
    for r in range(args.rounds):
        order = ["a", "b"]
        rng.shuffle(order)
        for side in order:
            binary, env = sides[side]
            res, c = run(binary, args.filter, env, args.min_time)
            ctx[side] = c
            runs[side].append({name: ms for name, (ms, _) in res.items()})
            for name, (ms, bps) in res.items():
                times[side].setdefault(name, []).append(ms)
                if bps:
                    bw[side].setdefault(name, []).append(bps)
        print(f"round {r + 1}/{args.rounds} done ({order[0].upper()} then {order[1].upper()})", file=sys.stderr)
    load_after = load_average()

    arch = {s: ctx.get(s, {}).get("skewadam.arch", "?") for s in ("a", "b")}
    print(f"A = {args.label_a} (kernels {arch['a']}), B = {args.label_b} (kernels {arch['b']}); "
          f"medians of {args.rounds} runs each, A and B in random order in each round; "
          f"load average {load_before} before, {load_after} after")
    print()
    print("| benchmark | A ms | A GB/s | B ms | B GB/s | B / A |")
    print("|---|---|---|---|---|---|")
    for name in sorted(set(times["a"]) & set(times["b"])):
        ta = statistics.median(times["a"][name])
        tb = statistics.median(times["b"][name])
        ga = statistics.median(bw["a"][name]) / 1e9 if name in bw["a"] else float("nan")
        gb = statistics.median(bw["b"][name]) / 1e9 if name in bw["b"] else float("nan")
        print(f"| {name} | {ta:.3f} | {ga:.1f} | {tb:.3f} | {gb:.1f} | {tb / ta:.3f} |")

    if args.ratio:
        print()
        print("Ratios within one run (median over the runs, [min, max]):")
        print()
        print("| ratio | A | B |")
        print("|---|---|---|")
        for num, den in args.ratio:
            names = sorted(set(runs["a"][0]) & set(runs["b"][0]))
            n = one_match(num, names, "NUM")
            d = one_match(den, names, "DEN")
            cells = []
            for side in ("a", "b"):
                q = [one[n] / one[d] for one in runs[side]]
                cells.append(f"{statistics.median(q):.3f} [{min(q):.3f}, {max(q):.3f}]")
            print(f"| {n} / {d} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
