//! `doctor`: what this machine offers the workbook, and where each kind of
//! check runs on it. It only looks: a missing driver or library is a line of
//! the report, never an error.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::render::{bold, dim};

/// The libraries a GPU build links, by the name the loader looks for; NCCL
/// only with the `nccl` feature.
const CUDA_LIBRARIES: [(&str, &str); 6] = [
    ("CUDA driver", "libcuda.so.1"),
    ("CUDA runtime", "libcudart.so"),
    ("cuBLAS", "libcublas.so"),
    ("cuBLASLt", "libcublasLt.so"),
    ("cuRAND", "libcurand.so"),
    ("NVRTC", "libnvrtc.so"),
];
const NCCL_LIBRARY: (&str, &str) = ("NCCL", "libnccl.so");

pub fn doctor() -> anyhow::Result<bool> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let machine = Machine::probe();
    println!("{}", bold("This machine"));
    row("CPU cores", &format!("{cores} (with --nproc N, each rank gets {cores}/N kernel threads)"));
    match &machine.gpus {
        Some(list) if !list.is_empty() => row("CUDA devices", &list.join("; ")),
        Some(_) => row("CUDA devices", "none (nvidia-smi lists no GPU)"),
        None => row("CUDA devices", "none (no nvidia-smi)"),
    }
    let found = machine.cuda_libraries.iter().chain([&machine.nccl]);
    for ((what, name), found) in CUDA_LIBRARIES.iter().chain([&NCCL_LIBRARY]).zip(found) {
        let found = found.as_ref().map_or_else(|| "not found".to_string(), |p| p.display().to_string());
        row(&format!("{what} ({name})"), &found);
    }
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

/// The GPU build this machine can run, or `None` when a CUDA device, nvcc
/// or a CUDA library is missing.
pub fn gpu_build() -> Option<GpuBuild> {
    Machine::probe().gpu_build()
}

pub struct GpuBuild {
    /// `nccl`, or `cuda` where NCCL's library is missing.
    pub feature: &'static str,
    /// The CUDA devices `nvidia-smi` lists.
    pub gpus: usize,
}

impl GpuBuild {
    /// Whether the multi-rank checks can run on GPUs: NCCL and a GPU per rank.
    pub fn multi_rank(&self) -> bool {
        self.feature == "nccl" && self.gpus >= 2
    }
}

/// What `doctor` looks at, probed once.
struct Machine {
    /// The GPUs `nvidia-smi -L` lists, or `None` when it cannot be run.
    gpus: Option<Vec<String>>,
    /// Where each of [`CUDA_LIBRARIES`] is, in that order.
    cuda_libraries: Vec<Option<PathBuf>>,
    nccl: Option<PathBuf>,
    nvcc: Option<PathBuf>,
}

impl Machine {
    fn probe() -> Self {
        let gpus = Command::new("nvidia-smi").arg("-L").output().ok().map(|out| {
            let text = String::from_utf8_lossy(&out.stdout);
            text.lines().filter(|l| l.starts_with("GPU")).map(str::to_string).collect()
        });
        let cache = Command::new("ldconfig").arg("-p").output().map(|out| out.stdout).unwrap_or_default();
        let cache = String::from_utf8_lossy(&cache);
        Self {
            gpus,
            cuda_libraries: CUDA_LIBRARIES.iter().map(|(_, name)| find_library(name, &cache)).collect(),
            nccl: find_library(NCCL_LIBRARY.1, &cache),
            nvcc: find_on_path("nvcc"),
        }
    }

    fn has_gpu(&self) -> bool {
        self.gpus.as_ref().is_some_and(|gpus| !gpus.is_empty())
    }

    fn gpu_build(&self) -> Option<GpuBuild> {
        if !self.gpu_missing().is_empty() {
            return None;
        }
        let feature = if self.nccl.is_some() { "nccl" } else { "cuda" };
        Some(GpuBuild { feature, gpus: self.gpus.as_ref().map_or(0, Vec::len) })
    }

    /// What this machine lacks for a CUDA build that runs, in words.
    fn gpu_missing(&self) -> Vec<String> {
        let mut missing = Vec::new();
        if !self.has_gpu() {
            missing.push("no CUDA device".to_string());
        }
        if self.nvcc.is_none() {
            missing.push("no nvcc on the PATH (candle compiles its CUDA kernels with it)".to_string());
        }
        let absent = CUDA_LIBRARIES.iter().zip(&self.cuda_libraries).filter(|(_, found)| found.is_none());
        missing.extend(absent.map(|((_, name), _)| format!("no {name}")));
        missing
    }
}

fn row(label: &str, value: &str) {
    println!("  {label:<28} {}", dim(value));
}

/// Where the dynamic loader would find `name` (or a versioned `name.N`):
/// `LD_LIBRARY_PATH`, then the loader's `cache` (what `ldconfig -p` prints).
fn find_library(name: &str, cache: &str) -> Option<PathBuf> {
    let dirs =
        std::env::var_os("LD_LIBRARY_PATH").map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).unwrap_or_default();
    if let Some(found) = dirs.iter().find_map(|dir| versioned(dir, name)) {
        return Some(found);
    }
    cache
        .lines()
        .filter(|line| line.trim_start().starts_with(name))
        .find_map(|line| line.rsplit("=> ").next().map(|p| PathBuf::from(p.trim())))
}

/// `dir/name`, or the first `dir/name.*` there.
fn versioned(dir: &Path, name: &str) -> Option<PathBuf> {
    let exact = dir.join(name);
    if exact.is_file() {
        return Some(exact);
    }
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().and_then(|f| f.to_str()).is_some_and(|f| f.starts_with(&format!("{name}."))))
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(program)).find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::versioned;

    #[test]
    fn a_library_is_found_under_its_name_or_a_versioned_one() {
        let dir = std::env::temp_dir().join(format!("doctor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("libnccl.so.2"), b"").unwrap();
        assert_eq!(versioned(&dir, "libnccl.so"), Some(dir.join("libnccl.so.2")));
        assert_eq!(versioned(&dir, "libcudart.so"), None, "nothing of that name is there");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
