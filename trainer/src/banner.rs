//! The lines of a run's banner that say how it spreads over its ranks and
//! which exercises step it, each named with whose body runs: the learner's,
//! the reference leaned on in its place, the reference compiled in place of a
//! file that does not parse, or the reference standing in for a stub. A
//! learner whose code does not run never reads "your exercise" for it.

use workbook::distributed::MeshShape;
use workbook::parallel::fsdp::ShardingStrategy;
use workbook::parallel::pipeline::stage_layers;
use workbook::parallel::zero::update_shard_body;
use workbook::parallel::DataAxis;

use crate::needs::{self, Body};
use crate::run::RunOptions;
use crate::strategy::Strategy;

/// The banner's lines about the exercises this run steps with.
pub fn exercise_lines(options: &RunOptions) -> candle_core::Result<Vec<String>> {
    let mesh = options.layout.strategy.mesh(options.nproc)?;
    let named = |number| named(number, needs::body(number));
    let mut lines = Vec::new();
    if options.layout.own_ring {
        lines.push(format!(
            "all-reduce (--allreduce ring): every one runs the ring from {}; here it carries {}",
            named(16),
            ring_carries(options.layout.strategy, mesh, options.layout.powersgd_rank.is_some())
        ));
    }
    if options.layout.ddp_overlap {
        lines.push(format!("gradients (--ddp-overlap): buckets all-reduced during backward by {}", named(19)));
    }
    if let Some(rank) = options.layout.powersgd_rank {
        lines.push(format!(
            "gradients (--powersgd-rank): matrices averaged as rank-{rank} PowerSGD estimates by {}",
            named(18)
        ));
    }
    match options.layout.strategy {
        Strategy::Ddp if options.layout.ddp_overlap => {}
        Strategy::Ddp => lines.push(format!(
            "training step: micro-batches accumulated, {}clipped and stepped by {}",
            match mesh.dp {
                1 => String::new(),
                replicas => format!("gradients averaged over the {replicas} replicas, "),
            },
            named(10)
        )),
        Strategy::Mesh { stages, schedule, sequence_parallel, data, .. } => {
            match data {
                DataAxis::ShardOptimizer => lines.push(format!(
                    "optimizer (--strategy zero1): AdamW's moments sharded across {}, each step by {}{}",
                    workbook::words::count(mesh.dp, "data-parallel replica"),
                    named(17),
                    match mesh.dp {
                        1 =>
                            "; with one replica it holds every moment: ZeRO-1 saves memory from 2 replicas on \
                              (--nproc, or --nproc / (pp · tp) on a mesh)",
                        _ => "",
                    }
                )),
                DataAxis::ShardGradients => lines.push(format!(
                    "optimizer (--strategy zero2): each micro-batch's gradient reduce-scattered across {} as its \
                     backward ends, AdamW's moments and the gradient kept as shards, each shard stepped by `update_shard` \
                     of {}{}",
                    workbook::words::count(mesh.dp, "data-parallel replica"),
                    named(17),
                    match mesh.dp {
                        1 =>
                            "; with one replica the shard is everything: ZeRO-2 saves memory from 2 replicas on \
                              (--nproc, or --nproc / tp with --tp)",
                        _ => "",
                    }
                )),
                DataAxis::YourDdp => lines.push(format!(
                    "DDP (--own-ddp): each micro-batch's forward and backward, and the gradients averaged over the \
                     {} ranks in buckets of {:.1} MiB, by {}",
                    mesh.dp,
                    options.layout.bucket_bytes as f64 / (1u64 << 20) as f64,
                    named(26)
                )),
                DataAxis::ShardBlocks { sharding, shard_group, precision, reduce_in_f32 } => {
                    let dtypes = match reduce_in_f32 {
                        true => format!("{precision}, gradients reduced in f32"),
                        false => precision.to_string(),
                    };
                    let across = match (sharding, shard_group) {
                        (ShardingStrategy::ShardGradOp, _) => format!(
                            "the {} data-parallel replicas (SHARD_GRAD_OP, {dtypes}: parameters kept whole, \
                             gradients and AdamW's state sharded)",
                            mesh.dp
                        ),
                        (ShardingStrategy::NoShard, _) => format!(
                            "the {} data-parallel replicas (NO_SHARD, {dtypes}: nothing sharded, each gradient \
                             all-reduced as under DDP)",
                            mesh.dp
                        ),
                        (_, None) if mesh.dp == 1 => format!(
                            "the one data-parallel replica (FULL_SHARD, {dtypes}): with one replica a shard is the \
                             whole unit, FSDP saves memory from 2 replicas on (--nproc / (pp · tp))"
                        ),
                        (_, None) => format!("the {} data-parallel replicas (FULL_SHARD, {dtypes})", mesh.dp),
                        (_, Some(size)) => format!(
                            "groups of {size} of the {} data-parallel replicas, each group a replica of the others \
                             (HYBRID_SHARD, {dtypes})",
                            mesh.dp
                        ),
                    };
                    let blocks = match (mesh.tp, stages) {
                        (1, 1) => "every block is",
                        (1, _) => "every block of each stage is",
                        _ => "this rank's tensor-parallel shards of every block (FSDP × TP) are",
                    };
                    let root = match stages {
                        1 => "the embedding, final norm and head one more unit, the root, gathered for each micro-batch",
                        _ => "each stage's embedding, final norm and head one more unit, its root, gathered for the step",
                    };
                    let updated = match sharding {
                        ShardingStrategy::NoShard => "whole state",
                        _ => "shard",
                    };
                    lines.push(format!(
                        "FSDP (--strategy fsdp): {blocks} an FSDP unit across {across}, stepped by {} and its \
                         {updated} updated by {}; {root}; the plan from {}, the units from {}, their checkpoints \
                         gathered and cut again by {}",
                        named(22),
                        update_shard_body(),
                        named(12),
                        named(14),
                        named(15)
                    ))
                }
                DataAxis::Replicate => {}
            }
            if stages > 1 {
                let layers = options.config.model.num_layers;
                let micro_batches = options.config.grad_accum_steps;
                let cut: Vec<String> = (0..stages).map(|s| format!("{:?}", stage_layers(layers, stages, s))).collect();
                lines.push(format!(
                    "pipeline: {stages} stages (layers {}), the {schedule} step of {} over {}: bubble \
                     (S-1)/(M+S-1) = {:.0}%, at most {} in flight on stage 0",
                    cut.join(", "),
                    named(schedule.exercise()),
                    workbook::words::count(micro_batches, "micro-batch"),
                    100.0 * (stages - 1) as f64 / (micro_batches + stages - 1) as f64,
                    workbook::words::count(schedule.most_in_flight(0, stages, micro_batches), "micro-batch")
                ));
            }
            if mesh.tp > 1 {
                let run_by = match sequence_parallel {
                    true => format!("{}, norms and residuals cut along the sequence (--sequence-parallel)", named(27)),
                    false => named(23),
                };
                let blocks = if stages > 1 { "every stage's blocks" } else { "every block" };
                lines.push(format!(
                    "tensor parallelism: {blocks} split across {} ranks (heads and MLP units), run once per \
                     micro-batch by {run_by}; embedding and head whole",
                    mesh.tp
                ));
            }
        }
    }
    if mesh.tp > 1 {
        let line = match options.layout.strategy {
            Strategy::Mesh { sequence_parallel: true, .. } => format!(
                "tensor-parallel MLP: every block's MLP cut by `shard` and run by `partial` of {}, whose f also \
                 sums the norms' weight gradients",
                named(20)
            ),
            _ => format!(
                "tensor-parallel MLP: every block's MLP cut by `shard` and run by `forward` (f, `partial`, g) of {}",
                named(20)
            ),
        };
        lines.push(line);
    }
    if options.layout.activation_checkpointing {
        lines.push(
            "activation checkpointing (--activation-checkpointing): each block keeps only its input in forward \
             and is recomputed in backward"
                .to_string(),
        );
    }
    if options.layout.strategy.cuts_the_model() {
        lines.push(format!("mesh: {mesh}, each rank's place and groups laid out by {}", named(25)));
        let shared = match options.layout.strategy {
            Strategy::Mesh { data: DataAxis::ShardOptimizer, .. } => {
                "each rank's gradients reduce-scattered with the same place in the others, AdamW's state sharded"
            }
            Strategy::Mesh { data: DataAxis::ShardGradients, .. } => {
                "each micro-batch's gradients reduce-scattered with the same place in the others, the gradients and \
                 AdamW's state sharded"
            }
            Strategy::Mesh { data: DataAxis::ShardBlocks { sharding: ShardingStrategy::NoShard, .. }, .. } => {
                "each unit's gradient (each block's, and the root's) all-reduced with the same place in the others"
            }
            Strategy::Mesh { data: DataAxis::ShardBlocks { .. }, .. } => {
                "each unit's gradient (each block's, and the root's) reduce-scattered with the same place in the \
                 others"
            }
            _ => "each rank's gradients averaged with the same place in the others",
        };
        if mesh.dp > 1 {
            lines.push(format!("data parallelism: {} replicas, {shared}", mesh.dp));
        }
    }
    Ok(lines)
}

