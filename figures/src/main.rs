//! `figures draw DATA OUT` draws every guide figure from the recorded data
//! in DATA into OUT; `figures check DATA OUT` says which figures in OUT are
//! not what their data draws today.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};
use figures::catalog::FIGURES;

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<ExitCode> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [command, data, out] = args.as_slice() else {
        bail!("usage: figures draw|check <data dir> <figures dir>");
    };
    let (data, out) = (PathBuf::from(data), PathBuf::from(out));
    let mut stale = 0;
    for figure in FIGURES {
        let svg = figure.draw(&data)?;
        let path = out.join(figure.file);
        match command.as_str() {
            "draw" => {
                std::fs::create_dir_all(&out)?;
                std::fs::write(&path, svg)?;
                println!("drew {}", path.display());
            }
            "check" => {
                if std::fs::read_to_string(&path).ok().as_deref() != Some(svg.as_str()) {
                    println!("{} is stale: its data draws another picture (run `cargo xtask figures`)", path.display());
                    stale += 1;
                }
            }
            other => bail!("unknown command `{other}`: draw or check"),
        }
    }
    Ok(if stale == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
