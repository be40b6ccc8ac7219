//! The `tessel-kafka` binary: parse the command line, start the runtime, run the command.

use std::process::ExitCode;

use clap::Parser;
use tessel_kafka::cli::Cli;

/// See Cargo.toml: glibc's allocator cost a fifth of the CPU per event.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// At most this many threads on tokio's blocking pool: a few per connection of the largest
/// region (1,000 connections), with room to spare.
const MAX_BLOCKING_THREADS: usize = 4_096;

/// How long an idle thread of the blocking pool lives. An idle region's rounds (a statistics
/// event every 5 s per connection, a quiet poll every ~5 s) wake idle threads in turn, so
/// with tokio's 10 s every thread a burst created (a drain, a rebalance) stayed for ever
/// (100 idle connections kept 103); at 100 ms about (rounds per second) / 10 remain.
const BLOCKING_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_millis(100);

/// How long the exit waits for work left on the blocking pool once the command returned.
const EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

fn main() -> ExitCode {
    // Before any client or socket exists: descriptors grow with the work (librdkafka's sockets
    // and wake-up descriptors per client, dispatcher connections); the daemon logs the outcome.
    tessel_kafka::limits::raise_at_start();
    let cli = Cli::parse();
    // Each connection polls librdkafka and commits on the blocking pool, and a revoke holds
    // its poll round until the connection drained (bounded by drain_timeout_ms). The pool's
    // threads exist only while used; its bound (512 by default) must not make a region-wide
    // rebalance of hundreds of connections wait on itself.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .thread_keep_alive(BLOCKING_KEEP_ALIVE)
        .build();
    match runtime {
        Ok(runtime) => {
            let code = runtime.block_on(tessel_kafka::cli::commands::execute(cli));
            // A consumer left closing in the background (its group's coordinator did not
            // answer it leaving; its commits were made) does not hold the exit.
            runtime.shutdown_timeout(EXIT_WAIT);
            code
        }
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}
