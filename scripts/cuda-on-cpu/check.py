"""Runs the fused CUDA kernels of kernels/src/cuda.rs on the CPU and compares them with NumPy.

Takes the kernels' modules out of cuda.rs unchanged, compiles them with g++
against shim.h (a thread per CUDA thread, real barriers, warp shuffles through
shared memory) and driver.cpp, runs each kernel on random inputs, and checks
the results against float64 NumPy: the attention softmax with its causal mask
and scale, the plain softmax at widths a block's threads do and do not
divide, a row with nothing allowed (NaN, as the CPU kernels give), the
softmax's backward, the mean cross-entropy and its gradient at GPT-2's
vocabulary (also with -inf logits), SiLU with its gradient, and AdamW's
update, which must equal the CPU's update_one to the bit. Every check runs
twice: built with multiply-adds kept apart, as NVRTC compiles the kernels
(fmad=false), and fused into single roundings (-mfma -ffp-contract=fast,
where the processor has FMA), as NVRTC's default would. It checks the
kernels' arithmetic, not the Rust code that launches them, nor a GPU: that
is scripts/gpu-check.sh's job.

    python3 scripts/cuda-on-cpu/check.py       # needs g++ with C++20 and numpy

Not part of any test; a run takes about half a minute.
"""

import pathlib
import re
import subprocess
import sys
import tempfile

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
CUDA_RS = HERE.parents[1] / "kernels" / "src" / "cuda.rs"
RTOL, ATOL = 1e-5, 1e-6


def module_sources():
    """Each NVRTC module of cuda.rs (`const F32_MODULE: [&str; 3] = [A, B, C];`) as the text of its parts, joined."""
    text = CUDA_RS.read_text()
    parts = dict(re.findall(r'const (\w+): &str = r#"(.*?)"#;', text, re.S))
    modules = re.findall(r"const (\w+)_MODULE: \[&str; \d+\] = \[([^\]]*)\];", text)
    if not modules:
        sys.exit(f"no `const <NAME>_MODULE: [&str; N] = [...];` lists of sources in {CUDA_RS}")
    return {name.lower(): "".join(parts[part.strip()] for part in names.split(",")) for name, names in modules}


# How multiply-adds are compiled: kept apart (NVRTC's fmad=false, the
# kernels' setting) and fused (fmad=true, NVRTC's default).
CONTRACTIONS = {"multiply-adds apart": ["-ffp-contract=off"], "multiply-adds fused": ["-mfma", "-ffp-contract=fast"]}


def has_fma():
    try:
        return " fma " in pathlib.Path("/proc/cpuinfo").read_text().replace("\n", " ")
    except OSError:
        return False


def build(folder, flags):
    for name, source in module_sources().items():
        (folder / f"{name}.cu").write_text(source)
    driver = folder / "driver"
    command = ["g++", "-std=c++20", "-O2", *flags, "-pthread", f"-I{HERE}", f"-I{folder}", str(HERE / "driver.cpp"), "-o", str(driver)]
    subprocess.run(command, check=True)
    return driver


def run(driver, folder, inputs, *args):
    for name, values in inputs.items():
        values.tofile(folder / name)
    subprocess.run([str(driver), str(folder), *map(str, args)], check=True)


def read(folder, name, shape):
    return np.fromfile(folder / name, dtype=np.float32).reshape(shape)


def softmax_reference(x, allowed, scale):
    scores = np.where(allowed, scale * x, -np.inf)
    with np.errstate(invalid="ignore"):
        e = np.exp(scores - scores.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)


failures = []


def compare(what, got, want):
    close = np.allclose(got, want, rtol=RTOL, atol=ATOL, equal_nan=True)
    error = np.nanmax(np.abs(got - want)) if np.isfinite(want).any() else 0.0
    print(f"{'ok  ' if close else 'FAIL'} {what}: largest difference {error:.2e}")
    if not close:
        failures.append(what)


