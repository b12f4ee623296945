"""Where a training step's time goes, by kind of op, at 1 and 2 threads, on both sides.

The workbook: `perf record` of the trainer's `bench` program (the dev build
`cargo train` runs, reference solutions), its samples sorted into kinds of op
by symbol, and per thread: the thread that runs the step, and the others
(the parts of a batch split across threads, rayon's pool). PyTorch: `pytorch_baseline.py --profile`
(torch.profiler), its ops' self CPU time sorted into the same kinds.

Prints a markdown table per side: milliseconds of CPU per optimizer step in
each kind, at 1 thread and at 2 (on the step's own thread and on the others).
A kind whose time stays on the step's thread at 2 threads runs on one core.

    cargo build -p trainer --features solutions --bin bench
    python3 benchmarks/op_profile.py            # needs perf, and torch for PyTorch's side

Linux only (perf). Not part of any test.
"""

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile

# (kind, pattern on the symbol), first match wins. The workbook's symbols are
# Rust paths; PyTorch's are aten op names.
WORKBOOK_KINDS = [
    ("matrix products", r"gemm|matmul"),
    ("fused kernels (kernels crate)", r"workbook_kernels"),
    ("elementwise (binary, unary, affine)", r"binary_map|unary_map|Affine|affine|BinaryOp|UnaryOp|Map2|Map1|powf|elu"),
    ("reductions", r"[Rr]educe|sum_impl|ReduceSum|max_keepdim|argm"),
    ("copies, strided and contiguous", r"copy_strided|copy2d|memmove|memcpy|Copy|index_select|IndexSelect|gather|Gather"),
    ("zero-fill", r"memset|const_set|zeros|clear_page"),
    ("allocation and page faults", r"malloc|_int_free|free|cfree|page_fault|do_anonymous|alloc_pages|mmap|brk"),
    ("thread pool: waiting, waking", r"rayon|crossbeam|futex|sched_yield|spin|[Bb]arrier|park|schedule|wake"),
    ("autograd bookkeeping", r"backprop|GradStore|sorted_nodes|HashMap|hashbrown|Arc|drop_in_place"),
]
PYTORCH_KINDS = [
    ("matrix products", r"aten::(mm|bmm|addmm|matmul|linear)$"),
    ("fused kernels (kernels crate)", r"softmax|log_softmax|nll_loss|cross_entropy|silu|scaled_dot"),
    ("elementwise (binary, unary, affine)", r"aten::(mul|add|sub|div|neg|rsqrt|sqrt|pow|exp|cos|sin|lerp|addcmul|addcdiv|mul_|add_|div_|sub_|lerp_|addcmul_|addcdiv_|sqrt_|_foreach)"),
    ("reductions", r"aten::(sum|mean|norm|linalg_vector_norm|max|amax)"),
    ("copies, strided and contiguous", r"aten::(copy_|clone|contiguous|cat|index_select|embedding|embedding_dense_backward|gather|_to_copy|to)"),
    ("zero-fill", r"aten::(zero_|zeros|fill_|zeros_like|empty)"),
]
OTHER = "everything else"
WAITING = "thread pool: waiting, waking"
# The trainer's allocator settings (its `mallopt` calls), given to PyTorch as
# `cargo xtask bench` does.
SAME_ALLOCATOR = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1073741824"
HZ = 499
TOKENS_PER_STEP = 16 * 128  # the tiny config's batch


def kind_of(symbol, kinds):
    for name, pattern in kinds:
        if re.search(pattern, symbol):
            return name
    return OTHER


ROLES = ["the step's thread", "other threads (the batch's parts, rayon's pool)", "candle's elementwise worker"]


def role_of(tid, comm, step_tid):
    if tid == step_tid:
        return 0
    return 2 if comm.startswith("candle-bp") else 1


