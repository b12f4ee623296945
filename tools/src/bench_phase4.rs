//! `bench phase4`: what each Phase 4 exercise buys inside the trainer, on
//! CPU ranks: tokens/s, the bytes the busiest rank sends per step and the
//! peak memory of one rank, beside plain DDP on the same ranks.
//!
//! Runs `trainer`'s `bench` with the reference solutions once per variant
//! and round, interleaved, at the tiny config and at GPT-2 124M's shape, and
//! writes the tables into `benchmarks/results.md` under their own heading.

use anyhow::{bail, Result};
use xtask::render;
use xtask::workspace::Workspace;

use crate::bench::{cpu_model, median, replace_section, workbook_bench, Measurement, Ranks, Workload, RESULTS};

const HEADING: &str = "## Phase 4 inside the trainer: what each exercise buys";

/// One way of training on the ranks, and the trainer flags that pick it.
struct Variant {
    name: &'static str,
    /// The exercises it runs, as the table lists them.
    exercises: &'static str,
    ranks: Ranks,
    flags: &'static [&'static str],
}

const TWO_PROCESSES: Ranks = Ranks { nproc: 2, threads_per_rank: 1, processes: true };

/// What is compared; the ratios are to the first two-process variant, plain DDP.
const VARIANTS: [Variant; 11] = [
    Variant {
        name: "single process, 2 threads",
        exercises: "",
        ranks: Ranks { nproc: 1, threads_per_rank: 2, processes: true },
        flags: &[],
    },
    Variant { name: "DDP, the backend's all-reduce after backward", exercises: "", ranks: TWO_PROCESSES, flags: &[] },
    Variant {
        name: "DDP, your ring all-reduce",
        exercises: "16",
        ranks: TWO_PROCESSES,
        flags: &["--allreduce", "ring"],
    },
    Variant { name: "DDP, PowerSGD rank 2", exercises: "18", ranks: TWO_PROCESSES, flags: &["--powersgd-rank", "2"] },
    Variant {
        name: "DDP, buckets all-reduced during backward",
        exercises: "19",
        ranks: TWO_PROCESSES,
        flags: &["--ddp-overlap"],
    },
    Variant {
        name: "GPipe pipeline, 2 stages",
        exercises: "21",
        ranks: TWO_PROCESSES,
        flags: &["--pp", "2", "--pipeline-schedule", "gpipe"],
    },
    Variant {
        name: "1F1B pipeline, 2 stages",
        exercises: "24",
        ranks: TWO_PROCESSES,
        flags: &["--pp", "2", "--pipeline-schedule", "1f1b"],
    },
    Variant {
        name: "ZeRO-1, AdamW's state sharded",
        exercises: "17",
        ranks: TWO_PROCESSES,
        flags: &["--strategy", "zero1"],
    },
    Variant {
        name: "ZeRO-2, the gradients sharded too",
        exercises: "17",
        ranks: TWO_PROCESSES,
        flags: &["--strategy", "zero2"],
    },
    Variant {
        name: "FSDP, full_shard, your unit step",
        exercises: "12–15, 22",
        ranks: TWO_PROCESSES,
        flags: &["--strategy", "fsdp"],
    },
    Variant { name: "your DDP", exercises: "26", ranks: TWO_PROCESSES, flags: &["--own-ddp"] },
];

/// The variant the others are compared with.
const PLAIN_DDP: usize = 1;

const MESH_HEADING: &str = "## Parallelisms composed on a mesh";
const FOUR_PROCESSES: Ranks = Ranks { nproc: 4, threads_per_rank: 1, processes: true };

/// The parallelisms of one run laid out on a mesh of four processes; the
/// ratios are to the first, DDP on the same four.
const COMPOSED: [Variant; 4] = [
    Variant { name: "DDP, 4 replicas", exercises: "", ranks: FOUR_PROCESSES, flags: &[] },
    Variant {
        name: "dp 2 × pp 2, GPipe",
        exercises: "21, 25",
        ranks: FOUR_PROCESSES,
        flags: &["--pp", "2", "--pipeline-schedule", "gpipe"],
    },
    Variant { name: "dp 2 × tp 2", exercises: "23, 25", ranks: FOUR_PROCESSES, flags: &["--tp", "2"] },
    Variant {
        name: "pp 2 × tp 2, GPipe",
        exercises: "21, 23, 25",
        ranks: FOUR_PROCESSES,
        flags: &["--pp", "2", "--pipeline-schedule", "gpipe", "--tp", "2"],
    },
];

