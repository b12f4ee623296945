//! Hugging Face model directories, both ways: a Llama that transformers wrote
//! (grouped-query attention, tied embeddings) loads and computes what
//! transformers computes, variants the model lacks are refused by name, and
//! every checkpoint is a directory transformers can read. Needs finished
//! exercises: run with `cargo test -p trainer --features solutions`.
//! `cargo xtask interop` runs the transformers side where it is installed.

mod common;
use common::scratch;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use candle_core::{DType, Device, Tensor};
use serde_json::{json, Value};
use trainer::config::RunConfig;
use workbook::data::{DataConfig, DatasetKind, SamplerState, Tokenizer};
use workbook::hf::{read_tokenizer, write_tokenizer, Pretrained};
use workbook::train::{Checkpoint, DataPosition, TrainConfig, TrainerState};
use workbook::{init_params, Gpt, ParamStore};

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf_gqa_tied")
}

fn expected() -> HashMap<String, Tensor> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf_gqa_tied.safetensors");
    candle_core::safetensors::load(path, &Device::Cpu).unwrap()
}

fn train_config() -> TrainConfig {
    RunConfig::load("tiny").unwrap().train_config(false)
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar().unwrap()
}

#[test]
fn a_transformers_llama_with_grouped_query_attention_and_tied_embeddings_computes_what_transformers_does() {
    let pretrained = Pretrained::read(&fixture_dir()).unwrap();
    let config = &pretrained.config;
    assert_eq!((config.num_heads, config.kv_heads()), (4, 2), "4 query heads share 2 key/value heads");
    assert!(config.tie_word_embeddings, "config.json ties the embeddings");
    assert_eq!(
        (config.rope_theta, config.norm_eps),
        (5000.0, 2e-5),
        "rope_theta and rms_norm_eps come from config.json"
    );
    assert!(!pretrained.params.contains_key("lm_head.weight"), "a tied model has no head of its own");

    let expected = expected();
    let ids = expected["ids"].to_dtype(DType::U32).unwrap();
    let params = ParamStore::from_tensors(pretrained.params.clone()).unwrap();
    let pass = Gpt::new(config, &params).unwrap().forward(&ids, Some(&ids)).unwrap();
    let logits_diff = max_diff(&pass.logits, &expected["logits"]);
    assert!(logits_diff < 1e-4, "logits differ from transformers' by {logits_diff:e}");
    let loss_diff = max_diff(pass.loss.as_ref().unwrap(), &expected["loss"]);
    assert!(loss_diff < 1e-5, "the loss differs from transformers' by {loss_diff:e}");

    let grads = pass.backward().unwrap();
    for (name, var) in params.iter() {
        let grad = grads.get(var.as_tensor()).unwrap_or_else(|| panic!("no gradient for {name}"));
        let diff = max_diff(grad, &expected[&format!("grad.{name}")]);
        // The tied table's gradient sums the embedding's and the head's; k/v's sum their query heads'.
        assert!(diff < 1e-4, "the gradient of {name} differs from transformers' by {diff:e}");
    }
}

/// Copies the fixture into a scratch directory with config.json's `key` set to `value`.
fn edited_fixture(name: &str, key: &str, value: Value) -> PathBuf {
    let dir = scratch(name);
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture_dir().join(file), dir.join(file)).unwrap();
    }
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    config[key] = value;
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    dir
}

#[test]
fn llama_variants_the_model_lacks_are_refused_by_name_not_loaded_wrongly() {
    let cases = [
        ("mistral", "model_type", json!("mistral"), "model_type"),
        ("scaled-rope", "rope_scaling", json!({"rope_type": "linear", "factor": 2.0}), "rope_type"),
        ("scaled-rope-v5", "rope_parameters", json!({"rope_type": "yarn", "rope_theta": 5e3}), "rope_type"),
        ("mlp-bias", "mlp_bias", json!(true), "mlp_bias"),
        ("head-dim", "head_dim", json!(16), "head_dim"),
        ("untied", "tie_word_embeddings", json!(false), "lm_head.weight"),
    ];
    for (name, key, value, named) in cases {
        let err = Pretrained::read(&edited_fixture(name, key, value)).unwrap_err().to_string();
        assert!(err.contains(named), "{name}: the error should name `{named}`:\n{err}");
    }
    let err = Pretrained::read(&scratch("empty")).unwrap_err().to_string();
    assert!(err.contains("no config.json"), "{err}");
}

