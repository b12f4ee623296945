//! `infer`: generate text from a checkpoint.
//!
//! `cargo run --release -p trainer --bin infer -- --checkpoint checkpoints --prompt "Once upon a time"`

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::anyhow;
use clap::Parser;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use trainer::checkpoints;
use trainer::generate::{generate, Sampling};
use workbook::data::Tokenizer;
use workbook::train::Checkpoint;
use workbook::{Gpt, ParamStore};

/// Generate text from a trained model.
#[derive(Parser)]
#[command(name = "infer")]
struct Args {
    /// A step_NNNNNN checkpoint, or a directory of them (the newest is used).
    #[arg(long, default_value = "checkpoints")]
    checkpoint: PathBuf,
    #[arg(long, default_value = "Once upon a time")]
    prompt: String,
    #[arg(long, default_value_t = 200)]
    max_new_tokens: usize,
    /// 0 is greedy: always the most likely token.
    #[arg(long, default_value_t = 0.8)]
    temperature: f64,
    /// Sample among the k most likely tokens only (0: all).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

fn main() -> ExitCode {
    trainer::main_with(|| run(Args::parse()))
}

fn run(args: Args) -> anyhow::Result<()> {
    let dir = checkpoints::resolve(&args.checkpoint)?;
    let checkpoint = Checkpoint::read(&dir)?;
    let config = checkpoint.state.model.clone();
    let (tokenizer, trained_len) = checkpoint
        .state
        .data
        .as_ref()
        .map_or((Tokenizer::Bytes, config.max_seq_len), |d| (d.config.tokenizer, d.config.seq_len));
    let params = ParamStore::from_tensors(checkpoint.params)?;
    let model =
        Gpt::new(&config, &params).map_err(|e| anyhow!("{} does not hold a usable model: {e}", dir.display()))?;
    let prompt = tokenizer.encode(&args.prompt);
    if prompt.is_empty() {
        anyhow::bail!("the prompt is empty: give at least one character with --prompt");
    }
    let sampling = Sampling { temperature: args.temperature, top_k: args.top_k };
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let new = generate(&model, &prompt, args.max_new_tokens, trained_len, sampling, Some(tokenizer.eot()), &mut rng)?;
    println!("{}{}", args.prompt, tokenizer.decode(&new));
    Ok(())
}
