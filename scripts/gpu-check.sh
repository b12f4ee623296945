#!/usr/bin/env bash
# Every GPU check and benchmark of the workbook, in two halves, for a
# maintainer who has one NVIDIA GPU for a few minutes and no Rust toolchain
# on it (the binaries travel; the toolchain, its crates and the build stay).
#
#   scripts/gpu-check.sh build   on any x86-64 Linux machine with the Rust
#                                toolchain: fetches CUDA 13.0's compiler and
#                                libraries from PyPI into target/gpu-toolkit,
#                                builds the GPU binaries with the real nvcc
#                                and packs them, stripped, into
#                                target/gpu-check.tar.xz (about 25 MiB: candle's
#                                PTX kernels make each binary 60 MB, and text
#                                packs well), to copy to the GPU machine.
#   scripts/gpu-check.sh run     on the GPU machine, in a copy of the repo
#                                holding target/gpu-check.tar.xz: the single-GPU
#                                checks and the one-rank NCCL group, the
#                                multi-GPU checks (they skip on one GPU), 60
#                                steps of training on the GPU (f32 and bf16
#                                autocast) against the CPU's loss, with
#                                --ddp-overlap, on two TCP ranks sharing the
#                                GPU, FSDP x TP x PP, ZeRO-2 x TP and HSDP x PP
#                                on TCP ranks sharing the GPU, every
#                                data-parallel axis x TP x PP against one
#                                process on the GPU ($OUT/matrix-gpu.md), a
#                                traced FSDP run with --prefetch, the
#                                trainer's tokens/s (and candle's composed
#                                ops') beside PyTorch's on the same GPU in
#                                f32, TF32 and bf16 autocast, and
#                                the GPU time of a step by kernel (Nsight
#                                Compute); writes $OUT/gpu-report.md (or
#                                ./gpu-report.md). `run REGEX` runs only the
#                                steps whose heading matches REGEX (bash's
#                                =~), for a rerun that must be short.
#
# The GPU machine needs the NVIDIA driver, python3 with PyTorch, CUDA's
# libraries (cuBLAS, cuRAND, NVRTC, NCCL), as PyTorch's pip wheels bring, and
# Nsight Compute's `ncu` for the profile.
# `run` takes about seven minutes on an H200; the first `build` about twenty
# on two cores (candle's CUDA kernels), later ones a few.
set -euo pipefail
cd "$(dirname "$0")/.."

TOOLKIT=target/gpu-toolkit
CHECK=target/gpu-check
PACKED=$CHECK.tar.xz
# CUDA 13.0 and NCCL 2.28, as the H100 and H200 machines this ran on have.
WHEELS=(
    nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88
    nvidia-cuda-runtime==13.0.96 nvidia-cuda-nvrtc==13.0.88 nvidia-cublas==13.0.2.14
    nvidia-curand==10.4.0.35 nvidia-nccl-cu13==2.28.9 nvidia-cuda-cccl==13.0.85
)

