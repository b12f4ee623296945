//! The FSDP runtime's ledger (`cargo xtask bench fsdp`): what one rank
//! holds gathered at its peak, a size that depends on the model, not on
//! the machine.

use anyhow::Result;

use super::{quote, Quote, Sources};

const SECTION: &str = "FSDP: memory and communication per rank";

pub fn quotes(sources: &Sources) -> Result<Vec<Quote>> {
    let section = sources.results.section(SECTION)?;
    let ledger = section.table_headed("config")?;
    let full_shard =
        ledger.row(&[("config", "tiny"), ("precision", "fp32"), ("strategy", "ZeRO-3 (FULL_SHARD)"), ("N", "2")])?;
    Ok(vec![quote("tiny-full-shard-gathered", format!("{:.2} MiB", full_shard.number("gathered peak MiB")?))])
}
