#!/usr/bin/env python3
"""What a user's translation unit pays to compile: the README's usage example
(between <!-- example:begin usage-example cpp --> and <!-- example:end -->) against a file of
comparable purpose that includes <Eigen/Dense> and multiplies two matrices
(bench/compile_cost_eigen.cpp), compiled with the same compiler and flags.

For each flag set (-O2, and -O3 -march=native by default) the two files are
compiled alternately, ROUNDS times each (5 by default), in an order drawn at
random for each round, so that a slow phase of a shared machine falls on
both; --jobs N runs N compilations side by side, in that order. Each
compilation's CPU time (user + system of the compiler and its children) and
peak memory (the largest resident set of the compiler's processes) are read
from the operating system. The table gives the medians
and the ratio of the medians; --compiled DIR adds the README's example in the
compiled mode (SKEWADAM_COMPILED, skewadam/engine/backend/cpu/compiled.hpp), DIR being the
folder that holds skewadam/compiled_levels.hpp (the build's generated/
folder). A report, not a test: nothing is asserted.

  bench/compile_cost.py [--rounds 5] [--jobs 1] [--flags=-O2 --flags='-O3 -march=native']
                        [--compiled BUILD/generated]
"""

import argparse
import concurrent.futures
import os
import random
import re
import shlex
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def readme_example():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    m = re.search(r"<!-- example:begin usage-example cpp -->[^`]*```cpp\n(.*?)```[^`]*<!-- example:end -->", text, re.S)
    if not m:
        sys.exit("compile_cost: README.md has no usage example between <!-- example:begin usage-example cpp --> and <!-- example:end -->")
    return m.group(1)


def find_include(header, candidates):
    for d in candidates:
        if os.path.isfile(os.path.join(d, header)):
            return d
    sys.exit(f"compile_cost: {header} not found in {', '.join(candidates)} (scripts/install-deps installs it)")


def measure(cxx, flags, source, workdir, tag):
    """Compiles in a child Python process so that its peak memory is its own
    (the object file named by tag: compilations may run side by side)."""
    code = (
        "import resource, subprocess, sys\n"
        "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "sys.stderr.write(r.stderr)\n"
        "print(u.ru_utime + u.ru_stime, u.ru_maxrss / 1024.0)\n"
        "sys.exit(r.returncode)\n")
    obj = os.path.join(workdir, f"{tag}.o")
    proc = subprocess.run([sys.executable, "-c", code, cxx, *flags, "-c", source, "-o", obj],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"compile_cost: {' '.join(shlex.quote(a) for a in [cxx, *flags, source])} failed:\n{proc.stderr}")
    cpu, mib = proc.stdout.split()
    return float(cpu), float(mib)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--flags", action="append", help="a flag set (repeatable; default: -O2, -O3 -march=native)")
    ap.add_argument("--compiled", metavar="DIR", help="also the compiled mode, DIR holding skewadam/compiled_levels.hpp")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=1,
                    help="compilations side by side (each its own process, so its CPU time stays its own; "
                         "a shared cache and memory bus slow both files alike)")
    args = ap.parse_args()
    flag_sets = args.flags or ["-O2", "-O3 -march=native"]
    if args.rounds < 1:
        sys.exit("compile_cost: --rounds must be at least 1")
    if args.jobs < 1:
        sys.exit("compile_cost: --jobs must be at least 1")

    eigen = find_include("Eigen/Dense", ["/usr/include/eigen3", "/usr/local/include/eigen3"])
    common = ["-std=c++20", "-fopenmp", "-fno-math-errno", f"-I{os.path.join(ROOT, 'include')}", f"-I{eigen}"]
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as work:
        example = os.path.join(work, "readme_example.cpp")
        with open(example, "w") as f:
            f.write(readme_example())
        files = [("README usage", example, []), ("Eigen product", os.path.join(HERE, "compile_cost_eigen.cpp"), [])]
        if args.compiled:
            if not os.path.isfile(os.path.join(args.compiled, "skewadam", "compiled_levels.hpp")):
                sys.exit(f"compile_cost: --compiled {args.compiled}: no skewadam/compiled_levels.hpp there")
            files.insert(1, ("README usage, compiled mode", example, ["-DSKEWADAM_COMPILED", f"-I{args.compiled}"]))
        version = subprocess.run([args.cxx, "--version"], capture_output=True, text=True).stdout.splitlines()
        print(f"compiler: {version[0] if version else args.cxx}")
        try:
            with open("/proc/cpuinfo") as f:
                model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
        except OSError:
            model = "?"
        print(f"machine: {model}, {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}; {args.rounds} rounds, "
              f"{args.jobs} at a time")
        rows = []
        for fs in flag_sets:
            flags = shlex.split(fs)
            samples = {name: [] for name, _, _ in files}
            queue = []
            for r in range(args.rounds):
                order = list(files)
                rng.shuffle(order)
                queue += [(name, src, extra, f"{i}-{r}") for i, (name, src, extra) in enumerate(order)]
            with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
                done = pool.map(lambda q: (q[0], measure(args.cxx, common + flags + q[2], q[1], work, q[3])), queue)
                for name, sample in done:
                    samples[name].append(sample)
            eigen_cpu = statistics.median(c for c, _ in samples["Eigen product"])
            eigen_mem = statistics.median(m for _, m in samples["Eigen product"])
            for name, _, _ in files:
                cpu = statistics.median(c for c, _ in samples[name])
                mem = statistics.median(m for _, m in samples[name])
                lo = min(c for c, _ in samples[name])
                hi = max(c for c, _ in samples[name])
                rows.append((fs, name, cpu, lo, hi, mem, cpu / eigen_cpu, mem / eigen_mem))
        print()
        print("| flags | file | CPU s (median) | range | peak MiB | CPU / Eigen's | memory / Eigen's |")
        print("|---|---|---|---|---|---|---|")
        for fs, name, cpu, lo, hi, mem, rc, rm in rows:
            print(f"| `{fs}` | {name} | {cpu:.2f} | {lo:.2f}-{hi:.2f} | {mem:.0f} | {rc:.2f} | {rm:.2f} |")
        print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
