//! Numbers read off the runs recorded for the guide's figures
//! (`guide/figure-data/`): the loss curve's tokens/s step by step, the
//! spike of the run at a high learning rate, and the timings and gathered
//! bytes of the traced DDP and FSDP steps.

use std::ops::RangeInclusive;

use anyhow::{bail, Context, Result};

use super::format::{grouped, percent};
use super::model::Config;
use super::{quote, Quote, Sources};
use crate::catalog::{last_step, loss_curve_records, metrics_records, peak_lr, spike_run, spike_steps};
use crate::trace::Span;

/// The steps whose spread the profiling chapter quotes: past the first
/// steps' warm-up, before the end.
const STEADY_STEPS: RangeInclusive<u64> = 200..=500;

/// How a step's tokens/s varies, and what the whole run averaged.
pub fn loss_curve(sources: &Sources) -> Result<Vec<Quote>> {
    let records = loss_curve_records(&sources.data)?;
    let number = |record: &serde_json::Value, key: &str| {
        record[key].as_f64().with_context(|| format!("a metrics line has no `{key}`: {record}"))
    };
    let steady: Vec<f64> = records
        .iter()
        .filter(|r| r["step"].as_u64().is_some_and(|step| STEADY_STEPS.contains(&step)))
        .map(|r| number(r, "tokens_per_s"))
        .collect::<Result<_>>()?;
    let (Some(last), false) = (records.last(), steady.is_empty()) else {
        bail!("the loss curve's run has no steps {STEADY_STEPS:?}");
    };
    let (slowest, fastest) =
        (steady.iter().copied().fold(f64::INFINITY, f64::min), steady.iter().copied().fold(0.0, f64::max));
    let tiny = Config::read(&sources.configs, "tiny")?;
    let tokens_per_step = (tiny.batch_size * tiny.seq_len) as f64;
    let (steps, seconds, last_rate) = (records.len() as f64, number(last, "elapsed_s")?, number(last, "tokens_per_s")?);
    let average = steps * tokens_per_step / seconds;
    Ok(vec![
        quote(
            "spread",
            format!(
                "{} to {} tok/s at steps {} to {}",
                grouped(slowest, 0),
                grouped(fastest, 0),
                STEADY_STEPS.start(),
                STEADY_STEPS.end()
            ),
        ),
        quote("spread-percent", percent(fastest / slowest - 1.0, 0)),
        quote(
            "average",
            format!("{steps:.0} × {} / {seconds:.0} ≈ {} tokens/s", grouped(tokens_per_step, 0), grouped(average, 0)),
        ),
        quote("seconds", format!("{seconds:.0} s")),
        quote("last-step", grouped(last_rate, 0)),
        quote("under-last-step", percent(1.0 - average / last_rate, 0)),
    ])
}

/// When the traced `--ddp-overlap` step's blocks and all-reduces ran.
pub fn ddp_overlap(sources: &Sources) -> Result<Vec<Quote>> {
    let spans = last_step(&sources.data, "ddp-overlap.trace.json")?.spans;
    let ranks = spans.iter().map(|s| s.rank + 1).max().unwrap_or(0);
    let of = |rank: usize, kind: &'static str| spans.iter().filter(move |s| s.rank == rank && s.name.starts_with(kind));
    let last_backward = |rank| of(rank, "backward").max_by(|a, b| a.end.total_cmp(&b.end)).context("no backward span");
    let forward_end = of(0, "forward").map(|s| s.end).fold(0.0, f64::max);
    let backward_start = of(0, "backward").map(|s| s.start).fold(f64::INFINITY, f64::min);
    let backward_end = last_backward(0)?.end;
    let hidden: Vec<String> =
        of(0, "all_reduce").filter(|s| s.start < backward_end).map(|s| format!("{:.0}", s.start)).collect();
    let ends: Vec<&Span> = (0..ranks).map(last_backward).collect::<Result<_>>()?;
    let (Some(early), Some(late)) =
        (ends.iter().min_by(|a, b| a.end.total_cmp(&b.end)), ends.iter().max_by(|a, b| a.end.total_cmp(&b.end)))
    else {
        bail!("the DDP trace's last step has no rank");
    };
    Ok(vec![
        quote("head-gap", format!("about {forward_end:.0} to {backward_start:.0} ms")),
        quote("hidden-all-reduces", format!("{} ms", in_words(&hidden))),
        quote("backward-end", format!("rank 0: {backward_end:.0} ms")),
        quote("straggler", straggler(&spans, early, late)?),
    ])
}

