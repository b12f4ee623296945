//! The model's parameters: what they are called, what shape they have, and where they live.

use std::collections::BTreeMap;

use super::{GptConfig, Linear};
use candle_core::{bail, DType, Device, Result, Shape, Tensor, Var};

/// What kind of module a parameter belongs to: the Rust counterpart of
/// PyTorch's `isinstance(module, nn.Linear)` checks in an init function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamKind {
    /// A token embedding table, (V, C).
    Embedding,
    /// The weight of a linear layer, (out_features, in_features).
    LinearWeight,
    /// The bias of a linear layer, (out_features).
    LinearBias,
    /// The scale of an RMSNorm, (C).
    NormWeight,
}

/// One parameter of the model: its Hugging Face Llama name, shape and kind.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Shape,
    pub kind: ParamKind,
}

impl ParamSpec {
    fn new(name: impl Into<String>, shape: impl Into<Shape>, kind: ParamKind) -> Self {
        Self { name: name.into(), shape: shape.into(), kind }
    }
}

/// The block a parameter belongs to: `Some(3)` for
/// `model.layers.3.mlp.up_proj.weight`, `None` outside the blocks.
pub fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("model.layers.")?.split('.').next()?.parse().ok()
}

/// Every parameter of the model described by `config`, in module order.
pub fn param_specs(config: &GptConfig) -> Vec<ParamSpec> {
    let (v, c, i) = (config.vocab_size, config.hidden_size, config.intermediate_size);
    let kv = config.kv_heads() * config.head_dim();
    let mut specs = vec![ParamSpec::new("model.embed_tokens.weight", (v, c), ParamKind::Embedding)];
    for layer in 0..config.num_layers {
        let p = format!("model.layers.{layer}");
        specs.push(ParamSpec::new(format!("{p}.input_layernorm.weight"), c, ParamKind::NormWeight));
        for (proj, fan_out) in [("q_proj", c), ("k_proj", kv), ("v_proj", kv), ("o_proj", c)] {
            linear_specs(&mut specs, &format!("{p}.self_attn.{proj}"), c, fan_out, config.bias);
        }
        specs.push(ParamSpec::new(format!("{p}.post_attention_layernorm.weight"), c, ParamKind::NormWeight));
        linear_specs(&mut specs, &format!("{p}.mlp.gate_proj"), c, i, config.bias);
        linear_specs(&mut specs, &format!("{p}.mlp.up_proj"), c, i, config.bias);
        linear_specs(&mut specs, &format!("{p}.mlp.down_proj"), i, c, config.bias);
    }
    specs.push(ParamSpec::new("model.norm.weight", c, ParamKind::NormWeight));
    if !config.tie_word_embeddings {
        specs.push(ParamSpec::new("lm_head.weight", (v, c), ParamKind::LinearWeight));
    }
    specs
}

fn linear_specs(specs: &mut Vec<ParamSpec>, prefix: &str, fan_in: usize, fan_out: usize, bias: bool) {
    specs.push(ParamSpec::new(format!("{prefix}.weight"), (fan_out, fan_in), ParamKind::LinearWeight));
    if bias {
        specs.push(ParamSpec::new(format!("{prefix}.bias"), fan_out, ParamKind::LinearBias));
    }
}

/// Where modules find their weights by name: the parameter store, or views
/// into an FSDP unit's flat parameter. Gradients computed through the tensors
/// it returns land on whatever variable backs them.
pub trait Weights {
    /// The tensor of parameter `name`.
    fn tensor(&self, name: &str) -> Result<Tensor>;

    /// The linear layer `{prefix}.weight` (and `{prefix}.bias` when `bias`).
    fn linear(&self, prefix: &str, bias: bool) -> Result<Linear> {
        let weight = self.tensor(&format!("{prefix}.weight"))?;
        let bias = if bias { Some(self.tensor(&format!("{prefix}.bias"))?) } else { None };
        Ok(Linear::new(weight, bias))
    }
}

impl Weights for ParamStore {
    fn tensor(&self, name: &str) -> Result<Tensor> {
        Ok(self.get(name)?.as_tensor().clone())
    }
}