/// Exercise `number` as the banner names it, by whose body runs.
fn named(number: u32, body: Body) -> String {
    match body {
        Body::Yours => format!("your exercise {number}"),
        Body::Leaned if cfg!(feature = "solutions") => format!("exercise {number}'s reference body"),
        Body::Leaned => format!("exercise {number}'s reference body (leaned on)"),
        Body::DoesNotParse => {
            format!("exercise {number}'s reference body, in place of your file, which does not parse")
        }
        // A run that calls a stub is refused before it starts, except where an
        // earlier phase's runtime has the reference stand in (exercise 22).
        Body::NotStarted => format!("exercise {number}'s reference body, standing in until you start yours"),
    }
}

/// What goes through exercise 16's ring: every all-reduce of the run, on
/// every group of the mesh, which under some layouts is little more than
/// the logged loss. Reduce-scatters and all-gathers stay the backend's.
fn ring_carries(strategy: Strategy, mesh: MeshShape, powersgd: bool) -> String {
    let across_replicas = |what: &str| (mesh.dp > 1).then(|| format!("{what} across the {} replicas", mesh.dp));
    let gradients = match strategy {
        Strategy::Ddp | Strategy::Mesh { data: DataAxis::Replicate, .. } if powersgd => {
            across_replicas("the gradients' PowerSGD factors")
        }
        Strategy::Mesh { data: DataAxis::ShardOptimizer | DataAxis::ShardGradients, .. } => None,
        Strategy::Mesh { data: DataAxis::ShardBlocks { sharding, .. }, .. } => match sharding {
            ShardingStrategy::NoShard => across_replicas("the gradients"),
            ShardingStrategy::HybridShard => Some("each shard's gradients across the groups that hold it".to_string()),
            ShardingStrategy::FullShard | ShardingStrategy::ShardGradOp => None,
        },
        Strategy::Ddp | Strategy::Mesh { .. } => across_replicas("the gradients"),
    };
    // Sequence parallelism turns the partial sums into reduce-scatters and
    // all-gathers; the norms, which saw a chunk of the tokens each, still sum.
    let within_blocks = match strategy {
        Strategy::Mesh { sequence_parallel: true, .. } => "the norms' gradients",
        _ => "every block's partial sums, forward and backward,",
    };
    let partial_sums = (mesh.tp > 1).then(|| format!("{within_blocks} across the {} tensor-parallel ranks", mesh.tp));
    // Whole replicas under DDP take the norm of gradients they already hold;
    // ZeRO-1 adds its reduced shards' squares over the ranks.
    let sharded = !matches!(strategy, Strategy::Ddp | Strategy::YOUR_DDP);
    let norm = sharded.then(|| "the gradient norm".to_string());
    let carried: Vec<String> =
        [partial_sums, gradients, norm, Some("the logged loss".to_string())].into_iter().flatten().collect();
    let (last, rest) = carried.split_last().expect("the logged loss is always there");
    let listed = match rest {
        [] => format!("only {last}"),
        _ => format!("{} and {last}", rest.join(", ")),
    };
    match mesh.dp {
        1 => format!("{listed} (one replica: no gradients to average)"),
        _ => listed,
    }
}

