//! What share of its CPU's peak the workbook reaches at GPT-2 124M's shape
//! (`cargo xtask bench`'s throughput table). The clock is not recorded, so
//! the profiling chapter bounds it: one core's peak is at least what the
//! host line's single-threaded matrix product reached.

use anyhow::Result;

use super::format::{grouped, percent};
use super::model::Config;
use super::{code_block, quote, Quote, Sources};

const SECTION: &str = "Training throughput";
/// A core's FLOPs per cycle as the chapter assumes them: AVX2's 8 f32 lanes,
/// a multiply and an add, two FMA units.
const FLOPS_PER_CYCLE: f64 = 32.0;
/// Clocks shown above the lowest one the host line allows, in GHz.
const CLOCK_STEPS: [f64; 3] = [0.0, 0.5, 1.0];

pub fn quotes(sources: &Sources) -> Result<Vec<Quote>> {
    let section = sources.results.section(SECTION)?;
    let table = section.table_under("`small` config")?;
    let single = table.row(&[("setup", "workbook, single process, batch split across 2 threads")])?;
    let ddp = table.row(&[("setup", "workbook, DDP on 2 processes")])?;
    let cores = ddp.number("threads")?;
    let flops = Config::read(&sources.configs, "small")?.model.flops_per_token();
    let rate = |name: String, short, tokens: f64| Rate { name, short, tokens, gflops: tokens * flops / 1e9 };
    let rows = [
        rate("single process".into(), "single", single.number("tokens/s")?),
        rate(format!("DDP, {cores} processes"), "DDP", ddp.number("tokens/s")?),
    ];
    let ddp_gflops = rows[1].gflops;
    let gemm = section.number_after("matrix product at ")?;
    let lowest_clock = gemm / FLOPS_PER_CYCLE;
    Ok(vec![
        quote("host", section.host()?),
        quote("gemm-1-thread", format!("{gemm:.0} GFLOP/s")),
        quote("cpu-rates", code_block(rates(cores, flops, &rows))),
        quote("ddp-full-clock", format!("{:.1} GHz", ddp_gflops / (cores * FLOPS_PER_CYCLE))),
        quote("clock-bound", format!("{FLOPS_PER_CYCLE:.0}·f ≥ {gemm:.0} and f ≥ {lowest_clock:.1} GHz")),
        quote("cpu-mfu-by-clock", code_block(mfu_by_clock(cores, lowest_clock, &rows))),
        quote(
            "ddp-mfu-bound",
            format!("{ddp_gflops:.0} / ({cores} × {gemm:.0}) = {}", percent(ddp_gflops / (cores * gemm), 0)),
        ),
    ])
}

/// One measured row: its tokens/s and the model FLOP/s they stand for.
struct Rate {
    name: String,
    /// Its name in the MFU table.
    short: &'static str,
    tokens: f64,
    gflops: f64,
}

/// The peak's formula, then each row's tokens/s turned into GFLOP/s.
fn rates(cores: f64, flops: f64, rows: &[Rate]) -> String {
    let labels: Vec<String> = rows.iter().map(|r| format!("{}, {:.0} tok/s:", r.name, r.tokens)).collect();
    let width = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    let mut text = format!(
        "peak = cores × clock × {FLOPS_PER_CYCLE:.0} = {cores} × f × {FLOPS_PER_CYCLE:.0} = {:.0}·f GFLOP/s (f in GHz)\n",
        cores * FLOPS_PER_CYCLE
    );
    for (label, row) in labels.iter().zip(rows) {
        let pad = width - label.chars().count();
        text += &format!(
            "\n{label}{} {:.0} × {:.1}M = {} GFLOP/s",
            " ".repeat(pad),
            row.tokens,
            flops / 1e6,
            grouped(row.gflops, 0)
        );
    }
    text
}

/// Each row's MFU at the lowest clock the host allows and at a few above it.
fn mfu_by_clock(cores: f64, lowest_clock: f64, rows: &[Rate]) -> String {
    let clocks = CLOCK_STEPS.map(|step| lowest_clock + step);
    let line = |label: &str, cells: Vec<String>, unit: &str| {
        let cells: String = cells.iter().map(|c| format!("{c:<10}")).collect();
        format!("{label:<16}{}{unit}", cells.trim_end())
    };
    let peak = |clock: f64| cores * clock * FLOPS_PER_CYCLE;
    let mut lines = vec![
        line("f", clocks.iter().map(|f| format!("{f:.1} GHz")).collect(), ""),
        line("peak", clocks.iter().map(|&f| format!("{:.0}", peak(f))).collect(), " GFLOP/s"),
    ];
    for row in rows {
        let mfu = clocks.iter().map(|&f| percent(row.gflops / peak(f), 0)).collect();
        lines.push(line(&format!("MFU, {}", row.short), mfu, ""));
    }
    lines.join("\n")
}
