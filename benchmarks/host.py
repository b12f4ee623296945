"""The machine a benchmark ran on, as one JSON line: torch's version, whether
it was built with MKL, and a GEMM calibration (a 1024 x 1024 f32 matrix
product, in GFLOP/s, on 1 and 2 threads), so that runs on different machines
can be compared.

Run: python benchmarks/host.py
"""

import json
import time

import torch


def gflops(threads, n=1024, repeats=20):
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e9


print(json.dumps({
    "torch": torch.__version__,
    "mkl": torch.backends.mkl.is_available(),
    "gflops_1": gflops(1),
    "gflops_2": gflops(2),
}))
