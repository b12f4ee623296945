//! Reference solution of exercise 8: AdamW parameter groups.

use crate::model::ParamStore;
use crate::train::ParamGroup;

pub fn param_groups(params: &ParamStore, weight_decay: f64) -> Vec<ParamGroup> {
    let (decay, no_decay): (Vec<_>, Vec<_>) = params.iter().partition(|(_, var)| var.rank() >= 2);
    let names = |group: Vec<(&str, _)>| group.into_iter().map(|(name, _)| name.to_string()).collect();
    vec![ParamGroup { names: names(decay), weight_decay }, ParamGroup { names: names(no_decay), weight_decay: 0.0 }]
}
