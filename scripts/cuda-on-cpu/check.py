"""Runs the fused CUDA kernels of kernels/src/cuda.rs on the CPU and compares them with NumPy.

Takes the kernels' modules out of cuda.rs unchanged, compiles them with g++
against shim.h (a coroutine per CUDA thread, barriers, warp shuffles through
shared memory), cuda_bf16.h (bf16 with the hardware's rounding) and
driver.cpp, runs each kernel on random inputs, and checks the results against
float64 NumPy: the attention softmax with its causal mask and scale, the
plain softmax at widths a block's threads do and do not divide, a row with
nothing allowed (NaN, as the CPU kernels give), the softmax's backward, the
mean cross-entropy and its gradient at GPT-2's vocabulary (also with -inf
logits), each in f32 and in bf16; SiLU with its gradient, and AdamW's
update, which must equal the CPU's update_one to the bit. The bf16 kernels
read and write bf16 and compute in f32: each output must lie within half a
bf16 step of the exact value (one rounding), and the stand-in header's
rounding must equal NumPy's to the bit, ties and overflow included. Every
check runs twice: built with multiply-adds kept apart, as NVRTC compiles the
kernels (fmad=false), and fused into single roundings (-mfma
-ffp-contract=fast, where the processor has FMA), as NVRTC's default would.
It checks the kernels' arithmetic, not the Rust code that launches them, nor
a GPU: that is scripts/gpu-check.sh's job. Where that script's `build` has
unpacked CUDA 13.0's NVRTC, each module is also compiled with it as cuda.rs
compiles it (NVRTC needs no GPU).

    python3 scripts/cuda-on-cpu/check.py       # needs g++ with C++20 and numpy

Not part of any test; a run takes about 25 s on 2 cores, most of it the kernels running
on coroutines, one build per core.
"""

import contextlib
import ctypes
import io
import multiprocessing
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
    command = ["g++", "-std=c++20", "-O2", *flags, f"-I{HERE}", f"-I{folder}", str(HERE / "driver.cpp"), "-o", str(driver)]
    subprocess.run(command, check=True)
    return driver


def run(driver, folder, inputs, *args):
    for name, values in inputs.items():
        values.tofile(folder / name)
    subprocess.run([str(driver), str(folder), *map(str, args)], check=True)


def read(folder, name, shape, element=None):
    """An output of the kernels, as float64 values."""
    element = element or F32
    return element.decode(np.fromfile(folder / name, dtype=element.stored)).reshape(shape)


def to_bf16(values):
    """float32 values as bf16 bits, rounded to nearest, ties to even, as CUDA's
    __float2bfloat16: the top half of the f32 bits, plus one where the
    dropped half is above its midpoint, or at it with an odd top half (a
    carry can reach the exponent: that rounds up a binade, or to infinity).
    NaN stays NaN."""
    values = np.asarray(values, np.float32)
    bits = values.view(np.uint32)
    kept, dropped = bits >> 16, bits & 0xFFFF
    up = (dropped > 0x8000) | ((dropped == 0x8000) & (kept & 1 == 1))
    return np.where(np.isnan(values), np.uint16(0x7FFF), (kept + up).astype(np.uint16))


