//! Opening a GPU the way every part of the workbook uses one.
//!
//! A device from [`Device::new_cuda`] queues on CUDA's per-thread default
//! stream, a different stream for each host thread, and nothing orders the
//! work of one thread with another's: DDP's overlapped backward (a thread of
//! its own) would hand the rank's thread gradients whose kernels sit on
//! another stream. [`open`] gives the device one explicit stream, the
//! compute stream, which every thread queues on in the order it submits.
//!
//! The only other stream is NCCL's communication stream, and the NCCL group
//! orders the crossings between the two itself with events, as PyTorch's
//! ProcessGroupNCCL does (see `distributed/nccl.rs`). So cudarc's automatic
//! tracking, which records an event on each buffer for each kernel that
//! reads or writes it once a context has two streams, is turned off: it would
//! order nothing the group does not, and cost driver calls at every launch.

use candle_core::{Device, Result};

/// GPU `ordinal`, with one compute stream that serves every thread and no
/// per-buffer event tracking (see the module's documentation).
#[cfg(feature = "cuda")]
pub fn open(ordinal: usize) -> Result<Device> {
    let device = Device::new_cuda_with_stream(ordinal)?;
    // SAFETY: no buffer exists on this device yet, and the one place work
    // crosses to another stream, the NCCL group, orders it by hand: the
    // communication stream waits for the compute stream before each call,
    // and the compute stream waits for the call before reading its result
    // or freeing the buffers it uses.
    unsafe { device.as_cuda_device()?.disable_event_tracking() };
    Ok(device)
}

/// Without CUDA compiled in, candle's own error that says so.
#[cfg(not(feature = "cuda"))]
pub fn open(ordinal: usize) -> Result<Device> {
    Device::new_cuda(ordinal)
}
