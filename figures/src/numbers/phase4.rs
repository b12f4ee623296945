//! What each Phase 4 exercise costs in the trainer (`cargo xtask bench
//! phase4`): speed beside plain DDP, bytes sent and peak memory, at the
//! tiny config and at GPT-2 124M's shape; and how long 124M's DDP traffic
//! would take at the bus bandwidth `cargo xtask bench allreduce` measured.

use anyhow::Result;

use super::format::{grouped, percent, ratio};
use super::results::{Row, Table};
use super::{allreduce, quote, table, Quote, Sources};

const SECTION: &str = "Phase 4 inside the trainer: what each exercise buys";
const SINGLE: &str = "single process, 2 threads";
const DDP: &str = "DDP, the backend's all-reduce after backward";
const RING: &str = "DDP, your ring all-reduce";
const POWERSGD: &str = "DDP, PowerSGD rank 2";
const OVERLAP: &str = "DDP, buckets all-reduced during backward";
const GPIPE: &str = "GPipe pipeline, 2 stages";
const ONE_F_ONE_B: &str = "1F1B pipeline, 2 stages";
const ZERO1: &str = "ZeRO-1, AdamW's state sharded";
const ZERO2: &str = "ZeRO-2, the gradients sharded too";
const FSDP: &str = "FSDP, full_shard, your unit step";
/// The pipelines' stages, as their rows name them.
const STAGES: f64 = 2.0;
const PEAK: &str = "peak memory per rank";
const SPEED: &str = "vs DDP";
const SENT: &str = "sent per step, busiest rank";

pub fn quotes(sources: &Sources) -> Result<Vec<Quote>> {
    let section = sources.results.section(SECTION)?;
    let (tiny, small) = (section.table_under("`tiny` config")?, section.table_under("`small` config")?);
    Ok(vec![
        quote("host", section.host()?),
        quote("tiny-ddp-peak", mib(setup(tiny, DDP)?.number(PEAK)?)),
        quote("tiny-overlap-peak", mib(setup(tiny, OVERLAP)?.number(PEAK)?)),
        quote("tiny-gpipe-peak", mib(setup(tiny, GPIPE)?.number(PEAK)?)),
        quote("tiny-ring-speed", ratio(setup(tiny, RING)?.number(SPEED)?)),
        quote("tiny-overlap-speed", ratio(setup(tiny, OVERLAP)?.number(SPEED)?)),
        quote("tiny-powersgd-speed", ratio(setup(tiny, POWERSGD)?.number(SPEED)?)),
        quote("tiny-1f1b-saving", mib(one_f_one_b_saving(tiny)?)),
        quote("small-ddp-peak", mib(setup(small, DDP)?.number(PEAK)?)),
        quote("small-overlap-peak", mib(setup(small, OVERLAP)?.number(PEAK)?)),
        quote("small-powersgd-peak", mib(setup(small, POWERSGD)?.number(PEAK)?)),
        quote("small-gpipe-peak", mib(setup(small, GPIPE)?.number(PEAK)?)),
        quote("small-zero1-peak", mib(setup(small, ZERO1)?.number(PEAK)?)),
        quote("small-zero2-peak", mib(setup(small, ZERO2)?.number(PEAK)?)),
        quote("small-fsdp-peak", mib(setup(small, FSDP)?.number(PEAK)?)),
        quote("small-zero1-speed", ratio(setup(small, ZERO1)?.number(SPEED)?)),
        quote("small-zero2-speed", ratio(setup(small, ZERO2)?.number(SPEED)?)),
        quote("small-ring-speed", ratio(setup(small, RING)?.number(SPEED)?)),
        quote("small-overlap-speed", ratio(setup(small, OVERLAP)?.number(SPEED)?)),
        quote("small-powersgd-speed", ratio(setup(small, POWERSGD)?.number(SPEED)?)),
        quote("small-1f1b-saving", mib(one_f_one_b_saving(small)?)),
        quote("small-ddp-sent", format!("{:.3} MB", setup(small, DDP)?.number(SENT)?)),
        quote(
            "bubble-table",
            table("| setup | M | bubble (S−1)/(M+S−1) | tokens/s |\n|---|---:|---:|---:|", bubble_rows(tiny)?),
        ),
        quote(
            "schedule-table",
            table(
                "| | tiny config, M = 4 micro-batches of 16 sequences | GPT-2 124M's shape, T 256, M = 2 of 2 \
                 sequences |\n|---|---:|---:|",
                schedule_rows(tiny, small)?,
            ),
        ),
        quote("small-ddp-traffic-share", ddp_traffic_share(sources, small)?),
    ])
}

