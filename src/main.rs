//! The `tessel-kafka` binary: parse the command line, load config, run, map the result to an
//! exit code.

use std::process::ExitCode;

use clap::Parser;
use tessel_kafka::cli::{Cli, Command, ConfigCommand};
use tessel_kafka::config::{Config, LogConfig};
use tessel_kafka::dev_dispatcher::{DevDispatcher, Faults};
use tessel_kafka::{app::App, shutdown, telemetry};
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the async runtime: {e}")),
    };
    runtime.block_on(async {
        match cli.command {
            Command::Run { config } => {
                let config = match Config::load(&config) {
                    Ok(c) => c,
                    Err(e) => return fail(&e.to_string()),
                };
                telemetry::init_tracing(&config.log);
                let token = CancellationToken::new();
                shutdown::spawn_signal_handler(token.clone());
                let result = match App::build(config) {
                    Ok(app) => app.run(token, true).await,
                    Err(e) => Err(e.into()),
                };
                match result {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => fail(&format!("{e:#}")),
                }
            }
            Command::Config {
                command: ConfigCommand::Check { config },
            } => match Config::load(&config) {
                Ok(c) => {
                    println!("# configuration is valid; effective values, secrets redacted\n");
                    print!("{}", toml::to_string_pretty(&c).unwrap_or_default());
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e.to_string()),
            },
            Command::DevDispatcher {
                listen,
                latency_ms,
                fail_ratio,
                fail_status,
            } => {
                telemetry::init_tracing(&LogConfig::default());
                let token = CancellationToken::new();
                shutdown::spawn_signal_handler(token.clone());
                let faults = Faults {
                    latency_ms: (latency_ms, latency_ms),
                    fail_ratio,
                    fail_status,
                    ..Faults::default()
                };
                match DevDispatcher::start(listen, faults, true, token.clone()).await {
                    Ok(d) => {
                        println!("dev dispatcher listening on {}", d.url());
                        token.cancelled().await;
                        ExitCode::SUCCESS
                    }
                    Err(e) => fail(&format!("cannot listen on {listen}: {e}")),
                }
            }
        }
    })
}

fn fail(message: &str) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::FAILURE
}