/// The fixture's weights in a scratch directory, with an `lm_head.weight`
/// made from the embedding by `head`.
fn fixture_with_head(name: &str, head: impl Fn(&Tensor) -> Tensor) -> PathBuf {
    let dir = edited_fixture(name, "tie_word_embeddings", json!(true));
    let mut weights = candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap();
    let embedding = &weights["model.embed_tokens.weight"];
    weights.insert("lm_head.weight".into(), head(embedding));
    candle_core::safetensors::save(&weights, dir.join("model.safetensors")).unwrap();
    dir
}

/// A tied model whose file also holds a head: a copy of the embedding is
/// the tied head, but one that differs is refused by name, since tying would
/// replace it (transformers keeps it and warns).
#[test]
fn a_tied_config_with_a_head_of_its_own_is_refused_not_tied_over() {
    let copy = fixture_with_head("tied-copy", |embedding| embedding.copy().unwrap());
    let loaded = Pretrained::read(&copy).expect("a head equal to the embedding is the tied head");
    assert!(!loaded.params.contains_key("lm_head.weight"), "the tied head is the embedding");
    let differs = fixture_with_head("tied-differs", |embedding| (embedding + 0.5).unwrap());
    let err = Pretrained::read(&differs).unwrap_err().to_string();
    for named in ["tie_word_embeddings", "`lm_head.weight` that differs"] {
        assert!(err.contains(named), "the error should name {named}:\n{err}");
    }
}

