//! Run configurations: `configs/<size>.toml`, then command-line overrides.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;
use workbook::data::Tokenizer;
use workbook::memory::{available_memory, Footprint, RunShape};
use workbook::train::{AdamWConfig, CosineSchedule, LrSchedule, OptimizerConfig, TrainConfig};
use workbook::GptConfig;

/// The model sizes shipped in `configs/`.
pub const SIZES: [&str; 3] = ["tiny", "small", "medium"];

/// One `configs/*.toml` file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    pub tokenizer: Tokenizer,
    pub seq_len: usize,
    /// Sequences per micro-batch, across all ranks together.
    pub batch_size: usize,
    pub grad_accum_steps: usize,
    pub max_steps: usize,
    pub model: GptConfig,
    pub optimizer: OptimizerSettings,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerSettings {
    pub lr: f64,
    pub min_lr: f64,
    pub warmup_steps: usize,
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub max_grad_norm: f64,
}

impl OptimizerSettings {
    /// Every setting in its range, so that a typo fails here and not as a NaN
    /// in the middle of a run (or in a checkpoint nothing can read).
    fn validate(&self) -> Result<()> {
        let o = self;
        let checks: [(&str, f64, bool, &str); 7] = [
            ("lr", o.lr, o.lr > 0.0, "a positive number"),
            ("min_lr", o.min_lr, (0.0..=o.lr).contains(&o.min_lr), "between 0 and lr"),
            ("weight_decay", o.weight_decay, o.weight_decay >= 0.0, "0 or more"),
            ("beta1", o.beta1, (0.0..1.0).contains(&o.beta1), "in [0, 1)"),
            ("beta2", o.beta2, (0.0..1.0).contains(&o.beta2), "in [0, 1)"),
            ("eps", o.eps, o.eps > 0.0, "a positive number"),
            ("max_grad_norm", o.max_grad_norm, o.max_grad_norm > 0.0, "a positive number"),
        ];
        for (name, value, in_range, range) in checks {
            if !(value.is_finite() && in_range) {
                let flag = match name {
                    "lr" => " (--lr, or the config's)",
                    _ => " (in the config file)",
                };
                bail!("optimizer setting {name} = {value}{flag} must be {range}");
            }
        }
        Ok(())
    }
}

/// `--bucket-cap-mb`: a size in megabytes (0.5 allowed, as PyTorch's
/// `bucket_cap_mb`), as bytes; at least one.
pub fn bucket_cap_bytes(text: &str) -> Result<usize, String> {
    match text.parse::<f64>() {
        Ok(mb) if mb.is_finite() && mb * 1024.0 * 1024.0 >= 1.0 => Ok((mb * 1024.0 * 1024.0) as usize),
        _ => Err(format!("`{text}` is not a size in megabytes above zero (e.g. 25 or 0.5)")),
    }
}

/// The workbook's directory: where `configs/` and `datasets/` are. Found when
/// the program runs, not fixed when it is built, so a moved or copied workbook
/// works: `WORKBOOK_ROOT` if set, else the nearest directory holding
/// `configs/` at or above the working directory, else above the program
/// itself (`target/release/train` sits two levels below it).
pub fn workbook_root() -> Result<PathBuf> {
    let is_root = |dir: &Path| dir.join("configs").is_dir();
    if let Some(dir) = std::env::var_os("WORKBOOK_ROOT").map(PathBuf::from) {
        if !is_root(&dir) {
            bail!("WORKBOOK_ROOT is {}, which has no configs/ directory: point it at the workbook", dir.display());
        }
        return Ok(dir);
    }
    let here = std::env::current_dir().ok();
    let program = std::env::current_exe().ok().and_then(|p| p.canonicalize().ok());
    let found = [here, program]
        .into_iter()
        .flatten()
        .find_map(|start| start.ancestors().find(|d| is_root(d)).map(Path::to_path_buf));
    found.ok_or_else(|| {
        anyhow!(
            "cannot find the workbook (a directory with configs/ and datasets/): run from inside it, set \
             WORKBOOK_ROOT, or give --model-size a config file and --data-path a text file"
        )
    })
}

