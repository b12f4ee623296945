//! Where a rank computes (the CPU or one GPU) and which backend carries its
//! collectives: PyTorch's `torch.cuda.set_device(local_rank)` and the
//! `backend=` of `init_process_group`.

use anyhow::{anyhow, bail, Result};
use candle_core::Device;
use clap::ValueEnum;
use workbook::distributed::{DistEnv, ProcessGroup, TcpProcessGroup};

/// The flags `train` and `bench` share: where ranks compute, what connects them.
#[derive(clap::Args, Debug, Clone)]
pub struct ComputeArgs {
    /// cpu, or cuda: one GPU per rank, GPU LOCAL_RANK of its machine (a build with --features cuda).
    #[arg(long, value_enum, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
    /// What carries the collectives between processes: tcp (any device), or nccl
    /// (GPUs, one per rank). Default: nccl with --device cuda in a build with NCCL, else tcp.
    #[arg(long, value_enum)]
    backend: Option<Backend>,
    /// With --device cuda: f32 matrix products on the tensor cores in TF32
    /// (inputs rounded to 10 bits of mantissa, sums in f32), as PyTorch's
    /// `torch.backends.cuda.matmul.allow_tf32 = True`. Off by default, as in PyTorch.
    #[arg(long)]
    pub tf32: bool,
    /// With --device cuda: the model's projections and head multiply in bf16,
    /// the rest stays f32 (PyTorch's `torch.autocast(dtype=torch.bfloat16)`;
    /// the weights stay f32 masters). Nothing to do under FSDP's --precision
    /// bf16, whose weights are already bf16.
    #[arg(long = "autocast-bf16")]
    pub autocast_bf16: bool,
}

impl ComputeArgs {
    /// Sets this process's precision of f32 matrix products on the GPU (TF32
    /// or not), and checks that autocast has a GPU to run on; each rank's
    /// thread turns autocast on for itself (`RunOptions::autocast_bf16`).
    pub fn set_matmul_precision(&self) -> Result<()> {
        if self.tf32 && self.device != DeviceKind::Cuda {
            bail!("--tf32 changes how GPUs multiply f32 matrices: add --device cuda, or leave it out on the CPU");
        }
        if self.autocast_bf16 && self.device != DeviceKind::Cuda {
            bail!("--autocast-bf16 is for GPUs, whose tensor cores multiply bf16 fast: add --device cuda");
        }
        candle_core::cuda::set_gemm_reduced_precision_f32(self.tf32);
        Ok(())
    }

    /// The backend asked for, or the device's default.
    pub fn backend(&self) -> Backend {
        self.backend.unwrap_or(Backend::default_for(self.device))
    }
}

/// What a build without the `nccl` feature answers when NCCL is asked of it.
const NO_NCCL: &str =
    "this build has no NCCL: rebuild with `--features nccl` (it needs CUDA's nvcc), or use --backend tcp";

/// What a rank computes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeviceKind {
    Cpu,
    /// One NVIDIA GPU per rank, picked by `LOCAL_RANK` (needs a build with `--features cuda`).
    Cuda,
}

/// What carries the collectives between ranks that are processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The workbook's TCP rings (Gloo's role): any device; GPU tensors pass through the host.
    Tcp,
    /// NVIDIA's NCCL, GPU to GPU: one GPU per rank (needs a build with `--features nccl`).
    Nccl,
}

impl Backend {
    /// PyTorch's choice: NCCL for GPUs when it is built in, the TCP rings otherwise.
    pub fn default_for(device: DeviceKind) -> Self {
        match device {
            DeviceKind::Cuda if cfg!(feature = "nccl") => Self::Nccl,
            _ => Self::Tcp,
        }
    }

    /// Refuses a backend that cannot serve `device`.
    pub fn check(self, device: DeviceKind) -> Result<()> {
        if self == Self::Nccl && device != DeviceKind::Cuda {
            bail!("--backend nccl moves tensors between GPUs: add --device cuda, or use --backend tcp on the CPU");
        }
        if self == Self::Nccl && !cfg!(feature = "nccl") {
            bail!("{NO_NCCL}");
        }
        Ok(())
    }
}

/// The device of the rank with `local_rank` on its machine. NCCL drives
/// exactly one GPU per rank; the TCP backend lets ranks share GPUs in turn
/// (rank `r` takes GPU `r mod count`), so two ranks can train on one GPU.
pub fn rank_device(kind: DeviceKind, local_rank: usize, backend: Backend) -> Result<Device> {
    if kind == DeviceKind::Cpu {
        return Ok(Device::Cpu);
    }
    let count = cuda_device_count()?;
    if count == 0 {
        bail!("--device cuda: no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)");
    }
    let ordinal = match backend {
        Backend::Nccl if local_rank >= count => bail!(
            "NCCL drives one GPU per rank, but the rank with LOCAL_RANK {local_rank} finds only {count} GPU(s) on \
             its machine: run at most {count} rank(s) per node, or share the GPUs with --backend tcp"
        ),
        Backend::Nccl => local_rank,
        Backend::Tcp => local_rank % count,
    };
    workbook::gpu::open(ordinal).map_err(|e| anyhow!("opening GPU {ordinal}: {e}"))
}

/// Joins the job this process was started in, over `backend`, with this
/// rank's `device`.
pub fn join(env: &DistEnv, backend: Backend, device: &Device) -> Result<Box<dyn ProcessGroup>> {
    let joining = |e: candle_core::Error| anyhow!("rank {} joining the job: {e}", env.rank);
    match backend {
        Backend::Tcp => Ok(Box::new(TcpProcessGroup::init(&env.rendezvous()).map_err(joining)?)),
        Backend::Nccl => join_nccl(env, device).map_err(joining),
    }
}

#[cfg(feature = "nccl")]
fn join_nccl(env: &DistEnv, device: &Device) -> candle_core::Result<Box<dyn ProcessGroup>> {
    let group = workbook::distributed::NcclProcessGroup::init(&env.nccl_rendezvous(), device.as_cuda_device()?)?;
    Ok(Box::new(group))
}

#[cfg(not(feature = "nccl"))]
fn join_nccl(_: &DistEnv, _: &Device) -> candle_core::Result<Box<dyn ProcessGroup>> {
    candle_core::bail!("{NO_NCCL}")
}

/// How many CUDA devices this process sees.
#[cfg(feature = "cuda")]
fn cuda_device_count() -> Result<usize> {
    use candle_core::cuda_backend::cudarc::driver::CudaContext;
    let count = CudaContext::device_count().map_err(|e| anyhow!("asking the CUDA driver for its devices: {e:?}"))?;
    Ok(count.max(0) as usize)
}

#[cfg(not(feature = "cuda"))]
fn cuda_device_count() -> Result<usize> {
    bail!(
        "--device cuda: this build has no CUDA; rebuild with `--features cuda` (or `nccl` for NCCL too), which \
         needs CUDA's nvcc (see the guide's chapter on launching)"
    )
}

/// The memory in use on `device`'s GPU (by every process on it, as
/// nvidia-smi counts it) and its total, in MiB; `None` on the CPU.
#[cfg(feature = "cuda")]
pub fn gpu_memory_mib(device: &Device) -> Option<(f64, f64)> {
    let Device::Cuda(gpu) = device else { return None };
    let (free, total) = gpu.cuda_stream().context().mem_get_info().ok()?;
    let mib = |bytes: usize| bytes as f64 / (1 << 20) as f64;
    Some((mib(total - free), mib(total)))
}

#[cfg(not(feature = "cuda"))]
pub fn gpu_memory_mib(_: &Device) -> Option<(f64, f64)> {
    None
}
