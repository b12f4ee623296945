//! FSDP units: the groups of parameters gathered, freed, reduced and saved
//! together. Which modules become units is exercise 14.

use std::collections::BTreeSet;

use candle_core::{bail, Result};

use crate::model::{layer_of, param_specs, GptConfig};

/// The name of the unit holding every parameter outside the blocks.
pub const ROOT_UNIT: &str = "root";

/// One FSDP unit: a name and its parameters, in module order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsdpUnit {
    pub name: String,
    pub params: Vec<String>,
}

/// The layer prefix of block `layer`'s parameters, which is also its unit's name.
pub fn block_unit_name(layer: usize) -> String {
    format!("model.layers.{layer}")
}

/// Checks that `units` is what the runtime runs: the root unit first, with
/// every parameter outside the blocks, then one unit per block in layer order,
/// named after it and holding exactly its parameters.
pub fn check_units(config: &GptConfig, units: &[FsdpUnit]) -> Result<()> {
    if units.len() != config.num_layers + 1 {
        bail!(
            "the wrap policy made {} units; a model with {} blocks needs {}: the root and one per block",
            units.len(),
            config.num_layers,
            config.num_layers + 1
        );
    }
    let specs = param_specs(config);
    for (i, unit) in units.iter().enumerate() {
        let expected_name = if i == 0 { ROOT_UNIT.to_string() } else { block_unit_name(i - 1) };
        if unit.name != expected_name {
            bail!(
                "unit {i} is called `{}`; expected `{expected_name}` (the root first, then the blocks in order)",
                unit.name
            );
        }
        let holds: BTreeSet<&str> = unit.params.iter().map(String::as_str).collect();
        if holds.len() != unit.params.len() {
            bail!("unit `{}` lists a parameter twice", unit.name);
        }
        // The root holds what is in no block; unit i holds block i − 1.
        let belongs = |name: &str| layer_of(name) == i.checked_sub(1);
        let expected: BTreeSet<&str> = specs.iter().map(|s| s.name.as_str()).filter(|n| belongs(n)).collect();
        if let Some(missing) = expected.difference(&holds).next() {
            bail!("unit `{}` lacks `{missing}`", unit.name);
        }
        if let Some(extra) = holds.difference(&expected).next() {
            bail!("unit `{}` holds `{extra}`, which belongs to another unit", unit.name);
        }
    }
    Ok(())
}
