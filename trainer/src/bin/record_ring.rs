//! `record_ring`: runs exercise 16's ring all-reduce on `--nproc` thread
//! ranks and prints, as one JSON object, every rank's input and what it
//! received at each step. The guide's ring figure is drawn from it
//! (`cargo xtask figures --record`).
//!
//! Rank r's element i is 2^r + 16·i, so every partial sum says which ranks'
//! values it holds (a subset of ranks has one sum per element) and where in
//! the tensor it comes from.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Result};
use candle_core::{Device, Tensor};
use clap::Parser;
use workbook::distributed::{spawn, P2pRecorder, P2pTrace, ProcessGroup};
use workbook::phase4_under_the_hood::ring_all_reduce;

#[derive(Parser)]
#[command(name = "record_ring")]
struct Args {
    /// Ranks, as threads (at most 8: the partial sums must stay exact).
    #[arg(long, default_value_t = 3)]
    nproc: usize,
    /// Elements per rank.
    #[arg(long, default_value_t = 7)]
    len: usize,
}

fn main() -> ExitCode {
    trainer::main_with(|| run(Args::parse()))
}

fn input(rank: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| (1u32 << rank) as f32 + 16.0 * i as f32).collect()
}

fn run(args: Args) -> Result<()> {
    if !(2..=8).contains(&args.nproc) || args.len < args.nproc {
        bail!("--nproc must be 2 to 8 and --len at least --nproc");
    }
    let traces: Vec<Arc<Mutex<P2pTrace>>> = (0..args.nproc).map(|_| Arc::default()).collect();
    let results = spawn(args.nproc, |pg| {
        let rank = pg.rank();
        let t = Tensor::from_vec(input(rank, args.len), args.len, &Device::Cpu)?;
        ring_all_reduce(&P2pRecorder::around(Box::new(pg), traces[rank].clone()), &t)?.to_vec1::<f32>()
    })?;
    let traces: Vec<P2pTrace> = traces.iter().map(|t| t.lock().unwrap_or_else(|e| e.into_inner()).clone()).collect();
    let record = serde_json::json!({
        "inputs": (0..args.nproc).map(|r| input(r, args.len)).collect::<Vec<_>>(),
        "received": traces.iter().map(|t| &t.received).collect::<Vec<_>>(),
        "outputs": results,
    });
    println!("{record}");
    Ok(())
}
