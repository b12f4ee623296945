//! The flags that say how a run's ranks share the work (`--strategy`, `--pp`,
//! `--tp` and those that go with them), and the one place that checks them
//! and turns them into a [`Layout`]: `train` and `bench` both take them.

use anyhow::Result;
use workbook::distributed::MeshShape;
use workbook::parallel::ddp::DEFAULT_BUCKET_BYTES;
use workbook::parallel::fsdp::{Precision, ShardingStrategy};
use workbook::parallel::pipeline::PipelineSchedule;
use workbook::parallel::DataAxis;
use workbook::GptConfig;

use crate::config::{at_least_one, bucket_cap_bytes, parsed, RunConfig};
use crate::strategy::{Layout, Strategy};

/// How the ranks share the work.
#[derive(Debug, Clone, clap::Args)]
pub struct LayoutFlags {
    /// Recompute each block in backward instead of keeping its activations
    /// (whole or split blocks, any --pp and --tp). Not with --own-ddp (your
    /// wrapper builds its own model) or --strategy fsdp (its units are
    /// recomputed in backward already).
    #[arg(long)]
    pub activation_checkpointing: bool,
    /// `ddp` (whole replicas), `zero1` (whole replicas, AdamW's state sharded by your
    /// exercise 17), `zero2` (the gradients sharded too) or `fsdp` (sharded; see
    /// --sharding and --precision).
    #[arg(long, value_enum, default_value_t = StrategyName::Ddp)]
    pub strategy: StrategyName,
    /// With --strategy fsdp: full_shard (the default), shard_grad_op, no_shard or hybrid_shard.
    #[arg(long, value_parser = parsed::<ShardingStrategy>)]
    pub sharding: Option<ShardingStrategy>,
    /// With --sharding hybrid_shard: the ranks of one shard group, consecutive
    /// ranks replicated across groups (default: the ranks of one node).
    #[arg(long, value_name = "RANKS")]
    pub hybrid_group_size: Option<usize>,
    /// With --strategy fsdp: fp32 (the default), bf16 or fp16 (its loss scaled).
    #[arg(long, value_parser = parsed::<Precision>)]
    pub precision: Option<Precision>,
    /// With --precision bf16 or fp16: reduce-scatter and accumulate the
    /// gradients in fp32 (PyTorch: MixedPrecision(reduce_dtype=torch.float32)),
    /// at twice the 16-bit reduce's gradient traffic and memory.
    #[arg(long, requires = "precision")]
    pub reduce_in_fp32: bool,
    /// `ring` all-reduces with your exercise 16 instead of the backend's own ring.
    #[arg(long, value_enum, default_value_t = AllReduce::Backend)]
    pub allreduce: AllReduce,
    /// With --strategy ddp (with or without --pp and --tp): average each
    /// matrix gradient across the replicas as a rank-R PowerSGD estimate
    /// (your exercise 18) instead of whole.
    #[arg(long, value_name = "R", value_parser = at_least_one)]
    pub powersgd_rank: Option<u64>,
    /// Cut the blocks into S pipeline stages, one per rank, stepped by your
    /// exercise 21 on GPipe's schedule or by your exercise 24 on 1F1B's
    /// (--pipeline-schedule); the micro-batches are --grad-accum's. With --tp
    /// T each stage's blocks are split across T ranks. With more ranks than
    /// S·T, the pipeline is replicated across them, data-parallel.
    #[arg(long = "pp", visible_alias = "pipeline-stages", value_name = "S", conflicts_with = "ddp_overlap")]
    pub pipeline_stages: Option<usize>,
    /// Split every block across T tensor-parallel ranks, Megatron style,
    /// run by your exercise 23 (the embedding and head stay whole on
    /// every rank); with --pp, each stage's blocks. With more ranks than T
    /// (or S·T), the group is replicated across them, data-parallel: DDP,
    /// ZeRO-1, ZeRO-2 (without --pp), or with --strategy fsdp each rank's
    /// shards of a block an FSDP unit across the replicas (FSDP × TP).
    #[arg(long = "tp", value_name = "T", conflicts_with = "ddp_overlap")]
    pub tensor_parallel: Option<usize>,
    /// With --tp: cut the norms and residuals of every block along the
    /// sequence, each tensor-parallel rank keeping its chunk of the tokens,
    /// run by your exercise 27 (Megatron's sequence parallelism); with
    /// --pp too, within each stage.
    #[arg(long, requires = "tensor_parallel")]
    pub sequence_parallel: bool,
    /// Data-parallel replicas: inferred as --nproc / (pp · tp); given, it is
    /// checked against that, so that a job laid out by hand fails before it starts.
    #[arg(long = "dp", value_name = "D")]
    pub data_parallel: Option<usize>,
    /// With --pp: `gpipe` (all forwards, then all backwards) or `1f1b` (one
    /// forward, one backward in turn after a warm-up).
    #[arg(long, value_name = "SCHEDULE", default_value = "gpipe", requires = "pipeline_stages")]
    pub pipeline_schedule: PipelineSchedule,
    /// With --strategy ddp: all-reduce gradient buckets during backward, with
    /// your exercise 19, instead of after it.
    #[arg(long, conflicts_with = "powersgd_rank")]
    pub ddp_overlap: bool,
    /// With --strategy ddp: your DataParallel of exercise 26 runs each
    /// micro-batch's forward and backward and averages the gradients, in
    /// buckets of --bucket-cap-mb (over your ring with --allreduce ring).
    #[arg(
        long,
        conflicts_with_all = ["pipeline_stages", "tensor_parallel", "powersgd_rank", "ddp_overlap", "activation_checkpointing"]
    )]
    pub own_ddp: bool,
    /// With --strategy fsdp (with or without --pp and --tp): gather the next
    /// unit's parameters while the current one computes, in forward and
    /// backward (PyTorch's forward_prefetch and
    /// backward_prefetch=BACKWARD_PRE); two units are whole at once. With
    /// full_shard or hybrid_shard: the others keep parameters whole.
    #[arg(long)]
    pub prefetch: bool,
    /// With --strategy fsdp (with or without --pp and --tp): keep AdamW's
    /// moments and the f32 master shards of the FSDP units in a file in
    /// --checkpoint-dir, read back when the step or an all-gather needs them
    /// (PyTorch's CPUOffload, one level down: the disk).
    #[arg(long)]
    pub offload: bool,
    /// Where gradients are all-reduced in buckets (--strategy ddp, with or
    /// without --pp/--tp; --own-ddp): the most megabytes one all-reduce
    /// carries (PyTorch's bucket_cap_mb) [default: 25].
    #[arg(long = "bucket-cap-mb", value_name = "MB", value_parser = bucket_cap_bytes)]
    pub bucket_bytes: Option<usize>,
}

