"""Where a training step's GPU time goes, kernel by kernel, from Nsight Compute.

Runs `ncu` on the trainer's `bench` program, recording each kernel's
duration (gpu__time_duration.sum) and its launch's threads, with the caches
and clocks left as they are, and prints markdown: the GPU time per optimizer
step in each kind of kernel, the kernels that take the most, and the
(kernel, launch size) pairs that take the most, with the bandwidth an
elementwise binary op of that size would reach. ncu runs the kernels one at a
time, so the sum is the GPU's busy time, without the gaps in which it waits
for the host; compare it with the step's wall time from an unprofiled `bench`.

    python3 benchmarks/gpu_profile.py --bench target/gpu-check/bench --steps 2 -- \\
        --model-size small --steps 1 --warmup 1 --grad-accum 1 --device cuda --ranks threads

`--steps` is the number of optimizer steps the bench arguments run in all
(warm-up included): the totals are divided by it. Needs ncu (Nsight Compute)
and a GPU. Not part of any test.
"""

import argparse
import collections
import csv
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile

METRIC = "gpu__time_duration.sum"
# The launch's threads: candle's elementwise kernels start one per element
# (in blocks of 1,024), so for them this is the tensor's size.
THREADS = ("launch__grid_size", "launch__block_size")

# (kind, pattern on the kernel's name), first match wins: cuBLAS's matrix
# products, the workbook's fused kernels, then candle's kernels by name
# (ucopy/copy2d copy, b* are binary elementwise ops, u* unary ones, ...).
KINDS = [
    ("matrix products (cuBLAS)", r"gemm|gemv|xmma|cutlass|splitKreduce|sm\d+_"),
    ("fused softmax (workbook)", r"^softmax_rows|^softmax_backward_rows"),
    ("fused cross-entropy (workbook)", r"^cross_entropy|^mean$"),
    ("fused SiLU (workbook)", r"^silu_"),
    ("AdamW (workbook)", r"^adamw_update"),
    ("copies and layout changes", r"copy|transpose|cast_"),
    ("reductions (sum, max, softmax)", r"fast_sum|fast_max|fast_min|sum_|max_|min_|softmax|argm|reduce"),
    ("index ops (gather, index_select, index_add)", r"gather|scatter|^is_|^ia_|index"),
    ("where and masks", r"where"),
    ("binary elementwise", r"^b(add|sub|mul|div|maximum|minimum)|^badd|^bmul|^bsub|^bdiv"),
    ("unary elementwise and affine", r"^u[a-z]|affine|powf|elu|fill|const_set"),
]
OTHER = "other"


def ncu_path():
    found = shutil.which("ncu")
    if found:
        return found
    for root in ("/opt/nvidia", "/usr/local/cuda"):
        for dirpath, _, files in os.walk(root):
            if "ncu" in files:
                return os.path.join(dirpath, "ncu")
    sys.exit("ncu (Nsight Compute) is not on the PATH, nor under /opt/nvidia or /usr/local/cuda")


def kind_of(name):
    for kind, pattern in KINDS:
        if re.search(pattern, name):
            return kind
    return OTHER


def to_ms(value, unit):
    value = float(value.replace(",", ""))
    scale = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3, "s": 1e3}
    if unit not in scale:
        sys.exit(f"unexpected unit {unit!r} for {METRIC}")
    return value * scale[unit]


def launches_in(report):
    """(kernel name, milliseconds, threads) for every kernel launch in an ncu report."""
    text = subprocess.run(
        [ncu_path(), "--import", report, "--csv", "--page", "details", "--print-units", "base"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rows = csv.DictReader(io.StringIO(text[text.index('"ID"') :]))
    launches = collections.defaultdict(dict)
    for row in rows:
        metrics = launches[row["ID"]]
        metrics["name"] = row["Kernel Name"]
        if row.get("Metric Name") == METRIC:
            metrics["ms"] = to_ms(row["Metric Value"], row["Metric Unit"])
        elif row.get("Metric Name") in THREADS:
            metrics[row["Metric Name"]] = int(float(row["Metric Value"].replace(",", "")))
    for metrics in launches.values():
        if "ms" in metrics:
            yield metrics["name"], metrics["ms"], metrics.get(THREADS[0], 0) * metrics.get(THREADS[1], 0)


def short(name, width=70):
    name = re.sub(r"\(.*", "", name)
    return name if len(name) <= width else name[: width - 1] + "…"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", required=True, help="the trainer's bench program")
    parser.add_argument("--steps", type=int, required=True, help="optimizer steps the bench arguments run in all")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("bench_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    bench_args = args.bench_args[1:] if args.bench_args[:1] == ["--"] else args.bench_args

    with tempfile.TemporaryDirectory() as folder:
        report = os.path.join(folder, "step.ncu-rep")
        metrics = ",".join((METRIC, *THREADS))
        command = [ncu_path(), "--metrics", metrics, "--cache-control", "none", "--clock-control", "none"]
        command += ["--export", report, "--force-overwrite", args.bench, *bench_args]
        subprocess.run(command, check=True, stdout=sys.stderr)
        launches = list(launches_in(report))

    if not launches:
        sys.exit("ncu recorded no kernels")
    by_kind = collections.defaultdict(float)
    by_name = collections.defaultdict(lambda: [0, 0.0])
    by_size = collections.defaultdict(lambda: [0, 0.0])
    for name, ms, threads in launches:
        by_kind[kind_of(name)] += ms
        by_name[short(name)][0] += 1
        by_name[short(name)][1] += ms
        by_size[(short(name, 30), threads)][0] += 1
        by_size[(short(name, 30), threads)][1] += ms
    total = sum(by_kind.values())
    per_step = total / args.steps
    print(f"{len(launches) / args.steps:.0f} kernels and {per_step:.1f} ms of GPU time per optimizer step")
    print()
    print("| kind of kernel | ms per step | share |")
    print("|---|---:|---:|")
    for kind, ms in sorted(by_kind.items(), key=lambda item: -item[1]):
        print(f"| {kind} | {ms / args.steps:.1f} | {100 * ms / total:.1f}% |")
    print()
    print(f"| kernel (the {args.top} that take the most) | launches per step | ms per step | share |")
    print("|---|---:|---:|---:|")
    for name, (count, ms) in sorted(by_name.items(), key=lambda item: -item[1][1])[: args.top]:
        print(f"| `{name}` | {count / args.steps:g} | {ms / args.steps:.1f} | {100 * ms / total:.1f}% |")
    print()
    print(f"| kernel and launch size (the {args.top} that take the most) | threads | launches per step | ms per step | GB/s if 3 × 4 bytes a thread |")
    print("|---|---:|---:|---:|---:|")
    for (name, threads), (count, ms) in sorted(by_size.items(), key=lambda item: -item[1][1])[: args.top]:
        rate = 12 * threads * count / (ms * 1e6)
        print(f"| `{name}` | {threads:,} | {count / args.steps:g} | {ms / args.steps:.2f} | {rate:,.0f} |")


if __name__ == "__main__":
    main()