/// The rank whose backward ended first waits in the next all-reduce for the
/// one whose backward ended last: the same collective, a long bar and a short one.
fn straggler(spans: &[Span], early: &Span, late: &Span) -> Result<String> {
    let name = |span: &Span| span.name.split(',').next().unwrap_or_default().to_string();
    let waited = spans
        .iter()
        .filter(|s| s.rank == early.rank && s.name.starts_with("all_reduce") && s.start >= early.end)
        .min_by(|a, b| a.start.total_cmp(&b.start))
        .context("no all-reduce after the first rank's backward")?;
    let joined = spans
        .iter()
        .find(|s| s.rank == late.rank && name(s) == name(waited))
        .with_context(|| format!("rank {} has no `{}`", late.rank, name(waited)))?;
    let block = |span: &Span| format!("B{}", span.name.rsplit(' ').next().unwrap_or_default());
    Ok(format!(
        "Here rank {}'s {} ends at about {:.0} ms, rank {}'s {} at {:.0} ms; `{}` lasts about {:.1} ms on rank {} \
         and {:.1} ms on rank {}. Rank {} was waiting for rank {}.",
        late.rank,
        block(late),
        late.end,
        early.rank,
        block(early),
        early.end,
        name(waited),
        waited.end - waited.start,
        early.rank,
        joined.end - joined.start,
        late.rank,
        early.rank,
        late.rank
    ))
}

/// `48, 63, 78 and 82`.
fn in_words(items: &[String]) -> String {
    match items.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// The sizes of the traced FULL_SHARD step's units, from the bytes it held
/// gathered: the root alone between blocks, the root and one block at the peak.
pub fn fsdp(sources: &Sources) -> Result<Vec<Quote>> {
    let step = last_step(&sources.data, "fsdp.trace.json")?;
    let gathered: Vec<f64> =
        step.samples.iter().filter(|s| s.rank == 0 && s.name == "gathered bytes").map(|s| s.value).collect();
    let root = gathered.iter().copied().filter(|&b| b > 0.0).fold(f64::INFINITY, f64::min);
    let peak = gathered.iter().copied().fold(0.0, f64::max);
    if !root.is_finite() {
        bail!("the FSDP trace's last step gathers nothing on rank 0");
    }
    let mib = |bytes: f64| format!("{:.2} MiB", bytes / (1u64 << 20) as f64);
    Ok(vec![quote("root", mib(root)), quote("block", mib(peak - root))])
}

/// The run at a high peak learning rate beside the loss curve's: its largest
/// one-step rise of the loss, how each run ended, and its skipped updates.
pub fn loss_spike(sources: &Sources) -> Result<Vec<Quote>> {
    let spiked = spike_run(&sources.data)?;
    let calm = spike_steps(&sources.data, "loss-curve.metrics.jsonl")?;
    let rise = spiked
        .steps
        .windows(2)
        .filter(|pair| pair[0].loss.is_finite() && pair[1].loss.is_finite())
        .max_by(|a, b| (a[1].loss - a[0].loss).total_cmp(&(b[1].loss - b[0].loss)))
        .context("the spiked run has fewer than two finite steps")?;
    let (before, peak) = (rise[0], rise[1]);
    let after = spiked.steps.iter().find(|s| s.step == peak.step + 1).context("the spike is the run's last step")?;
    let (Some(last), Some(calm_last)) = (spiked.steps.last(), calm.last()) else {
        bail!("a run of the stability figure has no steps");
    };
    let held_out = |file: &str| -> Result<f64> {
        let records = metrics_records(&sources.data, file)?;
        records
            .iter()
            .rev()
            .find_map(|r| r["eval_loss"].as_f64())
            .with_context(|| format!("{file} has no held-out loss"))
    };
    let skipped = metrics_records(&sources.data, "loss-spike.metrics.jsonl")?
        .last()
        .and_then(|r| r["skipped_steps"].as_u64())
        .context("the spiked run's metrics do not count skipped updates")?;
    Ok(vec![
        quote("peak-lr", format!("{}", spiked.max_lr)),
        quote("config-lr", format!("{}", peak_lr(&sources.data, "loss-curve.metrics.jsonl")?)),
        quote("max-grad-norm", format!("{}", spiked.max_grad_norm)),
        quote(
            "spike",
            format!(
                "from {:.2} at step {} to {:.2} at step {}, and {:.2} at step {}",
                before.loss, before.step, peak.loss, peak.step, after.loss, after.step
            ),
        ),
        quote(
            "spike-norm",
            format!("{:.2} at step {} to {:.2} at step {}", before.grad_norm, before.step, peak.grad_norm, peak.step),
        ),
        quote("spike-clip-factor", format!("{:.0}", peak.grad_norm / spiked.max_grad_norm)),
        quote(
            "final",
            format!(
                "{:.2} and {:.2} at step {} (held out: {:.2} and {:.2})",
                last.loss,
                calm_last.loss,
                last.step,
                held_out("loss-spike.metrics.jsonl")?,
                held_out("loss-curve.metrics.jsonl")?
            ),
        ),
        quote(
            "skipped",
            match skipped {
                0 => "no update was skipped".to_string(),
                1 => "one update was skipped".to_string(),
                n => format!("{n} updates were skipped"),
            },
        ),
    ])
}