impl LayoutFlags {
    /// What these flags choose for a job of `world_size` ranks, `node_size`
    /// of them to a machine, checked against `config`: a pair of flags that
    /// does not go together is refused with its reason.
    pub fn choose(&self, config: &RunConfig, world_size: usize, node_size: usize) -> Result<Layout> {
        // Flags that shape one strategy's step, and what each does there.
        let one_strategy_flags = [
            ("--powersgd-rank", self.powersgd_rank.is_some(), StrategyName::Ddp, "it compresses DDP's all-reduces"),
            ("--ddp-overlap", self.ddp_overlap, StrategyName::Ddp, "it all-reduces DDP's buckets during backward"),
            ("--own-ddp", self.own_ddp, StrategyName::Ddp, "your exercise 26 is a DDP"),
            ("--prefetch", self.prefetch, StrategyName::Fsdp, "it gathers the next FSDP unit early"),
            ("--offload", self.offload, StrategyName::Fsdp, "it moves FSDP units' optimizer state to a file"),
        ];
        for (flag, given, only, what) in one_strategy_flags {
            if given && self.strategy != only {
                anyhow::bail!("{flag} applies to --strategy {only} only ({what}), not to --strategy {}", self.strategy);
            }
        }
        if self.activation_checkpointing && self.strategy == StrategyName::Fsdp {
            anyhow::bail!(
                "--activation-checkpointing with --strategy fsdp: each FSDP unit is recomputed in backward already \
                 (exercise 22 replays it from its input); drop --activation-checkpointing"
            );
        }
        // ZeRO-1's gradient goes in one reduce-scatter, FSDP's unit by unit: no buckets.
        let no_buckets = match self.strategy {
            StrategyName::Zero1 => Some("exercise 17 reduce-scatters each rank's gradient whole"),
            StrategyName::Zero2 => Some("each micro-batch's gradient is reduce-scattered whole"),
            StrategyName::Fsdp => Some("each FSDP unit reduce-scatters its own gradient"),
            StrategyName::Ddp => None,
        };
        if let (Some(why), Some(_)) = (no_buckets, self.bucket_bytes) {
            anyhow::bail!(
                "--bucket-cap-mb sizes DDP's all-reduces; --strategy {} has none ({why}): drop --bucket-cap-mb",
                self.strategy
            );
        }
        let kept_whole = [ShardingStrategy::ShardGradOp, ShardingStrategy::NoShard];
        if let Some(sharding) = self.sharding.filter(|s| self.prefetch && kept_whole.contains(s)) {
            anyhow::bail!(
                "--prefetch gathers the next FSDP unit early; --sharding {sharding} keeps every unit's parameters \
                 whole, so nothing is gathered: drop --prefetch"
            );
        }
        let strategy = match (self.pipeline_stages, self.tensor_parallel) {
            (None, None) if self.own_ddp => Strategy::YOUR_DDP,
            (None, None) => self.whole_replicas(node_size)?,
            (stages, tp) => self.mesh(stages.unwrap_or(1), tp.unwrap_or(1), config, world_size)?,
        };
        if let Some(size) = self.hybrid_group_size {
            let replicas = strategy.mesh(world_size)?.dp;
            if size == 0 || !replicas.is_multiple_of(size) {
                anyhow::bail!(
                    "--hybrid-group-size {size}: the {} do not split into shard groups of {size}: give a size that \
                     divides {replicas}",
                    workbook::words::count(replicas, "data-parallel rank")
                );
            }
        }
        if let Some(dp) = self.data_parallel {
            let shape = strategy.mesh(world_size)?;
            MeshShape::new(world_size, Some(dp), Some(shape.pp), Some(shape.tp))
                .map_err(|e| anyhow::anyhow!("--dp {dp}: {e}"))?;
        }
        Ok(Layout {
            strategy,
            activation_checkpointing: self.activation_checkpointing,
            own_ring: self.allreduce == AllReduce::Ring,
            powersgd_rank: self.powersgd_rank.map(|r| r as usize),
            ddp_overlap: self.ddp_overlap,
            prefetch: self.prefetch,
            offload: self.offload,
            bucket_bytes: self.bucket_bytes.unwrap_or(DEFAULT_BUCKET_BYTES),
        })
    }
}

