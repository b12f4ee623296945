"""Bus bandwidth of PyTorch's gloo all-reduce on CPU processes, beside the workbook's
`allreduce` program: the same payloads, the same definition as nccl-tests
(algbw = bytes / time, busbw = algbw * 2(N-1)/N).

Run: python -m torch.distributed.run --nproc_per_node 2 benchmarks/allreduce_gloo.py
Prints one JSON line per size from rank 0. Needs: pip install torch. Not a CI dependency.
"""

import argparse
import json
import time

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes-mb", default="1,4,16,64,256")
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    n = dist.get_world_size()
    for mb in (int(s) for s in args.sizes_mb.split(",")):
        size = mb * 1_000_000
        t = torch.ones(size // 4, dtype=torch.float32)
        dist.all_reduce(t)  # warm-up
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(t)
        seconds = (time.perf_counter() - start) / args.iters
        algbw = size / seconds / 1e9
        if dist.get_rank() == 0:
            print(json.dumps({"bytes": size, "seconds": seconds, "algbw_gbs": algbw, "busbw_gbs": algbw * 2 * (n - 1) / n}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
