"""PyTorch baseline for `cargo xtask bench`: the workbook's training step, in PyTorch on the CPU (or one GPU).

Trains the same Llama-style GPT (RMSNorm, RoPE, SwiGLU, causal attention,
untied head) as the workbook, with the same config file, batch, AdamW
parameter groups, gradient clipping and learning rate, on random tokens, and
prints one JSON line: {"tokens_per_s": ..., "steps": ..., "threads": ...}.

Run: python benchmarks/pytorch_baseline.py --config configs/tiny.toml --threads 2
DDP on the gloo backend, each rank a process started by torchrun:
     python -m torch.distributed.run --nproc_per_node 2 benchmarks/pytorch_baseline.py --threads 1
(the global batch is split across the ranks, as the workbook splits it; rank 0 prints).
On a GPU, beside the workbook's `train --device cuda`:
     python benchmarks/pytorch_baseline.py --device cuda --config configs/small.toml
(f32 weights and matrix products, no TF32, as the workbook computes them on CUDA).
Needs: pip install torch (CPU wheels are fine). It is not a CI dependency;
`cargo xtask bench` runs it when `python3` can import torch (or the
interpreter named by WORKBOOK_PYTHON).
"""

import argparse
import contextlib
import json
import math
import os
import sys
import time
import tomllib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

VOCAB = {"bytes": 257, "gpt2": 50257}


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Block(nn.Module):
    def __init__(self, c, heads, inter, eps):
        super().__init__()
        self.heads = heads
        self.input_layernorm = RMSNorm(c, eps)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(c, c, bias=False) for _ in range(4))
        self.post_attention_layernorm = RMSNorm(c, eps)
        self.gate_proj = nn.Linear(c, inter, bias=False)
        self.up_proj = nn.Linear(c, inter, bias=False)
        self.down_proj = nn.Linear(inter, c, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, c = x.shape
        h = self.input_layernorm(x)
        split = lambda y: y.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        q, k, v = split(self.q_proj(h)), split(self.k_proj(h)), split(self.v_proj(h))
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + mask
        y = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.o_proj(y)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Gpt(nn.Module):
    def __init__(self, vocab, m):
        super().__init__()
        c = m["hidden_size"]
        self.embed_tokens = nn.Embedding(vocab, c)
        self.layers = nn.ModuleList(
            Block(c, m["num_heads"], m["intermediate_size"], m["norm_eps"]) for _ in range(m["num_layers"])
        )
        self.norm = RMSNorm(c, m["norm_eps"])
        self.lm_head = nn.Linear(c, vocab, bias=False)
        d = c // m["num_heads"]
        inv_freq = 1.0 / m["rope_theta"] ** (torch.arange(0, d, 2).float() / d)
        angles = torch.outer(torch.arange(m["max_seq_len"]).float(), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        mask = torch.full((t, t), float("-inf"), device=idx.device).triu(1)
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x, self.cos[:t], self.sin[:t], mask)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))


def synchronize(device):
    """Waits for the GPU's queued kernels, so that the clock measures them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="configs/tiny.toml")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--seq-len", type=int, help="default: the config's")
    parser.add_argument("--batch-size", type=int, help="sequences per step over all ranks; default: the config's")
    parser.add_argument("--grad-accum", type=int, help="micro-batches per step; default: the config's")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda for one GPU")
    parser.add_argument("--tf32", action="store_true", help="f32 matrix products in TF32 on the GPU, as bench --tf32")
    parser.add_argument("--autocast-bf16", action="store_true",
                        help="forward under torch.autocast(dtype=torch.bfloat16) on the GPU, as bench --autocast-bf16")
    parser.add_argument("--profile", action="store_true",
                        help="print the timed steps' ops by self CPU time (torch.profiler) to stderr")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with open(args.config, "rb") as f:
        cfg = tomllib.load(f)
    cfg["seq_len"] = args.seq_len or cfg["seq_len"]
    cfg["batch_size"] = args.batch_size or cfg["batch_size"]
    cfg["grad_accum_steps"] = args.grad_accum or cfg["grad_accum_steps"]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    vocab, o = VOCAB[cfg["tokenizer"]], cfg["optimizer"]
    model = Gpt(vocab, cfg["model"]).to(device)
    params = list(model.parameters())
    # The model has no buffers: nothing to broadcast before every forward.
    step_model = nn.parallel.DistributedDataParallel(model, broadcast_buffers=False) if world > 1 else model
    opt = torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": o["weight_decay"]},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"],
    )
    b, t, k = cfg["batch_size"], cfg["seq_len"], cfg["grad_accum_steps"]

    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if args.autocast_bf16 else contextlib.nullcontext()

    def loss_of(idx):
        with autocast:
            return step_model(idx) / k

    def optimizer_step():
        for micro in range(k):
            idx = torch.randint(0, vocab, (b // world, t), device=device)
            if world > 1 and micro < k - 1:
                with step_model.no_sync():  # all-reduce once per step, as the workbook does
                    loss_of(idx).backward()
            else:
                loss_of(idx).backward()
        torch.nn.utils.clip_grad_norm_(params, o["max_grad_norm"])
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        optimizer_step()
    synchronize(device)
    activities = [torch.profiler.ProfilerActivity.CPU]
    profiler = torch.profiler.profile(activities=activities) if args.profile else contextlib.nullcontext()
    with profiler:
        start = time.perf_counter()
        for _ in range(args.steps):
            optimizer_step()
        synchronize(device)
        seconds = time.perf_counter() - start
    if args.profile:
        table = profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
        print(table, file=sys.stderr)
    if world > 1:
        dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        tokens_per_s = args.steps * b * t * k / seconds
        print(json.dumps({"tokens_per_s": tokens_per_s, "steps": args.steps, "threads": args.threads * world}))


if __name__ == "__main__":
    main()