/// `--strategy`: how the replicas share the work; with `--pp` or `--tp`, the
/// mesh's data-parallel axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StrategyName {
    /// Whole replicas, gradients all-reduced.
    Ddp,
    /// Whole replicas, AdamW's state sharded by your exercise 17; with --pp
    /// or --tp, sharded across the replicas of the mesh.
    Zero1,
    /// As zero1, and each micro-batch's gradient reduce-scattered as soon as
    /// its backward ends, each rank keeping its shard only; with --tp, not --pp.
    Zero2,
    /// Sharded units (see --sharding and --precision).
    Fsdp,
}

/// `--allreduce`: whose ring averages the gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AllReduce {
    /// The process backend's own all-reduce (TCP's ring, or NCCL's).
    Backend,
    /// Your exercise 16's, over the backend's point-to-point messages.
    Ring,
}

impl std::fmt::Display for StrategyName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = clap::ValueEnum::to_possible_value(self).expect("no value is skipped");
        f.write_str(name.get_name())
    }
}

impl LayoutFlags {
    /// Refuses FSDP's own flags under any other `--strategy`.
    fn refuse_fsdp_flags(&self) -> Result<()> {
        if self.strategy == StrategyName::Fsdp {
            return Ok(());
        }
        let given = [
            ("--sharding", self.sharding.is_some()),
            ("--precision", self.precision.is_some()),
            ("--reduce-in-fp32", self.reduce_in_fp32),
            ("--hybrid-group-size", self.hybrid_group_size.is_some()),
        ];
        match given.iter().find(|(_, given)| *given) {
            Some((flag, _)) => {
                anyhow::bail!("{flag} applies to --strategy fsdp only; {} keeps whole f32 replicas", self.strategy)
            }
            None => Ok(()),
        }
    }

    /// The strategy `--strategy` names without `--pp` or `--tp`, with its
    /// FSDP options; `node_size` ranks share a machine.
    fn whole_replicas(&self, node_size: usize) -> Result<Strategy> {
        self.refuse_fsdp_flags()?;
        match self.strategy {
            StrategyName::Ddp => Ok(Strategy::Ddp),
            StrategyName::Zero1 => Ok(Strategy::ZERO1),
            StrategyName::Zero2 => Ok(Strategy::ZERO2),
            StrategyName::Fsdp => {
                let sharding = self.sharding.unwrap_or(ShardingStrategy::FullShard);
                let hybrid = sharding == ShardingStrategy::HybridShard;
                if self.hybrid_group_size.is_some() && !hybrid {
                    anyhow::bail!("--hybrid-group-size applies to --sharding hybrid_shard only");
                }
                // A node's ranks by default: the launcher numbers them consecutively.
                let hybrid_group_size = hybrid.then_some(self.hybrid_group_size.unwrap_or(node_size));
                let (precision, reduce_in_f32) = self.fsdp_precision()?;
                let shard_group = hybrid_group_size;
                Ok(Strategy::whole_replicas(DataAxis::ShardBlocks { sharding, shard_group, precision, reduce_in_f32 }))
            }
        }
    }