fn setup<'a>(table: &'a Table, name: &str) -> Result<Row<'a>> {
    table.row(&[("setup", name)])
}

fn mib(value: f64) -> String {
    format!("{} MiB", grouped(value, 0))
}

/// How much lower 1F1B's peak is than GPipe's.
fn one_f_one_b_saving(table: &Table) -> Result<f64> {
    Ok(setup(table, GPIPE)?.number(PEAK)? - setup(table, ONE_F_ONE_B)?.number(PEAK)?)
}

/// One process, DDP and GPipe at the tiny config, with the bubble
/// (S−1)/(M+S−1) the pipeline's schedule predicts.
fn bubble_rows(tiny: &Table) -> Result<String> {
    let micro_batches = tiny.heading_number_after("config, ")?;
    let bubble = (STAGES - 1.0) / (micro_batches + STAGES - 1.0);
    let rows = [
        ("one process (2 threads, the batch split across them)", SINGLE, String::new()),
        ("DDP on 2 processes", DDP, String::new()),
        ("pipeline of 2 stages, GPipe", GPIPE, percent(bubble, 0)),
    ];
    let mut lines = vec![];
    for (label, name, bubble) in rows {
        let tokens = grouped(setup(tiny, name)?.number("tokens/s")?, 0);
        lines.push(format!("| {label} | {micro_batches} | {bubble} | {tokens} |"));
    }
    Ok(lines.join("\n"))
}

/// GPipe's and 1F1B's peak memory and speed, at both sizes.
fn schedule_rows(tiny: &Table, small: &Table) -> Result<String> {
    let cell = |table: &Table, name: &str, speed_unit: &str| -> Result<String> {
        let row = setup(table, name)?;
        Ok(format!("{}, {}{speed_unit}", mib(row.number(PEAK)?), ratio(row.number(SPEED)?)))
    };
    Ok(format!(
        "| GPipe (Exercise 21) | {} | {} |\n| 1F1B (this exercise) | {} | {} |",
        cell(tiny, GPIPE, " DDP's tokens/s")?,
        cell(small, GPIPE, "")?,
        cell(tiny, ONE_F_ONE_B, "")?,
        cell(small, ONE_F_ONE_B, "")?,
    ))
}

/// Plain DDP's bytes per step at 124M's shape over the measured bus
/// bandwidth, beside the step's time.
fn ddp_traffic_share(sources: &Sources, small: &Table) -> Result<String> {
    let ddp = setup(small, DDP)?;
    let sent_mb = ddp.number(SENT)?;
    let busbw_mb = allreduce::busbw_256_mb(sources)? * 1e3;
    let tokens = small.heading_number_after("T ")?
        * small.heading_number_after("batch ")?
        * small.heading_number_after("), ")?;
    let tokens_per_s = ddp.number("tokens/s")?;
    let (transfer, step) = (sent_mb / busbw_mb, tokens / tokens_per_s);
    Ok(format!(
        "{sent_mb:.1} / {} ≈ {transfer:.2} s, and a step of {} tokens at {tokens_per_s:.0} tok/s takes about \
         {step:.0} s: {} of the step",
        grouped(busbw_mb, 0),
        grouped(tokens, 0),
        percent(transfer / step, 0)
    ))
}