def check_softmax(driver, folder, rng, rows_per_query, width, queries, scale, label):
    rows = rows_per_query * max(queries, 1)
    x = (rng.standard_normal((rows, width)) * 3).astype(np.float32)
    dy = rng.standard_normal((rows, width)).astype(np.float32)
    mask = np.tril(np.ones((queries, width), np.uint8)) if queries else None
    inputs = {"x": x, "dy": dy} | ({"mask": mask} if queries else {})
    run(driver, folder, inputs, "softmax", rows, width, queries, scale)
    allowed = np.tile(mask, (rows_per_query, 1)).astype(bool) if queries else np.ones_like(x, bool)
    y = softmax_reference(x.astype(np.float64), allowed, scale)
    got = read(folder, "y", x.shape)
    compare(f"{label}, forward", got, y)
    if queries:
        masked = got[~allowed]
        print(f"{'ok  ' if (masked == 0).all() else 'FAIL'} {label}: masked weights exactly 0")
        if not (masked == 0).all():
            failures.append(f"{label}: masked weights")
    dx = scale * y * (dy - (y * dy).sum(-1, keepdims=True))
    compare(f"{label}, backward", read(folder, "dx", x.shape), dx)


def check_nothing_allowed(driver, folder):
    inputs = {"x": np.ones((1, 64), np.float32), "dy": np.ones((1, 64), np.float32), "mask": np.zeros((1, 64), np.uint8)}
    run(driver, folder, inputs, "softmax", 1, 64, 1, 1.0)
    nan = np.isnan(read(folder, "y", (1, 64))).all()
    print(f"{'ok  ' if nan else 'FAIL'} a row with nothing allowed gives NaN")
    if not nan:
        failures.append("a row with nothing allowed")


def check_cross_entropy(driver, folder, rng, rows, classes, blocked=0):
    """`blocked` logits of each row, the first ones (none of them a target), are -inf."""
    logits = (rng.standard_normal((rows, classes)) * 3).astype(np.float32)
    logits[:, :blocked] = -np.inf
    targets = (blocked + (np.arange(rows) * 7919) % (classes - blocked)).astype(np.uint32)
    dloss = np.array([3.0], np.float32)
    run(driver, folder, {"logits": logits, "targets": targets, "dloss": dloss}, "cross_entropy", rows, classes)
    x = logits.astype(np.float64)
    top = x.max(-1, keepdims=True)
    lse = (top + np.log(np.exp(x - top).sum(-1, keepdims=True)))[:, 0]
    picked = x[np.arange(rows), targets]
    label = f"cross-entropy ({rows}, {classes})" + (f", first {blocked} logits -inf" if blocked else "")
    compare(f"{label}, loss", read(folder, "loss", (1,)), np.array([(lse - picked).mean()]))
    grad = np.exp(x - lse[:, None])
    grad[np.arange(rows), targets] -= 1
    compare(f"{label}, gradient", read(folder, "dlogits", x.shape), grad * dloss[0] / rows)


def check_cross_entropy_nothing_finite(driver, folder):
    """A row of nothing but -inf has no log-sum-exp: NaN, as the CPU's kernel gives."""
    inputs = {"logits": np.full((1, 40), -np.inf, np.float32), "targets": np.array([3], np.uint32), "dloss": np.ones(1, np.float32)}
    run(driver, folder, inputs, "cross_entropy", 1, 40)
    nan = np.isnan(read(folder, "loss", (1,))).all()
    print(f"{'ok  ' if nan else 'FAIL'} cross-entropy of a row of nothing but -inf is NaN")
    if not nan:
        failures.append("cross-entropy of an all -inf row")


