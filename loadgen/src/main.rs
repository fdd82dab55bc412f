//! `mcpyard-loadgen`: load for an MCP Streamable HTTP endpoint, and the fast MCP upstream
//! it is measured against.
//!
//! ```text
//! mcpyard-loadgen upstream --listen 127.0.0.1:0 --delay-ms 1          # prints: listening ADDR
//! mcpyard-loadgen run --url http://ADDR/mcp --scenario tools-call --rate 5000 \
//!     --connections 16 --duration 10s --warmup 2s --json out.json --hgrm out.hgrm --svg out.svg
//! ```
//!
//! Module map, in reading order:
//! - `args.rs`: the command line; `limits.rs`: every bound.
//! - `arrival.rs`: kernel receive timestamps onto the run's clock.
//! - `schedule.rs`: intended send times, the pacer, the open/closed loops (clock injected).
//! - `record.rs`: per-connection histograms and error counts, merged at the end.
//! - `series.rs`: `--intervals`, the run's figures per interval, written as it goes.
//! - `client.rs`, `mcp.rs`: HTTP and MCP on the generator side, with mcpyard's codecs.
//! - `run.rs`: request scenarios on one thread per connection.
//! - `streams.rs`: idle-sessions and fanout, thousands of GET streams on one thread.
//! - `report/`: the table, `--json`, `--hgrm` and `--svg`.
//! - `upstream/`: the fixture server.
//! - `sys.rs`: rlimit, timer slack, timerfd and `recvmsg` with receive timestamps (the only
//!   `unsafe`).
#![forbid(unused_must_use)]

mod args;
mod arrival;
mod client;
mod limits;
mod mcp;
mod record;
mod report;
mod run;
mod schedule;
mod series;
mod streams;
mod sys;
mod tls;
mod upstream;

use std::process::ExitCode;

use args::{ArgError, Command, RunArgs, Scenario};
use run::RunError;

/// Exit status for a command-line mistake.
const EXIT_USAGE: u8 = 2;
/// Exit status for a run that failed or a fixture that could not start.
const EXIT_FAILURE: u8 = 1;

fn main() -> ExitCode {
    let words: Vec<String> = std::env::args().skip(1).collect();
    let command = match args::parse(&words) {
        Ok(command) => command,
        Err(ArgError::Help) => {
            println!("{}", args::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(err) => {
            eprintln!("mcpyard-loadgen: {err}\n{}", args::USAGE);
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let result = match command {
        Command::Upstream(args) => upstream::serve(args).map_err(|e| e.to_string()),
        Command::Run(args) => run_command(&args).map_err(|e| e.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("mcpyard-loadgen: {err}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

fn run_command(args: &RunArgs) -> Result<(), RunError> {
    if let Err(err) = sys::raise_nofile_limit() {
        eprintln!("mcpyard-loadgen: warning: cannot raise the open-file limit: {err}");
    }
    if matches!(args.scenario, Scenario::IdleSessions | Scenario::Fanout) {
        return streams::run_and_report(args);
    }
    let rec = run::run(args)?;
    print!("{}", report::table(args, &rec));
    let title = format!(
        "{} response time, {} connections{}",
        args.scenario.name(),
        args.connections,
        match args.mode {
            args::Mode::Open { rate } => format!(", {rate} req/s"),
            args::Mode::Closed => ", closed loop".into(),
        }
    );
    report::write_files(args, &report::run_json(args, &rec), &rec.response, &title)?;
    if rec.ok_count() == 0 {
        return Err(RunError::NoSamples);
    }
    Ok(())
}