    /// The mesh of `stages` pipeline stages of blocks split `tp` ways that
    /// `world_size` ranks are laid out on, checked against the model.
    fn mesh(&self, stages: usize, tp: usize, config: &RunConfig, world_size: usize) -> Result<Strategy> {
        let flags = match (stages, tp) {
            (1, _) => format!("--tp {tp}"),
            (_, 1) => format!("--pp {stages}"),
            _ => format!("--pp {stages} --tp {tp}"),
        };
        self.refuse_fsdp_flags()?;
        let data = match self.strategy {
            StrategyName::Ddp => DataAxis::Replicate,
            StrategyName::Zero1 => DataAxis::ShardOptimizer,
            StrategyName::Zero2 if stages > 1 => anyhow::bail!(
                "--strategy zero2 with {flags}: ZeRO-2 reduce-scatters each micro-batch's gradient as soon as its \
                 backward ends, and a pipeline's schedule holds a stage's gradients over all its micro-batches \
                 (DeepSpeed's pipeline engine refuses the same pair); use --strategy zero1 with --pp"
            ),
            StrategyName::Zero2 => DataAxis::ShardGradients,
            StrategyName::Fsdp => self.fsdp_on_a_pipeline(&flags)?,
        };
        if tp > 1 {
            check_tensor_split(tp, &config.model)?;
        }
        if self.sequence_parallel && !config.seq_len.is_multiple_of(tp) {
            anyhow::bail!(
                "--sequence-parallel cuts each sequence of {} tokens into {tp} chunks, one per tensor-parallel rank: \
                 use a --seq-len that {tp} divides",
                config.seq_len
            );
        }
        let (schedule, sequence_parallel) = (self.pipeline_schedule, self.sequence_parallel);
        let strategy = Strategy::Mesh { stages, tp, schedule, sequence_parallel, data };
        strategy.mesh(world_size).map_err(|e| anyhow::anyhow!("{flags}: {e}"))?;
        Ok(strategy)
    }

    /// FSDP's `--precision` and whether it reduces in f32 too (`--reduce-in-fp32`).
    fn fsdp_precision(&self) -> Result<(Precision, bool)> {
        let precision = self.precision.unwrap_or(Precision::Fp32);
        if self.reduce_in_fp32 && precision == Precision::Fp32 {
            anyhow::bail!(
                "--precision fp32 reduces the gradients in fp32 already: --reduce-in-fp32 goes with bf16 or fp16"
            );
        }
        Ok((precision, self.reduce_in_fp32))
    }

    /// What the replicas of a pipeline's stages shard under --strategy fsdp:
    /// each block, as `--sharding` says (FULL_SHARD by default; HYBRID_SHARD
    /// across groups of `--hybrid-group-size`), in `--precision`.
    fn fsdp_on_a_pipeline(&self, flags: &str) -> Result<DataAxis> {
        let (precision, reduce_in_f32) = self.fsdp_precision()?;
        let sharding = self.sharding.unwrap_or(ShardingStrategy::FullShard);
        let shard_group = match (sharding, self.hybrid_group_size) {
            (ShardingStrategy::HybridShard, Some(size)) => Some(size),
            (ShardingStrategy::HybridShard, None) => anyhow::bail!(
                "--sharding hybrid_shard with {flags} needs --hybrid-group-size: how many replicas of a stage share \
                 one set of shards"
            ),
            (_, Some(_)) => anyhow::bail!("--hybrid-group-size applies to --sharding hybrid_shard only"),
            (_, None) => None,
        };
        Ok(DataAxis::ShardBlocks { sharding, shard_group, precision, reduce_in_f32 })
    }
}

/// Refuses a `model` whose blocks do not split evenly across `ranks` tensor-parallel ranks.
fn check_tensor_split(ranks: usize, model: &GptConfig) -> anyhow::Result<()> {
    let cut =
        [("heads", model.num_heads), ("key/value heads", model.kv_heads()), ("MLP units", model.intermediate_size)];
    if let Some((what, count)) = cut.iter().find(|(_, count)| !count.is_multiple_of(ranks)) {
        anyhow::bail!(
            "--tp {ranks}: the model's {count} {what} do not split evenly across {ranks} ranks: use a --tp that divides {count}"
        );
    }
    if model.bias {
        anyhow::bail!("--tp takes a model without biases: a row-parallel layer's bias would be added once per rank");
    }
    Ok(())
}
