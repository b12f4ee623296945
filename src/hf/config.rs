//! `config.json` ↔ [`GptConfig`]: the Llama shape in Hugging Face's words.

use std::fs;
use std::path::Path;

use candle_core::{bail, DType, Result};
use serde::Deserialize;
use serde_json::{json, Value};

use super::CONFIG_FILE;
use crate::data::Tokenizer;
use crate::error::io_path;
use crate::model::GptConfig;

pub(super) const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// Writes `config.json` and `generation_config.json` for a model of shape
/// `config` whose weights are stored in `dtype`.
pub fn write_config(dir: &Path, config: &GptConfig, dtype: DType, tokenizer: Option<Tokenizer>) -> Result<()> {
    let eot = tokenizer.map(Tokenizer::eot);
    let llama = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.kv_heads(),
        "head_dim": config.head_dim(),
        "max_position_embeddings": config.max_seq_len,
        // transformers 5 reads `rope_parameters`, earlier versions `rope_theta`.
        "rope_theta": config.rope_theta,
        "rope_parameters": { "rope_type": "default", "rope_theta": config.rope_theta },
        "rms_norm_eps": config.norm_eps,
        "hidden_act": "silu",
        // The model's one `bias` switch covers the attention and the MLP projections.
        "attention_bias": config.bias,
        "mlp_bias": config.bias,
        "attention_dropout": 0.0,
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": eot,
        "eos_token_id": eot,
        // transformers 5 reads `dtype`, earlier versions `torch_dtype`.
        "dtype": torch_dtype(dtype)?,
        "torch_dtype": torch_dtype(dtype)?,
        "use_cache": true,
    });
    let generation = json!({ "bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot, "do_sample": false });
    write_json(&dir.join(CONFIG_FILE), &llama)?;
    write_json(&dir.join(GENERATION_CONFIG_FILE), &generation)
}

pub(super) fn write_json(path: &Path, value: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(candle_core::Error::wrap)?;
    fs::write(path, text).map_err(|e| io_path("write", path, e))
}

fn torch_dtype(dtype: DType) -> Result<&'static str> {
    Ok(match dtype {
        DType::F32 => "float32",
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        other => bail!("weights in {other:?} have no Hugging Face dtype name"),
    })
}

/// The fields of a Hugging Face `LlamaConfig` this model reads; others are
/// ignored, except those that change the architecture (checked in [`read_config`]).
#[derive(Deserialize)]
struct LlamaConfig {
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    max_position_embeddings: usize,
    rope_theta: Option<f64>,
    /// transformers 4's name for a scaled rotary embedding.
    rope_scaling: Option<Value>,
    /// transformers 5's: `rope_type` and `rope_theta` together.
    rope_parameters: Option<Value>,
    #[serde(default = "default_rms_norm_eps")]
    rms_norm_eps: f64,
    #[serde(default = "default_hidden_act")]
    hidden_act: String,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
    /// `LlamaConfig`'s default is untied.
    #[serde(default)]
    tie_word_embeddings: bool,
}

/// LlamaConfig's own default rotary base, for configs that give none.
const DEFAULT_ROPE_THETA: f64 = 10000.0;

// LlamaConfig's own defaults, for configs that leave the field out.
fn default_rms_norm_eps() -> f64 {
    1e-6
}
fn default_hidden_act() -> String {
    "silu".into()
}

/// Reads `dir/config.json` as a model shape, with an error for every Llama
/// variant this model would load wrongly.
pub fn read_config(dir: &Path) -> Result<GptConfig> {
    let path = dir.join(CONFIG_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "{} is not a model directory: it has no {CONFIG_FILE} (point at a step_NNNNNN checkpoint or a Hugging \
             Face Llama directory)",
            dir.display()
        ),
        Err(e) => return Err(io_path("read", &path, e)),
    };
    let llama: LlamaConfig = match serde_json::from_str(&text) {
        Ok(llama) => llama,
        Err(e) => bail!("{} is not a Llama config this model can read: {e}", path.display()),
    };
    let unsupported = |what: String| -> Result<GptConfig> {
        bail!("{}: {what}; this workbook's model cannot load it without changing what it computes", path.display())
    };
    match llama.model_type.as_deref() {
        Some("llama") => {}
        other => return unsupported(format!("model_type is {other:?}, not \"llama\"")),
    }
    for (name, rope) in [("rope_scaling", &llama.rope_scaling), ("rope_parameters", &llama.rope_parameters)] {
        let rope_type = rope.as_ref().filter(|r| !r.is_null()).map(|r| r.get("rope_type").or_else(|| r.get("type")));
        if let Some(kind) = rope_type.filter(|kind| kind.and_then(Value::as_str) != Some("default")) {
            return unsupported(format!(
                "{name} asks for rope_type {} (the model's rotary embedding is the unscaled default)",
                kind.map_or("unnamed".to_string(), Value::to_string)
            ));
        }
    }
    let nested_theta = llama.rope_parameters.as_ref().and_then(|r| r.get("rope_theta")).and_then(Value::as_f64);
    let rope_theta = nested_theta.or(llama.rope_theta).unwrap_or(DEFAULT_ROPE_THETA);
    if llama.hidden_act != "silu" {
        return unsupported(format!("hidden_act is {:?} (the MLP is SwiGLU, with SiLU)", llama.hidden_act));
    }
    if llama.attention_bias != llama.mlp_bias {
        return unsupported(format!(
            "attention_bias is {} but mlp_bias is {} (the model has one bias switch for both)",
            llama.attention_bias, llama.mlp_bias
        ));
    }
    if llama.num_attention_heads == 0 || !llama.hidden_size.is_multiple_of(llama.num_attention_heads) {
        return unsupported(format!(
            "hidden_size {} does not split into {} heads",
            llama.hidden_size, llama.num_attention_heads
        ));
    }
    let head_dim = llama.hidden_size / llama.num_attention_heads;
    if let Some(explicit) = llama.head_dim.filter(|&d| d != head_dim) {
        return unsupported(format!("head_dim is {explicit}, not hidden_size / num_attention_heads = {head_dim}"));
    }
    let config = GptConfig {
        vocab_size: llama.vocab_size,
        hidden_size: llama.hidden_size,
        num_layers: llama.num_hidden_layers,
        num_heads: llama.num_attention_heads,
        num_kv_heads: llama.num_key_value_heads.filter(|&kv| kv != llama.num_attention_heads),
        intermediate_size: llama.intermediate_size,
        max_seq_len: llama.max_position_embeddings,
        rope_theta,
        norm_eps: llama.rms_norm_eps,
        bias: llama.attention_bias,
        tie_word_embeddings: llama.tie_word_embeddings,
    };
    if let Err(e) = config.validate() {
        bail!("{}: {e}", path.display());
    }
    Ok(config)
}
