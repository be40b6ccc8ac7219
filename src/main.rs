//! The `tessel-kafka` binary: parse the command line, start the runtime, run the command.

use std::process::ExitCode;

use clap::Parser;
use tessel_kafka::cli::Cli;

/// See Cargo.toml: glibc's allocator cost a fifth of the CPU per event.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime.block_on(tessel_kafka::cli::commands::execute(cli)),
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}
