//! `cargo xtask`: the binary is the library's command line (src/lib.rs).

fn main() -> std::process::ExitCode {
    xtask::main()
}
