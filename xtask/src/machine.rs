//! What this machine offers a GPU build: CUDA devices, nvcc and the CUDA
//! libraries. It only looks: a missing driver or library is an answer, never
//! an error. `check-phase` asks it whether the GPU checks can run here, and
//! `doctor` reports all of it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The libraries a GPU build links, by the name the loader looks for; NCCL
/// only with the `nccl` feature.
pub const CUDA_LIBRARIES: [(&str, &str); 6] = [
    ("CUDA driver", "libcuda.so.1"),
    ("CUDA runtime", "libcudart.so"),
    ("cuBLAS", "libcublas.so"),
    ("cuBLASLt", "libcublasLt.so"),
    ("cuRAND", "libcurand.so"),
    ("NVRTC", "libnvrtc.so"),
];
/// NCCL by the exact name the linker wants: cudarc links `-lnccl`, which
/// NCCL's runtime package (`libnccl.so.2` alone) does not satisfy.
pub const NCCL_LIBRARY: (&str, &str) = ("NCCL", "libnccl.so");

/// The GPU build this machine can run, or `None` when a CUDA device, nvcc
/// or a CUDA library is missing.
pub fn gpu_build() -> Option<GpuBuild> {
    Machine::probe().gpu_build()
}

pub struct GpuBuild {
    /// `nccl`, or `cuda` where NCCL's library is missing.
    pub feature: &'static str,
    /// The CUDA devices this process's CUDA sees (`CUDA_VISIBLE_DEVICES` honoured).
    pub gpus: usize,
}

impl GpuBuild {
    /// Whether the multi-rank checks can run on GPUs: NCCL and a GPU per rank.
    pub fn multi_rank(&self) -> bool {
        self.feature == "nccl" && self.gpus >= 2
    }
}

/// What a GPU build needs of this machine, probed once.
pub struct Machine {
    /// The GPUs, or `None` when `nvidia-smi` cannot be run.
    pub gpus: Option<Gpus>,
    /// Where each of [`CUDA_LIBRARIES`] is, in that order.
    pub cuda_libraries: Vec<Option<PathBuf>>,
    /// NCCL under the name the linker wants.
    pub nccl: Option<PathBuf>,
    /// NCCL under a versioned name only, which runs a build but cannot link one.
    pub nccl_runtime: Option<PathBuf>,
    pub nvcc: Option<PathBuf>,
}

/// The GPUs `nvidia-smi -L` lists, and those of them CUDA shows this process.
pub struct Gpus {
    pub listed: usize,
    pub visible: Vec<String>,
}

impl Machine {
    pub fn probe() -> Self {
        let gpus = Command::new("nvidia-smi").arg("-L").output().ok().map(|out| {
            let text = String::from_utf8_lossy(&out.stdout);
            let listed: Vec<String> = text.lines().filter(|l| l.starts_with("GPU")).map(str::to_string).collect();
            let visible = visible_devices(&listed, std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref());
            Gpus { listed: listed.len(), visible }
        });
        let cache = Command::new("ldconfig").arg("-p").output().map(|out| out.stdout).unwrap_or_default();
        let cache = String::from_utf8_lossy(&cache);
        let nccl = find_library(NCCL_LIBRARY.1, &cache, Names::Exact);
        Self {
            gpus,
            cuda_libraries: CUDA_LIBRARIES
                .iter()
                .map(|(_, name)| find_library(name, &cache, Names::OrVersioned))
                .collect(),
            nccl_runtime: nccl.is_none().then(|| find_library(NCCL_LIBRARY.1, &cache, Names::OrVersioned)).flatten(),
            nccl,
            nvcc: find_on_path("nvcc"),
        }
    }

    pub fn has_gpu(&self) -> bool {
        self.gpus.as_ref().is_some_and(|gpus| !gpus.visible.is_empty())
    }

    pub fn gpu_build(&self) -> Option<GpuBuild> {
        if !self.gpu_missing().is_empty() {
            return None;
        }
        let feature = if self.nccl.is_some() { "nccl" } else { "cuda" };
        Some(GpuBuild { feature, gpus: self.gpus.as_ref().map_or(0, |gpus| gpus.visible.len()) })
    }

    /// What this machine lacks for a CUDA build that runs, in words.
    pub fn gpu_missing(&self) -> Vec<String> {
        let mut missing = Vec::new();
        if !self.has_gpu() {
            missing.push("no CUDA device visible".to_string());
        }
        if self.nvcc.is_none() {
            missing.push("no nvcc on the PATH (candle compiles its CUDA kernels with it)".to_string());
        }
        let absent = CUDA_LIBRARIES.iter().zip(&self.cuda_libraries).filter(|(_, found)| found.is_none());
        missing.extend(absent.map(|((_, name), _)| format!("no {name}")));
        missing
    }
}