build() {
    local cuda="$PWD/$TOOLKIT/nvidia/cu13" link="$PWD/$TOOLKIT/link"
    if [ ! -x "$cuda/bin/nvcc" ]; then
        mkdir -p "$TOOLKIT/wheels"
        python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$TOOLKIT/wheels" "${WHEELS[@]}"
        for wheel in "$TOOLKIT"/wheels/*.whl; do
            python3 -m zipfile -e "$wheel" "$TOOLKIT"
        done
        chmod +x "$cuda"/bin/* "$cuda"/nvvm/bin/*
    fi
    # The linker wants unversioned names (cudarc links -lcublas, -lnccl, ...).
    mkdir -p "$link"
    for lib in "$cuda"/lib/lib*.so.* "$PWD/$TOOLKIT"/nvidia/nccl/lib/libnccl.so.*; do
        ln -sfn "$lib" "$link/$(basename "$lib" | sed 's/\.so\..*/.so/')"
    done
    cuda_stub "$link"
    export PATH="$cuda/bin:$PATH" CUDA_HOME="$cuda" CUDA_COMPUTE_CAP=90 LIBRARY_PATH="$link"
    # Both packages name their GPU and reference features alike.
    local target=(--target-dir target/gpu --features nccl,solutions)
    cargo build --release --quiet -p trainer "${target[@]}" --bin train --bin bench --bin matrix
    local graded
    # The checks in release too: they share every crate with the trainer, where a
    # test-profile build would compile candle's CUDA kernels a second time.
    graded=$(cargo test --release --quiet "${target[@]}" --test graded --no-run --message-format=json |
        python3 -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable") and "graded" in m["executable"]][-1])')
    rm -rf "$CHECK" && mkdir -p "$CHECK"
    cp target/gpu/release/{train,bench,matrix} "$graded" "$CHECK/"
    mv "$CHECK/$(basename "$graded")" "$CHECK/graded"
    strip "$CHECK"/{train,bench,matrix,graded}
    # NVRTC compiles the bf16 kernels only with CUDA's cuda_bf16.h on an include
    # path, and a machine with CUDA's libraries may lack their headers: the
    # toolkit's travel too, for `run` to point CUDA_HOME at.
    mkdir -p "$CHECK/cuda" && cp -r "$cuda/include" "$CHECK/cuda/"
    echo "$PWD" >"$CHECK/built-in"
    # Python's tarfile packs and unpacks on both machines, whatever else they lack.
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "w:xz", preset=6).add(sys.argv[2], "gpu-check")' \
        "$PACKED" "$CHECK"
    du -h "$PACKED"
    echo "carry $PACKED to the GPU machine and run: scripts/gpu-check.sh run"
}

# libcuda.so comes with the driver, which a build machine lacks: a stub that
# exports every driver function cudarc declares lets the linker resolve them;
# at run time the driver's own libcuda.so.1 is loaded in its place.
cuda_stub() {
    local link=$1 sys
    sys=$(ls -d "$HOME"/.cargo/registry/src/*/cudarc-0.19.*/src/driver/sys | tail -1)
    grep -hoE '^ +fn cu[A-Za-z0-9_]+' "$sys"/*.rs | sed 's/^ *fn //' | sort -u |
        sed 's/.*/void &(void) {}/' >"$link/cuda_stub.c"
    cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$link/libcuda.so" "$link/cuda_stub.c"
}

