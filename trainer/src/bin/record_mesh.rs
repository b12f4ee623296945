//! `record_mesh`: lays a world of `dp · pp · tp` ranks out as the device
//! mesh does (exercise 25) and prints, as one JSON object, the mesh's shape,
//! every rank's coordinates and one rank's group along each axis. The
//! guide's mesh figure is drawn from it (`cargo xtask figures --record`).

use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::Parser;
use workbook::distributed::{Axis, MeshShape};

#[derive(Parser)]
#[command(name = "record_mesh")]
struct Args {
    #[arg(long, default_value_t = 2)]
    dp: usize,
    #[arg(long, default_value_t = 2)]
    pp: usize,
    #[arg(long, default_value_t = 2)]
    tp: usize,
    /// The rank whose groups are recorded.
    #[arg(long, default_value_t = 5)]
    rank: usize,
}

fn main() -> ExitCode {
    trainer::main_with(|| run(Args::parse()))
}

fn run(args: Args) -> Result<()> {
    let shape = MeshShape { dp: args.dp, pp: args.pp, tp: args.tp };
    if shape.world_size() == 0 || args.rank >= shape.world_size() {
        bail!("--dp, --pp and --tp must be at least 1 and --rank one of their {} ranks", shape.world_size());
    }
    let coords: Vec<_> = (0..shape.world_size())
        .map(|rank| {
            let at = shape.coords(rank);
            serde_json::json!({ "dp": at.dp, "pp": at.pp, "tp": at.tp })
        })
        .collect();
    let group = |axis| shape.group_of(args.rank, axis);
    let record = serde_json::json!({
        "shape": { "dp": shape.dp, "pp": shape.pp, "tp": shape.tp },
        "coords": coords,
        "rank": args.rank,
        "groups": { "tp": group(Axis::Tp), "pp": group(Axis::Pp), "dp": group(Axis::Dp) },
    });
    println!("{record}");
    Ok(())
}