def check_silu(driver, folder, rng, n, blocks):
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    dy = rng.standard_normal(n).astype(np.float32)
    run(driver, folder, {"x": x, "dy": dy}, "silu", n, blocks)
    v = x.astype(np.float64)
    s = 1 / (1 + np.exp(-v))
    compare(f"SiLU, {n} elements on {blocks * 256} threads, forward", read(folder, "y", (n,)), v * s)
    compare(f"SiLU, {n} elements on {blocks * 256} threads, backward", read(folder, "dx", (n,)), dy * s * (1 + v * (1 - s)))


def f32_bits(value):
    """The bits of `value` rounded to f32, as the host passes a constant."""
    return int(np.float32(value).view(np.uint32))


def check_adamw(driver, folder, rng, n, blocks):
    decayed, g, m = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    v = np.abs(rng.standard_normal(n)).astype(np.float32)
    g[:4] = [0.0, -0.0, 1e-30, -1e-30]  # zeros of both signs, and squares that underflow
    b1, b2, eps, lr, t = 0.9, 0.95, 1e-8, 6e-4, 3
    inv_c1, inv_c2 = 1 / (1 - b1**t), 1 / (1 - b2**t)
    constants = (b1, 1 - b1, b2, 1 - b2, inv_c1, inv_c2, eps, lr)
    run(driver, folder, {"decayed": decayed, "g": g, "m": m, "v": v}, "adamw", n, blocks, *map(f32_bits, constants))
    # The CPU's update_one, one f32 operation at a time in its order (numpy
    # keeps float32 arithmetic in float32 and fuses nothing).
    b1f, omb1, b2f, omb2, ic1, ic2, epsf, lrf = (np.float32(c) for c in constants)
    zero, one = np.float32(0), np.float32(1)
    exp_avg = (m * b1f + zero) + (g * omb1 + zero)
    exp_avg_sq = (v * b2f + zero) + ((g * g) * omb2 + zero)
    denom = np.sqrt(exp_avg_sq * ic2 + zero) * one + epsf
    p_new = decayed - (((exp_avg * ic1 + zero) / denom) * lrf + zero)
    for name, want in (("m", exp_avg), ("v", exp_avg_sq), ("parameter", p_new)):
        got = read(folder, {"m": "m_out", "v": "v_out", "parameter": "p"}[name], (n,))
        differ = int((got.view(np.uint32) != want.view(np.uint32)).sum())
        print(f"{'ok  ' if differ == 0 else 'FAIL'} AdamW, {n} elements on {blocks * 256} threads, {name}: {differ} differ from the CPU's in their bits")
        if differ:
            failures.append(f"AdamW {name}")


def check_all(driver, folder):
    rng = np.random.default_rng(7)
    check_softmax(driver, folder, rng, 2, 300, 300, 0.125, "causal softmax, 2 heads x T 300, scale 1/8")
    check_softmax(driver, folder, rng, 7, 1000, 0, 1.0, "softmax, 7 rows of 1000")
    check_softmax(driver, folder, rng, 5, 40, 0, 1.0, "softmax, 5 rows of 40 (64 threads)")
    check_nothing_allowed(driver, folder)
    check_cross_entropy(driver, folder, rng, 19, 50_257)
    check_cross_entropy(driver, folder, rng, 5, 37)
    # 3000 classes on 1024 threads: the first 64 threads meet -inf first, then finite logits.
    check_cross_entropy(driver, folder, rng, 3, 3000, blocked=64)
    check_cross_entropy_nothing_finite(driver, folder)
    check_silu(driver, folder, rng, 5_000, 3)
    check_adamw(driver, folder, rng, 3_000, 2)


def main():
    for contraction, flags in CONTRACTIONS.items():
        if "-mfma" in flags and not has_fma():
            print(f"skipped the build with {contraction}: this processor has no FMA")
            continue
        print(f"-- built with {contraction}")
        with tempfile.TemporaryDirectory() as name:
            folder = pathlib.Path(name)
            check_all(build(folder, flags), folder)
    if failures:
        sys.exit(f"{len(failures)} check(s) failed: {', '.join(failures)}")


if __name__ == "__main__":
    main()
