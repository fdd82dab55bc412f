//! `mcpyard --config FILE` runs the gateway; `mcpyard check --config FILE` only validates.

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: mcpyard [check] --config FILE\n\
  mcpyard --config FILE         run the gateway\n\
  mcpyard check --config FILE   validate FILE and exit";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut check = false;
    let mut config: Option<PathBuf> = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "check" => check = true,
            "--config" | "-c" => config = args.next().map(PathBuf::from),
            "--help" | "-h" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            "--version" | "-V" => {
                println!("mcpyard {}", env!("CARGO_PKG_VERSION"));
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("mcpyard: unexpected argument {other:?}\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(path) = config else {
        eprintln!("mcpyard: --config FILE is required\n{USAGE}");
        return ExitCode::from(2);
    };
    let config = match mcpyard::config::load(&path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mcpyard: {e}");
            return ExitCode::from(1);
        }
    };
    if check {
        println!("{}: ok", path.display());
        return ExitCode::SUCCESS;
    }
    match mcpyard::gateway::run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mcpyard: {e}");
            ExitCode::from(1)
        }
    }
}