/// An index's shard names are files beside it; one that leads out of the
/// model directory is refused before anything is read.
#[test]
fn an_index_naming_files_outside_the_model_directory_is_refused() {
    let outside = scratch("outside.safetensors");
    std::fs::copy(fixture_dir().join("model.safetensors"), &outside).unwrap();
    // Both lead to a real file: the sibling of the model directory.
    let up = format!("../{}", outside.file_name().unwrap().to_str().unwrap());
    for (name, shard) in [("index-up", up), ("index-abs", outside.display().to_string())] {
        let dir = scratch(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(fixture_dir().join("config.json"), dir.join("config.json")).unwrap();
        let weights = candle_core::safetensors::load(&outside, &Device::Cpu).unwrap();
        let map: serde_json::Map<String, Value> = weights.keys().map(|k| (k.clone(), json!(shard))).collect();
        let index = json!({ "metadata": {}, "weight_map": map });
        std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
        let err = Pretrained::read(&dir).unwrap_err().to_string();
        assert!(err.contains("which is not a file of"), "{name}: the shard `{shard}` must be refused:\n{err}");
    }
}

#[test]
fn gpt2s_tokenizer_file_has_its_50000_merges_and_both_tokenizers_are_recognised() {
    for tokenizer in Tokenizer::ALL {
        let dir = scratch(&format!("tokenizer-{tokenizer}"));
        std::fs::create_dir_all(&dir).unwrap();
        write_tokenizer(&dir, tokenizer, 1024).unwrap();
        assert_eq!(read_tokenizer(&dir).unwrap(), Some(tokenizer));
        let file: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer.json")).unwrap()).unwrap();
        let (vocab, merges) = (&file["model"]["vocab"], file["model"]["merges"].as_array().unwrap());
        match tokenizer {
            // GPT-2's published vocabulary: 50000 merges, " the" is 262 and is built from "Ġt" + "he".
            Tokenizer::Gpt2 => {
                assert_eq!(merges.len(), 50000);
                assert_eq!(vocab["Ġthe"], 262);
                assert!(merges.contains(&Value::from("Ġt he")), "Ġthe is made from Ġt and he");
            }
            Tokenizer::Bytes => {
                assert!(merges.is_empty(), "one token per byte: nothing to merge");
                assert_eq!((vocab["A"].clone(), vocab["Ġ"].clone()), (65.into(), 32.into()), "ids are byte values");
            }
        }
    }
}

#[test]
fn every_checkpoint_is_a_hugging_face_directory_of_the_same_model() {
    let expected = Pretrained::read(&fixture_dir()).unwrap();
    let config = expected.config.clone();
    let params = init_params(&config, 5, &Device::Cpu).unwrap();
    let tensors: HashMap<String, Tensor> = params.iter().map(|(n, v)| (n.to_string(), v.as_tensor().clone())).collect();
    let data = DataConfig { kind: DatasetKind::Dummy, path: None, tokenizer: Tokenizer::Bytes, seq_len: 8, seed: 1 };
    let position = DataPosition { config: data, sampler: SamplerState::default(), held_out: 0 };
    let state = TrainerState::new(3, 3, config.clone(), train_config(), Some(position));
    let dir = scratch("checkpoint").join("step_000003");
    Checkpoint { params: tensors.clone(), optimizer: HashMap::new(), state }.write(&dir).unwrap();

    let read = Pretrained::read(&dir).unwrap();
    assert_eq!(read.config, config, "config.json describes the checkpoint's model");
    assert_eq!(read.tokenizer, Some(Tokenizer::Bytes), "the run's tokenizer is written beside it");
    for (name, tensor) in &tensors {
        assert_eq!(max_diff(tensor, &read.params[name]), 0.0, "{name} reads back bit for bit");
    }
}

#[test]
fn infer_runs_a_hugging_face_directory_and_says_when_it_lacks_a_tokenizer() {
    let infer = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_infer"))
            .arg("--checkpoint")
            .arg(fixture_dir())
            .args(["--max-new-tokens", "3", "--temperature", "0"])
            .args(extra)
            .output()
            .unwrap()
    };
    let stderr = |out: &std::process::Output| String::from_utf8_lossy(&out.stderr).into_owned();
    let no_tokenizer = infer(&[]);
    assert_eq!(no_tokenizer.status.code(), Some(1));
    assert!(stderr(&no_tokenizer).contains("--tokenizer"), "{}", stderr(&no_tokenizer));
    let too_big = infer(&["--tokenizer", "bytes"]);
    assert!(stderr(&too_big).contains("257 ids but the model's vocabulary has 61"), "{}", stderr(&too_big));
}

#[test]
fn train_init_from_starts_from_the_given_weights() {
    let train = |dir: &Path, extra: &[&std::ffi::OsStr]| {
        let out = Command::new(env!("CARGO_BIN_EXE_train"))
            .args(["--dataset", "dummy", "--seq-len", "16", "--batch-size", "2", "--warmup-steps", "1"])
            .args(["--nproc", "1", "--checkpoint-every", "1", "--checkpoint-dir"])
            .arg(dir)
            .args(extra)
            .env("RAYON_NUM_THREADS", "1")
            .output()
            .unwrap();
        assert!(out.status.success(), "train failed:\n{}", String::from_utf8_lossy(&out.stderr));
    };
    let (source, started) = (scratch("init-source"), scratch("init-started"));
    train(&source, &["--max-steps".as_ref(), "2".as_ref()]);
    let source_step = source.join("step_000002");
    // One step at a learning rate too small to move anything: the weights stay the source's.
    let flags = ["--max-steps", "2", "--lr", "1e-12", "--seed", "99", "--init-from"];
    let mut args: Vec<&std::ffi::OsStr> = flags.iter().map(|f| f.as_ref()).collect();
    args.push(source_step.as_os_str());
    train(&started, &args);
    let (from, to) = (Pretrained::read(&source_step).unwrap(), Pretrained::read(&started.join("step_000001")).unwrap());
    for (name, tensor) in &from.params {
        let diff = max_diff(tensor, &to.params[name]);
        assert!(diff < 1e-6, "{name} moved by {diff:e}: the run did not start from --init-from's weights");
    }
}