/// The trainable parameters, by name.
///
/// A `BTreeMap`, not candle's `VarMap` (a `HashMap`): iteration is in name
/// order, so flattening, bucketing and sharding are the same on every rank.
#[derive(Debug, Clone, Default)]
pub struct ParamStore {
    vars: BTreeMap<String, Var>,
}

impl ParamStore {
    /// Wraps named tensors as trainable variables (their data is copied).
    pub fn from_tensors<I, S>(tensors: I) -> Result<Self>
    where
        I: IntoIterator<Item = (S, Tensor)>,
        S: Into<String>,
    {
        let vars =
            tensors.into_iter().map(|(name, t)| Ok((name.into(), Var::from_tensor(&t)?))).collect::<Result<_>>()?;
        Ok(Self { vars })
    }

    /// Named variables as they are: the store shares them (and their gradients).
    pub fn from_vars(vars: impl IntoIterator<Item = (String, Var)>) -> Self {
        Self { vars: vars.into_iter().collect() }
    }

    /// The variable called `name`, or an error naming it.
    pub fn get(&self, name: &str) -> Result<&Var> {
        match self.vars.get(name) {
            Some(var) => Ok(var),
            None => bail!("parameter `{name}` is missing: the parameters do not fit this model config"),
        }
    }

    /// Checks that the store holds exactly the parameters of `config`, with their shapes.
    pub fn check_matches(&self, config: &GptConfig) -> Result<()> {
        self.check_holds(config, |_| true)
    }

    /// Checks that the store holds every parameter of `config` that `part`
    /// names, with its shape, and nothing that is not of `config`: a whole
    /// model, or the part of it a rank builds (a pipeline stage's).
    pub fn check_holds(&self, config: &GptConfig, part: impl Fn(&str) -> bool) -> Result<()> {
        let specs = param_specs(config);
        for spec in specs.iter().filter(|spec| part(&spec.name)) {
            let var = self.get(&spec.name)?;
            if var.shape() != &spec.shape {
                bail!(
                    "parameter `{}` has shape {:?} but the model config needs {:?}",
                    spec.name,
                    var.shape(),
                    spec.shape
                );
            }
        }
        if let Some(extra) = self.vars.keys().find(|name| !specs.iter().any(|s| &s.name == *name)) {
            bail!("parameter `{extra}` is not part of a model with this config");
        }
        Ok(())
    }

    /// Name and variable of every parameter, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Var)> {
        self.vars.iter().map(|(name, var)| (name.as_str(), var))
    }

    /// The parameters whose names `keep` accepts, sharing their variables
    /// (and so their gradients) with this store.
    pub fn subset(&self, keep: impl Fn(&str) -> bool) -> Self {
        let vars = self.vars.iter().filter(|(name, _)| keep(name)).map(|(n, v)| (n.clone(), v.clone())).collect();
        Self { vars }
    }

    /// The parameters of every store in `parts`, sharing their variables;
    /// an error when two hold a parameter of the same name.
    pub fn union<'a>(parts: impl IntoIterator<Item = &'a ParamStore>) -> Result<Self> {
        let mut vars = BTreeMap::new();
        for (name, var) in parts.into_iter().flat_map(ParamStore::iter) {
            if vars.insert(name.to_string(), var.clone()).is_some() {
                bail!("parameter `{name}` is held twice");
            }
        }
        Ok(Self { vars })
    }

    /// The device the model computes on: any parameter's (a model, or the
    /// part of it a rank holds, keeps its parameters together).
    pub fn device(&self) -> Result<Device> {
        match self.vars.values().next() {
            Some(var) => Ok(var.device().clone()),
            None => bail!("an empty parameter store is on no device"),
        }
    }

    /// The total number of scalars.
    pub fn num_params(&self) -> usize {
        self.vars.values().map(|v| v.elem_count()).sum()
    }

    /// A copy with every parameter cast to `dtype`.
    pub fn to_dtype(&self, dtype: DType) -> Result<Self> {
        let tensors =
            self.iter().map(|(name, var)| Ok((name.to_string(), var.to_dtype(dtype)?))).collect::<Result<Vec<_>>>()?;
        Self::from_tensors(tensors)
    }
}
