#!/usr/bin/env python3
"""The benchmark's smoke test: runs skewadam-bench on a few small rows (and
the copy kernel, the machine's memory bandwidth) with a handful of
iterations, and checks what it printed: every row the filter names is
present, once; every time is finite and positive; every row that counts
bytes counts a finite, positive rate; the copy kernel moves between 0.1 GB/s
and 10 TB/s (the range of any machine the project runs on: outside it, the
benchmark measures something else); and the benchmark names the CPU level
its kernels ran on. No timing is compared with another.

  check_bench.py BENCH
"""

import json
import math
import subprocess
import sys

ROWS = [f"step/{kind}/{dtype}/{shape}/threads:{t}/real_time"
        for kind, shape in (("router", "128x4096"), ("backbone", "128tensors_64x256_256"))
        for dtype in ("f32", "bf16") for t in (1, 2)]
COPY = "stream/copy/threads:1/real_time"
LEVELS = {"avx512bw", "fma3+avx2", "avx2", "sse4.2", "sse2", "arm64+neon", "scalar"}


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    flt = ("^(step/(router/(f32|bf16)/128x4096|backbone/(f32|bf16)/128tensors_64x256_256)/threads:(1|2)"
           "|stream/copy/threads:1)/")
    out = subprocess.run([sys.argv[1], f"--benchmark_filter={flt}", "--benchmark_min_time=0.001",
                          "--benchmark_format=json"], check=True, capture_output=True, text=True).stdout
    data = json.loads(out)
    problems = []
    rows = {}
    for b in data.get("benchmarks", []):
        if b.get("run_type", "iteration") != "iteration":
            continue
        if b["name"] in rows:
            problems.append(f"{b['name']}: printed twice")
        rows[b["name"]] = b
    for name in ROWS + [COPY]:
        if name not in rows:
            problems.append(f"{name}: missing")
    for name, b in rows.items():
        if name not in ROWS and name != COPY:
            problems.append(f"{name}: not asked for")
        t = b.get("real_time")
        if not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            problems.append(f"{name}: time {t!r}")
        rate = b.get("bytes_per_second")
        if rate is not None and (not math.isfinite(rate) or rate <= 0):
            problems.append(f"{name}: {rate!r} bytes per second")
    copy = rows.get(COPY, {}).get("bytes_per_second")
    if copy is None:
        problems.append(f"{COPY}: no bytes per second")
    elif not 1e8 <= copy <= 1e13:
        problems.append(f"{COPY}: {copy / 1e9:.3g} GB/s, outside 0.1 GB/s .. 10 TB/s")
    arch = data.get("context", {}).get("skewadam.arch")
    if arch not in LEVELS:
        problems.append(f"context skewadam.arch: {arch!r}, not a CPU level's tag ({', '.join(sorted(LEVELS))})")
    if problems:
        print("skewadam-bench smoke test failed:\n  " + "\n  ".join(problems))
        return 1
    print(f"skewadam-bench: {len(rows)} rows, kernels {arch}, copy {copy / 1e9:.1f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