/// Which files stand for a library `name`.
#[derive(Clone, Copy)]
enum Names {
    /// `name` itself, as the linker wants it (`-lnccl` needs `libnccl.so`).
    Exact,
    /// `name` or a versioned `name.N`, as the loader takes it at run time.
    OrVersioned,
}

/// Where library `name` is, under the `names` that count: in
/// `LD_LIBRARY_PATH`, then in the loader's `cache` (what `ldconfig -p` prints).
fn find_library(name: &str, cache: &str, names: Names) -> Option<PathBuf> {
    let dirs =
        std::env::var_os("LD_LIBRARY_PATH").map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).unwrap_or_default();
    let in_dir = |dir: &PathBuf| match names {
        Names::Exact => Some(dir.join(name)).filter(|p| p.is_file()),
        Names::OrVersioned => versioned(dir, name),
    };
    if let Some(found) = dirs.iter().find_map(in_dir) {
        return Some(found);
    }
    // The cache lists `libnccl.so.2 (libc6,x86-64) => /path`: a space ends the exact name.
    let listed = match names {
        Names::Exact => format!("{name} "),
        Names::OrVersioned => name.to_string(),
    };
    cache
        .lines()
        .filter(|line| line.trim_start().starts_with(&listed))
        .find_map(|line| line.rsplit("=> ").next().map(|p| PathBuf::from(p.trim())))
}

/// The GPUs of `listed` (`nvidia-smi -L`'s lines, in PCI order, which is
/// CUDA's with `CUDA_DEVICE_ORDER=PCI_BUS_ID`; the count holds either way) that CUDA
/// shows a process whose `CUDA_VISIBLE_DEVICES` is `visible`: all of them
/// when it is unset; else each entry in turn, an index or a UUID (or its
/// start), until the first that names no GPU, since CUDA ignores the rest.
fn visible_devices(listed: &[String], visible: Option<&str>) -> Vec<String> {
    let Some(visible) = visible else { return listed.to_vec() };
    let uuid = |line: &str| line.split("UUID: ").nth(1).map(|u| u.trim_end_matches(')').to_string());
    let mut shown: Vec<String> = vec![];
    for entry in visible.split(',').map(str::trim) {
        let found = match entry.parse::<usize>() {
            Ok(index) => listed.get(index),
            Err(_) if entry.len() >= 4 => listed.iter().find(|l| uuid(l).is_some_and(|u| u.starts_with(entry))),
            Err(_) => None,
        };
        match found {
            Some(gpu) if !shown.contains(gpu) => shown.push(gpu.clone()),
            _ => break,
        }
    }
    shown
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
    use super::{find_library, versioned, visible_devices, Names};

    fn listed() -> Vec<String> {
        (0..3)
            .map(|i| format!("GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i}a1b2c3d-0000-1111-2222-33334444555{i})"))
            .collect()
    }

    #[test]
    fn cuda_visible_devices_decides_which_gpus_count() {
        let gpus = listed();
        assert_eq!(visible_devices(&gpus, None), gpus, "unset: every GPU");
        assert!(visible_devices(&gpus, Some("")).is_empty(), "empty: none");
        assert_eq!(visible_devices(&gpus, Some("2,0")), [gpus[2].clone(), gpus[0].clone()], "in the order given");
        assert_eq!(visible_devices(&gpus, Some("1,7,0")), [gpus[1].clone()], "CUDA stops at the first bad entry");
        assert_eq!(visible_devices(&gpus, Some("GPU-2a1b")), [gpus[2].clone()], "a UUID's start names a GPU");
        assert_eq!(visible_devices(&gpus, Some("0,0")), [gpus[0].clone()], "a repeated GPU ends the list");
    }

    #[test]
    fn the_linker_wants_the_unversioned_nccl() {
        let cache = "\tlibnccl.so.2 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnccl.so.2\n";
        assert_eq!(find_library("libnccl.so", cache, Names::Exact), None, "libnccl.so.2 alone cannot link -lnccl");
        let cache = format!("{cache}\tlibnccl.so (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnccl.so\n");
        let exact = Some("/usr/lib/x86_64-linux-gnu/libnccl.so".into());
        assert_eq!(find_library("libnccl.so", &cache, Names::Exact), exact);
    }

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