run() {
    local out=${OUT:-.} built
    if [ ! -x "$CHECK/graded" ]; then
        python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$PACKED" target
    fi
    built=$(cat "$CHECK/built-in")
    # The test binary reads its fixtures where it was built.
    if [ "$built" != "$PWD" ] && [ ! -e "$built" ]; then
        mkdir -p "$(dirname "$built")" && ln -s "$PWD" "$built"
    fi
    # CUDA's headers for NVRTC (the bf16 kernels), unless the machine names its own.
    export CUDA_HOME="${CUDA_HOME:-$PWD/$CHECK/cuda}"
    # CUDA's libraries, where PyTorch's wheels put them.
    local nvidia
    nvidia=$(python3 -c 'import nvidia; print(next(iter(nvidia.__path__)))' 2>/dev/null || true)
    if [ -n "$nvidia" ]; then
        export LD_LIBRARY_PATH="$(ls -d "$nvidia"/*/lib | tr '\n' ':')${LD_LIBRARY_PATH:-}"
    fi
    local report="$out/gpu-report.md"
    {
        echo "# GPU checks, $(date -u +%Y-%m-%d)"
        echo
        echo '```text'
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no nvidia-smi"
        python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' ||
            echo "no PyTorch with CUDA"
        echo '```'
    } >"$report"
    # The workbook's ops on the GPU are the default; the first 124M row measures candle's
    # composed ops instead, for the gain.
    local composed=(env WORKBOOK_CUDA_KERNELS=composed)
    section "Single-GPU checks, the one-rank NCCL group, the multi-GPU checks (skip on one GPU)" \
        "$CHECK/graded" gpu:: gpu_ranks:: watchdog:: --test-threads 1
    local steps=(--model-size tiny --dataset dummy --max-steps 60 --warmup-steps 5 --log-every 60)
    section "60 steps of the tiny config on the GPU" "$CHECK/train" "${steps[@]}" \
        --device cuda --checkpoint-dir /tmp/gpu-check-cuda --overwrite
    section "The same 60 steps on the GPU with bf16 autocast" "$CHECK/train" "${steps[@]}" \
        --device cuda --autocast-bf16 --checkpoint-dir /tmp/gpu-check-bf16 --overwrite
    section "The same 60 steps on the CPU" "$CHECK/train" "${steps[@]}" --checkpoint-dir /tmp/gpu-check-cpu --overwrite
    # Backward on a thread of its own, queuing on the one compute stream, and
    # the buckets all-reduced on NCCL's stream meanwhile (one rank: the
    # ordering runs, the sum is the identity).
    local overlap=(--ddp-overlap --bucket-cap-mb 0.5)
    section "The same 60 steps on the GPU with --ddp-overlap, one NCCL rank" "$CHECK/train" "${steps[@]}" \
        --device cuda "${overlap[@]}" --checkpoint-dir /tmp/gpu-check-overlap --overwrite
    # Two ranks on one GPU: only the TCP backend allows it (NCCL refuses).
    local shared=(--device cuda --backend tcp --nproc 2)
    section "The same 60 steps on two TCP ranks sharing the GPU" "$CHECK/train" "${steps[@]}" "${shared[@]}" \
        --checkpoint-dir /tmp/gpu-check-tcp --overwrite
    section "The same 60 steps on two TCP ranks sharing the GPU, --ddp-overlap" "$CHECK/train" "${steps[@]}" \
        "${shared[@]}" "${overlap[@]}" --checkpoint-dir /tmp/gpu-check-tcp-overlap --overwrite
    # The one model and step on a mesh: the data-parallel axis after tensor and
    # pipeline parallelism, the ranks sharing the GPU over TCP. A minute and a
    # half each at most, so that a hang leaves the benchmarks their time.
    local sp=(--tp 2 --sequence-parallel) on4=(--device cuda --backend tcp --nproc 4)
    local on8=(--device cuda --backend tcp --nproc 8)
    section "The same 60 steps as FSDP x TP 2 (SP) x PP 2 on eight TCP ranks sharing the GPU" timeout 90 "$CHECK/train" \
        "${steps[@]}" "${on8[@]}" --strategy fsdp "${sp[@]}" --pp 2 --checkpoint-dir /tmp/gpu-check-mesh --overwrite
    section "The same 60 steps as ZeRO-2 x TP 2 (SP) on four TCP ranks sharing the GPU" timeout 90 "$CHECK/train" \
        "${steps[@]}" "${on4[@]}" --strategy zero2 "${sp[@]}" --checkpoint-dir /tmp/gpu-check-zero2 --overwrite
    section "The same 60 steps as HSDP (2 x 2) x PP 2 on eight TCP ranks sharing the GPU" timeout 90 "$CHECK/train" \
        "${steps[@]}" "${on8[@]}" --strategy fsdp --sharding hybrid_shard --hybrid-group-size 2 --pp 2 \
        --checkpoint-dir /tmp/gpu-check-hsdp --overwrite
    # Every data-parallel axis on every mesh of tp {1, 2} x pp {1, 2}, against one
    # process on the GPU: the whole table comes back as matrix-gpu.md.
    limit=300 section "Every data-parallel axis x TP x PP on the GPU against one process on it (matrix --device cuda)" \
        bash -c '"$1" --device cuda >"$2"' matrix "$CHECK/matrix" "$out/matrix-gpu.md"
    # Each unit's all-gather started on NCCL's stream while the unit before computes.
    section "FULL_SHARD on one NCCL rank with --prefetch, 2 steps, traced" "$CHECK/train" --model-size tiny \
        --dataset dummy --max-steps 2 --device cuda --strategy fsdp --prefetch --trace \
        --checkpoint-dir /tmp/gpu-check-prefetch --overwrite
    cp /tmp/gpu-check-prefetch/trace.json "$out/fsdp-prefetch-gpu.trace.json" 2>/dev/null || true
    # The GPU's dense peaks (datasheets) in f32 without tensor cores, TF32 and bf16, for the MFU.
    local f32=() tf32=() bf16=()
    case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
        *H100*PCIe*) f32=(--peak-tflops 51) tf32=(--peak-tflops 378) bf16=(--peak-tflops 756) ;;
        *H100* | *H200*) f32=(--peak-tflops 67) tf32=(--peak-tflops 495) bf16=(--peak-tflops 989) ;;
    esac
    local shape=(--steps 4 --warmup 1)
    local small=("$CHECK/bench" --model-size small "${shape[@]}" --device cuda --ranks threads)
    local torch_small=(python3 benchmarks/pytorch_baseline.py --config configs/small.toml "${shape[@]}" --device cuda)
    section "Trainer, GPT-2 124M shape, T 1024, f32: candle's composed ops" "${composed[@]}" "${small[@]}" "${f32[@]}"
    section "Trainer, same, f32: the workbook's ops" "${small[@]}" "${f32[@]}"
    section "PyTorch, same shape, f32" "${torch_small[@]}"
    section "Trainer, same, TF32" "${small[@]}" --tf32 "${tf32[@]}"
    section "PyTorch, same shape, TF32" "${torch_small[@]}" --tf32
    section "Trainer, same, bf16 autocast" "${small[@]}" --autocast-bf16 "${bf16[@]}"
    section "PyTorch, same shape, bf16 autocast" "${torch_small[@]}" --autocast-bf16
    section "Trainer, tiny config, f32" "$CHECK/bench" --model-size tiny --steps 30 \
        --device cuda --ranks threads "${f32[@]}"
    section "PyTorch, tiny config, f32" python3 benchmarks/pytorch_baseline.py --config configs/tiny.toml \
        --steps 30 --device cuda
    # Two optimizer steps of one micro-batch (8 x 1024 tokens) under Nsight Compute.
    local profiled=(--bench "$CHECK/bench" --steps 2 -- --model-size small --steps 1 --warmup 1 --batch-size 8
        --grad-accum 1 --device cuda --ranks threads)
    section "GPU time by kernel, 124M shape, one micro-batch, f32" \
        timeout 120 python3 benchmarks/gpu_profile.py "${profiled[@]}"
    echo "report: $report"
}

# Runs a command, appending its heading, its output's end and its exit
# status to the report; a failing step does not stop the others, and one that
# hangs (a GPU fault, a rank waiting forever) is stopped after three minutes
# (exit 124; `limit=SECONDS section ...` gives a step longer) so that the
# steps after it still run within the machine's time.
section() {
    local heading=$1 status=0
    shift
    if [ -n "$only" ] && ! [[ $heading =~ $only ]]; then
        return
    fi
    echo "== $heading"
    local log
    log=$(mktemp)
    timeout "${limit:-180}" "$@" >"$log" 2>&1 || status=$?
    tail -n 60 "$log"
    {
        echo
        echo "## $heading"
        echo
        echo "\`$*\` (exit $status)"
        echo
        echo '```text'
        tail -n 60 "$log"
        echo '```'
    } >>"$report"
}

only=${2:-}
case "${1:-}" in
build) build ;;
run) run ;;
*)
    echo "usage: scripts/gpu-check.sh build | run [regex] (see the top of this file)" >&2
    exit 2
    ;;
esac
