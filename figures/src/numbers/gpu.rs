//! The one-GPU rows of `benchmarks/results.md` as model FLOPs: each row's
//! MFU against the datasheet's peak for its precision, and the rate of the
//! profiled micro-batch's matrix products.

use anyhow::Result;

use super::format::{grouped, percent, ratio};
use super::model::Config;
use super::results::{Section, Table};
use super::{quote, table, Quote, Sources};

const SECTION: &str = "On one GPU";
const F32_ROW: &str = "GPT-2 124M shape, T 1024, f32";
const BF16_ROW: &str = "GPT-2 124M shape, T 1024, bf16 autocast (`--autocast-bf16`)";
const TINY_ROW: &str = "`tiny` config, f32, 30 steps";

/// The datasheet's dense peaks the section states, in TFLOP/s.
struct Peaks {
    f32: f64,
    tf32: f64,
    bf16: f64,
}

impl Peaks {
    fn of(section: &Section) -> Result<Peaks> {
        Ok(Peaks {
            f32: section.number_before(" TFLOP/s f32")?,
            tf32: section.number_before(" TF32")?,
            bf16: section.number_before(" bf16)")?,
        })
    }
}

pub fn quotes(sources: &Sources) -> Result<Vec<Quote>> {
    let section = sources.results.section(SECTION)?;
    let runs = section.table_headed("shape, precision")?;
    let peaks = Peaks::of(section)?;
    let config = Config::read(&sources.configs, "small")?;
    let six_n = config.model.flops_per_token();
    let with_attention = six_n + config.model.attention_flops_per_token(config.seq_len);
    let (workbook_f32, pytorch_f32) = (tokens(runs, F32_ROW, "workbook")?, tokens(runs, F32_ROW, "PyTorch")?);
    let workbook_bf16 = tokens(runs, BF16_ROW, "workbook")?;
    let tflops = |tokens_per_s: f64, per_token: f64| tokens_per_s * per_token / 1e12;
    let mut quotes = vec![
        quote("peak-f32", format!("{:.0} TFLOP/s", peaks.f32)),
        quote("peak-tf32", format!("{:.0}", peaks.tf32)),
        quote("peak-bf16", format!("{:.0}", peaks.bf16)),
        quote(
            "mfu-table",
            table(
                "| row of `results.md` | tokens/s | 6N × tokens/s | MFU |\n|---|---:|---:|---:|",
                mfu_rows(runs, &peaks, six_n)?,
            ),
        ),
        quote("workbook-f32-mfu-attention", percent(tflops(workbook_f32, with_attention) / peaks.f32, 1)),
        quote("pytorch-f32-mfu-attention", percent(tflops(pytorch_f32, with_attention) / peaks.f32, 1)),
        quote("workbook-f32-against-bf16-peak", percent(tflops(workbook_f32, six_n) / peaks.bf16, 1)),
        quote("bf16-ceiling", format!("{:.0} / {:.0} ≈ {:.0}", peaks.bf16, peaks.f32, peaks.bf16 / peaks.f32)),
        quote("bf16-speedup", ratio(workbook_bf16 / workbook_f32)),
        quote("tiny-vs-pytorch", ratio(runs.row(&[("shape, precision", TINY_ROW)])?.number("ratio")?)),
        quote("f32-vs-pytorch", ratio(runs.row(&[("shape, precision", F32_ROW)])?.number("ratio")?)),
    ];
    quotes.extend(profile(section, &peaks, &config, with_attention, pytorch_f32)?);
    Ok(quotes)
}

/// The four f32 and bf16 rows, each as 6N × tokens/s against its precision's peak.
fn mfu_rows(runs: &Table, peaks: &Peaks, six_n: f64) -> Result<String> {
    let mut rows = vec![];
    for (label, row, side, peak) in [
        ("workbook, f32", F32_ROW, "workbook", peaks.f32),
        ("PyTorch, f32", F32_ROW, "PyTorch", peaks.f32),
        ("workbook, bf16 autocast", BF16_ROW, "workbook", peaks.bf16),
        ("PyTorch, bf16 autocast", BF16_ROW, "PyTorch", peaks.bf16),
    ] {
        let tokens = tokens(runs, row, side)?;
        let tflops = tokens * six_n / 1e12;
        rows.push(format!(
            "| {label} | {} | {tflops:.1} TFLOP/s | {tflops:.1} / {peak:.0} = {} |",
            grouped(tokens, 0),
            percent(tflops / peak, 1)
        ));
    }
    Ok(rows.join("\n"))
}

/// A row's tokens/s on one `side`, the workbook or PyTorch.
fn tokens(runs: &Table, row: &str, side: &str) -> Result<f64> {
    runs.row(&[("shape, precision", row)])?.number(&format!("{side} tokens/s"))
}

/// Where one profiled micro-batch's GPU time goes: its matrix products, at
/// what rate, and what the rest takes beside PyTorch's whole micro-batch.
fn profile(section: &Section, peaks: &Peaks, config: &Config, per_token: f64, pytorch_f32: f64) -> Result<Vec<Quote>> {
    let kernels = section.table_headed("kind of kernel")?;
    let kernel_ms = |kind: &str| kernels.row(&[("kind of kernel", kind)])?.number("ms");
    let (products, total) = (kernel_ms("matrix products (cuBLAS)")?, kernel_ms("total")?);
    let micro_batch = (config.batch_size * config.seq_len) as f64;
    let rate = micro_batch * per_token / (products / 1e3) / 1e12;
    Ok(vec![
        quote("kernels-ms", format!("{total:.0} ms")),
        quote("products-ms", format!("{products:.0} ms")),
        quote("products-rate", format!("{rate:.0} TFLOP/s")),
        quote("products-share-of-peak", percent(rate / peaks.f32, 0)),
        quote("pytorch-micro-batch-ms", format!("{:.0} ms", micro_batch / pytorch_f32 * 1e3)),
        quote("other-kernels-ms", format!("{:.0} ms", total - products)),
        quote("additions", format!("{:.0}", section.number_before(" additions of")?)),
    ])
}
