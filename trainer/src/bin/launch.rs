//! `launch`: starts a program as the ranks of a job, one process each, with
//! the `env://` variables set (the workbook's `torchrun`).
//!
//! ```text
//! launch --nproc-per-node 2 -- train --model-size tiny
//! launch --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 --nproc-per-node 4 -- train ...
//! ```
//!
//! A bare program name is looked up beside this launcher first, so the
//! workbook's own programs need no path.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use trainer::launching::LaunchArgs;

/// Start a program as the ranks of a job (like torchrun).
#[derive(Parser)]
#[command(name = "launch", version)]
struct Args {
    #[command(flatten)]
    launch: LaunchArgs,
    /// The program, then its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<OsString>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let (program, rest) = args.command.split_first().expect("clap requires a program");
    match args.launch.launch(&resolve(program), rest) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `program` itself, or the program of that name beside this launcher.
fn resolve(program: &OsString) -> PathBuf {
    let path = PathBuf::from(program);
    if path.components().count() == 1 {
        let sibling = std::env::current_exe().ok().and_then(|exe| Some(exe.parent()?.join(&path)));
        if let Some(sibling) = sibling.filter(|p| p.is_file()) {
            return sibling;
        }
    }
    path
}
