//! `rdkvctl`: the rdkv admin and data CLI, in the style of etcdctl.
//!
//! Prints results on stdout in the `-w` format; on failure prints only
//! `Error: ...` on stderr and exits 1. `get` of an absent key prints nothing and
//! exits 0 (as etcdctl does). `endpoint status`/`health` print what they could
//! learn and exit 1 if any endpoint failed or is unhealthy.

#![forbid(unsafe_code)]
// Non-test functions stay under 100 lines (issue 13); tests may run longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

mod args;
mod backup;
mod check;
mod commands;
mod nodes;
mod output;
mod rebalance;
mod shards;
mod top;
mod top_shards;
mod views;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = args::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(&anyhow::Error::new(e).context("cannot start the runtime")),
    };
    let format = cli.global.write_out;
    if let args::Command::Top {
        interval_ms,
        iterations,
    } = cli.command
    {
        let interval = std::time::Duration::from_millis(interval_ms);
        let ran = runtime.block_on(async {
            let client = commands::client(&cli.global)?;
            top::run(&client, interval, iterations).await
        });
        return match ran {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&e),
        };
    }
    if let Some(outcome) = commands::run_local(&cli.command) {
        return finish(outcome, format);
    }
    let outcome = runtime.block_on(async {
        let client = commands::client(&cli.global)?;
        commands::run(&client, cli.command).await
    });
    finish(outcome, format)
}

/// Prints what a command produced and gives its exit code.
fn finish(outcome: anyhow::Result<commands::Outcome>, format: output::Format) -> ExitCode {
    match outcome {
        Ok(outcome) => {
            let text = output::render(outcome.view.as_ref(), format);
            let mut stdout = std::io::stdout().lock();
            // A closed pipe (`| head`) is not an error worth reporting.
            let _ = stdout
                .write_all(text.as_bytes())
                .and_then(|()| stdout.flush());
            match outcome.failure {
                Some(e) => fail(&e),
                None => ExitCode::SUCCESS,
            }
        }
        Err(e) => fail(&e),
    }
}

fn fail(error: &anyhow::Error) -> ExitCode {
    eprintln!("Error: {error:#}");
    ExitCode::FAILURE
}