pub fn bench_phase4(ws: &Workspace, model_size: &str, steps: usize, large_steps: usize, rounds: usize) -> Result<bool> {
    if rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    // Every variant trains the same batch.
    let mut workloads = vec![with_micro_batches(model_size, steps)];
    if large_steps > 0 {
        let title = "GPT-2 124M shape (`small` config, T 256, batch 2), 2 micro-batches per step";
        workloads.push(Workload { grad_accum: Some(2), steps: large_steps, ..Workload::gpt2_small(title) });
    }
    let mut report = format!(
        "Written by `cargo xtask bench phase4` ({rounds} interleaved rounds; {cpu}). The trainer runs\n\
         each Phase 4 exercise's reference solution on 2 single-threaded CPU processes over TCP, on\n\
         random tokens, with the same global batch as plain DDP. *Sent per step* is the tensor bytes\n\
         the busiest rank sent to the other per optimizer step, counted by the process group;\n\
         *peak memory* is the largest peak resident set (VmHWM) of one rank's process. tokens/s and\n\
         memory are medians over rounds; the ratios are taken within a round.\n\n\
         Expected traffic at N = 2: a ring all-reduce sends 2(N−1)/N · 4Ψ bytes per rank, 4Ψ for Ψ\n\
         f32 gradients; PowerSGD sends (n + m)·r floats for each n×m matrix instead of n·m, and the\n\
         vectors whole; a pipeline stage sends each micro-batch's activations forward (B·T·H floats)\n\
         and their gradients back, with a bubble of (S−1)/(M+S−1) of the step idle. In memory a\n\
         GPipe stage holds the activations of all M micro-batches at once, a 1F1B stage s at most\n\
         S − s of them. ZeRO-1 sends what the all-reduce sends, as one reduce-scatter and one\n\
         all-gather, and keeps 1/N of AdamW's moments; ZeRO-2 keeps 1/N of the gradient too, for\n\
         a reduce-scatter per micro-batch: (M + 1)/2 times the all-reduce's bytes over M\n\
         micro-batches. FSDP gathers each block's parameters twice per micro-batch (the root's\n\
         once) and reduce-scatters each unit's gradient once, nearly 1.5·M times the all-reduce's\n\
         bytes, and holds 1/N of every model state between uses. The rows that shard (ZeRO, FSDP)\n\
         hand freed blocks of 4 MiB and more back to the operating system, as the trainer does\n\
         for them; the others keep freed memory for reuse, as the trainer does for them.\n",
        cpu = cpu_model()
    );
    for workload in &workloads {
        println!("{}", render::bold(&format!("Phase 4 variants, {}, {} timed steps", workload.title, workload.steps)));
        let mut runs: Vec<Vec<Measurement>> = VARIANTS.iter().map(|_| vec![]).collect();
        for round in 1..=rounds {
            println!("  round {round} of {rounds}");
            for (variant, samples) in VARIANTS.iter().zip(&mut runs) {
                samples.push(workbook_bench(&ws.root, workload, variant.ranks, variant.flags)?);
            }
        }
        let table = table(&VARIANTS, &runs, PLAIN_DDP);
        println!("{table}");
        report += &format!(
            "\n### {}\n\n{} timed optimizer steps after {} warm-up steps.\n\n{table}",
            workload.title, workload.steps, workload.warmup
        );
    }
    replace_section(&ws.root.join(RESULTS), HEADING, &report)?;
    println!("written to {RESULTS}");
    Ok(true)
}

/// `bench mesh`: the parallelisms composed on a mesh of four single-threaded
/// processes at `model_size`, beside DDP on the same four, into its own
/// section of `benchmarks/results.md`.
pub fn bench_mesh(ws: &Workspace, model_size: &str, steps: usize, rounds: usize) -> Result<bool> {
    if rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let workload = with_micro_batches(model_size, steps);
    println!("{}", render::bold(&format!("Composed parallelisms, {}, {steps} timed steps", workload.title)));
    let mut runs: Vec<Vec<Measurement>> = COMPOSED.iter().map(|_| vec![]).collect();
    for round in 1..=rounds {
        println!("  round {round} of {rounds}");
        for (variant, samples) in COMPOSED.iter().zip(&mut runs) {
            samples.push(workbook_bench(&ws.root, &workload, variant.ranks, variant.flags)?);
        }
    }
    let table = table(&COMPOSED, &runs, 0);
    println!("{table}");
    let report = format!(
        "Written by `cargo xtask bench mesh` ({rounds} interleaved rounds; {cpu}). The trainer runs\n\
         the reference solutions on 4 single-threaded CPU processes over TCP, on random tokens, with\n\
         the same global batch in every row, laid out by exercise 25's mesh: two replicas of a\n\
         two-stage GPipe pipeline (exercise 21), two replicas of every block split across two\n\
         ranks (exercise 23), and one pipeline of two stages, each split across two ranks (both).\n\
         *Sent per step* counts every group a rank belongs to. What to expect:\n\
         a pipeline stage sends each micro-batch's activations on and their gradients back, and\n\
         all-reduces only its own stage's gradients; a tensor-parallel rank all-reduces a (B, T, C)\n\
         activation four times per block and micro-batch, two forward (g) and two backward (f),\n\
         running each block once. Both exist to fit models that one device cannot hold.\n\n\
         ### {}\n\n{steps} timed optimizer steps after {} warm-up steps.\n\n{table}",
        workload.title,
        workload.warmup,
        cpu = cpu_model()
    );
    replace_section(&ws.root.join(RESULTS), MESH_HEADING, &report)?;
    println!("written to {RESULTS}");
    Ok(true)
}

