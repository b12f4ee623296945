//! `cargo xtask interop`: the workbook's checkpoints against Hugging Face
//! transformers, both ways (needs a Python with torch and transformers; CI
//! never runs it).
//!
//! 1. Export: a tiny model trained on the bundled stories (byte tokenizer),
//!    and one with GPT-2's tokenizer, grouped-query attention and tied
//!    embeddings, each loaded from its checkpoint directory alone by
//!    `AutoModelForCausalLM` and `AutoTokenizer`: the same token ids, logits
//!    and greedy text as `cargo infer`.
//! 2. Import: a grouped-query, tied Llama saved by transformers, run by
//!    `infer`: the same logits and greedy text as transformers.
//!
//! The Python side is `tools/interop/interop.py`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use xtask::render;
use xtask::workspace::{cargo, Workspace};

use crate::python::python_that_imports;

const SCRIPT: &str = "tools/interop/interop.py";
const PROMPT: &str = "Once upon a time, Lily's café had naïve  spaces,\n\ttabs and 123 numbers!";
const NEW_TOKENS: &str = "40";

/// A second model shape that uses every feature an export must carry, with
/// rope_theta and norm_eps off the defaults a careless reader would assume.
const GPT2_GQA_TIED: &str = r#"tokenizer = "gpt2"
seq_len = 64
batch_size = 4
grad_accum_steps = 1
max_steps = 6

[model]
vocab_size = 50257
hidden_size = 64
num_layers = 2
num_heads = 4
num_kv_heads = 2
tie_word_embeddings = true
intermediate_size = 96
max_seq_len = 128
rope_theta = 5000.0
norm_eps = 3e-5
bias = false

[optimizer]
lr = 3e-3
min_lr = 3e-4
warmup_steps = 2
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
eps = 1e-8
max_grad_norm = 1.0
"#;

pub fn interop(ws: &Workspace) -> Result<bool> {
    let python = match python_that_imports("torch, transformers, safetensors") {
        Ok(python) => python,
        Err(why) => bail!("interop compares with Hugging Face transformers: {why}"),
    };
    let out = ws.root.join("target/interop");
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("cannot clear {}", out.display()))?;
    }
    std::fs::create_dir_all(&out)?;
    build_binaries(&ws.root)?;
    let interop = Interop { root: ws.root.clone(), out: out.clone(), python };

    println!("{}", render::bold("export: checkpoints load in transformers with no code"));
    let bytes_run = interop.train("bytes", &["--model-size", "tiny", "--max-steps", "60"])?;
    interop.compare(&bytes_run, "bytes")?;
    let gpt2_config = out.join("gpt2_gqa_tied.toml");
    std::fs::write(&gpt2_config, GPT2_GQA_TIED)?;
    let gpt2_run = interop.train("gpt2", &["--model-size", &gpt2_config.to_string_lossy(), "--max-steps", "6"])?;
    interop.compare(&gpt2_run, "gpt2")?;

    println!("{}", render::bold("import: a Llama saved by transformers runs in infer"));
    let imported = out.join("transformers_llama");
    interop.python(&["make", &imported.to_string_lossy(), &bytes_run.to_string_lossy()])?;
    interop.compare(&imported, "imported")?;
    println!("{}", render::green("interop: both directions agree"));
    Ok(true)
}

struct Interop {
    root: PathBuf,
    out: PathBuf,
    python: String,
}

impl Interop {
    /// Trains into `out/<name>` and returns its one checkpoint.
    fn train(&self, name: &str, args: &[&str]) -> Result<PathBuf> {
        let dir = self.out.join(name);
        let mut train = Command::new(self.binary("train"));
        train.current_dir(&self.root).args(args).args(["--nproc", "1", "--checkpoint-every", "1000"]);
        run(train.arg("--checkpoint-dir").arg(&dir), &format!("training the {name} model"))?;
        let newest = std::fs::read_dir(&dir)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("step_")))
            .max();
        newest.with_context(|| format!("training wrote no checkpoint into {}", dir.display()))
    }

    /// `infer` on `model` writes its greedy text and logits; transformers must agree.
    fn compare(&self, model: &Path, name: &str) -> Result<()> {
        let (logits, text) =
            (self.out.join(format!("{name}.logits.safetensors")), self.out.join(format!("{name}.txt")));
        let mut infer = Command::new(self.binary("infer"));
        infer.arg("--checkpoint").arg(model).args(["--prompt", PROMPT, "--max-new-tokens", NEW_TOKENS]);
        infer.args(["--temperature", "0"]).arg("--save-logits").arg(&logits);
        let output = run(&mut infer, &format!("infer on the {name} model"))?;
        std::fs::write(&text, output)?;
        let paths = [model, &logits, &text].map(|p| p.to_string_lossy().into_owned());
        self.python(&["compare", &paths[0], &paths[1], &paths[2], PROMPT, NEW_TOKENS])
    }

    fn python(&self, args: &[&str]) -> Result<()> {
        let mut command = Command::new(&self.python);
        command.current_dir(&self.root).arg(SCRIPT).args(args);
        let stdout = run(&mut command, "the transformers side")?;
        print!("{stdout}");
        Ok(())
    }

    fn binary(&self, name: &str) -> PathBuf {
        self.root.join("target/release").join(name)
    }
}

fn build_binaries(root: &Path) -> Result<()> {
    let mut build = cargo(root);
    build.args(["build", "--release", "--quiet", "-p", "trainer", "--features", "solutions"]);
    build.args(["--bin", "train", "--bin", "infer"]);
    run(&mut build, "building train and infer").map(drop)
}

/// Runs `command`; its stdout, or an error with its stderr.
fn run(command: &mut Command, what: &str) -> Result<String> {
    let output = command.output().with_context(|| format!("cannot start {what}"))?;
    if !output.status.success() {
        bail!("{what} failed:\n{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