#[cfg(test)]
mod tests {
    use workbook::parallel::pipeline::PipelineSchedule;

    use super::*;

    #[test]
    fn an_exercise_is_yours_only_when_your_code_runs() {
        assert_eq!(named(23, Body::Yours), "your exercise 23");
        assert!(named(23, Body::Leaned).starts_with("exercise 23's reference body"));
        assert_eq!(named(22, Body::NotStarted), "exercise 22's reference body, standing in until you start yours");
        assert_eq!(
            named(16, Body::DoesNotParse),
            "exercise 16's reference body, in place of your file, which does not parse"
        );
    }

    #[test]
    fn the_ring_says_what_it_carries_with_one_replica() {
        let mesh = |stages, tp, sequence_parallel| Strategy::Mesh {
            stages,
            tp,
            schedule: PipelineSchedule::GPipe,
            sequence_parallel,
            data: DataAxis::Replicate,
        };
        let pipeline = mesh(2, 1, false);
        let carried = ring_carries(pipeline, pipeline.mesh(2).unwrap(), false);
        assert_eq!(carried, "the gradient norm and the logged loss (one replica: no gradients to average)");
        let tp = mesh(1, 2, false);
        let carried = ring_carries(tp, tp.mesh(4).unwrap(), false);
        assert!(carried.starts_with("every block's partial sums, forward and backward, across the 2"), "{carried}");
        assert!(carried.contains("the gradients across the 2 replicas"), "{carried}");
        let sequence = mesh(1, 2, true);
        let carried = ring_carries(sequence, sequence.mesh(2).unwrap(), false);
        assert!(carried.starts_with("the norms' gradients across the 2 tensor-parallel ranks"), "{carried}");
        for zero in [Strategy::ZERO1, Strategy::ZERO2] {
            assert_eq!(ring_carries(zero, zero.mesh(2).unwrap(), false), "the gradient norm and the logged loss");
        }
        let alone = ring_carries(Strategy::Ddp, Strategy::Ddp.mesh(1).unwrap(), false);
        assert_eq!(alone, "only the logged loss (one replica: no gradients to average)");
        let ddp = ring_carries(Strategy::Ddp, Strategy::Ddp.mesh(2).unwrap(), false);
        assert_eq!(ddp, "the gradients across the 2 replicas and the logged loss");
    }
}
