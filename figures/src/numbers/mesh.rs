//! The parallelisms composed on a mesh of four processes (`cargo xtask
//! bench mesh`), each layout beside DDP on the same four.

use anyhow::Result;

use super::format::{grouped, ratio};
use super::results::Row;
use super::{quote, Quote, Sources};

const SECTION: &str = "Parallelisms composed on a mesh";
const DDP: &str = "DDP, 4 replicas";
const PP: &str = "dp 2 × pp 2, GPipe";
const TP: &str = "dp 2 × tp 2";
const PP_TP: &str = "pp 2 × tp 2, GPipe";
const SENT: &str = "sent per step, busiest rank";
const PEAK: &str = "peak memory per rank";

pub fn quotes(sources: &Sources) -> Result<Vec<Quote>> {
    let section = sources.results.section(SECTION)?;
    let tiny = section.table_under("`tiny` config")?;
    let layout = |name| tiny.row(&[("setup", name)]);
    let ddp = layout(DDP)?;
    let ddp_sent = ddp.number(SENT)?;
    let sent = |row: &Row| -> Result<String> { Ok(ratio(row.number(SENT)? / ddp_sent)) };
    let peak = |row: &Row| -> Result<String> { Ok(format!("{} MiB", grouped(row.number(PEAK)?, 0))) };
    let (pp, tp, pp_tp) = (layout(PP)?, layout(TP)?, layout(PP_TP)?);
    Ok(vec![
        quote("host", section.host()?),
        quote("ddp-peak", peak(&ddp)?),
        quote("pp-speed", ratio(pp.number("vs DDP")?)),
        quote("pp-sent", sent(&pp)?),
        quote("pp-peak", peak(&pp)?),
        quote("tp-speed", ratio(tp.number("vs DDP")?)),
        quote("tp-sent", sent(&tp)?),
        quote("pp-tp-speed", ratio(pp_tp.number("vs DDP")?)),
        quote("pp-tp-sent", sent(&pp_tp)?),
        quote("pp-tp-peak", peak(&pp_tp)?),
    ])
}
