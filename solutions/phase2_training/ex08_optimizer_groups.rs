//! Reference solution of exercise 8: AdamW parameter groups.

use candle_core::Result;

use crate::model::ParamStore;
use crate::train::{AdamW, OptimizerConfig, ParamGroup};

pub fn build_optimizer(params: &ParamStore, config: &OptimizerConfig) -> Result<AdamW> {
    let (decay, no_decay): (Vec<_>, Vec<_>) = params.iter().partition(|(_, var)| var.rank() >= 2);
    let names = |group: Vec<(&str, _)>| group.into_iter().map(|(name, _)| name.to_string()).collect();
    let groups = vec![
        ParamGroup { names: names(decay), weight_decay: config.weight_decay },
        ParamGroup { names: names(no_decay), weight_decay: 0.0 },
    ];
    AdamW::new(groups, config.adamw)
}
