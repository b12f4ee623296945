//! The weights of a Hugging Face model directory: one safetensors file, or
//! shards listed by an index.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Component, Path};

use candle_core::{bail, DType, Device, Result, Tensor};
use serde::Deserialize;

use crate::error::io_path;
use crate::model::{param_specs, GptConfig};

const SINGLE_FILE: &str = "model.safetensors";
const INDEX_FILE: &str = "model.safetensors.index.json";

#[derive(Deserialize)]
struct Index {
    /// Parameter name → the shard that holds it.
    weight_map: BTreeMap<String, String>,
}

/// Every parameter of `config` from the safetensors in `dir`, as f32 on the
/// CPU; an error names what is missing, extra or of the wrong shape.
pub fn read_weights(dir: &Path, config: &GptConfig) -> Result<HashMap<String, Tensor>> {
    let mut tensors = HashMap::new();
    for file in weight_files(dir)? {
        let path = dir.join(&file);
        let loaded = match candle_core::safetensors::load(&path, &Device::Cpu) {
            Ok(loaded) => loaded,
            Err(e) => bail!("{} is not a readable safetensors file: {e}", path.display()),
        };
        tensors.extend(loaded);
    }
    // A buffer older exports carry; the model computes its rotary table itself.
    tensors.retain(|name, _| !name.ends_with("rotary_emb.inv_freq"));
    if config.tie_word_embeddings {
        drop_tied_head(dir, &mut tensors)?;
    }
    let specs = param_specs(config);
    let mut params = HashMap::with_capacity(specs.len());
    for spec in &specs {
        let Some(tensor) = tensors.remove(&spec.name) else {
            bail!("{}: the weights lack `{}`, which config.json's model needs", dir.display(), spec.name);
        };
        if tensor.shape() != &spec.shape {
            bail!(
                "{}: `{}` has shape {:?} but config.json's model needs {:?}",
                dir.display(),
                spec.name,
                tensor.shape(),
                spec.shape
            );
        }
        params.insert(spec.name.clone(), tensor.to_dtype(DType::F32)?);
    }
    if let Some(extra) = tensors.keys().min() {
        bail!(
            "{}: the weights hold `{extra}`, which this model has no place for (a bias, or a module another \
             architecture has); it cannot be loaded without changing what the model computes",
            dir.display()
        );
    }
    Ok(params)
}

/// Some exports write a tied head out beside the embedding; a copy of the
/// embedding is dropped. A head that differs from it is refused: tying
/// would replace it (transformers keeps both untied and only warns), so the
/// model would not compute what the weights say.
fn drop_tied_head(dir: &Path, tensors: &mut HashMap<String, Tensor>) -> Result<()> {
    const HEAD: &str = "lm_head.weight";
    const EMBEDDING: &str = "model.embed_tokens.weight";
    let (Some(head), Some(embedding)) = (tensors.get(HEAD), tensors.get(EMBEDDING)) else {
        tensors.remove(HEAD);
        return Ok(());
    };
    let same = head.shape() == embedding.shape()
        && head.to_dtype(DType::F32)?.eq(&embedding.to_dtype(DType::F32)?)?.flatten_all()?.min(0)?.to_scalar::<u8>()?
            == 1;
    if !same {
        bail!(
            "{}: config.json says tie_word_embeddings: true, but the weights hold an `{HEAD}` that differs from              `{EMBEDDING}`; tying would replace that head. Set tie_word_embeddings to false in config.json to load              the head as it is, or remove `{HEAD}` from the weights to tie it to the embedding",
            dir.display()
        );
    }
    tensors.remove(HEAD);
    Ok(())
}

/// `file` as an index names it, when it is a file of `dir` itself: a plain
/// name, not a path that leads out of the model directory.
fn shard_in(dir: &Path, file: &str) -> Result<String> {
    let mut parts = Path::new(file).components();
    match (parts.next(), parts.next()) {
        (Some(Component::Normal(_)), None) => Ok(file.to_string()),
        _ => bail!(
            "{} lists the shard `{file}`, which is not a file of {}: an index names shards by their file names              beside it",
            dir.join(INDEX_FILE).display(),
            dir.display()
        ),
    }
}

/// The safetensors files of `dir`: the shards of its index, or its one file.
fn weight_files(dir: &Path) -> Result<Vec<String>> {
    let index = dir.join(INDEX_FILE);
    if index.is_file() {
        let text = fs::read_to_string(&index).map_err(|e| io_path("read", &index, e))?;
        let index: Index = match serde_json::from_str(&text) {
            Ok(index) => index,
            Err(e) => bail!("{} is not a safetensors index: {e}", dir.join(INDEX_FILE).display()),
        };
        let mut files: Vec<String> =
            index.weight_map.values().map(|file| shard_in(dir, file)).collect::<Result<_>>()?;
        files.sort();
        files.dedup();
        return Ok(files);
    }
    if dir.join(SINGLE_FILE).is_file() {
        return Ok(vec![SINGLE_FILE.to_string()]);
    }
    bail!(
        "{} has no weights: neither {SINGLE_FILE} nor {INDEX_FILE} (PyTorch .bin weights are not read; save \
         with safe_serialization=True)",
        dir.display()
    )
}
