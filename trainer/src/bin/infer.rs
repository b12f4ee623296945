//! `infer`: generate text from a checkpoint or a Hugging Face Llama directory.
//!
//! `cargo run --release -p trainer --bin infer -- --checkpoint checkpoints --prompt "Once upon a time"`

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use candle_core::{Device, Tensor};
use clap::Parser;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use trainer::generate::{generate, Sampling};
use trainer::model_dir::ModelDir;
use trainer::report;

/// Generate text from a trained model.
#[derive(Parser)]
#[command(name = "infer", version, allow_negative_numbers = true)]
struct Args {
    /// A step_NNNNNN checkpoint, a directory of them (the newest is used), or
    /// a Hugging Face Llama directory (config.json and safetensors).
    #[arg(long, default_value = "checkpoints")]
    checkpoint: PathBuf,
    #[arg(long, default_value = "Once upon a time")]
    prompt: String,
    #[arg(long, default_value_t = 200)]
    max_new_tokens: usize,
    /// 0 is greedy: always the most likely token.
    #[arg(long, default_value_t = 0.8, value_parser = temperature)]
    temperature: f64,
    /// Sample among the k most likely tokens only (0: all).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// bytes or gpt2; default: the model directory's own.
    #[arg(long)]
    tokenizer: Option<String>,
    /// Also write the prompt's token ids (`ids`, (1, T)) and the model's logits
    /// for it (`logits`, (1, T, V)) to this safetensors file, to compare with
    /// another implementation.
    #[arg(long)]
    save_logits: Option<PathBuf>,
}

/// 0 (greedy) or a positive, finite number: a negative one would invert
/// the distribution, and inf or NaN would make it uniform or meaningless.
fn temperature(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(t) if t.is_finite() && t >= 0.0 => Ok(t),
        _ => Err(format!("`{text}` is not a temperature: give 0 (greedy) or a positive number such as 0.8")),
    }
}

fn main() -> ExitCode {
    trainer::main_with(|| run(Args::parse()))
}

fn run(args: Args) -> anyhow::Result<()> {
    let source = ModelDir::open(&args.checkpoint)?;
    let broken = source.non_finite_params()?;
    if let Some(first) = broken.first() {
        eprintln!(
            "warning: {} of {}'s parameters hold NaN or infinity (first: {first}): its training diverged and what \
             it generates means nothing; use an earlier checkpoint",
            broken.len(),
            source.dir.display()
        );
    }
    let tokenizer = source.tokenizer(args.tokenizer.as_deref().map(str::parse).transpose()?)?;
    let model = source.model()?;
    let prompt = tokenizer.encode(&args.prompt);
    if prompt.is_empty() {
        anyhow::bail!("the prompt is empty: give at least one character with --prompt");
    }
    if let Some(path) = &args.save_logits {
        let ids = Tensor::new(prompt.as_slice(), &Device::Cpu)?.unsqueeze(0)?; // (1, T)
        let logits = model.forward(&ids, None)?.logits;
        let tensors =
            HashMap::from([("ids".to_string(), ids.to_dtype(candle_core::DType::I64)?), ("logits".into(), logits)]);
        candle_core::safetensors::save(&tensors, path)?;
    }
    // On stderr: stdout holds the text alone, for a pipe.
    eprintln!("model: {}", source.dir.display());
    if prompt.len() + args.max_new_tokens > source.context_len {
        eprintln!(
            "note: the model was trained on contexts of {} tokens: past that it reads the last {} tokens only, \
             a sliding window",
            source.context_len, source.context_len
        );
    }
    let sampling = Sampling { temperature: args.temperature, top_k: args.top_k };
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let new =
        generate(&model, &prompt, args.max_new_tokens, source.context_len, sampling, Some(tokenizer.eot()), &mut rng)?;
    report!("{}{}", args.prompt, tokenizer.decode(&new));
    Ok(())
}