/// `steps` timed steps of `model_size`'s config with 4 micro-batches each,
/// so that a pipeline has some to overlap (its bubble is (S − 1)/(M + S − 1)).
fn with_micro_batches(model_size: &str, steps: usize) -> Workload {
    Workload {
        title: format!("`{model_size}` config, 4 micro-batches per step"),
        model_size: model_size.into(),
        seq_len: None,
        batch_size: None,
        grad_accum: Some(4),
        steps,
        warmup: 3,
    }
}

/// One row per variant, `runs[v]` holding variant v's measurement of each
/// round, compared with `runs[baseline]` round by round.
fn table(variants: &[Variant], runs: &[Vec<Measurement>], baseline: usize) -> String {
    let mut out = String::from(
        "| setup | exercise | tokens/s | vs DDP | sent per step, busiest rank | vs DDP | peak memory per rank |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    let plain = &runs[baseline];
    for (variant, samples) in variants.iter().zip(runs) {
        let tokens_per_s = median(&samples.iter().map(|m| m.tokens_per_s).collect::<Vec<_>>());
        let speed_ratios: Vec<f64> = samples.iter().zip(plain).map(|(m, p)| m.tokens_per_s / p.tokens_per_s).collect();
        let sent = samples[0].sent_bytes_per_step.unwrap_or(0.0);
        let plain_sent = plain[0].sent_bytes_per_step.unwrap_or(0.0);
        let two_ranks = variant.ranks.nproc > 1;
        let memory: Option<Vec<f64>> = samples.iter().map(|m| m.peak_memory_mib).collect();
        out += &format!(
            "| {} | {} | {tokens_per_s:.0} | {} | {} | {} | {} |\n",
            variant.name,
            variant.exercises,
            if two_ranks { format!("{:.2}x", median(&speed_ratios)) } else { String::new() },
            if two_ranks { megabytes(sent) } else { "none".into() },
            if two_ranks && plain_sent > 0.0 { format!("{:.3}x", sent / plain_sent) } else { String::new() },
            memory.map(|m| format!("{:.0} MiB", median(&m))).unwrap_or_default(),
        );
    }
    out
}

fn megabytes(bytes: f64) -> String {
    format!("{:.3} MB", bytes / 1e6)
}

#[cfg(test)]
mod tests {
    use super::{table, Measurement, PLAIN_DDP, VARIANTS};

    fn run(tokens_per_s: f64, sent: f64, memory: Option<f64>) -> Measurement {
        Measurement { setup: None, tokens_per_s, sent_bytes_per_step: Some(sent), peak_memory_mib: memory }
    }

    #[test]
    fn each_variant_is_compared_with_plain_ddp_of_its_round() {
        let mut runs: Vec<Vec<Measurement>> =
            VARIANTS.iter().map(|_| vec![run(100.0, 4e6, Some(200.0)), run(300.0, 4e6, Some(220.0))]).collect();
        runs[0] = vec![run(50.0, 0.0, Some(400.0)), run(60.0, 0.0, Some(400.0))];
        runs[3] = vec![run(90.0, 1e5, Some(210.0)), run(330.0, 1e5, None)];
        let text = table(&VARIANTS, &runs, PLAIN_DDP);
        assert!(text.contains("| single process, 2 threads |  | 55 |  | none |  | 400 MiB |"), "{text}");
        assert!(
            text.contains(
                "| DDP, the backend's all-reduce after backward |  | 200 | 1.00x | 4.000 MB | 1.000x | 210 MiB |"
            ),
            "{text}"
        );
        // Ratios 0.9 and 1.1 within the rounds; a round without memory leaves it blank.
        assert!(text.contains("| DDP, PowerSGD rank 2 | 18 | 210 | 1.00x | 0.100 MB | 0.025x |  |"), "{text}");
    }
}