impl RunConfig {
    /// Reads `size` when it is a path to a file, else `configs/<size>.toml` in the workbook.
    pub fn load(size: &str) -> Result<Self> {
        let path = if Path::new(size).is_file() {
            PathBuf::from(size)
        } else {
            workbook_root()?.join("configs").join(format!("{size}.toml"))
        };
        // A name with a separator or an extension was meant as a file.
        let looks_like_a_path = size.contains(['/', '\\']) || size.ends_with(".toml");
        if !path.is_file() && looks_like_a_path {
            bail!("there is no config file at {size}: check the path given to --model-size");
        }
        if !path.is_file() {
            bail!("unknown model size `{size}`: choose {} or give the path of a config file", SIZES.join(", "));
        }
        let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("{} is not a valid run config", path.display()))
    }

    /// Switches to `tokenizer`, resizing the model's vocabulary to match it.
    pub fn set_tokenizer(&mut self, tokenizer: Tokenizer) {
        self.tokenizer = tokenizer;
        self.model.vocab_size = tokenizer.vocab_size();
    }

    pub fn train_config(&self, activation_checkpointing: bool) -> TrainConfig {
        let o = &self.optimizer;
        TrainConfig {
            grad_accum_steps: self.grad_accum_steps,
            max_grad_norm: o.max_grad_norm,
            schedule: LrSchedule::Cosine(CosineSchedule {
                max_lr: o.lr,
                min_lr: o.min_lr,
                warmup_steps: o.warmup_steps,
                max_steps: self.max_steps,
            }),
            optimizer: OptimizerConfig {
                weight_decay: o.weight_decay,
                adamw: AdamWConfig { beta1: o.beta1, beta2: o.beta2, eps: o.eps },
            },
            activation_checkpointing,
        }
    }

    /// Checks what no single field can: that the pieces fit together on
    /// `world_size` data-parallel ranks, `ranks_here` of which share this machine.
    pub fn validate(&self, world_size: usize, ranks_here: usize) -> Result<()> {
        if world_size == 0 {
            bail!("--nproc must be at least 1");
        }
        if self.batch_size == 0 {
            bail!("--batch-size must be at least 1: it is the sequences of one micro-batch, over all ranks together");
        }
        if !self.batch_size.is_multiple_of(world_size) {
            bail!(
                "the batch size, {} (--batch-size, or the config's), does not divide across {}: give --batch-size \
                 a multiple of {world_size} (it is the global batch, split evenly)",
                self.batch_size,
                workbook::words::count(world_size, "data-parallel rank")
            );
        }
        if self.seq_len < 2 || self.seq_len > self.model.max_seq_len {
            bail!(
                "--seq-len {} must be between 2 and the model's max_seq_len {}",
                self.seq_len,
                self.model.max_seq_len
            );
        }
        if self.grad_accum_steps == 0 {
            bail!("--grad-accum must be at least 1: it is the micro-batches of one step");
        }
        if self.max_steps == 0 {
            bail!("--max-steps must be at least 1");
        }
        if self.optimizer.warmup_steps >= self.max_steps {
            bail!(
                "warmup_steps {} must be smaller than max_steps {}: lower --warmup-steps or raise --max-steps",
                self.optimizer.warmup_steps,
                self.max_steps
            );
        }
        self.optimizer.validate()?;
        // Larger is fine: vocabularies are often padded to a round size.
        if self.model.vocab_size < self.tokenizer.vocab_size() {
            bail!(
                "the model's vocab_size {} is smaller than the {} tokenizer's {}: fix vocab_size in the config file",
                self.model.vocab_size,
                self.tokenizer,
                self.tokenizer.vocab_size()
            );
        }
        self.model.validate()?;
        self.check_fits(world_size, ranks_here)
    }

    /// Fails, before anything is allocated, when the machine's free memory
    /// cannot hold even the run's smallest footprint (where the OS says how
    /// much is free), naming the setting that asks for the most.
    fn check_fits(&self, world_size: usize, ranks_here: usize) -> Result<()> {
        let run = RunShape {
            micro_batch: self.batch_size / world_size,
            seq_len: self.seq_len,
            grad_accum: self.grad_accum_steps,
            ranks_here: ranks_here.max(1),
        };
        let need = Footprint::of(&self.model, run);
        let Some(available) = available_memory() else { return Ok(()) };
        if need.total() <= available {
            return Ok(());
        }
        let gib = |bytes: f64| format!("{:.1} GiB", bytes / (1u64 << 30) as f64);
        let each_rank = match run.ranks_here {
            1 => String::new(),
            n => format!(", on each of the {n} ranks on this machine"),
        };
        let parts = [
            (need.model_states, "parameters, gradients and AdamW state".to_string(), "a smaller model".to_string()),
            (
                need.rotary,
                format!("the rotary tables of max_seq_len {}{each_rank}", self.model.max_seq_len),
                "a smaller max_seq_len in the config".to_string(),
            ),
            (
                need.attention,
                format!(
                    "one layer's attention scores for {} sequences of {} tokens{each_rank}",
                    run.micro_batch, run.seq_len
                ),
                "a smaller --batch-size or --seq-len".to_string(),
            ),
            (
                need.batches,
                format!("the tokens of one step's {} micro-batches (--grad-accum){each_rank}", run.grad_accum),
                format!("a smaller --grad-accum than {}", run.grad_accum),
            ),
        ];
        let (_, _, remedy) = parts.iter().max_by(|a, b| a.0.total_cmp(&b.0)).expect("four parts");
        let fewer_ranks = if run.ranks_here > 1 { ", or fewer ranks on this machine (--nproc)" } else { "" };
        let listed: Vec<String> = parts.iter().map(|(bytes, what, _)| format!("{} for {what}", gib(*bytes))).collect();
        bail!(
            "this run needs at least {} ({}) but the machine has {} free: choose {remedy}{fewer_ranks}",
            gib(need.total()),
            listed.join("; "),
            gib(available)
        )
    }
}

/// A count flag's value: a whole number of 1 or more (clap's own range
/// check would answer `0 is not in 1..18446744073709551615`).
pub fn at_least_one(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("give a whole number of 1 or more".to_string()),
    }
}

/// A flag's value parsed by the type's own `FromStr`, whose error says what it takes.
pub fn parsed<T: std::str::FromStr>(text: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    text.parse().map_err(|e: T::Err| e.to_string())
}