def from_bf16(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


class F32:
    """The f32 kernels: inputs written as they are; results within RTOL/ATOL of float64."""

    name, stored, rtol, atol = "f32", np.float32, RTOL, ATOL

    @staticmethod
    def encode(values):
        return np.asarray(values, np.float32)

    @staticmethod
    def decode(stored):
        return stored.astype(np.float64)


class BF16:
    """The bf16 kernels: inputs rounded to bf16 (the reference reads the same
    rounded values); results rounded once from f32, so within half a bf16
    step (2^-8 relative) of the exact value, plus f32's own error."""

    name, stored, rtol, atol = "bf16", np.uint16, 2.0**-8 + RTOL, ATOL
    encode, decode = staticmethod(to_bf16), staticmethod(from_bf16)


def softmax_reference(x, allowed, scale):
    scores = np.where(allowed, scale * x, -np.inf)
    with np.errstate(invalid="ignore"):
        e = np.exp(scores - scores.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)


failures = []


def compare(what, got, want, element=None):
    element = element or F32
    close = np.allclose(got, want, rtol=element.rtol, atol=element.atol, equal_nan=True)
    error = np.nanmax(np.abs(got - want)) if np.isfinite(want).any() else 0.0
    print(f"{'ok  ' if close else 'FAIL'} {what}: largest difference {error:.2e}")
    if not close:
        failures.append(what)


def check_softmax(driver, folder, rng, element, rows_per_query, width, queries, scale, label):
    label = f"{element.name} {label}"
    rows = rows_per_query * max(queries, 1)
    x = element.encode(rng.standard_normal((rows, width)) * 3)
    dy = element.encode(rng.standard_normal((rows, width)))
    mask = np.tril(np.ones((queries, width), np.uint8)) if queries else None
    inputs = {"x": x, "dy": dy} | ({"mask": mask} if queries else {})
    run(driver, folder, inputs, "softmax", element.name, rows, width, queries, scale)
    allowed = np.tile(mask, (rows_per_query, 1)).astype(bool) if queries else np.ones(x.shape, bool)
    y = softmax_reference(element.decode(x), allowed, scale)
    got = read(folder, "y", x.shape, element)
    compare(f"{label}, forward", got, y, element)
    if queries:
        masked = got[~allowed]
        print(f"{'ok  ' if (masked == 0).all() else 'FAIL'} {label}: masked weights exactly 0")
        if not (masked == 0).all():
            failures.append(f"{label}: masked weights")
    # The backward pass reads the forward's output as the kernel wrote it (in bf16, rounded).
    y, dy = got, element.decode(dy)
    dx = scale * y * (dy - (y * dy).sum(-1, keepdims=True))
    compare(f"{label}, backward", read(folder, "dx", x.shape, element), dx, element)


def check_nothing_allowed(driver, folder, element):
    ones = element.encode(np.ones((1, 64)))
    inputs = {"x": ones, "dy": ones, "mask": np.zeros((1, 64), np.uint8)}
    run(driver, folder, inputs, "softmax", element.name, 1, 64, 1, 1.0)
    nan = np.isnan(read(folder, "y", (1, 64), element)).all()
    print(f"{'ok  ' if nan else 'FAIL'} {element.name} softmax: a row with nothing allowed gives NaN")
    if not nan:
        failures.append(f"{element.name} softmax of a row with nothing allowed")


def check_cross_entropy(driver, folder, rng, element, rows, classes, blocked=0):
    """`blocked` logits of each row, the first ones (none of them a target), are -inf."""
    logits = rng.standard_normal((rows, classes)) * 3
    logits[:, :blocked] = -np.inf
    logits = element.encode(logits)
    targets = (blocked + (np.arange(rows) * 7919) % (classes - blocked)).astype(np.uint32)
    dloss = element.encode([3.0])
    run(driver, folder, {"logits": logits, "targets": targets, "dloss": dloss}, "cross_entropy", element.name, rows, classes)
    x = element.decode(logits)
    top = x.max(-1, keepdims=True)
    lse = (top + np.log(np.exp(x - top).sum(-1, keepdims=True)))[:, 0]
    picked = x[np.arange(rows), targets]
    label = f"{element.name} cross-entropy ({rows}, {classes})" + (f", first {blocked} logits -inf" if blocked else "")
    compare(f"{label}, loss", read(folder, "loss", (1,), element), np.array([(lse - picked).mean()]), element)
    grad = np.exp(x - lse[:, None])
    grad[np.arange(rows), targets] -= 1
    compare(f"{label}, gradient", read(folder, "dlogits", x.shape, element), grad * element.decode(dloss)[0] / rows, element)


def check_cross_entropy_nothing_finite(driver, folder, element):
    """A row of nothing but -inf has no log-sum-exp: NaN, as the CPU's kernel gives."""
    inputs = {"logits": element.encode(np.full((1, 40), -np.inf)), "targets": np.array([3], np.uint32), "dloss": element.encode([1.0])}
    run(driver, folder, inputs, "cross_entropy", element.name, 1, 40)
    nan = np.isnan(read(folder, "loss", (1,), element)).all()
    print(f"{'ok  ' if nan else 'FAIL'} {element.name} cross-entropy of a row of nothing but -inf is NaN")
    if not nan:
        failures.append(f"{element.name} cross-entropy of an all -inf row")


def check_bf16_rounding(driver, folder, rng):
    """The stand-in __float2bfloat16 against to_bf16, bit for bit, and
    __bfloat162float against from_bf16: ties both ways, values either side
    of a tie, the largest finite bf16 and what rounds past it into infinity,
    subnormals, signed zeros, infinities, NaN, and random values."""
    edges = np.array(
        [0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0x00008000, 0x00018000,
         0x00000001, 0x80000000, 0x00000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFF800001],
        np.uint32,
    ).view(np.float32)
    x = np.concatenate([edges, (rng.standard_normal(4096) * np.exp2(rng.integers(-140, 120, 4096))).astype(np.float32)])
    run(driver, folder, {"x": x}, "convert", len(x))
    got = np.fromfile(folder / "bf16", dtype=np.uint16)
    want = to_bf16(x)
    nan = np.isnan(x)
    differ = int((got[~nan] != want[~nan]).sum()) + int((~np.isnan(from_bf16(got[nan]))).sum())
    widened = np.fromfile(folder / "widened", dtype=np.float32).astype(np.float64)
    differ += int((widened[~nan] != from_bf16(want[~nan])).sum())
    print(f"{'ok  ' if differ == 0 else 'FAIL'} bf16 rounding of {len(x)} f32 values (ties, overflow, subnormals, NaN): {differ} differ from NumPy's")
    if differ:
        failures.append("bf16 rounding")


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
        got = np.fromfile(folder / {"m": "m_out", "v": "v_out", "parameter": "p"}[name], dtype=np.float32)
        differ = int((got.view(np.uint32) != want.view(np.uint32)).sum())
        print(f"{'ok  ' if differ == 0 else 'FAIL'} AdamW, {n} elements on {blocks * 256} threads, {name}: {differ} differ from the CPU's in their bits")
        if differ:
            failures.append(f"AdamW {name}")


def check_all(driver, folder):
    rng = np.random.default_rng(7)
    check_bf16_rounding(driver, folder, rng)
    for element in (F32, BF16):
        check_softmax(driver, folder, rng, element, 2, 300, 300, 0.125, "causal softmax, 2 heads x T 300, scale 1/8")
        check_softmax(driver, folder, rng, element, 7, 1000, 0, 1.0, "softmax, 7 rows of 1000")
        check_softmax(driver, folder, rng, element, 5, 40, 0, 1.0, "softmax, 5 rows of 40 (64 threads)")
        check_nothing_allowed(driver, folder, element)
        check_cross_entropy(driver, folder, rng, element, 19, 50_257)
        check_cross_entropy(driver, folder, rng, element, 5, 37)
        # 3000 classes on 1024 threads: the first 64 threads meet -inf first, then finite logits.
        check_cross_entropy(driver, folder, rng, element, 3, 3000, blocked=64)
        check_cross_entropy_nothing_finite(driver, folder, element)
    check_silu(driver, folder, rng, 5_000, 3)
    check_adamw(driver, folder, rng, 3_000, 2)


# CUDA 13.0's NVRTC and headers, where `scripts/gpu-check.sh build` unpacks them.
TOOLKIT = HERE.parents[1] / "target" / "gpu-toolkit" / "nvidia" / "cu13"
# The options Module::compile in cuda.rs gives NVRTC. It gives the include
# path to the bf16 module only; the f32 module includes no header.
NVRTC_OPTIONS = ["--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false", f"--include-path={TOOLKIT / 'include'}"]


def check_nvrtc():
    """Compiles each module with NVRTC, which needs no GPU, where the toolkit is at hand:
    what NVRTC rejects, g++ may accept."""
    libs = TOOLKIT / "lib"
    builtins, nvrtc = sorted(libs.glob("libnvrtc-builtins.so.*")), sorted(libs.glob("libnvrtc.so.*"))
    if not (builtins and nvrtc):
        print(f"skipped NVRTC: none in {TOOLKIT} (scripts/gpu-check.sh build puts CUDA 13.0's there)")
        return
    # Loaded first, so that NVRTC finds its builtins without LD_LIBRARY_PATH.
    ctypes.CDLL(str(builtins[0]), mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(str(nvrtc[0]))
    options = (ctypes.c_char_p * len(NVRTC_OPTIONS))(*(option.encode() for option in NVRTC_OPTIONS))
    for name, source in module_sources().items():
        program = ctypes.c_void_p()
        lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), f"{name}.cu".encode(), 0, None, None)
        status = lib.nvrtcCompileProgram(program, len(NVRTC_OPTIONS), options)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(program, log)
        lib.nvrtcDestroyProgram(ctypes.byref(program))
        print(f"{'ok  ' if status == 0 else 'FAIL'} NVRTC ({nvrtc[0].name}) compiles the {name} module")
        if status != 0:
            print(log.value.decode(errors="replace"))
            failures.append(f"NVRTC, {name} module")


def checked_with(contraction):
    """Every check on the kernels built with `contraction`, in a process of
    its own: what it printed, and its failures."""
    # A worker may run both builds, and starts with the parent's failures:
    # only those this build adds are its own.
    before = len(failures)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), tempfile.TemporaryDirectory() as name:
        folder = pathlib.Path(name)
        check_all(build(folder, CONTRACTIONS[contraction]), folder)
    return printed.getvalue(), failures[before:]


def main():
    check_nvrtc()
    chosen = []
    for contraction, flags in CONTRACTIONS.items():
        if "-mfma" in flags and not has_fma():
            print(f"skipped the build with {contraction}: this processor has no FMA")
            continue
        chosen.append(contraction)
    # Each build's checks keep one core busy: the two run side by side. What
    # is printed so far goes out first, not once more from each worker.
    sys.stdout.flush()
    with multiprocessing.Pool(len(chosen)) as pool:
        for contraction, (printed, failed) in zip(chosen, pool.map(checked_with, chosen)):
            print(f"-- built with {contraction}")
            print(printed, end="")
            failures.extend(failed)
    if failures:
        sys.exit(f"{len(failures)} check(s) failed: {', '.join(failures)}")


if __name__ == "__main__":
    main()
