//! `doctor`: what this machine offers the workbook (xtask's `machine` probe),
//! and where each kind of check runs on it. It only looks: a missing driver
//! or library is a line of the report, never an error.

use xtask::machine::{Machine, CUDA_LIBRARIES, NCCL_LIBRARY};
use xtask::render::{bold, dim};

pub fn doctor() -> anyhow::Result<bool> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let machine = Machine::probe();
    println!("{}", bold("This machine"));
    row("CPU cores", &format!("{cores} (with --nproc N, each rank gets {cores}/N kernel threads)"));
    let hidden = |listed: usize| match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(visible) => format!(" (CUDA_VISIBLE_DEVICES={visible:?} shows CUDA these of the {listed} nvidia-smi lists)"),
        Err(_) => String::new(),
    };
    match &machine.gpus {
        Some(gpus) if !gpus.visible.is_empty() => {
            row("CUDA devices", &format!("{}{}", gpus.visible.join("; "), hidden(gpus.listed)))
        }
        Some(gpus) if gpus.listed > 0 => row("CUDA devices", &format!("none{}", hidden(gpus.listed))),
        Some(_) => row("CUDA devices", "none (nvidia-smi lists no GPU)"),
        None => row("CUDA devices", "none (no nvidia-smi)"),
    }
    for ((what, name), found) in CUDA_LIBRARIES.iter().zip(&machine.cuda_libraries) {
        let found = found.as_ref().map_or_else(|| "not found".to_string(), |p| p.display().to_string());
        row(&format!("{what} ({name})"), &found);
    }
    let nccl = match (&machine.nccl, &machine.nccl_runtime) {
        (Some(path), _) => path.display().to_string(),
        (None, Some(runtime)) => format!(
            "only {}: a build with --features nccl links {}; install NCCL's development package (libnccl-dev), \
             or link {} to it",
            runtime.display(),
            NCCL_LIBRARY.1,
            NCCL_LIBRARY.1
        ),
        (None, None) => "not found".to_string(),
    };
    row(&format!("{} ({})", NCCL_LIBRARY.0, NCCL_LIBRARY.1), &nccl);
    let nvcc = machine.nvcc.as_ref();
    row(
        "nvcc",
        &nvcc.map_or_else(|| "not found (the cuda feature needs it to build)".to_string(), |p| p.display().to_string()),
    );
    println!();
    println!("{}", bold("Where the checks run"));
    row("exercise tests", "this machine's CPU");
    let on_cpu =
        "CPU ranks: threads in the graded tests, one process per rank in the process tests and `cargo train --nproc N`";
    let build = machine.gpu_build();
    match &build {
        Some(build) if build.multi_rank() => row(
            "multi-rank checks",
            &format!(
                "{on_cpu}; `check-phase 2|3` also on {} GPUs, one process each over NCCL (`gpu_ranks::`)",
                build.gpus
            ),
        ),
        _ => row("multi-rank checks", on_cpu),
    }
    let gpu = match (build.map(|build| build.feature), machine.has_gpu()) {
        (Some(feature), _) => {
            let ranks =
                if feature == "nccl" { "NCCL, one GPU per rank" } else { "over TCP: NCCL's library is missing" };
            format!(
                "`check-phase` also builds with --features {feature} and runs the GPU checks (`gpu::`) on GPU 0; \
                 train on GPUs with `cargo run --release -p trainer --features {feature} --bin train -- --device cuda` \
                 (--nproc N: {ranks})"
            )
        }
        (None, true) => format!("not used: {}", machine.gpu_missing().join(", ")),
        (None, false) => "none here; train and the GPU checks run on CUDA devices with the CUDA toolkit".to_string(),
    };
    row("GPUs", &gpu);
    Ok(true)
}

fn row(label: &str, value: &str) {
    println!("  {label:<28} {}", dim(value));
}