def workbook_profile(root, threads, steps):
    """CPU ms per step by kind and by thread role, and the step's wall ms."""
    binary = os.path.join(root, "target", "debug", "bench")
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "perf.data")
        # The trainer shares the threads itself, as `cargo train` does.
        env = {k: v for k, v in os.environ.items() if k not in ("RAYON_NUM_THREADS", "CANDLE_NUM_THREADS")}
        run = subprocess.run(
            ["perf", "record", "-F", str(HZ), "-o", data, "--", binary, "--model-size", "tiny",
             "--steps", str(steps), "--warmup", "5", "--nproc", "1", "--threads", str(threads)],
            cwd=root, env=env, capture_output=True, text=True, check=True)
        tokens_per_s = json.loads([l for l in run.stdout.splitlines() if l.startswith("{")][-1])["tokens_per_s"]
        report = subprocess.run(
            ["perf", "report", "-i", data, "--no-children", "--sort", "pid,sym", "--stdio", "-F",
             "sample,pid,sym", "-t", "\t"],
            capture_output=True, text=True, check=True).stdout
    rows = []
    for line in report.splitlines():
        fields = line.strip().split("\t")
        if line.startswith("#") or len(fields) < 3 or not fields[0].strip().isdigit():
            continue
        # "26579:bench" (perf's pid key is the thread), "[.] symbol" or "[k] symbol".
        tid, comm = fields[1].strip().split(":", 1)
        rows.append((int(fields[0]), int(tid), comm.strip(), re.sub(r"^\[.\] ", "", fields[2].strip())))
    step_tid = min(tid for _, tid, _, _ in rows)  # the process's first thread runs the step
    # Samples cover the whole run; the warm-up steps count as steps, start-up is left in.
    ms_per_sample = 1000.0 / HZ / (steps + 5)
    ms = collections.defaultdict(lambda: [0.0] * len(ROLES))
    for samples, tid, comm, symbol in rows:
        role = role_of(tid, comm, step_tid)
        # candle's worker waits for work by spinning inside its thread's entry function.
        kind = WAITING if role == 2 and "begin_short_backtrace" in symbol else kind_of(symbol, WORKBOOK_KINDS)
        ms[kind][role] += samples * ms_per_sample
    return ms, TOKENS_PER_STEP / tokens_per_s * 1000


def pytorch_profile(root, python, threads, steps):
    """Self CPU ms per step by kind (torch.profiler does not split by thread)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), GLIBC_TUNABLES=SAME_ALLOCATOR)
    run = subprocess.run(
        [python, "benchmarks/pytorch_baseline.py", "--threads", str(threads), "--steps", str(steps),
         "--warmup", "5", "--profile"],
        cwd=root, env=env, capture_output=True, text=True, check=True)
    tokens_per_s = json.loads(run.stdout.strip().splitlines()[-1])["tokens_per_s"]
    ms = collections.defaultdict(float)
    for line in run.stderr.splitlines():
        fields = line.split()
        if not fields or not fields[0].startswith("aten::"):
            continue
        # Columns: name, self CPU %, self CPU, CPU total %, CPU total, CPU time avg, # of calls.
        self_cpu = fields[2]
        value = float(re.sub(r"[a-z]+$", "", self_cpu))
        unit = re.sub(r"^[0-9.]+", "", self_cpu)
        value_ms = value * {"s": 1000, "ms": 1, "us": 1e-3}[unit]
        ms[kind_of(fields[0], PYTORCH_KINDS)] += value_ms / steps
    return ms, TOKENS_PER_STEP / tokens_per_s * 1000


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--python", default=os.environ.get("WORKBOOK_PYTHON", "python3"))
    args = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    kinds = [name for name, _ in WORKBOOK_KINDS] + [OTHER]

    ours = {threads: workbook_profile(root, threads, args.steps) for threads in (1, 2)}
    print("Workbook (`bench`, tiny config, one process), CPU ms per optimizer step by thread:\n")
    print(f"| kind of op | 1 thread | 2 threads: {' | 2 threads: '.join(ROLES)} |")
    print("|---|---:|" + "---:|" * len(ROLES))
    for kind in kinds:
        one = sum(ours[1][0].get(kind, [0.0]))
        two = ours[2][0].get(kind, [0.0] * len(ROLES))
        print(f"| {kind} | {one:.1f} | " + " | ".join(f"{v:.1f}" for v in two) + " |")
    print(f"| **step, wall** | {ours[1][1]:.0f} | {ours[2][1]:.0f} |" + " |" * (len(ROLES) - 1) + "\n")

    try:
        theirs = {threads: pytorch_profile(root, args.python, threads, args.steps) for threads in (1, 2)}
    except (OSError, subprocess.CalledProcessError) as error:
        print(f"PyTorch's side skipped: {error}", file=sys.stderr)
        return
    print("PyTorch (`pytorch_baseline.py --profile`), self CPU ms per optimizer step "
          "(all threads; torch.profiler counts an op's time on its calling thread):\n")
    print("| kind of op | 1 thread | 2 threads |")
    print("|---|---:|---:|")
    for kind in [name for name, _ in PYTORCH_KINDS] + [OTHER]:
        print(f"| {kind} | {theirs[1][0].get(kind, 0):.1f} | {theirs[2][0].get(kind, 0):.1f} |")
    print(f"| **step, wall** | {theirs[1][1]:.0f} | {theirs[2][1]:.0f} |")


if __name__ == "__main__":
    main()
