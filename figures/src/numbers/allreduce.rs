//! The ring all-reduce's bus bandwidth on loopback (`cargo xtask bench
//! allreduce`).

use anyhow::Result;

use super::{quote, Quote, Sources};

const SECTION: &str = "All-reduce bus bandwidth";

pub fn quotes(sources: &Sources) -> Result<Vec<Quote>> {
    Ok(vec![
        quote("host", sources.results.section(SECTION)?.host()?),
        quote("busbw-256-mb", format!("{:.2} GB/s", busbw_256_mb(sources)?)),
    ])
}

/// The workbook ring's bus bandwidth for a 256 MB payload, in GB/s: the
/// largest payload, the closest to a gradient's size.
pub fn busbw_256_mb(sources: &Sources) -> Result<f64> {
    let table = sources.results.section(SECTION)?.table_headed("payload")?;
    table.row(&[("payload", "256 MB")])?.number("workbook ring, busbw GB/s")
}
