//! Reference solution of exercise 14: which modules become FSDP units.

use crate::model::{param_specs, GptConfig};
use crate::parallel::fsdp::{block_unit_name, FsdpUnit, ROOT_UNIT};

pub fn wrap_policy(config: &GptConfig) -> Vec<FsdpUnit> {
    let mut units: Vec<FsdpUnit> = std::iter::once(ROOT_UNIT.to_string())
        .chain((0..config.num_layers).map(block_unit_name))
        .map(|name| FsdpUnit { name, params: vec![] })
        .collect();
    for spec in param_specs(config) {
        let block =
            (0..config.num_layers).find(|&layer| spec.name.starts_with(&format!("{}.", block_unit_name(layer))));
        let unit = block.map_or(0, |layer| layer + 1);
        units[unit].params.push(spec.name);
    }
    units
}
